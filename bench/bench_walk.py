"""The replay walk's chunked merge (``replay/walk.py``) against a peer given as a git revision of the
same file: one instrument's four streams, and (this tree only, the peer merges four) a pair's eight.

    .venv/bin/python bench/bench_walk.py --peer 6443394 -n 1000000 --repeat 5

Streams as a replay has them: n books at the exchange and at the engine (a feed latency apart, with
jitter, so the engine's stream is out of order now and then), n/2 trades, and n labels a Laya latency
after their books, all seeded. The two merges alternate, one warm-up each first; medians of the warm
runs. Both must give the same entries (else the script stops).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peer import module_at  # noqa: E402

from replay import walk as this  # noqa: E402


def _load(rev: str):
    return module_at(rev, "replay/walk.py")


def _streams(mod, n: int, seed: int, inst: int = 0) -> list:
    kw = {"inst": inst} if inst else {}
    rng = np.random.default_rng(seed)
    b_exch = np.cumsum(rng.integers(1, 200_000_000, n)).astype(np.int64)
    b_loc = b_exch + rng.integers(5_000_000, 40_000_000, n)
    t_exch = np.sort(rng.integers(int(b_exch[0]), int(b_exch[-1]), n // 2)).astype(np.int64)
    b_seq = np.arange(n, dtype=np.int64) * 3 + (inst << 40)
    t_seq = np.arange(n // 2, dtype=np.int64) * 3 + 1 + (inst << 40)
    due = b_loc + 2_000_000
    rank = np.argsort(np.lexsort((b_seq, b_loc))).astype(np.int64)
    return [
        mod.WalkStream(b_exch, 10, b_seq, 0, **kw),
        mod.WalkStream(t_exch, 11, t_seq, 1, **kw),
        mod.WalkStream(b_loc, 20, b_seq, 2, **kw),
        mod.WalkStream(due, 40, rank, 4, **kw),
    ]


def _run(mod, streams, chunk: int) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    w = mod.StreamedWalk(streams, chunk)
    n, check = 0, 0
    while (c := w.next_chunk()) is not None:
        n += len(c[0])
        check = (check * 31 + int(c[3][-1]) + int(c[2][0])) % (1 << 61)
    return time.perf_counter() - t0, n, check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", required=True, help="git revision whose replay/walk.py is the peer")
    ap.add_argument("-n", type=int, default=1_000_000, help="books per instrument")
    ap.add_argument("--chunk", type=int, default=65_536)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    peer = _load(a.peer)
    runs = {
        "this tree, 4 streams": (this, _streams(this, a.n, 1)),
        f"peer {a.peer}, 4 streams": (peer, _streams(peer, a.n, 1)),
        "this tree, 8 streams (a pair)": (
            this,
            _streams(this, a.n // 2, 1, 0) + _streams(this, a.n // 2, 2, 1),
        ),
    }
    got = {k: _run(mod, s, a.chunk) for k, (mod, s) in runs.items()}  # warm-up: compiles
    first, second = list(got.values())[:2]
    if first[1:] != second[1:]:
        sys.exit("the two merges gave different entries: not the same work")
    times: dict[str, list[float]] = {k: [] for k in runs}
    for i in range(a.repeat):
        for k, (mod, s) in runs.items():
            dt, n, _ = _run(mod, s, a.chunk)
            times[k].append(dt)
            print(f"  run {i + 1} {k:>32}: {dt:.3f} s ({n} entries)", flush=True)
    print("\n| merge | median warm s | entries/s |")
    print("|---|---|---|")
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"| {k} | {m:.3f} | {got[k][1] / m:,.0f} |")


if __name__ == "__main__":
    main()
