"""Subcommands ``simulate``, ``replay``, ``report`` and ``demo``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine.bounds import S_MAX, add_leg_args, check_seed, leg_fields
from engine.errors import DualhubError
from engine.risk_args import add_risk_args, risk_fields
from engine.strategies.registry import add_strategy_args, strategy_fields
from venue.fills import FILL_MODELS

# What each fill model assumes about a resting order's place in the queue (venue/fills.py).
FILL_MODEL_HELP = {
    "touch": "a trade at or through our price fills us up to its size: no queue ahead (optimistic)",
    "through": "only a trade strictly through our price fills us (pessimistic, no queue tracking)",
    "queue_power2": "we join behind the displayed size, trades at our price eat the queue ahead, and "
    "a size drop that no trade explains is a cancel behind us with probability back^2 / (back^2 + "
    "front^2) (hftbacktest's PowerProbQueue(2))",
    "queue_power3": "as queue_power2 with power 3 (cancels lean harder towards the longer side)",
    "queue_log": "as queue_power2 with f(x) = log(1 + x) (hftbacktest's LogProbQueue: cancels spread evenly)",
    "risk_averse": "as queue_power2 but cancels are always behind us: only trades move us up (most "
    "conservative)",
}
DEFAULT_FILL_MODEL = "queue_power2"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "simulate",
        help="write a simulated Bitget v2 session (books15 + trade) to Parquet",
        description="Generate a deterministic (seeded) BTCUSDT-like market as Bitget v2 books15/trade push "
        "frames and normalise them into a session directory through the recorder's codec. With --symbols, "
        "several symbols in one session: the first leads, each other one is cointegrated with it (a "
        "mean-reverting spread with regime shifts; the true parameters go into the manifest).",
    )
    p.add_argument("--out", type=Path, required=True, help="session directory to create")
    p.add_argument("--symbol", help="one symbol (default BTCUSDT)")
    p.add_argument(
        "--symbols",
        metavar="A,B,...",
        help="several symbols, comma-separated, the first the leader, e.g. BTCUSDT,ETHUSDT "
        "(known contracts: venue.simulator.INSTRUMENTS)",
    )
    p.add_argument("--minutes", type=float, default=10.0, help="simulated duration (default 10)")
    p.add_argument(
        "--seed",
        type=int,
        default=7,
        help="seed of the market simulator: the same seed, the same session (default 7)",
    )
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser(
        "replay",
        help="replay a session through Laya, the Kev queue, the risk gateway and the simulated exchange",
        description="Deterministic replay on a virtual clock. Writes the run's event log (Parquet) and a "
        "manifest with the run digest; the same inputs always give the same digest.",
    )
    p.add_argument(
        "session",
        type=Path,
        help="session directory (has manifest.json); or several consecutive sessions of the same "
        "instruments replayed as one run (state carries across, each gap between them is declared): a "
        "folder of sessions, a quoted glob of session directories, or a catalog folder with --from/--to "
        "(replay/sessions.py)",
    )
    add_range_args(p)
    p.add_argument(
        "--symbol",
        help="the symbol to replay (its books and trades); required for a session of several symbols, "
        "each a run of its own",
    )
    p.add_argument(
        "--symbols",
        metavar="A,B,...|ALL",
        help="several symbols traded as one portfolio: one engine, one clock, one risk gateway whose "
        "portfolio rules (net delta, gross exposure, loss stop) see them all; ALL: every symbol of the "
        "session",
    )
    p.add_argument(
        "--instrument",
        action="append",
        metavar="SYMBOL:FIELD=V,...",
        help="an instrument's own settings (tick, size_step, min_qty, quote_qty, max_position, "
        "max_order_qty; default: the session's contract and the config's sizes, with --symbols at the "
        "first symbol's notional), e.g. ETHUSDT:quote_qty=0.06; repeatable",
    )
    p.add_argument(
        "--contract",
        metavar="FIELD=V,...",
        help="the replayed symbol's contract over the session's (tick, size_step, min_qty, maker_fee_rate, "
        "taker_fee_rate), e.g. tick=0.01,taker_fee_rate=0.0004; the run's config says contract_source flag",
    )
    p.add_argument(
        "--contract-defaults",
        action="store_true",
        help="replay on the engine's default contract (Bitget's BTCUSDT perpetual: tick 0.1, size step "
        "0.001, fees 0.0002/0.0006) instead of the spec the session's manifest gives",
    )
    p.add_argument(
        "--kev-hub",
        choices=("pairs", "llm"),
        help="with --symbols: Kev answers for the whole portfolio, one command setting every instrument's "
        "target: from the pairs rule on the fitted hedge ratios (engine/kev/pairs.py), or from llama-server "
        "asked the same v2 question (llm: with --kev-mode llm)",
    )
    add_leg_args(p)
    p.add_argument("--out", type=Path, help="run directory (default SESSION/runs/run-<config hash>)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument(
        "--python-engine",
        action="store_true",
        help="drive the engine per event even where the compiled loop applies (same core and events, slower)",
    )
    p.add_argument("--seed", type=int, default=1, help="seed for every component's RNG")
    p.add_argument("--model", type=Path, help="Laya ONNX model (default data/models/laya-v0.onnx)")
    p.add_argument("--provider", choices=("auto", "cuda", "cpu"), default="auto", help="Laya provider")
    p.add_argument(
        "--laya-mode",
        choices=("batch", "tick"),
        default="batch",
        help="batch: Laya labels every snapshot in one pass before the replay (default; the same labels); "
        "tick: one inference per snapshot as it arrives, as live mode does",
    )
    p.add_argument(
        "--features",
        choices=("auto", "v0", "v1"),
        default="auto",
        help="Laya features to compute: auto (those the model was trained on, from its metadata; "
        "default), v0 (books15) or v1 (books15 + trades); the model must match",
    )
    p.add_argument(
        "--kev-lag-p5-ms",
        type=float,
        default=200.0,
        help="sim mode: Kev's lag model (log-normal) has this 5th percentile, in ms (default 200)",
    )
    p.add_argument(
        "--kev-lag-p95-ms",
        type=float,
        default=350.0,
        help="sim mode: and this 95th percentile, in ms (default 350)",
    )
    p.add_argument(
        "--fill-model",
        choices=list(FILL_MODELS),
        default=DEFAULT_FILL_MODEL,
        metavar="MODEL",
        help=f"how resting orders fill (default {DEFAULT_FILL_MODEL}): "
        + "; ".join(f"{name}: {FILL_MODEL_HELP[name]}" for name in FILL_MODELS),
    )
    p.add_argument(
        "--kev-mode",
        choices=("sim", "cassette", "llm"),
        default="sim",
        help="sim: rule advisor + lag model; cassette: recorded replies at their recorded lag; "
        "llm: ask a running llama-server (cached by key), lag measured (--kev-lag)",
    )
    p.add_argument("--kev-cassette", default="", help="cassette.parquet or a run directory (cassette mode)")
    p.add_argument("--kev-miss", choices=("fail", "sim", "live"), default="fail", help="cassette miss policy")
    p.add_argument("--kev-url", default="", help="llama-server URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--kev-lag-fit", default="", help="lag.json from `dualhub kev fit-lag` (measured lag)")
    p.add_argument("--kev-min-interval-ms", type=int, default=0, help="min spacing of Kev requests")
    p.add_argument(
        "--kev-timeout-ms",
        type=int,
        default=None,
        help="the engine gives up on a Kev request after this long on the replay clock (default 2000; "
        "with --kev-mode llm, what `dualhub kev bench` measured for the server's model, when it did)",
    )
    p.add_argument(
        "--kev-lag",
        choices=("measured", "model"),
        default="measured",
        help="llm mode: each call's measured wall time is its lag (default), or the lag model's draw",
    )
    p.add_argument(
        "--kev-lag-scale",
        type=float,
        metavar="X",
        help="multiply Kev's measured or recorded lags by X (a faster target GPU: < 1); as kev=X in "
        "--scale-latency",
    )
    add_strategy_args(p)
    p.add_argument(
        "--strategy-budget-ms",
        type=float,
        metavar="MS",
        help="a Python strategy (MODULE:FN) may take at most this long in one call, or the run stops with "
        "one line (default 1000, or $DUALHUB_STRATEGY_BUDGET_MS; 0: no budget)",
    )
    add_risk_args(p)
    p.add_argument("--report", action="store_true", help="print the report after the run")
    p.add_argument(
        "--scale-latency",
        default="",
        metavar="SPEC",
        help="what-if multipliers on modelled latencies, e.g. kev=2,laya=1,order=0.5,feed=1",
    )
    p.add_argument(
        "--params",
        metavar="JSON",
        help="a sweep's parameters over the flags' config (a results row's `params`: its replay_command "
        'replays that run, to the same digest), e.g. \'{"seed": 2, "scale_kev": 0.5}\'',
    )
    p.add_argument(
        "--market-cache",
        action="store_true",
        help="read the session's decoded, labelled books from its market cache (SESSION/cache/market), "
        "or build it for the next run (replay/market_cache.py): the same events either way",
    )
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser(
        "report",
        help="DuckDB report over a run: labels, Kev lag and drops, risk rejections, fills, PnL, latency",
        description="Check the run's event files against its manifest (a truncated or edited run is "
        "refused), then print its tear sheet (PnL, Sharpe, round trips, markouts, Laya calibration, "
        "latency) and the tables of analysis/queries.sql, computed by DuckDB over the event log. A run "
        "of several instruments leads with its portfolio: its limits and every loss stop (hit, when, cost), "
        "the portfolio's and each leg's PnL, drawdown, Sharpe and exposure, and the pairs hub's hedge ratio "
        "against the simulator's true beta or a rolling estimate; then the first leg's tear sheet.",
    )
    p.add_argument("run", type=Path, help="run directory written by `dualhub replay`")
    p.add_argument(
        "--html",
        type=Path,
        metavar="OUT.html",
        help="also write the key plots and tables to one self-contained HTML file",
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "demo",
        help="simulate a 10-minute BTCUSDT session, replay it and print the report",
        description="The first thing to run: simulate a BTCUSDT session (once; an existing one at --out is "
        "reused), replay it with the default configuration (Laya, Kev in sim mode, the risk gateway, the "
        "simulated exchange) and print the report. The first replay on a fresh checkout compiles the "
        "core first (about a minute), cached after.",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("data/sessions/demo"),
        help="session directory (default data/sessions/demo)",
    )
    p.add_argument(
        "--minutes", type=float, default=10.0, help="simulated duration of a new session (default 10)"
    )
    p.add_argument(
        "--seed", type=int, default=7, help="seed of the market simulator for a new session (default 7)"
    )
    p.set_defaults(func=cmd_demo)


def _check_simulation(args: argparse.Namespace) -> None:
    """``--minutes`` and ``--seed`` of a simulation (``simulate``, ``demo``)."""
    if not args.minutes > 0:
        raise DualhubError(f"--minutes must be > 0, got {args.minutes}")
    if not args.minutes <= S_MAX / 60:  # inf too: the session's nanosecond times must fit an int64
        raise DualhubError(f"--minutes must be at most {S_MAX / 60:g}, got {args.minutes}")
    check_seed(args.seed, "--seed")


def cmd_simulate(args: argparse.Namespace) -> int:
    from venue.simulator import check_symbols, simulate_session

    if args.symbol is not None and args.symbols is not None:
        raise DualhubError("give --symbol or --symbols, not both")
    if args.symbols is not None:
        symbols = check_symbols(symbol_list(args.symbols, "--symbols"))
    else:
        symbols = check_symbols([args.symbol or "BTCUSDT"])
    _check_simulation(args)
    if (args.out / "manifest.json").exists():
        raise DualhubError(f"{args.out} already holds a session; choose another --out")
    simulate_session(args.out, symbols=symbols, minutes=args.minutes, seed=args.seed, progress=True)
    print(f"session written: {args.out}")
    return 0


def symbol_list(text: str, option: str) -> list[str]:
    """``A,B,...`` as symbols, refusing an empty entry (``BTCUSDT,,``) or one given twice: a typo there
    must not quietly replay fewer instruments than asked."""
    picked = [s.strip() for s in text.split(",")]
    if not all(picked):
        raise DualhubError(f"{option} {text!r}: an empty symbol (a stray comma?)")
    if twice := sorted({s for s in picked if picked.count(s) > 1}):
        raise DualhubError(f"{option} {text!r}: {', '.join(twice)} given twice")
    return picked


def _symbol(args: argparse.Namespace) -> dict[str, Any]:
    """``--symbol``, or the session's one symbol (a session of several needs one picked), and its
    contract where the session gives one."""
    from engine.store import SessionError, open_session

    try:
        manifest = open_session(args.session).manifest
    except SessionError:  # not a session: the replay says so, after the config's own checks
        return {}
    symbols = manifest.get("symbols") or []
    several = getattr(args, "symbols", None)
    if several:
        if args.symbol:
            raise DualhubError("give --symbol or --symbols, not both")
        if getattr(args, "contract", None) or getattr(args, "contract_defaults", False):
            raise DualhubError(
                "--contract and --contract-defaults set one symbol's replay: with --symbols, give each "
                "instrument its own (--instrument SYMBOL:tick=T,size_step=S)"
            )
        picked = symbols if several == "ALL" else symbol_list(several, "--symbols")
        return {"symbols": tuple(picked)}
    if args.symbol:
        symbol = args.symbol  # the driver refuses one the session does not hold
    elif len(symbols) > 1:
        raise DualhubError(
            f"{args.session} holds {len(symbols)} symbols ({', '.join(symbols)}): pick one with --symbol"
        )
    elif symbols:
        symbol = symbols[0]
    else:
        return {}
    return {"symbol": symbol} | _contract(args, manifest, symbol)


CONTRACT_FIELDS = ("tick", "size_step", "min_qty", "maker_fee_rate", "taker_fee_rate")


def _contract(args: argparse.Namespace, manifest: dict[str, Any], symbol: str) -> dict[str, Any]:
    """The replayed symbol's contract and where it came from: the session's spec (its manifest), the
    engine's defaults (--contract-defaults), either with --contract's fields over it."""
    import dataclasses
    from decimal import Decimal, InvalidOperation

    from engine.contract import ContractConfig
    from replay.config import session_contract, session_spec_source

    given = getattr(args, "contract", None)
    if getattr(args, "contract_defaults", False):
        contract, source = ContractConfig(symbol=symbol), "flag"
    else:
        contract, source = session_contract(manifest, symbol), session_spec_source(manifest, symbol)
    if given:
        fields: dict[str, Any] = {}
        for item in given.split(","):
            k, eq, v = (x.strip() for x in item.partition("="))
            if k not in CONTRACT_FIELDS or not eq:
                raise DualhubError(
                    f"--contract {given!r}: {item!r} is not FIELD=VALUE ({', '.join(CONTRACT_FIELDS)})"
                )
            try:
                d = Decimal(v)
            except InvalidOperation:
                raise DualhubError(f"--contract {given!r}: {v!r} is not a number") from None
            if not d.is_finite() or (d <= 0 and not k.endswith("fee_rate")):
                raise DualhubError(f"--contract {given!r}: {k} must be a finite number > 0")
            fields[k] = d if k.endswith("fee_rate") else float(d)
        contract = dataclasses.replace(contract or ContractConfig(symbol=symbol), **fields)
        source = "flag"
    if contract is None:
        return {}
    return {"contract": contract} | ({"contract_source": source} if source else {})


def _config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from engine.instruments import instrument_args
    from engine.kev.timeout_advice import DEFAULT_TIMEOUT_MS
    from engine.laya.model import DEFAULT_MODEL
    from replay.config import ReplayConfig
    from replay.sweep import apply_scales, parse_scale_latency

    cfg = ReplayConfig(
        **_symbol(args),
        **({"kev_hub": args.kev_hub} if getattr(args, "kev_hub", None) else {}),
        **leg_fields(args),
        **({"instruments": instrument_args(args.instrument)} if getattr(args, "instrument", None) else {}),
        seed=args.seed,
        model_path=args.model or DEFAULT_MODEL,
        laya_provider=args.provider,
        laya_mode=args.laya_mode,
        laya_features=getattr(args, "features", "auto"),
        kev_lag_p5_ms=args.kev_lag_p5_ms,
        kev_lag_p95_ms=args.kev_lag_p95_ms,
        fill_model=args.fill_model,
        kev_mode=args.kev_mode,
        kev_cassette=args.kev_cassette,
        kev_miss_policy=args.kev_miss,
        kev_url=args.kev_url,
        kev_lag_fit=args.kev_lag_fit,
        kev_min_interval_ms=args.kev_min_interval_ms,
        kev_timeout_ms=DEFAULT_TIMEOUT_MS if args.kev_timeout_ms is None else args.kev_timeout_ms,
        kev_lag_source=args.kev_lag,
        **strategy_fields(args),
        **risk_fields(args),
    )
    replayed = cfg.symbols or (cfg.symbol,)
    if stray := sorted(set(cfg.instruments) - set(replayed)):
        # settings for an instrument the replay does not trade would be silently ignored
        raise DualhubError(
            f"--instrument {', '.join(stray)}: not a symbol of this replay ({', '.join(replayed)})"
        )
    spec = getattr(args, "scale_latency", "")
    scales = parse_scale_latency(spec) if spec else {}
    if args.kev_lag_scale is not None:
        if "kev" in scales and scales["kev"] != args.kev_lag_scale:
            raise DualhubError("--kev-lag-scale and --scale-latency kev=... disagree: give one")
        scales["kev"] = args.kev_lag_scale
    return apply_scales(cfg, scales) if scales else cfg


class CompileWatch:
    """Says, once, when a replay starts compiling the core (numba's ``numba:compile`` event: a cache
    miss, not a cache load), and adds up the time spent compiling: a first replay is otherwise a silent
    minute, and its speed figure would count the compiler."""

    def __init__(self) -> None:
        from numba.core import event

        class _Listener(event.Listener):
            def on_start(inner, ev) -> None:  # type: ignore[no-untyped-def]
                self._start()

            def on_end(inner, ev) -> None:  # type: ignore[no-untyped-def]
                self._end()

        self.listener = _Listener()
        self.seconds = 0.0
        self._depth = 0
        self._t0 = 0.0
        self._said = False

    def _start(self) -> None:
        import time

        if self._depth == 0:  # compiles nest: time the outermost only
            self._t0 = time.perf_counter()
            if not self._said:
                self._said = True
                print(
                    "compiling the replay core (a fresh checkout, or an edited rule: a minute or two the "
                    "first time, cached after)...",
                    flush=True,
                )
        self._depth += 1

    def _end(self) -> None:
        import time

        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._t0

    def __enter__(self) -> CompileWatch:
        from numba.core import event

        event.register("numba:compile", self.listener)
        return self

    def __exit__(self, *exc: object) -> None:
        from numba.core import event

        event.unregister("numba:compile", self.listener)


def _print_result(res, compile_s: float = 0.0) -> None:  # type: ignore[no-untyped-def]
    import sys

    from engine.optional import has_nvidia_gpu

    lay = res.laya
    # the speed figure is the replay's own: the compiler's time (a first run) is said apart
    run_s = max(res.wall_s - compile_s, 1e-9)
    compiled = f"; + {compile_s:.1f} s compiling, not counted" if compile_s >= 0.05 else ""
    print(
        f"replayed {res.books} snapshots + {res.trades} trades in {run_s:.2f} s "
        f"({res.books / run_s:,.0f} snapshots/s{compiled})"
    )
    print(
        f"Laya on {lay['active_provider']}"
        # the reason is Laya's warning on stderr (and runtime.json): not a second time here
        + (" (CUDA fell back)" if lay.get("fallback_reason") and has_nvidia_gpu() else "")
        + f", features {lay['feature_version']}"
    )
    for warning in res.warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    kev = res.kev
    print(f"Kev: {kev['mode']} ({kev['name']})" + ("" if kev["deterministic"] else ", NOT deterministic"))
    print(f"engine: {res.path}")
    if res.market_cache:
        print(f"market cache: {res.market_cache}")
    if kev["mode"] == "cassette":
        print(
            f"Kev cassette: {kev['hits']} hits, {kev['misses']} misses, {kev['fallbacks']} answered by the "
            f"fallback; lag {kev['lag']}"
        )
    elif kev["mode"] == "llm":  # a cache by request key in front of the server
        print(f"Kev llm: {kev['misses']} server calls, {kev['hits']} cached; lag {kev['lag']}")
    if kev.get("health", {}).get("warning"):
        print(f"WARNING: {kev['health']['warning']}")
    for stream, reasons in res.quarantine.items():  # invalid session rows the engine never saw
        why = ", ".join(f"{reason} {n}" for reason, n in reasons.items())
        print(f"quarantined {stream}: {sum(reasons.values())} rows ({why}): events/input_quarantine.parquet")
    print(f"run: {res.run_dir}")
    print(f"digest: {res.digest}")
    print(f"decision digest: {res.decision_digest}")


def _fees_note(session: Path, cfg: Any) -> str:
    """The contract a replay of a recorded or imported session traded and where it came from (its
    tick, step and fees decide every fill and the PnL); "" for a session that names no spec replayed
    on its default (a simulator's)."""
    from engine.store import SessionError, open_session

    try:
        manifest = open_session(session).manifest
    except SessionError:
        return ""
    if cfg.symbols or not (cfg.contract_source or "contracts" in manifest or "import" in manifest):
        return ""
    c = cfg.contract
    where = {
        "": "the engine's default (Bitget's BTCUSDT perpetual): the session names no spec",
        "flag": "as the command line set it",
    }.get(cfg.contract_source, f"from the session ({cfg.contract_source.partition(':')[2]})")
    return (
        f"contract {c.symbol}: tick {c.tick!r}, size step {c.size_step!r}, fees maker {c.maker_fee_rate} "
        f"taker {c.taker_fee_rate}, {where}"
    )


def add_range_args(p: argparse.ArgumentParser) -> None:
    """``--from``/``--to``: a day range over a catalog folder of sessions (replay/sessions.py)."""
    p.add_argument(
        "--from",
        dest="date_from",
        metavar="YYYY-MM-DD",
        help="with a catalog folder: the sessions whose first row falls on this UTC day or later, "
        "replayed as one run",
    )
    p.add_argument("--to", dest="date_to", metavar="YYYY-MM-DD", help="and on this UTC day or earlier")


def cmd_replay(args: argparse.Namespace) -> int:
    from analysis.console import print_report
    from engine.strategies import plugin
    from engine.urls import check_url
    from replay.driver import run_replay
    from replay.sessions import resolve

    # several sessions named: one range directory, a session like any other from here on
    args.session = resolve(args.session, args.date_from, args.date_to)
    plugin.set_budget_ms(args.strategy_budget_ms)  # None: the environment's or the default
    if args.kev_url:
        check_url(args.kev_url, "--kev-url")
    elif args.kev_mode == "llm" or (args.kev_mode == "cassette" and args.kev_miss == "live"):
        raise DualhubError("--kev-mode llm and --kev-miss live ask llama-server: pass its --kev-url")
    cfg = _config(args)
    if getattr(args, "params", None):
        from replay.sweep import params_config

        cfg = params_config(args.params, cfg)
    if args.kev_url and (cfg.kev_mode == "llm" or cfg.kev_miss_policy == "live"):
        import dataclasses

        from engine.kev import timeout_advice

        prompt = "portfolio" if cfg.kev_hub else "single"
        given = args.kev_timeout_ms  # or --params', when it set one
        if given is None and cfg.kev_timeout_ms != timeout_advice.DEFAULT_TIMEOUT_MS:
            given = cfg.kev_timeout_ms
        model = timeout_advice.server_model(args.kev_url)
        choice = timeout_advice.choose(given, model, prompt)
        print(choice.line, file=sys.stderr)
        cfg = dataclasses.replace(cfg, kev_timeout_ms=choice.timeout_ms)
    with CompileWatch() as compiling:
        res = run_replay(
            args.session,
            cfg,
            out_dir=args.out,
            overwrite=args.overwrite,
            progress=True,
            kernel=not getattr(args, "python_engine", False),
            market_cache=getattr(args, "market_cache", False),
        )
    _print_result(res, compiling.seconds)
    if note := _fees_note(args.session, cfg):
        print(note)
    if args.report:
        print_report(res.run_dir, run_lines=False)  # the run and its digest are printed just above
    _print_range(res.run_dir)
    return 0


def _print_range(run_dir: Path) -> None:
    """A run over several sessions: which, and each gap between them (replay/sessions.py)."""
    from replay.sessions import run_range_lines

    for line in run_range_lines(run_dir):
        print(line)


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.console import print_report

    if getattr(args, "html", None):
        from analysis.html import check_html_path
        from engine.optional import need

        need("matplotlib")  # before the report, not after it
        check_html_path(args.html)
    print_report(args.run)  # refuses a half-written or modified run (report.verify_run) before printing
    _print_range(args.run)
    if getattr(args, "html", None):
        from analysis.html import write_html

        print(f"html report: {write_html(args.run, args.html)}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from analysis.console import print_report
    from replay.config import ReplayConfig
    from replay.driver import run_replay
    from venue.simulator import simulate_session

    _check_simulation(args)
    if not (args.out / "manifest.json").exists():
        print(f"simulating {args.minutes:g} minutes of BTCUSDT (seed {args.seed}) into {args.out}")
        simulate_session(args.out, minutes=args.minutes, seed=args.seed, progress=True)
    else:
        print(f"replaying the session already at {args.out}")
    with CompileWatch() as compiling:
        res = run_replay(args.out, ReplayConfig(), overwrite=True, progress=True)
    _print_result(res, compiling.seconds)
    print_report(res.run_dir, run_lines=False)  # the run and its digest are printed just above
    return 0
