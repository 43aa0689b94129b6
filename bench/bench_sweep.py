#!/usr/bin/env python3
"""A 16-configuration serial sweep of one gen_books session against one fresh replay of it, this tree
beside another (``--base-tree``: a checkout of the code before, e.g. ``git worktree add DIR REV``).

Data: ``../shared/bench/gen_books.py -n N --out DIR`` (``-n`` here takes its first snapshots). The grid
differs in Kev's latency scale, Kev's timeout, a risk limit and the fill model (2 x 2 x 2 x 2), at the
default limits with the daily loss stop out of the way so every run keeps trading. Each tree, in
turn and ``--repeat`` times, in processes of their own (``cwd`` the tree, so its code runs):

* one fresh replay: a process that runs ``run_replay`` once with the grid's base config (it loads the
  compiled core from numba's cache and pages its memory in inside its wall, as ``dualhub replay``);
* the sweep, serially in one process: ``replay.sweep.sweep`` as that tree defines it (this tree's
  defaults: metrics-only rows, the market cache, dropped before each sweep so its first run builds it).

Reported per tree, medians over the repeats: the sweep's wall, its first configuration and the median
and worst of the others (each row's ``wall_s``), the sweep over one replay, peak RSS of the sweep's
process (``VmHWM``), and the machine's load. Every configuration's digest must be the same in both
trees. Run it by hand, never as a test; ``--ray-throughput`` is the Ray beside serial throughput bench
(:func:`ray_main`).

    .venv/bin/python bench/bench_sweep.py --data /tmp/gb1m -n 200000 --base-tree /work/helpers/base
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay_1m import run_dualhub, session_from_gen_books  # noqa: E402
from peer import ROOT, child_env  # noqa: E402

GRID = {
    "base": {"laya_provider": "cpu", "risk.daily_loss_stop_usd": 1e12},
    "grid": {
        "scale_kev": [0.5, 2.0],
        "kev_timeout_ms": [500, 2000],
        "risk.max_position": [0.02, 0.05],
        "fill_model": ["queue_power2", "touch"],
    },
}

_SWEEP = """
import json, re, shutil, sys, time
from pathlib import Path
import pyarrow.parquet as pq
from replay.sweep import parse_grid, sweep
import replay.sweep
grid = parse_grid(json.loads(sys.argv[1]))
session, out = Path(sys.argv[2]), Path(sys.argv[3])
shutil.rmtree(session / "cache", ignore_errors=True)  # the first run builds the market cache (this tree)
t = time.perf_counter()
sweep(grid, [session], out, progress=False, overwrite=True)
wall = time.perf_counter() - t
rows = pq.read_table(out).to_pylist()
hwm = int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
print(json.dumps({"tree": replay.sweep.__file__, "wall": wall, "hwm": hwm,
                  "rows": [{k: r.get(k) for k in ("param_hash", "digest", "wall_s", "error", "market_cache")}
                           for r in rows]}))
