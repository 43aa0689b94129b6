"""CLI: ``dualhub record``, ``dualhub recover``, ``dualhub serve`` and ``dualhub import``.

``python -m recorder.cli ...`` runs the same subcommands without the rest of ``dualhub``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from typing import Any

from engine.bounds import S_MAX, check_count, check_number, check_port, check_seed
from engine.errors import DualhubError
from wire.bitget.bitget_v2 import INST_TYPE, REST_BASE_URL, WS_PUBLIC_URL


def _csv(s: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in s.split(","))
    if any(items) and not all(items):  # "BTCUSDT,,": a typo must not quietly record fewer than asked
        raise argparse.ArgumentTypeError(f"{s!r} has an empty entry (a stray comma?)")
    return tuple(x for x in items if x)  # none at all: the config says so


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "record",
        help="record Bitget v2 public channels into a session (raw journal first, then Parquet)",
        description="Record Bitget v2 public WebSocket channels. Every frame goes to a compressed raw "
        "journal first; Parquet is produced on rotation and at shutdown. Ctrl-C / SIGTERM stop cleanly.",
    )
    p.add_argument("--symbols", type=_csv, required=True, help="comma-separated, e.g. BTCUSDT,ETHUSDT")
    p.add_argument("--channels", type=_csv, default=("books15", "trade"), help="default books15,trade")
    p.add_argument("--out", required=True, help="session directory to create")
    p.add_argument("--url", default=WS_PUBLIC_URL, help=f"default {WS_PUBLIC_URL}")
    p.add_argument(
        "--rest-url",
        help="REST base whose contracts endpoint gives each symbol's spec for the manifest (default: "
        "Bitget's with the default --url, none with another: the local exchange serves one)",
    )
    p.add_argument(
        "--inst-type", default=INST_TYPE, help=f"Bitget instType of the channels (default {INST_TYPE})"
    )
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--flush-ms", type=int, default=200, help="journal flush interval (ms)")
    p.add_argument("--rotate-s", type=float, default=900.0, help="journal segment age limit (s)")
    p.add_argument("--rotate-mb", type=float, default=64.0, help="journal segment size limit (MB)")
    p.add_argument("--ping-s", type=float, default=25.0, help="text ping interval (s)")
    p.add_argument(
        "--pong-timeout-s", type=float, default=10.0, help="reconnect when a ping gets no pong this long (s)"
    )
    p.add_argument("--silence-s", type=float, default=30.0, help="drop a connection silent this long (s)")
    p.add_argument("--silent-after-s", type=float, default=60.0, help="flag an acked arg with no data (s)")
    p.add_argument("--max-channels", type=int, default=50, help="channels per connection (<= 50)")
    p.add_argument("--backoff-s", type=float, default=1.0, help="initial reconnect backoff (s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the backoff jitter")
    p.add_argument("--no-status", action="store_true", help="no live status line")
    p.add_argument(
        "--max-lag-s",
        type=float,
        default=None,
        metavar="S",
        help="quarantine frames whose exchange time is more than S seconds before their receive time "
        "(default: no bound, as a local venue replaying history needs; ~60 suits the real venue)",
    )
    p.add_argument(
        "--max-lead-s", type=float, default=300.0, metavar="S",
        help="quarantine frames whose exchange time is more than S seconds after their receive time",
    )  # fmt: skip
    p.add_argument(
        "--price-band", type=float, default=2.0, metavar="X",
        help="quarantine a price more than X times away from the symbol's current mid (default 2)",
    )  # fmt: skip
    p.set_defaults(func=cmd_record)

    p = subparsers.add_parser(
        "recover",
        help="turn an interrupted recording's journal into a finished session",
        description="A recording stopped without its shutdown (a crash, SIGKILL, a power cut) leaves its raw "
        "journal but no manifest.json. Recover decodes the journal through the recorder's codec into the "
        "session's Parquet parts and writes the manifest, as a clean stop would have.",
    )
    p.add_argument(
        "dir", metavar="SESSION_DIR", help="the interrupted recording's directory (--out of `record`)"
    )
    p.set_defaults(func=cmd_recover)

    p = subparsers.add_parser(
        "serve",
        help="run the local Bitget v2 protocol server (from a session, the simulator or a toy feed)",
        description="A local WebSocket server speaking Bitget's v2 public protocol (subscribe, books15 and "
        "trade pushes, ping/pong), fed from a stored session, the market simulator or a toy feed, with "
        "injectable faults: point `dualhub record --url` or `dualhub live --ws-url` at the address it "
        "prints.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--session", help="stream a stored session's books15/trade")
    src.add_argument("--simulate", action="store_true", help="stream venue.simulator frames")
    src.add_argument("--toy", type=int, metavar="N", help="stream N steps of a built-in toy feed")
    p.add_argument(
        "--symbols",
        type=_csv,
        default=("BTCUSDT",),
        help="comma-separated symbols to serve (default BTCUSDT)",
    )
    p.add_argument("--minutes", type=float, default=5.0, help="simulator length")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulator or toy feed (default 0)")
    p.add_argument("--speed", type=float, default=1.0, help="time acceleration; 0 = as fast as read")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (printed)")
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="kind[@frame][:conn=N|all][:duration=S][:count=N][:code=X], repeatable",
    )
    p.add_argument(
        "--wire-year", choices=("2024", "2025", "2026"), default=None,
        help="book pushes laid out as Bitget's captures of that year (default 2026): fixed-depth checksum 0 "
        "without seq (2024), checksum 0 and seq (2025), seq and pseq (2026); books likewise",
    )  # fmt: skip
    p.add_argument("--no-checksum", action="store_true", help="books without checksum, whatever the year")
    p.add_argument(
        "--book-variant", choices=("2024", "2026"), default=None,
        help="older name: 2024 is --wire-year 2025 (checksum 0 and seq), 2026 is --wire-year 2026",
    )  # fmt: skip
    p.add_argument(
        "--trade-snapshot", type=int, default=50, metavar="N",
        help="after each trade subscribe, a snapshot of the last N trades first, as Bitget sends (0: none)",
    )  # fmt: skip
    p.add_argument("--exit-when-done", action="store_true", help="exit once the source is exhausted")
    p.set_defaults(func=cmd_serve)

    p = subparsers.add_parser(
        "import",
        help="import real recorded data into a session",
        description="Convert another recorder's capture of real market data into a dualhub session "
        "(books15 snapshots and trades, with the exchange's and the local clock), which replay, train "
        "and report then read like any other.",
    )
    isub = p.add_subparsers(dest="format", metavar="FORMAT", required=True)
    for market, what in (("futures", "USD-M futures"), ("spot", "spot")):
        q = isub.add_parser(
            f"binance-{market}",
            help=f"Binance {what} raw feed (<local_ts_ns> <json> lines, gzip ok)",
            description=f"Import a Binance {what} raw feed: one '<local_ts_ns> <json>' line per message "
            "(depth updates and trades; gzip ok), rebuilt into book snapshots at --interval-ms.",
        )
        q.add_argument("file", metavar="FILE", help="the capture (.txt or .gz)")
        q.add_argument("--out", required=True, help="session directory to create (must not exist)")
        q.add_argument("--interval-ms", type=int, default=100, help="book snapshot interval (exchange time)")
        q.set_defaults(func=cmd_import_binance, market=market)
    q = isub.add_parser(
        "bitget-v1",
        help="Bitget v1 websocket capture (cryptofeed sample format)",
        description="Import a Bitget v1 websocket capture in cryptofeed's sample format (book and trade "
        "messages) into a session.",
    )
    q.add_argument("file", metavar="FILE", help="the capture file")
    q.add_argument("--out", required=True, help="session directory to create (must not exist)")
    q.set_defaults(func=cmd_import_bitget_v1)
    q = isub.add_parser(
        "bitget-v2",
        help="Bitget v2 public frames captured by another tool ('<ts_recv_ns> <json>' or tardis-machine raw)",
        description="Import Bitget v2 public WebSocket frames captured by another tool: "
        "'<ts_recv_ns> <json>' lines (as dualhub's own journal holds them) or tardis-machine raw "
        'replay lines ({"localTimestamp": ..., "message": ...}); gzip ok. Every channel (books, books1, '
        "books5, books15, trade) goes through the recorder's own decoder and wire checks.",
    )
    q.add_argument("file", metavar="FILE", help="the capture (.txt, .jsonl or .gz)")
    q.add_argument("--out", required=True, help="session directory to create (must not exist)")
    q.set_defaults(func=cmd_import_bitget_v2)
    q = isub.add_parser(
        "tardis-csv",
        help="Tardis.dev CSV datasets (trades, book_snapshot_25, incremental_book_L2), e.g. bitget-futures",
        description="Import Tardis.dev downloadable CSV files (trades, book_snapshot_25, "
        "incremental_book_L2; gzip ok; any mix, any symbols, told by their header lines) into one "
        "session, through the recorder's wire checks.",
    )
    q.add_argument("files", metavar="FILE", nargs="+", help="the CSV files")
    q.add_argument("--out", required=True, help="session directory to create (must not exist)")
    q.set_defaults(func=cmd_import_tardis_csv)


def cmd_record(a: argparse.Namespace) -> int:
    from engine.errors import check_output_path
    from engine.urls import WS, check_url
    from engine.validate import WireLimits
    from recorder.record import RecordConfig, print_summary, run_record
    from wire.connection import ConnectionConfig

    check_url(a.url, "--url", WS)
    check_output_path(a.out, directory=True)
    check_number(a.rotate_mb, "--rotate-mb", high=1 << 20)
    try:
        cfg = RecordConfig(
            out=a.out,
            symbols=a.symbols,
            channels=a.channels,
            inst_type=a.inst_type,
            duration_s=a.duration,
            flush_interval_ms=a.flush_ms,
            rotate_s=a.rotate_s,
            rotate_bytes=int(a.rotate_mb * (1 << 20)),
            max_channels_per_conn=a.max_channels,
            seed=a.seed,
            status=not a.no_status and sys.stderr.isatty(),
            wire=WireLimits(max_lag_s=a.max_lag_s, max_lead_s=a.max_lead_s, band=a.price_band),
            connection=ConnectionConfig(
                url=a.url,
                ping_interval_s=a.ping_s,
                pong_timeout_s=a.pong_timeout_s,
                silence_limit_s=a.silence_s,
                silent_after_s=a.silent_after_s,
                backoff_initial_s=a.backoff_s,
                watchdog_tick_s=min(0.5, a.silence_s / 4, a.pong_timeout_s / 4),
            ),
        )
    except ValueError as e:
        raise DualhubError(str(e)) from None
    if a.rest_url:
        check_url(a.rest_url, "--rest-url")
    rest_url = a.rest_url if a.rest_url is not None else (REST_BASE_URL if a.url == WS_PUBLIC_URL else "")
    manifest = run_record(cfg, rest_url)
    print_summary(manifest)
    if why := manifest.get("contracts_error"):  # a replay of it then trades the engine's default contract
        print(f"WARNING: no contract specs recorded ({why})", file=sys.stderr)
    print(a.out)
    return 0


def cmd_recover(a: argparse.Namespace) -> int:
    from recorder.record import print_summary
    from recorder.recover import recover

    manifest = recover(a.dir)
    print_summary(manifest)
    print(a.dir)
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    from venue.bitget.public_server import BitgetServer, Fault, session_frames, simulator_frames, toy_frames

    try:
        faults = [Fault.parse(s) for s in a.fault]
    except ValueError as e:
        raise DualhubError(f"bad --fault: {e}") from None
    check_seed(a.seed, "--seed")
    check_number(a.speed, "--speed", zero=True)
    check_port(a.port)
    if a.simulate:
        check_number(a.minutes, "--minutes", high=S_MAX / 60)
    if a.toy is not None:
        check_count(a.toy, "--toy")
    symbols: set[str] | None = set(a.symbols)
    if a.session:
        source: Any = session_frames(a.session)
        symbols = None
    elif a.simulate:
        source = simulator_frames(a.symbols, minutes=a.minutes, seed=a.seed)
    else:
        source = toy_frames(a.symbols, n=a.toy, seed=a.seed)

    async def main() -> None:
        srv = BitgetServer(
            source,
            speed=a.speed,
            faults=faults,
            symbols=symbols,
            port=a.port,
            wire_year=a.wire_year,
            books_checksum=False if a.no_checksum else None,
            book_variant=a.book_variant,
            trade_snapshot=max(0, a.trade_snapshot),
            seed=a.seed,
            keep_frames=False,
        )
        await srv.start()
        print(f"listening {srv.url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        waits = [asyncio.create_task(stop.wait())]
        if a.exit_when_done:
            waits.append(asyncio.create_task(srv.finished.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        await srv.stop()
        print(f"sent {srv.sent_count} frames on {srv.connections} connections", file=sys.stderr)

    asyncio.run(main())
    return 0


def cmd_import_binance(a: argparse.Namespace) -> int:
    from recorder.importers.binance import import_binance

    if a.interval_ms <= 0:
        raise DualhubError(f"--interval-ms must be positive, not {a.interval_ms}")
    m = import_binance(a.file, a.out, market=a.market, interval_ms=a.interval_ms)
    imp = m["import"]
    print(
        f"imported {_streams(m)}; gaps {imp['gaps']}; crossed books {imp['crossed']};"
        f" discarded {_counts(imp['discarded'])}",
        file=sys.stderr,
    )
    print(a.out)
    return 0


def cmd_import_bitget_v1(a: argparse.Namespace) -> int:
    from recorder.importers.bitget_v1 import import_bitget_v1

    m = import_bitget_v1(a.file, a.out)
    imp = m["import"]
    print(
        f"imported {_streams(m)}; checksums verified {imp['checksums_verified']};"
        f" book faults {len(imp['book_faults'])}; gaps {imp['gaps']}; discarded {_counts(imp['discarded'])}",
        file=sys.stderr,
    )
    print(a.out)
    return 0


def cmd_import_bitget_v2(a: argparse.Namespace) -> int:
    from recorder.importers.bitget_v2_raw import import_bitget_v2_raw

    m = import_bitget_v2_raw(a.file, a.out)
    imp = m["import"]
    print(
        f"imported {_streams(m)} ({imp['format']}, {imp['inst_type']}); duplicate trades"
        f" {sum(imp['duplicate_trades'].values())}; gaps {imp['gaps']};"
        f" discarded {_counts(imp['discarded'])}",
        file=sys.stderr,
    )
    print(a.out)
    return 0


def cmd_import_tardis_csv(a: argparse.Namespace) -> int:
    from recorder.importers.tardis_csv import import_tardis_csv

    m = import_tardis_csv(a.files, a.out)
    imp = m["import"]
    print(
        f"imported {_streams(m)}; duplicate trades {sum(imp['duplicate_trades'].values())};"
        f" discarded {_counts(imp['discarded'])}",
        file=sys.stderr,
    )
    print(a.out)
    return 0


def _streams(m: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v['rows']}" for k, v in m["streams"].items())


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m recorder.cli``: these subcommands alone (same behaviour as under ``dualhub``)."""
    import logging

    parser = argparse.ArgumentParser(prog="recorder")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except DualhubError as e:
        print(f"{args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
