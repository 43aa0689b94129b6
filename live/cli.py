"""Subcommands ``live``, ``serve-exchange`` and ``kill``.

``dualhub live --symbols BTCUSDT [--paper | --live --i-understand-this-trades-real-money]
[--exchange-url URL] [--ws-url URL] [--duration S] [--out SESSION_DIR] [--kev-url URL]
[--dashboard [HOST:]PORT [--dashboard-token T]]``: the dashboard is live/dashboard.py

``dualhub serve-exchange SESSION [--realtime | --speed X] [--port P]``: a local Bitget (REST on P,
public and private WebSockets on P + 1) replaying SESSION and matching orders against its books.

``dualhub kill SESSION_DIR``: engage the kill switch of the ``dualhub live`` writing SESSION_DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from engine.bounds import add_leg_args, check_number, check_port, leg_fields
from engine.errors import DualhubError
from engine.instruments import instrument_args
from engine.risk_args import add_risk_args, risk_fields
from engine.strategies.registry import add_strategy_args, strategy_fields
from engine.urls import WS, check_url
from wire.bitget.bitget_v2 import REST_BASE_URL

CONFIRM_FLAG = "--i-understand-this-trades-real-money"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "live",
        help="run the engine live (paper by default) and record everything into a session that replays",
        description="The replay engine on a real-time clock: live books15/trade, Laya on every tick, Kev "
        "off the tick path, the risk gateway in front of every order. --paper (default) fills on the live "
        "book with the replay fill model; --live sends real orders through Bitget's signed API (keys only "
        "from BITGET_API_KEY, BITGET_API_SECRET, BITGET_API_PASSPHRASE). Kill switch: SIGUSR1, "
        "`dualhub kill OUT` or the file OUT/KILL. The venue is cancel-all'ed on exit.",
    )
    p.add_argument(
        "--symbols",
        default="BTCUSDT",
        help="comma-separated symbols (default BTCUSDT); several trade as one portfolio: one engine, one "
        "risk gateway, one run (runs/live-portfolio)",
    )
    p.add_argument(
        "--instrument",
        action="append",
        metavar="SYMBOL:FIELD=V,...",
        help="an instrument's own settings over the config (tick, size_step, min_qty, quote_qty, "
        "max_position, max_order_qty), e.g. ETHUSDT:quote_qty=0.06,max_position=1.5; repeatable",
    )
    p.add_argument(
        "--kev-hub",
        choices=("pairs", "llm"),
        help="several symbols: Kev answers for the whole portfolio, one command setting every "
        "instrument (the first symbol leading the others): the pairs rule on the hedge ratios fitted "
        "from the marks, or llama-server at --kev-url asked the same question (llm)",
    )
    add_leg_args(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--paper", action="store_true", help="simulated fills on the live book (default)")
    mode.add_argument("--live", action="store_true", help="real orders: needs keys and the confirmation flag")
    p.add_argument(CONFIRM_FLAG, dest="confirm", action="store_true", help="required with --live")
    p.add_argument("--exchange-url", default=REST_BASE_URL, help="REST base of a Bitget-protocol endpoint")
    p.add_argument("--ws-url", default="", help="WebSocket base (default: derived from --exchange-url)")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument("--out", type=Path, help="session directory (default data/sessions/live-<UTC time>)")
    p.add_argument("--kev-url", default="", help="llama-server URL (default: the rule advisor)")
    p.add_argument(
        "--kev-timeout-ms",
        type=int,
        default=None,
        help="give up on a Kev answer after this long (default 2000; with --kev-url, what `dualhub kev "
        "bench` measured for the server's model, when it did); below the server's latency every answer is "
        "discarded",
    )
    p.add_argument(
        "--kev-in-loop",
        action="store_true",
        help="run Kev's HTTP client on the tick path's event loop instead of its own process",
    )
    p.add_argument("--model", type=Path, help="Laya ONNX model (default data/models/laya-v0.onnx)")
    p.add_argument("--provider", choices=("auto", "cuda", "cpu"), default="auto", help="Laya provider")
    p.add_argument("--fill-model", default="touch", help="paper fill model (as replay's)")
    p.add_argument(
        "--busy-poll",
        action="store_true",
        help="never sleep the event loop and keep the label path warm (lowest tick latency; costs a core)",
    )
    add_strategy_args(p)
    p.add_argument(
        "--strategy-budget-ms",
        type=float,
        metavar="MS",
        help="a Python strategy (MODULE:FN) may take at most this long in one call, or the run stops "
        "trading and cancels everything (default 1000, or $DUALHUB_STRATEGY_BUDGET_MS; 0: no budget)",
    )
    add_risk_args(p)
    p.add_argument("--kill-file", default="", help="kill switch file (default OUT/KILL)")
    p.add_argument(
        "--contract-defaults", action="store_true", help="paper: do not ask the exchange for contracts"
    )
    p.add_argument("--seed", type=int, default=1, help="seed for every component's RNG (default 1)")
    p.add_argument(
        "--kill-flattens",
        action="store_true",
        help="the kill switch also closes positions with reduce-only market orders (risk-checked)",
    )
    p.add_argument("--status-every", type=float, default=10.0, help="status line every S seconds (0: none)")
    p.add_argument(
        "--feed-stale", type=float, default=3.0, help="warn when no market data arrives for S seconds (3)"
    )
    p.add_argument(
        "--venue-lost",
        type=float,
        default=20.0,
        help="end the run (live: kill switch), exit 1, when a link to the venue is out S seconds (20)",
    )
    p.add_argument(
        "--watchdog-s",
        type=float,
        default=None,
        metavar="S",
        help="--live: a watchdog process cancel-alls the venue when the engine dies (at once) or its "
        "heartbeat stops for S seconds (default 10; 0: no watchdog); records in OUT/watchdog.jsonl. "
        "--paper has none: its orders never reach a venue",
    )
    p.add_argument(
        "--dashboard",
        metavar="[HOST:]PORT",
        help="serve a page that follows the run (positions, PnL, orders, fills, risk, Kev, latency, links) "
        "and Prometheus /metrics on HOST:PORT (HOST default 127.0.0.1; any other needs a token)",
    )
    p.add_argument(
        "--dashboard-token",
        default=None,
        help="the dashboard's token (default $DUALHUB_DASHBOARD_TOKEN, better: a command line is visible "
        "to every user of the machine): needed for the kill switch button and for a non-loopback HOST",
    )
    p.set_defaults(func=cmd_live)

    p = sub.add_parser(
        "serve-exchange",
        help="a local Bitget v2 exchange replaying a session: signed REST orders, private WS, matching",
        description="Public books15/trade from SESSION (times rebased to now), signed REST order endpoints "
        "with Bitget's error codes, the private WebSocket (login, orders, fill, positions) and matching "
        "against its own book with the replay fill model: with `dualhub live --exchange-url`, a full dress "
        "rehearsal on one machine. API keys: BITGET_API_* from the environment, else local-key/"
        "local-secret/local-passphrase.",
    )
    p.add_argument("session", type=Path, help="session directory whose market data the exchange plays")
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--realtime", action="store_true", help="replay at recorded speed (default)")
    speed.add_argument("--speed", type=float, help="speed factor (0 = as fast as clients read)")
    p.add_argument("--port", type=int, default=0, help="REST port; the WebSockets use port + 1 (0: any)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--fill-model",
        default="touch",
        help="how resting orders fill, as replay's --fill-model (default touch)",
    )
    p.add_argument("--symbols", default="", help="only these symbols (comma-separated)")
    p.set_defaults(func=cmd_serve_exchange)

    p = sub.add_parser(
        "kill",
        help="engage the kill switch of a running `dualhub live`",
        description="Write the kill file that a `dualhub live` run watches (OUT/KILL unless the run named "
        "another): the run then refuses every new order, cancels its resting ones and, started with "
        "--kill-flattens, closes its positions. The file stays until removed: a run started over it does "
        "not trade.",
    )
    p.add_argument("out", type=Path, help="the session directory `dualhub live` is writing")
    p.add_argument("--reason", default="cli", help="recorded with the kill (default: cli)")
    p.set_defaults(func=cmd_kill)
    _extend_recover(sub)


def _extend_recover(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``dualhub recover`` (the recorder's command) also rebuilds live runs: given a live session (or
    one of its ``runs/*.tmp``), its unfinished runs are rebuilt from their write-ahead journals
    (live/recover.py). The recorder stands below live and cannot know of them, so live extends it."""
    p = sub.choices.get("recover")
    if p is None:
        return
    recorder_cmd = p.get_default("func")
    p.description = (p.description or "") + (
        " Given a `dualhub live` session (or one of its runs/*.tmp), it also rebuilds every run the "
        "engine did not finish from the run's write-ahead journal (orders.wal) and, for --live runs with "
        "the API keys in the environment, reconciles it with the venue."
    )

    def cmd_recover(args: argparse.Namespace) -> int:
        from live.recover import is_live_target

        if not is_live_target(args.dir):
            return int(recorder_cmd(args))
        return cmd_recover_live(args)

    p.set_defaults(func=cmd_recover)


