"""The live write-ahead journal's cost (live/wal.py): fsync per record against group commit.

Each policy journals the same records, one label row per "turn" (what a frame adds), and every
``--order-every``-th turn an order table as the core hands it over (what a decision adds):

- ``fsync-per-record``: ``fsync_ms=0``, commit after every turn: write + fsync on the loop;
- ``group-commit``: ``fsync_ms=50`` (the live default), commit after every turn: one write on the loop,
  a background thread fsyncs every 50 ms;
- ``runner``: what ``dualhub live`` does: commit only on order turns (and every 200 ms: not modelled,
  the run here is shorter), group commit.

And the tick path's share, peers alternated: a label row appended to the run's log without and with
the journal (``EventLog.append`` vs ``JournaledLog.append``), and the check the runner makes after
every turn (does the core hold rows to journal: its row counts compared as bytes).

Reported per policy (warm medians over ``--rounds``, policies alternated): records/s, the on-loop
cost of a commit (p50/p99 us), fsyncs and their latency (p50/p99 us). The journal lives in ``--dir``
(default: a fresh directory beside this script, on the repository's disk; /tmp may be tmpfs, where
fsync costs nothing).

    python bench/bench_wal.py [--turns 2000] [--rounds 5] [--order-every 20] [--dir PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from engine.eventlog import EventLog
from engine.events import STREAMS
from live.wal import JournaledLog, LiveWal

HEADER = {"run": "bench", "mode": "paper", "manifest": {"kind": "live"}}
NO_SEQ = pa.schema([f for f in STREAMS["order"].schema if f.name != "seq"])
POLICIES = {"fsync-per-record": (0, True), "group-commit": (50, True), "runner": (50, False)}


def _label(i: int) -> tuple:
    return (i, i + 1, "BTCUSDT", i, i, "HOLD", 0.7, 0.1, 0.1, 0.05, 0.05)


def _orders(i: int) -> pa.Table:
    n = 3
    return pa.Table.from_pydict(
        {
            "ts_event": [i] * n,
            "ts_recv": [i + 1] * n,
            "client_oid": [f"dh-{i * n + k}" for k in range(n)],
            "symbol": ["BTCUSDT"] * n,
            "kind": ["new", "cancel", "ack"],
            "side": ["buy", "sell", "buy"],
            "order_type": ["limit"] * n,
            "px": [30000.1, 30000.2, 30000.1],
            "qty": [0.01] * n,
            "reason": [""] * n,
        },
        schema=NO_SEQ,  # as the core hands its rows over
    )


def _pct(xs: list[int], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000


def run(policy: str, d: Path, turns: int, order_every: int) -> dict[str, float]:
    fsync_ms, every_turn = POLICIES[policy]
    path = d / f"{policy}.wal"
    path.unlink(missing_ok=True)
    wal = LiveWal(path, HEADER, fsync_ms=fsync_ms)
    commit_ns: list[int] = []
    t0 = time.perf_counter_ns()
    for i in range(turns):
        wal.rows.append(("label", _label(i)))
        wal.latency.append(("laya", i, 400))
        order_turn = i % order_every == 0
        if order_turn:
            wal.tables.append(("order", _orders(i)))
        if every_turn or order_turn:
            c0 = time.perf_counter_ns()
            wal.commit()
            commit_ns.append(time.perf_counter_ns() - c0)
    elapsed = time.perf_counter_ns() - t0
    stats = wal.close()
    fs = wal.writer.fsync_ns
    return {
        "records_per_s": stats["records"] / (elapsed / 1e9),
        "turns_per_s": turns / (elapsed / 1e9),
        "commit_p50_us": _pct(commit_ns, 0.5),
        "commit_p99_us": _pct(commit_ns, 0.99),
        "fsyncs": stats["fsyncs"],
        "fsync_p50_us": _pct(fs, 0.5),
        "fsync_p99_us": _pct(fs, 0.99),
        "bytes": stats["bytes"],
    }


def tick_share(d: Path, n: int, rounds: int) -> dict[str, float]:
    """ns per label append without and with the journal, and per end-of-turn check."""
    wal = LiveWal(d / "tick.wal", HEADER, fsync_ms=50)
    row = _label(1)
    nout = np.zeros(8, dtype=np.int64)
    no_rows = bytes(nout.nbytes)
    out: dict[str, list[float]] = {"EventLog.append": [], "JournaledLog.append": [], "turn check": []}
    for _ in range(rounds + 1):  # the first round warms up
        for name, log in (
            ("EventLog.append", EventLog(None)),
            ("JournaledLog.append", JournaledLog(None, wal)),
        ):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                log.append("label", row)
            out[name].append((time.perf_counter_ns() - t0) / n)
            wal.rows.clear()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            if nout.tobytes() != no_rows:  # as live/runner.py's _commit_wal
                break
        out["turn check"].append((time.perf_counter_ns() - t0) / n)
    wal.close()
    return {k: statistics.median(v[1:]) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--order-every", type=int, default=20)
    ap.add_argument("--dir", type=Path, default=None)
    a = ap.parse_args()
    base = a.dir or Path(__file__).resolve().parent
    d = Path(tempfile.mkdtemp(prefix="bench-wal-", dir=base))
    try:
        st = os.statvfs(d)
        print(f"journal directory {d} (block size {st.f_bsize})")
        for policy in POLICIES:  # warm-up: imports, page cache, the IPC writer
            run(policy, d, min(200, a.turns), a.order_every)
        results: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
        for _ in range(a.rounds):
            for policy in POLICIES:  # alternated: a disk's mood affects every policy alike
                results[policy].append(run(policy, d, a.turns, a.order_every))
        print(
            f"{a.turns} turns (a label row and a latency each; an order table every {a.order_every}), "
            f"median of {a.rounds} rounds"
        )
        cols = list(next(iter(results.values()))[0])
        print(f"{'policy':18s} " + " ".join(f"{c:>14s}" for c in cols))
        for policy, rs in results.items():
            med = {c: statistics.median(r[c] for r in rs) for c in cols}
            print(f"{policy:18s} " + " ".join(f"{med[c]:14.1f}" for c in cols))
        print("tick path share (ns each, median):")
        for k, v in tick_share(d, 20_000, a.rounds).items():
            print(f"  {k:22s} {v:8.0f}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
