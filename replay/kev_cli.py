"""``dualhub kev ...``: fit Kev's lag from recorded runs, benchmark a real llama-server.

``dualhub kev fit-lag SESSIONS_OR_RUNS... [--out lag.json]`` fits the answer times a run measured,
separating queue wait (``kev_request.queue_wait_ns``) from service time, and writes the distribution.
A live run's and an LLM replay's answer times are the ones in ``latency_recorded.parquet`` (every
answer, late ones included: an answer after the engine's timeout took that long all the same, where
``kev_response`` only says "timeout"). A replay whose lags were drawn from a model (sim mode, llm mode
with ``--kev-lag model``) or copied from a cassette measured nothing and is refused; a session
directory means its measured ``runs/*``. A run without a manifest is fitted from ``kev_response``.

``dualhub kev bench [--url URL] [-n 20] [--out bench.json]`` makes N real calls against a running
llama-server (or starts one from the LLM venv), prints p50/p90/p99 and the ``--kev-timeout-ms`` it
recommends (:func:`engine.kev.health.recommend_timeout_ms`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.errors import DualhubError, check_output_path
from engine.kev import timeout_advice
from engine.kev.advisor import InstrumentState, KevContext, KevContextV2, PairState
from engine.kev.cassette import CASSETTE_FILE, Cassette
from engine.kev.command import check_sense, validate_command, validate_command_v2
from engine.kev.failures import classify
from engine.kev.health import RECOMMEND_FACTOR, recommend_timeout_ms
from engine.kev.lag import fit_lag, summarize_ns
from engine.kev.timeout_advice import PROMPTS
from engine.latency.recorded import RECORDED_FILE
from engine.store import write_json
from engine.urls import check_url, redact

RESPONSE_FILE = Path("events") / "kev_response.parquet"
REQUEST_FILE = Path("events") / "kev_request.parquet"


# ---------------------------------------------------------------------------------------------------
# fit-lag


def find_runs(path: Path) -> list[Path]:
    """Run directories under ``path``: ``path`` itself, or ``path/runs/*`` for a session."""
    if (path / RESPONSE_FILE).exists():
        return [path]
    runs = sorted(p.parent.parent for p in path.glob(f"runs/*/{RESPONSE_FILE}"))
    if not runs:
        if not path.exists():
            raise DualhubError(f"{path} does not exist")
        raise DualhubError(
            f"{path} has no Kev responses: expected {RESPONSE_FILE} (a run) or runs/*/{RESPONSE_FILE} "
            "(a session)"
        )
    return runs


def modelled(run: Path) -> str:
    """Why ``run``'s Kev lags were not measured ("" when they were, or when it has no manifest)."""
    try:
        manifest = orjson.loads((run / "manifest.json").read_bytes())
    except FileNotFoundError:
        return ""
    except (OSError, orjson.JSONDecodeError) as e:
        raise DualhubError(f"cannot read {run / 'manifest.json'}: {e}") from None
    cfg = manifest.get("config") or {}
    if manifest.get("kind") == "live":
        return ""
    mode = cfg.get("kev_mode", "sim")
    if mode == "llm" and cfg.get("kev_lag_source") == "measured":
        return ""
    if mode == "cassette":
        return "its Kev lags were copied from a cassette (fit the run it was recorded from)"
    model = f"empirical {cfg['kev_lag_fit']}" if cfg.get("kev_lag_fit") else "lognormal"
    return f"its Kev lags were drawn from a lag model (kev_mode {mode}, {model})"