def cmd_recover_live(args: argparse.Namespace) -> int:
    from live.config import credentials_from_env
    from live.recover import recover_live

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    for r in recover_live(args.dir, credentials=credentials_from_env(), say=say):
        c = r.counts
        print(
            f"recovered {r.run_dir}: {r.orders} orders sent, {c.get('fill', 0)} fills, {c.get('label', 0)} "
            f"labels, {c.get('kev_response', 0)} Kev answers; venue: {r.reconcile['state']}"
        )
    print(args.dir)
    return 0


def _symbols(text: str) -> tuple[str, ...]:
    if not text.strip():
        return ()
    picked = tuple(s.strip().upper() for s in text.split(","))
    if not all(picked):  # "BTCUSDT,," : a typo must not quietly trade fewer symbols than asked
        raise DualhubError(f"--symbols {text!r}: an empty symbol (a stray comma?)")
    return picked


def _kev_timeout_ms(args: argparse.Namespace) -> int:
    """--kev-timeout-ms, or with --kev-url what `dualhub kev bench` measured for the server's model
    (said at start, as is a given timeout below the measured p50)."""
    from engine.kev import timeout_advice

    if not args.kev_url:
        return timeout_advice.DEFAULT_TIMEOUT_MS if args.kev_timeout_ms is None else args.kev_timeout_ms
    prompt = "portfolio" if args.kev_hub else "single"
    choice = timeout_advice.choose(args.kev_timeout_ms, timeout_advice.server_model(args.kev_url), prompt)
    print(choice.line, file=sys.stderr)
    return choice.timeout_ms


