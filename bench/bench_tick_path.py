"""Tick path of live mode: WebSocket frame read -> Laya label, and -> order sent, with Kev idle and busy.

    .venv/bin/python bench/bench_tick_path.py [--books 3000] [--rounds 3] [--out tick.json]
        [--kev-url http://127.0.0.1:8080]   # busy = a real llama-server instead of the stub

What runs is the live runner's own path (:meth:`live.runner.LiveRunner.deliver`): the frame is
stamped (the moment ``ws.recv`` returned); :class:`live.tick.TickLaya` scans a canonical books15 frame
with the compiled codec fast path, computes features v0 into Laya's input row and runs ONNX inference
(the label exists here), then builds the book event; it is scheduled on the live clock,
``Engine.on_book`` takes the label, due at receipt + measured compute, the strategy and the risk
gateway run, and the paper exchange's ``submit`` is called. Frames come from
the simulator (books15 + trade), fed with ``--gap-ms`` between them so the event loop has time for
everything else (Kev's HTTP I/O, timers), as between real pushes.

- **label**: stamp -> label computed (the Laya latency live mode records: scan, features, inference);
- **order1**: stamp -> ``submit`` of the first order decided on that frame (tick-to-order: strategy
  and risk included); **orders**: the same for every order of the frame (a requote sends two).

Kev **idle**: no request is ever in flight (Kev is never offered a label). Kev **busy**: every
non-HOLD label is offered to an advisor that keeps a request in flight all the time: by default
:class:`engine.kev.llama.LlamaAdvisor` against a stub llama-server in another process that answers
after ``--kev-lag-ms``, or a real llama-server with ``--kev-url``. As in live mode, Kev's client runs
in its own process (:mod:`engine.kev.process`); ``--kev-in-loop`` puts it on the tick path's event
loop instead. With ``--dashboard`` the rounds compare the live dashboard off and on instead (Kev idle
in both): "on" runs :class:`live.dashboard.Dashboard` as ``dualhub live --dashboard`` does (its
snapshot publisher on the loop every 250 ms, its server thread), read from another process as a
browser and Prometheus read it (``/api/state`` every 500 ms, ``/metrics`` every second). Per-round
p99s are printed too: on a shared 2-core machine they move by several us from round to round, so
compare medians over several rounds. Rounds alternate idle/busy (off/on) so drift hits both alike.
Figures also break the label path into its parts measured alone (the general path: decode, features,
inference; the compiled one: scan, features, inference, book event), and time
``TickLaya`` back to back with no event loop in between (hot caches: the floor of the path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.events import BookSnapshot  # noqa: E402
from engine.laya.features import (
    features_v0,  # noqa: E402
    features_v0_levels,  # noqa: E402
)
from engine.strategy import QuoteConfig  # noqa: E402
from live.runner import LiveConfig, LiveRunner  # noqa: E402
from live.tick import TickLaya  # noqa: E402
from venue.bitget.public_server import simulator_frames  # noqa: E402
from wire.bitget.bitget_v2 import StreamCounters, decode  # noqa: E402
from wire.bitget.bitget_v2_fast import Books15Scanner  # noqa: E402

COMMAND = '{"action":"HOLD","target_position":0.0,"hedge_ratio":0.0,"max_slippage_bps":2.0,"reason":"stub"}'


def _stub_llama(port_q: Any, lag_ms: float) -> None:
    """A llama-server stand-in: /v1/chat/completions answers a valid command after ``lag_ms``."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps(
        {
            "choices": [{"message": {"content": COMMAND}, "finish_reason": "stop"}],
            "timings": {"prompt_ms": 1.0, "predicted_ms": lag_ms},
            "usage": {"prompt_tokens": 10, "completion_tokens": 20},
        }
    ).encode()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(lag_ms / 1000)
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the bench cancelled the request at the end of a round
                pass

        def log_message(self, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    port_q.put(srv.server_address[1])
    srv.serve_forever()


def _pct(xs: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) / 1000.0  # ns -> us


def paper_runner(**cfg: Any) -> LiveRunner:
    """A paper-mode live runner on BTCUSDT with the contract's defaults, built as ``dualhub live`` builds
    it but not started: the bench delivers frames to it and runs its pump itself."""
    runner = LiveRunner(
        LiveConfig(out=str(Path(tempfile.mkdtemp(prefix="tick-")) / "s"), contract_defaults=True, **cfg)
    )
    runner._stop, runner._wake = asyncio.Event(), asyncio.Event()
    runner._prepare_dirs()
    runner._build({})
    return runner


async def _round(
    frames: list[bytes],
    *,
    busy: bool,
    kev_url: str,
    gap_s: float,
    warmup: int,
    provider: str,
    spin: bool = False,
    keep_warm: bool = True,
    kev_process: bool = True,
    requote_min_ms: float | None = None,
    dashboard: Any = None,
) -> dict[str, Any]:
    runner = paper_runner(
        laya_provider=provider,
        # idle: Kev is never asked (a minimum interval longer than the run); busy: every non-HOLD label
        kev_min_interval_ms=0 if busy else 10**9,
        kev_timeout_ms=60_000,
        kev_url=kev_url if busy else "",
        tick_keep_warm=keep_warm,
        busy_poll=spin,
        kev_process=kev_process,
        quotes=QuoteConfig()
        if requote_min_ms is None
        else QuoteConfig(requote_min_ns=round(requote_min_ms * 1e6)),
    )
    st = runner.syms["BTCUSDT"]
    orders: list[int] = []
    first: list[int] = []  # the first order of a frame (tick-to-order)
    cur = {"ts": 0, "in": False, "sent": False}
    submit = st.paper.submit  # type: ignore[union-attr]

    def timed_submit(intent: Any, now_ns: int) -> None:
        if cur["in"]:
            dt = time.time_ns() - cur["ts"]
            orders.append(dt)
            if not cur["sent"]:
                first.append(dt)
                cur["sent"] = True
        submit(intent, now_ns)

    st.paper.submit = timed_submit  # type: ignore[union-attr,method-assign]
    runner.feeding = True
    pump = asyncio.create_task(runner._pump())
    dash = publisher = None
    if dashboard is not None:  # (the reader process's command queue, its count of reads)
        from live.dashboard import Dashboard

        dash = Dashboard("127.0.0.1:0")
        publisher = asyncio.create_task(dash.start(runner))
        dashboard[0].put(dash.url)
    poller = asyncio.create_task(runner.busy_poll()) if spin else None
    busy_frames = n_books = 0
    for i, raw in enumerate(frames):
        if i == warmup:
            st.sink.kind.clear(), st.sink.ts.clear(), st.sink.dur.clear()
            orders.clear()
            first.clear()
            busy_frames = n_books = 0
        ts = runner.clock.stamp()  # ws.recv() just returned this frame
        cur["ts"], cur["in"], cur["sent"] = ts, True, False
        runner.deliver(raw, ts)
        cur["in"] = False
        if raw.startswith(b'{"action":"snapshot","arg":{"instType":"USDT-FUTURES","channel":"books15"'):
            n_books += 1
            busy_frames += bool(runner.kev_tasks)
        await asyncio.sleep(gap_s)  # with --spin the runner's busy_poll task keeps the loop running
    for t in (pump, poller, publisher):
        if t is not None:
            t.cancel()
    await asyncio.gather(*(t for t in (pump, poller, publisher) if t is not None), return_exceptions=True)
    if dash is not None:
        dashboard[0].put("")
        dash.close()
    for t in list(runner.kev_tasks):
        t.cancel()
    await asyncio.gather(*runner.kev_tasks, return_exceptions=True)
    inner = getattr(runner, "_advisor_inner", None)
    if hasattr(inner, "aclose"):
        await inner.aclose()
    labels = [d for k, d in zip(st.sink.kind, st.sink.dur, strict=True) if k == "laya"]
    return {
        "labels": labels,
        "orders": orders,
        "order1": first,
        "kev_busy_fraction": busy_frames / max(1, n_books),
        "kev_requests": st.engine.log.counts()["kev_request"],
    }


def _scrape(commands: Any, reads: Any) -> None:
    """The dashboard's readers, in a process of their own as a browser and Prometheus are: the page's
    state every 500 ms and /metrics every second, from the URL last put on ``commands`` ("": pause)."""
    import queue

    import httpx

    url, k = "", 0
    with httpx.Client(timeout=5.0) as c:
        while True:
            try:
                msg = commands.get(timeout=0.5)
            except queue.Empty:
                pass
            else:
                if msg is None:
                    return
                url = msg
            if not url:
                continue
            try:
                c.get(url + "api/state").raise_for_status()
                reads.value += 1
                if k % 2:
                    c.get(url + "metrics").raise_for_status()
                    reads.value += 1
            except httpx.HTTPError:  # the round ended under a request
                pass
            k += 1


def _parts(frames: list[bytes], laya: Any, n: int = 2000) -> dict[str, float]:
    """Median us of each step alone over books15 frames: the general path (decode, features,
    inference) and the compiled tick path live mode runs (scan, features, inference, book event)."""
    books = [f for f in frames if b'"books15"' in f[:90]][:n]
    counters = StreamCounters()
    sc = Books15Scanner()
    row = laya.input_row
    steps: dict[str, list[int]] = {
        k: []
        for k in (
            "decode",
            "features",
            "inference",
            "fast_scan",
            "fast_features",
            "fast_inference",
            "fast_book_event",
        )
    }
    buf = np.zeros(laya.n_features, dtype=np.float32)
    for raw in books:
        t0 = time.perf_counter_ns()
        (book,) = decode(raw, 0, counters)
        t1 = time.perf_counter_ns()
        assert isinstance(book, BookSnapshot)
        x = features_v0(book, out=buf)
        t2 = time.perf_counter_ns()
        laya.predict(x)
        t3 = time.perf_counter_ns()
        assert sc.scan(raw)
        t4 = time.perf_counter_ns()
        features_v0_levels(sc.levels, row)
        t5 = time.perf_counter_ns()
        laya.predict_row()
        t6 = time.perf_counter_ns()
        sc.book(raw, 0, counters)
        t7 = time.perf_counter_ns()
        for k, d in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6), strict=True):
            steps[k].append(d)
    return {k: statistics.median(v) / 1000 for k, v in steps.items()}