def load_lags(run: Path, *, include_errors: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """``(lag_ns, queue_wait_ns, unmatched)`` of one run from ``kev_response``; responses without a
    request get wait 0."""
    resp = pq.read_table(run / RESPONSE_FILE, columns=["request_id", "ok", "lag_ns"])
    ids = resp.column("request_id").to_numpy()
    ok = resp.column("ok").to_numpy(zero_copy_only=False).astype(bool)
    lag = resp.column("lag_ns").to_numpy()
    if not include_errors:
        ids, lag = ids[ok], lag[ok]
    waits = _waits(run)
    wait = np.array([waits.get(int(i), (0, -1))[1] for i in ids], dtype=np.int64)
    unmatched = int(np.count_nonzero(wait < 0))
    wait[wait < 0] = 0
    return lag.astype(np.int64), wait, unmatched


def _waits(run: Path) -> dict[int, tuple[int, int]]:
    """request id -> (pick-up time, queue wait) from ``kev_request``."""
    if not (run / REQUEST_FILE).exists():
        return {}
    req = pq.read_table(run / REQUEST_FILE, columns=["request_id", "ts_recv", "queue_wait_ns"])
    cols = (req.column(c).to_pylist() for c in ("request_id", "ts_recv", "queue_wait_ns"))
    return {rid: (ts, w) for rid, ts, w in zip(*cols, strict=True)}


def load_recorded(run: Path, *, include_errors: bool = False) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(lag_ns, queue_wait_ns, unmatched, late)`` of one run from its recorded answer times
    (``latency_recorded.parquet``, kind ``kev``, keyed by pick-up time): every answer, ``late`` of them
    after the engine's timeout. Whether an answer was an error comes from its ``kev_response`` or, for
    a late one, the run's cassette (a live run has one); answers never given (the run stopped first)
    are left out."""
    path = run / RECORDED_FILE
    if not path.exists():
        raise DualhubError(f"{run} has no {RECORDED_FILE}: its Kev answer times were not recorded")
    rec = pq.read_table(path)
    rec = rec.filter(pc.equal(rec.column("kind"), "kev"))
    by_pickup: dict[int, list[tuple[int, int]]] = {}
    for rid, (ts, w) in sorted(_waits(run).items()):
        by_pickup.setdefault(ts, []).append((rid, w))
    resp = pq.read_table(run / RESPONSE_FILE, columns=["request_id", "error"]).to_pylist()
    timed_out = {r["request_id"] for r in resp if classify(r["error"]) == "timeout"}
    error = {r["request_id"]: r["error"] for r in resp if r["request_id"] not in timed_out}
    if (run / CASSETTE_FILE).exists():
        for entries in Cassette.read(run / CASSETTE_FILE).entries.values():
            for e in entries:
                error.setdefault(e.request_id, e.error)
    lags, waits = [], []
    unmatched = late = 0
    for ts, dur in zip(rec.column("ts_ns").to_pylist(), rec.column("dur_ns").to_pylist(), strict=True):
        queue = by_pickup.get(ts)
        rid, wait = queue.pop(0) if queue else (-1, 0)
        unmatched += rid < 0
        err = error.get(rid, "")
        if err.startswith("no answer") or (err and not include_errors):
            continue
        late += rid in timed_out
        lags.append(dur)
        waits.append(wait)
    return np.array(lags, dtype=np.int64), np.array(waits, dtype=np.int64), unmatched, late


def fit_runs(
    paths: list[Path],
    *,
    include_errors: bool = False,
    lag_includes_queue: bool = False,
    allow_modelled: bool = False,
) -> dict[str, Any]:
    """Fit the measured Kev lags of ``paths`` (runs, or sessions: their measured runs). A run named
    directly whose lags were modelled is refused (``allow_modelled`` fits its ``kev_response`` lags
    anyway: the model's draws back, for tests)."""
    runs, skipped = [], []
    for p in paths:
        found = find_runs(p)
        for run in found:
            why = "" if allow_modelled else modelled(run)
            if not why:
                runs.append(run)
            elif len(found) == 1 and run == p:
                raise DualhubError(f"{run}: {why}; fit-lag fits measured lags (live runs, LLM replays)")
            else:
                skipped.append(f"{run.name} ({why})")
    if not runs:
        raise DualhubError(f"no run with measured Kev lags in {', '.join(map(str, paths))}")
    lags, waits, unmatched, late, sources = [], [], 0, 0, []
    for run in runs:
        if (run / RECORDED_FILE).exists() and not modelled(run):
            lag, wait, um, n_late = load_recorded(run, include_errors=include_errors)
            late += n_late
            sources.append(RECORDED_FILE)
        else:
            lag, wait, um = load_lags(run, include_errors=include_errors)
            sources.append(str(RESPONSE_FILE))
        lags.append(lag)
        waits.append(wait)
        unmatched += um
    lag_all = np.concatenate(lags)
    if lag_all.size == 0:
        what = "answers" if include_errors else "answers that were not errors (try --include-errors)"
        raise DualhubError(f"no Kev {what} in {', '.join(map(str, runs))}")
    return {
        "kind": "dualhub.kev_lag",
        "version": 1,
        "runs": [str(r) for r in runs],
        "sources": sources,
        "skipped": skipped,
        "include_errors": include_errors,
        "unmatched_requests": unmatched,
        "late_answers": late,
        "recommended_timeout_ms": recommend_timeout_ms(lag_all),
        "fit": fit_lag(lag_all, np.concatenate(waits), lag_includes_queue=lag_includes_queue),
    }


def _ms(ns: float) -> str:
    return f"{ns / 1e6:9.1f}"


def lag_table(fit: dict[str, Any]) -> str:
    lines = [f"{'component':<14}{'n':>6}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'max ms':>10}"]
    for comp in ("service_ns", "queue_wait_ns", "total_ns"):
        s = fit[comp]
        lines.append(f"{comp:<14}{s['n']:>6} {_ms(s['p50'])} {_ms(s['p90'])} {_ms(s['p99'])} {_ms(s['max'])}")
    return "\n".join(lines)


def cmd_fit_lag(args: argparse.Namespace) -> int:
    result = fit_runs(
        [Path(p) for p in args.paths],
        include_errors=args.include_errors,
        lag_includes_queue=args.lag_includes_queue,
    )
    print(lag_table(result["fit"]))
    print(
        f"queue share {result['fit']['queue_share']:.1%}; {len(result['runs'])} run(s); "
        f"{result['late_answers']} answers came after the engine's timeout (included)"
    )
    print(f"recommended --kev-timeout-ms {result['recommended_timeout_ms']}")
    for skipped in result["skipped"]:
        print(f"skipped {skipped}")
    if result["unmatched_requests"]:
        print(f"warning: {result['unmatched_requests']} responses had no kev_request (queue wait taken as 0)")
    if result["fit"]["negative_service"]:
        print(
            f"warning: {result['fit']['negative_service']} responses waited longer than their lag (clipped)"
        )
    if args.out:
        write_json(Path(args.out), result)
        print(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------------------------------------------
# bench


def bench_contexts(n: int, seed: int = 0) -> list[KevContext]:
    """``n`` varied, reproducible contexts (symbols, labels, prices, imbalance, positions)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sym, px = _BENCH_SYMBOLS[i % len(_BENCH_SYMBOLS)]
        out.append(
            KevContext(
                request_id=i,
                ts_ns=i * 1_000_000_000,
                symbol=sym,
                label=_BENCH_LABELS[(i // len(_BENCH_SYMBOLS)) % len(_BENCH_LABELS)],
                label_seq=i,
                p_label=round(float(rng.uniform(0.5, 0.99)), 3),
                mid=round(px * float(rng.uniform(0.97, 1.03)), 2),
                spread=round(px * 1e-5 * float(rng.uniform(0.5, 3.0)), 4),
                imbalance=round(float(rng.uniform(-1.0, 1.0)), 3),
                position=round(float(rng.uniform(-1.0, 1.0)), 2),
                max_position=1.0,
            )
        )
    return out


_BENCH_SYMBOLS = (("BTCUSDT", 67000.0), ("ETHUSDT", 3400.0), ("SOLUSDT", 145.0))
_BENCH_LABELS = ("LEAN_BUY", "LEAN_SELL", "EMERGENCY")


def bench_contexts_v2(n: int, seed: int = 0) -> list[KevContextV2]:
    """``n`` varied, reproducible portfolio contexts as the pairs hub asks them: BTCUSDT leading
    ETHUSDT, positions, marks, recent labels, the pair's spread, z-score and hedge ratio."""
    rng = np.random.default_rng([seed, 2])
    out = []
    for i in range(n):
        insts = []
        for j, (sym, px) in enumerate(_BENCH_SYMBOLS[:2]):
            limit = 0.05 if j == 0 else 1.0
            insts.append(
                InstrumentState(
                    symbol=sym,
                    position=round(float(rng.uniform(-limit, limit)), 3),
                    mark=round(px * float(rng.uniform(0.97, 1.03)), 2),
                    spread=round(px * 1e-5 * float(rng.uniform(0.5, 3.0)), 4),
                    labels=tuple(_BENCH_LABELS[int(k)] for k in rng.integers(0, 2, size=3)),
                    max_position=limit,
                )
            )
        pair = PairState(
            leader="BTCUSDT",
            follower="ETHUSDT",
            spread=round(float(rng.normal(0.0, 0.002)), 5),
            z=round(float(rng.normal(0.0, 1.8)), 2),
            hedge_ratio=round(float(rng.uniform(0.6, 1.1)), 3),
        )
        label = _BENCH_LABELS[i % len(_BENCH_LABELS)]
        out.append(
            KevContextV2(
                request_id=i,
                ts_ns=i * 1_000_000_000,
                symbol=insts[i % 2].symbol,
                label=label,
                label_seq=i,
                p_label=round(float(rng.uniform(0.5, 0.99)), 3),
                instruments=tuple(insts),
                pairs=(pair,),
            )
        )
    return out


def _why(e: BaseException) -> str:
    """``Type: message``, plus the system error underneath (e.g. ``Connection refused``) when there is one."""
    text = f"{type(e).__name__}: {e}"
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno:
            return f"{text} ({os.strerror(cause.errno)})"
        cause = cause.__cause__ or cause.__context__
    return text


def _pct(values: list[float], scale: float = 1.0) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values, dtype=np.float64) * scale
    return {f"p{p}": round(float(np.percentile(a, p)), 1) for p in (50, 90, 99)} | {
        "max": round(float(a.max()), 1)
    }


def _sense(ctx: KevContext | KevContextV2, raw: Any) -> str:
    """ "" for an answer the engine would act on, else why not (schema, or for a portfolio command
    the same sense checks the engine applies)."""
    if isinstance(ctx, KevContext):
        got = validate_command(raw)
        return got if isinstance(got, str) else ""
    got2 = validate_command_v2(raw, ctx.symbols, ctx.pair_keys)
    if isinstance(got2, str):
        return got2
    return check_sense(
        got2,
        {i.symbol: i.position for i in ctx.instruments},
        {i.symbol: i.mark for i in ctx.instruments},
        {i.symbol: i.max_position for i in ctx.instruments},
    )


async def _time_prompt(kev: Any, contexts: list[Any], warmup: list[Any]) -> dict[str, Any]:
    """Sequential calls of ``contexts`` (after the unmeasured ``warmup`` ones): wall time, the
    server's own timings, and how many answers the engine would act on."""
    walls, prompt_ms, predicted_ms, ptok, ctok = [], [], [], [], []
    ok = valid = 0
    errors: list[str] = []
    refused: dict[str, int] = {}
    for ctx in warmup:
        await kev.advise(ctx)
    for ctx in contexts:
        t0 = time.perf_counter_ns()
        reply = await kev.advise(ctx)
        walls.append(time.perf_counter_ns() - t0)
        if reply.raw is None:
            errors.append(reply.error)
            continue
        ok += 1
        why = _sense(ctx, reply.raw)
        if why:
            key = why.split(":", 1)[0] if why.startswith("command_inconsistent") else "schema"
            refused[key] = refused.get(key, 0) + 1
        else:
            valid += 1
        t = reply.timings
        prompt_ms.append(t.get("prompt_ms", 0.0))
        predicted_ms.append(t.get("predicted_ms", 0.0))
        ptok.append(t.get("prompt_tokens", 0.0))
        ctok.append(t.get("completion_tokens", 0.0))
    return {
        "n": len(contexts),
        "ok": ok,
        "usable": valid,
        "refused": refused,
        "errors": errors[:5],
        "wall_ms": _pct(walls, 1e-6),
        "prompt_ms": _pct(prompt_ms),
        "predicted_ms": _pct(predicted_ms),
        "prompt_tokens": _pct(ptok),
        "completion_tokens": _pct(ctok),
        "wall_ns_summary": summarize_ns(walls) if walls else {},
        "recommended_kev_timeout_ms": recommend_timeout_ms(walls),
    }


async def run_bench(
    url: str, n: int, *, warmup: int = 1, timeout_s: float = 60.0, prompts: tuple[str, ...] = PROMPTS
) -> dict[str, Any]:
    """``n`` sequential real calls of each prompt in ``prompts`` (``single``: one instrument's
    question; ``portfolio``: the pairs hub's), after ``warmup`` unmeasured ones; latency percentiles
    in ms. The recommendation is the slowest prompt's."""
    import httpx

    from engine.kev.llama import LlamaAdvisor, LlamaConfig

    cfg = LlamaConfig(base_url=url, timeout_s=timeout_s, retries=0, breaker_failures=1_000_000)
    makers = {"single": bench_contexts, "portfolio": bench_contexts_v2}
    async with LlamaAdvisor(cfg) as kev:
        try:  # reachable at all? One line naming the URL, not N failed calls and a traceback
            props = await kev.props()
        except httpx.HTTPError as e:
            raise DualhubError(f"cannot reach llama-server at {redact(url)}: {_why(e)}") from None
        per = {
            p: await _time_prompt(kev, makers[p](n), makers[p](warmup, seed=1)) for p in prompts
        }  # fmt: skip
    recs = [v["recommended_kev_timeout_ms"] for v in per.values() if v["recommended_kev_timeout_ms"]]
    first = per[prompts[0]]
    return {
        "kind": "dualhub.kev_bench",
        "url": url,
        "n": n,
        "ok": sum(v["ok"] for v in per.values()),
        "model": props.get("model_alias") or props.get("model_path", ""),
        "model_path": props.get("model_path", ""),
        "total_slots": props.get("total_slots"),
        "build_info": props.get("build_info", ""),
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "prompts": per,
        # the figures of the first prompt, under the names the single-prompt bench always used
        "schema_valid": first["usable"],
        "errors": first["errors"],
        **{
            k: first[k]
            for k in ("wall_ms", "prompt_ms", "predicted_ms", "prompt_tokens", "completion_tokens")
        },
        "wall_ns_summary": first["wall_ns_summary"],
        "recommended_kev_timeout_ms": max(recs) if recs else None,
    }


_FIGURES = ("wall_ms", "prompt_ms", "predicted_ms", "prompt_tokens", "completion_tokens")


def bench_table(result: dict[str, Any]) -> str:
    lines = [
        f"Kev latency: {result['n']} sequential calls per prompt; model "
        f"{Path(result['model_path']).name or result['model']}",
        f"{'prompt':<11}{'metric':<19}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}",
    ]
    for prompt, fig in result["prompts"].items():
        for name in _FIGURES:
            s = fig[name]
            if s:
                lines.append(
                    f"{prompt:<11}{name:<19}{s['p50']:>9.1f}{s['p90']:>9.1f}{s['p99']:>9.1f}{s['max']:>9.1f}"
                )
    lines.append(f"{'prompt':<11}{'answered':>9}{'usable':>8}  refused (why)          recommended timeout")
    for prompt, fig in result["prompts"].items():
        refused = ", ".join(f"{k} {v}" for k, v in sorted(fig["refused"].items())) or "-"
        rec = fig["recommended_kev_timeout_ms"]
        lines.append(
            f"{prompt:<11}{fig['ok']:>9}{fig['usable']:>8}  {refused:<22} {f'{rec} ms' if rec else '-'}"
        )
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise DualhubError("-n must be at least 1")
    if args.out:
        check_output_path(args.out, directory=False)
    prompts = PROMPTS if args.prompt == "both" else (args.prompt,)
    if args.url:
        check_url(args.url, "--url")
        result = asyncio.run(run_bench(args.url, args.n, warmup=args.warmup, prompts=prompts))
    else:
        from engine.kev.server import LlamaServer

        with LlamaServer() as srv:
            print(f"started {srv} in {srv.startup_s:.2f} s", file=sys.stderr)
            result = asyncio.run(run_bench(srv.url, args.n, warmup=args.warmup, prompts=prompts))
    print(bench_table(result))
    recommended = result["recommended_kev_timeout_ms"]
    if recommended is not None:
        why = f"p99 wall x {RECOMMEND_FACTOR:g}, the slowest prompt"
        print(f"recommended --kev-timeout-ms {recommended} ({why})")
        kept = timeout_advice.save(result)
        if kept is not None:
            print(f"kept for `replay --kev-mode llm` and `live --kev-url` with this model: {kept}")
    if args.out:
        write_json(Path(args.out), result)
        print(f"wrote {args.out}")
    return 0 if result["ok"] else 1


# ---------------------------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    kev = subparsers.add_parser(
        "kev",
        help="Kev, the LLM advisor: fit its lag, benchmark llama-server",
        description="Tools for Kev, the slow LLM advisor: fit-lag fits its lag from recorded runs (for "
        "replay --kev-lag-fit), bench measures a llama-server's latency.",
    )
    sub = kev.add_subparsers(dest="kev_command", metavar="KEV_COMMAND", required=True)

    fit = sub.add_parser(
        "fit-lag",
        help="fit Kev's lag distribution (queueing separated from service time) from recorded runs",
        description="Read the Kev requests and responses of recorded runs (or every run of a session), "
        "separate the time a request waited in Kev's queue from the server's service time, and fit the "
        "service time's distribution: `dualhub replay --kev-lag-fit LAG_JSON` then draws Kev's lag from it.",
    )
    fit.add_argument("paths", nargs="+", metavar="SESSIONS_OR_RUNS", help="run or session directories")
    fit.add_argument("--out", metavar="LAG_JSON", help="write the fit as JSON (e.g. lag.json)")
    fit.add_argument("--include-errors", action="store_true", help="also fit failed responses' lag")
    fit.add_argument(
        "--lag-includes-queue",
        action="store_true",
        help="recorded lag_ns counts from enqueue, not pick-up (service = lag - queue wait)",
    )
    fit.set_defaults(func=cmd_fit_lag)

    bench = sub.add_parser(
        "bench",
        help="N real calls against llama-server; prints p50/p90/p99",
        description="Ask a llama-server (the one at --url, or one started from the LLM venv) Kev's real "
        "question N times and print the latency quantiles, with a --kev-timeout-ms to use for it.",
    )
    bench.add_argument("--url", help="a running llama-server (default: start one from the LLM venv)")
    bench.add_argument("-n", type=int, default=20, help="measured calls (default 20)")
    bench.add_argument("--warmup", type=int, default=1, help="unmeasured calls first (default 1)")
    bench.add_argument(
        "--prompt",
        choices=("single", "portfolio", "both"),
        default="both",
        help="which question to time: one instrument's, the portfolio hub's (--kev-hub), or both (default)",
    )
    bench.add_argument("--out", metavar="BENCH_JSON", help="write the figures as JSON")
    bench.set_defaults(func=cmd_bench)