def cmd_live(args: argparse.Namespace) -> int:
    from engine.laya.model import DEFAULT_MODEL
    from engine.strategies import plugin
    from live.config import LiveConfig, credentials_from_env
    from live.runner import LiveRunner

    plugin.set_budget_ms(args.strategy_budget_ms)  # None: the environment's or the default

    check_url(args.exchange_url, "--exchange-url")
    if args.ws_url:
        check_url(args.ws_url, "--ws-url", WS)
    if args.kev_url:
        check_url(args.kev_url, "--kev-url")
    if args.kev_hub == "llm" and not args.kev_url:
        raise DualhubError("--kev-hub llm asks llama-server: pass its --kev-url")
    kev_timeout_ms = _kev_timeout_ms(args)
    creds = credentials_from_env()
    if args.confirm and not args.live:
        raise DualhubError(f"{CONFIRM_FLAG} only goes with --live")
    if args.live:
        if not args.confirm:
            raise DualhubError(f"--live sends real orders with real money: add {CONFIRM_FLAG} to confirm")
        if creds is None:
            raise DualhubError(
                "--live needs API keys in the environment: BITGET_API_KEY, BITGET_API_SECRET and "
                "BITGET_API_PASSPHRASE (never on the command line)"
            )
    out = args.out or Path("data/sessions") / time.strftime("live-%Y%m%dT%H%M%SZ", time.gmtime())
    cfg = LiveConfig(
        out=str(out),
        symbols=_symbols(args.symbols),
        instruments=instrument_args(args.instrument),
        kev_hub=args.kev_hub or "",
        **leg_fields(args),
        mode="live" if args.live else "paper",
        exchange_url=args.exchange_url,
        ws_url=args.ws_url,
        duration_s=args.duration,
        model_path=str(args.model or DEFAULT_MODEL),
        laya_provider=args.provider,
        fill_model=args.fill_model,
        kev_url=args.kev_url,
        kev_process=not args.kev_in_loop,
        kev_timeout_ms=kev_timeout_ms,
        kill_file=args.kill_file,
        contract_defaults=args.contract_defaults,
        seed=args.seed,
        busy_poll=args.busy_poll,
        kill_flattens=args.kill_flattens,
        status_every_s=args.status_every,
        feed_stale_s=args.feed_stale,
        venue_lost_s=args.venue_lost,
        **({} if args.watchdog_s is None else {"watchdog_s": args.watchdog_s}),
        **strategy_fields(args),
        **risk_fields(args),
    )
    dashboard = _dashboard(args)  # bound now: a busy port or a refused address is one line, exit 2
    runner = LiveRunner(
        cfg,
        credentials=creds if args.live else None,
        install_signals=True,
        status=lambda line: print(line, file=sys.stderr, flush=True),
        dashboard=dashboard,
    )
    try:
        result = asyncio.run(runner.run())
    except DualhubError:
        raise
    except Exception as e:  # never a traceback that could carry request details; the message redacted
        text = f"{type(e).__name__}: {e}"
        print(f"dualhub live: failed: {creds.redact(text) if creds else text}", file=sys.stderr)
        return 1
    finally:
        if dashboard is not None:
            dashboard.close()
    s = result.summary
    print(f"dualhub live: {cfg.mode} run stopped by {result.stopped_by or '?'}", file=sys.stderr)
    print(f"  session  {result.session_dir}", file=sys.stderr)
    for sym, run in result.run_dirs.items():
        c = result.counts.get(sym, {})
        print(
            f"  {sym:<10} {run}  labels {c.get('label', 0)}  orders {c.get('order', 0)}  "
            f"fills {c.get('fill', 0)}  kev {c.get('kev_response', 0)}",
            file=sys.stderr,
        )
    for sym, health in s.get("kev_health", {}).items():
        if health.get("warning"):
            print(f"  WARNING  {sym} {health['warning']}", file=sys.stderr)
    if result.killed:
        print(f"  KILLED   {result.killed}", file=sys.stderr)
    if s.get("crash"):
        print(f"  CRASH    {s['crash']}", file=sys.stderr)
    venue = s.get("venue", {})
    if venue.get("lost"):
        print(f"  LOST     {venue['lost']}", file=sys.stderr)
    for link, how in venue.get("at_exit", {}).items():
        print(f"  AT EXIT  {link} {how}", file=sys.stderr)
    for sym, f in s.get("flatten", {}).items():
        print(
            f"  FLATTEN  {sym} position {f['position_before']:g} -> {f.get('position_after', float('nan')):g}"
            f" ({len(f['orders'])} orders sent, {f['refused']} refused by the risk gateway)",
            file=sys.stderr,
        )
    left = (s.get("shutdown") or {}).get("cancel_all", {}).get("left_open")
    if isinstance(left, str) or left:
        print(f"  OPEN     orders may still be open at the venue: {left}", file=sys.stderr)
    print(f"  shutdown {s.get('shutdown')}", file=sys.stderr)
    return result.exit_code


