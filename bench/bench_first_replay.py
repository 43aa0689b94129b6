#!/usr/bin/env python3
"""A fresh process's first replay after install, compiling everything: this tree against a git revision
(run by hand).

Each run is a new process with an empty numba cache (``NUMBA_CACHE_DIR`` a new folder), started in its
tree (``cwd``: its packages come before the installed ones), that imports the replay and replays one
small simulated session on the compiled loop: the seconds from its start to the replay's end, compiling
included. The two trees alternate; the medians are printed.

    python bench/bench_first_replay.py --peer HEAD~1 --runs 2
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from peer import child_env, drop_tree, tree_at  # noqa: E402

CHILD = r"""
import sys, time
t0 = time.perf_counter()
import engine
from replay.driver import ReplayConfig, run_replay
assert engine.__file__.startswith(sys.argv[1]), engine.__file__  # this tree's engine, not the installed one
run = run_replay(sys.argv[2], ReplayConfig(), out_dir=sys.argv[3], kernel=True)
print(f"{time.perf_counter() - t0:.2f} {run.path}")
"""


def first_replay(name: str, tree: Path, session: Path, tmp: Path, k: int) -> float:
    env = dict(child_env(), NUMBA_CACHE_DIR=str(tmp / f"numba{k}"))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), str(session), str(tmp / f"run{k}")],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    secs, path = out.stdout.split(maxsplit=1)
    print(f"  {name} run {k}: {float(secs):.1f} s ({path.strip()})", flush=True)
    return float(secs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", required=True, help="the git revision to compare with (e.g. HEAD~1)")
    ap.add_argument("--runs", type=int, default=2, help="cold runs per tree, alternated")
    ap.add_argument("--minutes", type=float, default=1.0, help="the simulated session's length")
    a = ap.parse_args()
    from venue.simulator import simulate_session

    tmp = Path(tempfile.mkdtemp(prefix="first-replay-"))
    session = simulate_session(tmp / "session", minutes=a.minutes, seed=23)
    peer = tree_at(a.peer)
    times: dict[str, list[float]] = {"this tree": [], a.peer: []}
    try:
        k = 0
        for i in range(a.runs):
            order = [("this tree", ROOT), (a.peer, peer)]
            for name, tree in order if i % 2 == 0 else order[::-1]:
                times[name].append(first_replay(name, tree, session, tmp, k))
                k += 1
    finally:
        drop_tree(peer)
    for name, ts in times.items():
        print(f"{name:>12}: first replay (cold compile) median {statistics.median(ts):.1f} s over {len(ts)}")


if __name__ == "__main__":
    main()
