#!/usr/bin/env python3
"""Sweep throughput (runs/minute): serial in-process beside Ray with 1, 2, ... workers.

Simulated sessions (``--sessions`` x ``--minutes``) and a grid of ``--points`` Kev lag scales; every
configuration runs the whole sweep ``--repeat`` times into a fresh results table. For Ray, each
worker count gets its own local instance (``ray.init(num_cpus=W)``), started once: its start-up is
reported apart, the first sweep on it (workers importing the replay stack) is reported apart, and
the median is over all repeats. All runs of one key must produce one digest, whichever mode ran it.
Run it by hand, never as a test:

    .venv/bin/python bench/bench_sweep.py --sessions 4 --minutes 15 --points 4 --repeat 3 --workers 1,2
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from replay.ray_sweep import ray_sweep
from replay.sweep import parse_grid, sweep
from venue.simulator import simulate_session


def digests(out: Path | str) -> dict[tuple[str, str], str]:
    rows = pq.read_table(out).to_pylist()
    assert not any(r["error"] for r in rows), [r["error"] for r in rows if r["error"]]
    return {(r["session_digest"], r["param_hash"]): r["digest"] for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--points", type=int, default=4, help="grid points (scale_kev values)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", default="1,2", help="Ray worker counts, comma-separated")
    ap.add_argument("--memory-mb", type=int, default=1024)
    args = ap.parse_args()
    import ray

    grid = parse_grid(
        {
            "base": {"seed": 1, "laya_provider": "cpu"},
            "grid": {"scale_kev": [0.5 * (i + 1) for i in range(args.points)]},
        }
    )
    with tempfile.TemporaryDirectory() as td:
        root = Path(td)
        t0 = time.perf_counter()
        sessions = [
            simulate_session(root / "sessions" / f"s{i}", minutes=args.minutes, seed=i + 1)
            for i in range(args.sessions)
        ]
        n = len(sessions) * args.points
        print(
            f"{len(sessions)} sessions x {args.minutes:g} min, {args.points} grid points = {n} runs; "
            f"{os.cpu_count()} cores; sessions ready in {time.perf_counter() - t0:.1f} s"
        )
        results: list[tuple[str, float | None, float, float, float]] = []
        reference: dict[tuple[str, str], str] | None = None

        def check(out: Path | str) -> None:
            nonlocal reference
            got = digests(out)
            assert len(got) == n
            reference = reference or got
            assert got == reference, "a key produced another digest"

        rates = []
        for r in range(args.repeat):
            out = root / f"serial{r}" / "results.parquet"
            t = time.perf_counter()
            sweep(grid, sessions, out, progress=False)
            rates.append(n / (time.perf_counter() - t) * 60)
            check(out)
        results.append(("serial (in-process)", None, rates[0], statistics.median(rates), max(rates)))

        for w in (int(x) for x in args.workers.split(",")):
            t = time.perf_counter()
            ray.init(address="local", num_cpus=w, include_dashboard=False, logging_level=logging.ERROR)
            start_s = time.perf_counter() - t
            rates = []
            try:
                for r in range(args.repeat):
                    out = root / f"ray{w}-{r}" / "results.parquet"
                    t = time.perf_counter()
                    ray_sweep(grid, sessions, out, memory_mb=args.memory_mb, progress=False)
                    rates.append(n / (time.perf_counter() - t) * 60)
                    check(out)
            finally:
                ray.shutdown()
            results.append((f"Ray, {w} worker(s)", start_s, rates[0], statistics.median(rates), max(rates)))

    print()
    print(f"{'mode':<22}{'Ray start s':>12}{'first runs/min':>16}{'median runs/min':>17}{'best':>8}")
    for name, start_s, first, median, best in results:
        start = f"{start_s:.1f}" if start_s is not None else "-"
        print(f"{name:<22}{start:>12}{first:>16.0f}{median:>17.0f}{best:>8.0f}")
    print(f"\nall {n} keys gave the same digest in every mode and repeat")


if __name__ == "__main__":
    main()
