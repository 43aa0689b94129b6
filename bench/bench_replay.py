#!/usr/bin/env python3
"""Replay throughput: snapshots/s through the whole pipeline (Parquet in -> event log out).

Every snapshot is labelled by Laya (ONNX Runtime), non-HOLD labels go through the Kev queue (rule
advisor, modelled lag), the strategy quotes, every order passes the risk gateway, the simulated
exchange fills, and the run's Parquet event log and manifest are written.

Data: a simulated session (``--minutes``, default 60 = ~24 000 snapshots), or Bitget v2 frames from
``../shared/bench/gen_books.py`` (``--ndjson DIR/books15.ndjson``), the same data the hftbacktest
reference runs on. Prints each run and the median; run it by hand, never as a test.

    .venv/bin/python bench/bench_replay.py --minutes 60 --repeat 3

Any other option is a ``dualhub replay`` option, read by the replay command's own parser (``dualhub
replay --help``): Kev lag (``--kev-lag-p5-ms``, ``--kev-lag-p95-ms``, ``--kev-lag-fit``,
``--kev-lag-scale``), ``--scale-latency``, ``--laya-mode``, ``--fill-model``, ``--strategy``,
``--python-engine``... Order latencies, which ``ReplayConfig`` takes as spec strings
(``engine.latency.spec.parse_latency``), have options here: ``--latency-order-entry SPEC`` and so on.

    .venv/bin/python bench/bench_replay.py --minutes 10 --latency-order-entry lognormal:p5=1ms,p95=9ms \
        --kev-lag-p5-ms 50 --kev-lag-p95-ms 400
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from engine.errors import DualhubError
from engine.store import SessionWriter
from replay import cli as replay_cli
from replay.config import ReplayConfig
from replay.driver import run_replay
from wire.bitget.bitget_v2 import Control, StreamCounters, decode

# ReplayConfig's order latency spec fields, one option each (--latency-order-entry SPEC, ...)
ORDER_LATENCIES = ("latency_order_entry", "latency_order_response", "latency_cancel")


def session_from_ndjson(path: Path, out: Path) -> Path:
    """gen_books.py writes pushes only; receive time = push ts + 2 ms (a fixed feed latency)."""
    w = SessionWriter(out, source=f"ndjson:{path.name}", symbols=["BTCUSDT"])
    c = StreamCounters()
    with open(path, "rb") as f:
        for line in f:
            ts_recv = orjson.loads(line)["ts"] * 1_000_000 + 2_000_000
            w.add_all(e for e in decode(line.strip(), ts_recv, c) if not isinstance(e, Control))
    w.close()
    return out


def replay_options(argv: Sequence[str]) -> tuple[ReplayConfig, bool]:
    """``dualhub replay`` options -> (the config the replay command would run, --python-engine)."""
    p = argparse.ArgumentParser(prog="bench_replay.py")
    replay_cli.register(p.add_subparsers())
    args = p.parse_args(["replay", "(the bench's session)", *argv])
    if args.out is not None or args.report:
        p.error(
            "--out and --report are not bench options (the bench writes its runs to a temporary directory)"
        )
    return replay_cli._config(args), args.python_engine


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--ndjson", type=Path, help="books15.ndjson from shared/bench/gen_books.py")
    ap.add_argument("--repeat", type=int, default=3)
    for name in ORDER_LATENCIES:
        ap.add_argument(
            "--" + name.replace("_", "-"),
            metavar="SPEC",
            help=f"ReplayConfig.{name} (default {getattr(ReplayConfig(), name)}): const:5ms, "
            "lognormal:p5=1ms,p95=9ms, empirical:PATH, recorded:KIND@RUN_DIR",
        )
    args, rest = ap.parse_known_args(argv)
    try:
        cfg, python_engine = replay_options(rest)
        specs = {n: getattr(args, n) for n in ORDER_LATENCIES if getattr(args, n) is not None}
        cfg = dataclasses.replace(cfg, **specs)  # ReplayConfig checks each spec
    except DualhubError as e:
        print(f"bench_replay.py: error: {e}", file=sys.stderr)
        return 2
    print(
        f"order latencies: entry {cfg.latency_order_entry}, response {cfg.latency_order_response}, "
        f"cancel {cfg.latency_cancel} (x{cfg.scale_order:g}); Kev lag "
        + (cfg.kev_lag_fit or f"lognormal p5 {cfg.kev_lag_p5_ms:g} ms, p95 {cfg.kev_lag_p95_ms:g} ms")
        + f" (x{cfg.scale_kev:g})"
    )
    with tempfile.TemporaryDirectory() as td:
        t0 = time.perf_counter()
        if args.ndjson:
            session = session_from_ndjson(args.ndjson, Path(td) / "s")
        else:
            from venue.simulator import simulate_session

            session = simulate_session(Path(td) / "s", minutes=args.minutes, seed=7)
        print(f"session ready in {time.perf_counter() - t0:.1f} s")
        rates, digests = [], set()
        for i in range(args.repeat):
            r = run_replay(
                session, cfg, out_dir=Path(td) / f"run{i}", overwrite=True, kernel=not python_engine
            )
            rates.append(r.snapshots_per_s)
            digests.add(r.digest)
            print(
                f"run {i}: {r.books} snapshots + {r.trades} trades in {r.wall_s:.2f} s = "
                f"{r.snapshots_per_s:,.0f} snapshots/s ({sum(r.counts.values()):,} events out; {r.path})"
            )
        print(
            f"median: {statistics.median(rates):,.0f} snapshots/s end to end (laya {cfg.laya_mode}); "
            f"digests identical: {len(digests) == 1}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