def _tight(frames: list[bytes], laya: Any, rounds: int = 3) -> dict[str, float]:
    """Frame -> label of :class:`live.tick.TickLaya` called back to back (hot caches, no event loop)."""
    tick = TickLaya(laya, time.perf_counter_ns)
    books = [f for f in frames if b'"books15"' in f[:90]]
    lat: list[int] = []
    for r in range(rounds):
        counters = StreamCounters()
        for raw in books:
            ts = time.perf_counter_ns()
            tick.decode(raw, ts, counters)
            if r:  # the first round warms up
                assert tick._pre is not None
                lat.append(tick._pre[3])
    return {"n": len(lat), "p50_us": _pct(lat, 50), "p90_us": _pct(lat, 90), "p99_us": _pct(lat, 99)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--books", type=int, default=3000, help="books15 frames per round (default 3000)")
    ap.add_argument("--rounds", type=int, default=3, help="idle/busy round pairs (default 3)")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="pause between frames (default 1 ms)")
    ap.add_argument("--kev-lag-ms", type=float, default=300.0, help="stub llama-server answer time")
    ap.add_argument("--kev-url", default="", help="a real llama-server for the busy rounds")
    ap.add_argument("--warmup", type=int, default=300, help="frames not measured at the start of a round")
    ap.add_argument(
        "--spin", action="store_true", help="live mode's busy_poll on (the loop never sleeps; a hot core)"
    )
    ap.add_argument(
        "--no-keep-warm", action="store_true", help="live mode's tick_keep_warm off (cold label path)"
    )
    ap.add_argument(
        "--kev-in-loop",
        action="store_true",
        help="Kev's HTTP client on the tick path's event loop (live mode's kev_process off)",
    )
    ap.add_argument("--provider", choices=("cpu", "cuda", "auto"), default="cpu", help="Laya's provider")
    ap.add_argument(
        "--requote-min-ms",
        type=float,
        default=QuoteConfig().requote_min_ns / 1e6,
        help="the strategy's least time between requotes (default: the engine's); less gives more orders "
        "to measure per round",
    )
    ap.add_argument(
        "--dashboard",
        action="store_true",
        help="compare rounds with the live dashboard off and on (served and read) instead of Kev idle/busy",
    )
    ap.add_argument("--out", help="write the figures as JSON")
    args = ap.parse_args(argv)

    all_frames = [f for _, f in simulator_frames(["BTCUSDT"], minutes=60, seed=11)]
    books_seen, frames = 0, []
    for f in all_frames:
        frames.append(f)
        books_seen += b'"books15"' in f[:90]
        if books_seen >= args.books + args.warmup:
            break
    proc = None
    kev_url = args.kev_url
    if not kev_url:
        q: Any = mp.get_context("spawn").Queue()
        proc = mp.get_context("spawn").Process(target=_stub_llama, args=(q, args.kev_lag_ms), daemon=True)
        proc.start()
        kev_url = f"http://127.0.0.1:{q.get(timeout=20)}"
    modes = ("off", "on") if args.dashboard else ("idle", "busy")
    reader = None
    if args.dashboard:
        ctx = mp.get_context("spawn")
        commands, reads = ctx.Queue(), ctx.Value("i", 0)
        reader = ctx.Process(target=_scrape, args=(commands, reads), daemon=True)
        reader.start()
    try:
        res: dict[str, dict[str, list[int]]] = {m: {"labels": [], "order1": [], "orders": []} for m in modes}
        busy_fraction: list[float] = []
        round_p99: dict[str, list[float]] = {m: [] for m in modes}
        kev_requests = 0
        for _ in range(args.rounds):
            for mode in modes:
                r = asyncio.run(
                    _round(
                        frames,
                        busy=mode == "busy",
                        dashboard=(commands, reads) if mode == "on" else None,
                        kev_url=kev_url,
                        gap_s=args.gap_ms / 1000,
                        warmup=args.warmup,
                        provider=args.provider,
                        spin=args.spin,
                        keep_warm=not args.no_keep_warm,
                        kev_process=not args.kev_in_loop,
                        requote_min_ms=args.requote_min_ms,
                    )
                )
                res[mode]["labels"] += r["labels"]
                round_p99[mode].append(_pct(r["labels"], 99))
                res[mode]["orders"] += r["orders"]
                res[mode]["order1"] += r["order1"]
                if mode == "busy":
                    busy_fraction.append(r["kev_busy_fraction"])
                    kev_requests += r["kev_requests"]
    finally:
        if proc is not None:
            proc.terminate()
        if reader is not None:
            commands.put(None)
            reader.join(10)
    dashboard_reads = reads.value if reader is not None else 0
    from engine.laya.model import DEFAULT_MODEL, Laya, LayaConfig

    laya = Laya(LayaConfig(model_path=DEFAULT_MODEL, provider=args.provider))
    parts = _parts(frames, laya)
    tight = _tight(frames, laya)
    out: dict[str, Any] = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "python": sys.version.split()[0],
        "books_per_round": args.books,
        "gap_ms": args.gap_ms,
        "spin": args.spin,
        "requote_min_ms": args.requote_min_ms,
        "keep_warm": not args.no_keep_warm,
        "kev_process": not args.kev_in_loop,
        "rounds": args.rounds,
        "kev_busy": {
            "server": args.kev_url or f"stub ({args.kev_lag_ms:.0f} ms)",
            "fraction_of_books": busy_fraction,
            "requests": kev_requests,
        },
        "modes": list(modes),
        "dashboard_reads": dashboard_reads,
        "parts_median_us": parts,
        "tight_loop_labels": tight,
    }
    how = ("busy-polling" if args.spin else "sleeping") + (", keep-warm off" if args.no_keep_warm else "")
    how += ", Kev client on the loop" if args.kev_in_loop else ", Kev client in its own process"
    how += f", requotes >= {args.requote_min_ms:g} ms apart"
    print(
        f"tick path, {args.rounds} x {args.books} books per mode, {args.gap_ms} ms between frames "
        f"({how}), {os.cpu_count()} cores"
    )
    print(f"{'':<6} {'path':<8} {'n':>6} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8}")
    for mode in modes:
        for path in ("labels", "order1", "orders"):
            xs = res[mode][path]
            if not xs:
                continue
            row = {"n": len(xs), "p50_us": _pct(xs, 50), "p90_us": _pct(xs, 90), "p99_us": _pct(xs, 99)}
            out.setdefault(mode, {})[path] = row
            p50, p90, p99 = row["p50_us"], row["p90_us"], row["p99_us"]
            print(f"{mode:<6} {path:<8} {row['n']:>6} {p50:>8.1f} {p90:>8.1f} {p99:>8.1f}")
    first, second = modes
    what = "dashboard" if args.dashboard else "Kev"
    for path in ("labels", "order1", "orders"):
        i, b = out.get(first, {}).get(path), out.get(second, {}).get(path)
        if i and b:
            out.setdefault(f"{second}_vs_{first}_p99", {})[path] = b["p99_us"] / i["p99_us"] - 1
            print(f"{what} {second} vs {first}, {path} p99: {100 * (b['p99_us'] / i['p99_us'] - 1):+.1f}%")
    out["round_label_p99_us"] = round_p99
    for mode in modes:
        xs = round_p99[mode]
        print(
            f"label p99 per round, {mode}: "
            + ", ".join(f"{x:.1f}" for x in xs)
            + f" (median {statistics.median(xs):.1f})"
        )
    # a noisy minute on a shared machine lands in whichever round runs then: the median of the rounds'
    # p99s is the comparison that noise moves least
    mi, mb = statistics.median(round_p99[first]), statistics.median(round_p99[second])
    out[f"{second}_vs_{first}_p99_round_median"] = mb / mi - 1
    print(f"{what} {second} vs {first}, label p99 as the median of rounds: {100 * (mb / mi - 1):+.1f}%")
    if busy_fraction:
        frac = 100 * statistics.mean(busy_fraction)
        print(f"Kev in flight for {frac:.0f}% of books in busy rounds ({kev_requests} requests)")
    if args.dashboard:
        print(f"dashboard read {dashboard_reads} times in the 'on' rounds (state 0.5 s, metrics 1 s apart)")
    print("label path parts (median us, alone): " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    print(
        f"frame -> label back to back (TickLaya alone, {tight['n']} books): p50 {tight['p50_us']:.1f} us, "
        f"p90 {tight['p90_us']:.1f} us, p99 {tight['p99_us']:.1f} us"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