def _dashboard(args: argparse.Namespace) -> Any:
    """``--dashboard``: the bound server (live/dashboard.py), or None."""
    from live.dashboard import ENV_TOKEN, Dashboard

    if args.dashboard_token is not None and not args.dashboard:
        raise DualhubError("--dashboard-token only goes with --dashboard")
    if not args.dashboard:
        return None
    token = args.dashboard_token if args.dashboard_token is not None else os.environ.get(ENV_TOKEN, "")
    dash = Dashboard(args.dashboard, token)
    dash.serve()  # answers at once ("not started" until the run's loop publishes its first snapshot)
    print(f"dualhub live: dashboard {dash.url}  (Prometheus: {dash.url}metrics)", file=sys.stderr, flush=True)
    return dash


def cmd_serve_exchange(args: argparse.Namespace) -> int:
    from engine.store import open_session
    from live.config import credentials_from_env
    from venue.bitget.exchange import DEFAULT_ACCOUNTS, LocalExchange
    from venue.bitget.public_server import session_frames
    from venue.fills import FILL_MODELS

    if args.speed is not None:
        check_number(args.speed, "--speed", zero=True)
    check_port(args.port, high=65534)  # the WebSockets take port + 1
    if args.fill_model not in FILL_MODELS:
        raise DualhubError(f"unknown fill model {args.fill_model!r}; known: {', '.join(FILL_MODELS)}")
    session = open_session(args.session)
    want = _symbols(args.symbols) or None
    frames = session_frames(args.session, symbols=want)
    if not frames:
        raise DualhubError(f"{args.session} has no books15/trade frames to serve")
    creds = credentials_from_env()
    accounts = {creds.api_key: (creds.secret, creds.passphrase)} if creds else dict(DEFAULT_ACCOUNTS)
    speed = 1.0 if args.speed is None else args.speed
    symbols = want or tuple(session.manifest.get("symbols") or ("BTCUSDT",))
    ex = LocalExchange(
        frames,
        speed=speed,
        fill_model=args.fill_model,
        accounts=accounts,
        symbols=symbols,
        host=args.host,
        rest_port=args.port,
        ws_port=args.port + 1 if args.port else 0,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with ex:
            print(
                f"serve-exchange: REST {ex.rest_url}  WS {ex.ws_url}  "
                f"({len(frames)} frames at speed {speed})\n"
                f"  dualhub live --exchange-url {ex.rest_url} --ws-url {ex.ws_url} ...",
                flush=True,
            )
            if not creds:
                print(f"  API key {next(iter(accounts))} (local defaults)", flush=True)
            await stop.wait()

    asyncio.run(main())
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    import orjson

    from live.config import KILL_FILE, LIVE_JSON

    out: Path = args.out
    info = {}
    try:
        info = orjson.loads((out / LIVE_JSON).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        raise DualhubError(f"{out} has no {LIVE_JSON}: not a `dualhub live` session directory") from None
    kill_file = Path(info.get("kill_file") or out / KILL_FILE)
    kill_file.write_text(args.reason + "\n")
    state = "running" if info.get("running") else "not running (the kill file stays: remove it to trade)"
    print(f"dualhub kill: wrote {kill_file}; live run {state}", file=sys.stderr)
    return 0