"""


def run_sweep(tree: Path, session: Path, out: Path) -> dict:
    os.sync()
    p = subprocess.run(
        [sys.executable, "-c", _SWEEP, json.dumps(GRID), str(session), str(out)],
        capture_output=True,
        text=True,
        cwd=tree,
        env=child_env(),
    )
    if p.returncode:
        raise SystemExit(f"sweep in {tree} failed:\n{p.stderr[-3000:]}")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["tree"].startswith(str(tree)), (got["tree"], tree)  # the tree meant ran
    bad = [r["error"] for r in got["rows"] if r["error"]]
    assert not bad, bad
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, help="gen_books.py output directory")
    ap.add_argument("-n", type=int, default=0, help="the first n snapshots (0 = all)")
    ap.add_argument("--base-tree", type=Path, help="a checkout of the code to compare with")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the code measured (default this tree)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ray-throughput", action="store_true", help="the Ray beside serial throughput bench")
    ap.add_argument("--sessions", type=int, default=4, help="--ray-throughput: simulated sessions")
    ap.add_argument("--minutes", type=float, default=15.0, help="--ray-throughput: their length")
    ap.add_argument("--points", type=int, default=4, help="--ray-throughput: grid points")
    ap.add_argument("--workers", default="1,2", help="--ray-throughput: Ray worker counts")
    ap.add_argument("--memory-mb", type=int, default=1024)
    args = ap.parse_args()
    if args.ray_throughput:
        ray_main(args)
        return
    if args.data is None:
        ap.error("--data is required (gen_books.py output)")
    trees = [("this tree", args.tree.resolve())] + (
        [("base tree", args.base_tree.resolve())] if args.base_tree else []
    )
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as td:
        root = Path(td)
        session = session_from_gen_books(args.data, root / "session", args.n or None)
        books = pq.ParquetFile(next((session / "books15").glob("*.parquet"))).metadata.num_rows
        print(f"session: {books:,} snapshots; {os.cpu_count()} cores, load {_load()}")
        for name, tree in trees:  # untimed: each tree's compiled core into its numba cache
            run_dualhub(session, root / "warm", "queue_power2", 1e12, cwd=tree)
            print(f"{name}: warmed ({tree})")
        res: dict[str, dict[str, list]] = {n: {"replay": [], "sweep": []} for n, _ in trees}
        for r in range(args.repeat):
            for name, tree in trees if r % 2 == 0 else trees[::-1]:  # alternated
                walls, _, rss, _, digest, _ = run_dualhub(
                    session, root / "one", "queue_power2", 1e12, cwd=tree
                )
                s = run_sweep(tree, session, root / f"sweep-{name.split()[0]}-{r}" / "results.parquet")
                res[name]["replay"].append((walls[0], rss, digest))
                res[name]["sweep"].append(s)
                walls_s = [row["wall_s"] for row in s["rows"]]
                print(
                    f"[{r}] {name}: replay {walls[0]:.2f} s; sweep {s['wall']:.2f} s "
                    f"(first {walls_s[0]:.2f}, others median {statistics.median(walls_s[1:]):.2f} "
                    f"max {max(walls_s[1:]):.2f}), "
                    f"peak RSS {s['hwm']:.0f} MB; load {_load()}"
                )
        digests = {
            n: {row["param_hash"]: row["digest"] for row in v["sweep"][0]["rows"]} for n, v in res.items()
        }
        if len(digests) == 2:
            a, b = digests.values()
            assert a == b, "a configuration gave another digest in the other tree"
        print(
            f"\n{len(GRID['grid'])}-axis grid, 16 configurations; every digest equal across trees and repeats"
        )
        print(f"{'tree':<11}{'replay s':>9}{'sweep s':>9}{'first s':>9}{'rest med':>9}{'rest max':>9}"
              f"{'sweep/replay':>13}{'peak MB':>9}")  # fmt: skip
        for name, v in res.items():
            rep = statistics.median(w for w, _, _ in v["replay"])
            sw = statistics.median(s["wall"] for s in v["sweep"])
            first = statistics.median(s["rows"][0]["wall_s"] for s in v["sweep"])
            rest = statistics.median(
                statistics.median(x["wall_s"] for x in s["rows"][1:]) for s in v["sweep"]
            )
            worst = max(max(x["wall_s"] for x in s["rows"][1:]) for s in v["sweep"])
            hwm = max(s["hwm"] for s in v["sweep"])
            cells = f"{rep:>9.2f}{sw:>9.2f}{first:>9.2f}{rest:>9.2f}{worst:>9.2f}{sw / rep:>13.1f}{hwm:>9.0f}"
            print(f"{name:<11}{cells}")


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def ray_main(args: argparse.Namespace) -> None:
    """Sweep throughput (runs/minute): serial in-process beside Ray with 1, 2, ... workers, on simulated
    sessions and a grid of Kev lag scales; all runs of one key must produce one digest."""
    import ray

    from replay.ray_sweep import ray_sweep
    from replay.sweep import parse_grid, sweep
    from venue.simulator import simulate_session

    grid = parse_grid(
        {
            "base": {"seed": 1, "laya_provider": "cpu"},
            "grid": {"scale_kev": [0.5 * (i + 1) for i in range(args.points)]},
        }
    )
    with tempfile.TemporaryDirectory() as td:
        root = Path(td)
        sessions = [
            simulate_session(root / "sessions" / f"s{i}", minutes=args.minutes, seed=i + 1)
            for i in range(args.sessions)
        ]
        n = len(sessions) * args.points
        print(f"{len(sessions)} sessions x {args.minutes:g} min, {args.points} points = {n} runs")
        reference: dict | None = None
        results = []

        def check(out: Path | str) -> None:
            nonlocal reference
            rows = pq.read_table(out).to_pylist()
            assert not any(r["error"] for r in rows)
            got = {(r["session_digest"], r["param_hash"]): r["digest"] for r in rows}
            reference = reference or got
            assert got == reference, "a key produced another digest"

        rates = []
        for r in range(args.repeat):
            out = root / f"serial{r}" / "results.parquet"
            t = time.perf_counter()
            sweep(grid, sessions, out, progress=False)
            rates.append(n / (time.perf_counter() - t) * 60)
            check(out)
        results.append(("serial (in-process)", statistics.median(rates)))
        for w in (int(x) for x in args.workers.split(",")):
            ray.init(address="local", num_cpus=w, include_dashboard=False, logging_level=logging.ERROR)
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
            results.append((f"Ray, {w} worker(s)", statistics.median(rates)))
    for name, rate in results:
        print(f"{name:<22}{rate:>8.0f} runs/min (median)")


if __name__ == "__main__":
    main()
