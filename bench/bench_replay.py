#!/usr/bin/env python3
"""Replay throughput: snapshots/s through the whole pipeline (Parquet in -> event log out).

Every snapshot is labelled by Laya (ONNX Runtime), non-HOLD labels go through the Kev queue (rule
advisor, modelled lag), the strategy quotes, every order passes the risk gateway, the simulated
exchange fills, and the run's Parquet event log and manifest are written.

Data: a simulated session (``--minutes``, default 60 = ~24 000 snapshots), or Bitget v2 frames from
``../shared/bench/gen_books.py`` (``--ndjson DIR/books15.ndjson``), the same data the hftbacktest
reference runs on. Prints each run and the median; run it by hand, never as a test.

    .venv/bin/python bench/bench_replay.py --minutes 60 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from engine.store import SessionWriter
from engine.venues.bitget_v2 import Control, StreamCounters, decode
from replay.driver import ReplayConfig, run_replay


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--ndjson", type=Path, help="books15.ndjson from shared/bench/gen_books.py")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--laya-mode", choices=("batch", "tick"), default="batch")
    args = ap.parse_args()
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
                session, ReplayConfig(laya_mode=args.laya_mode), out_dir=Path(td) / f"run{i}", overwrite=True
            )
            rates.append(r.snapshots_per_s)
            digests.add(r.digest)
            print(
                f"run {i}: {r.books} snapshots + {r.trades} trades in {r.wall_s:.2f} s = "
                f"{r.snapshots_per_s:,.0f} snapshots/s ({sum(r.counts.values()):,} events out)"
            )
        print(
            f"median: {statistics.median(rates):,.0f} snapshots/s end to end (laya {args.laya_mode}); "
            f"digests identical: {len(digests) == 1}"
        )


if __name__ == "__main__":
    main()
