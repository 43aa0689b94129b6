#!/usr/bin/env python3
"""Where live mode's tick-to-order time goes: stamps along the path of each frame, frames that send an
order beside those that do not.

The live runner is built as in ``bench_tick_path.py`` (paper mode, Laya on the CPU, Kev never asked,
keep-warm on, busy-polling) and fed simulator frames ``--gap-ms`` apart. Its methods are wrapped to
stamp when each step starts: the frame's decode (scan, features, Laya), the clock's dispatch, the paper
exchange's book, the engine's book and label, the compiled step, the hand-over (``_after``) and the
order intent, and ``submit`` to the paper exchange. Printed: the median time from the frame's stamp to
each mark (a frame that sends no order has an ``intent`` mark where live mode's keep-warm builds
one). The wrappers cost ~0.2 us a mark, so the figures sit a little above ``bench_tick_path``'s.
With ``--peer REV`` each run alternates with the same measurement of git revision REV's code (a
worktree of its own, a fresh process each), so a change to the path is measured beside what it
replaced.

    .venv/bin/python bench/bench_tick_stages.py [--frames 20000] [--runs 2] [--peer REV]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import ROOT, child_env, peer_tree  # noqa: E402

MARKS = (
    "decoded",
    "dispatch",
    "paper_book",
    "on_book",
    "on_label",
    "step",
    "after",
    "intent",
    "submit",
)


async def _measure(n_frames: int, gap_s: float, warmup: int) -> dict[str, Any]:
    from bench_tick_path import paper_runner

    from venue.bitget.public_server import simulator_frames

    marks: dict[str, int] = {}

    def wrap(obj: Any, name: str, mark: str) -> None:
        inner = getattr(obj, name)

        def stamped(*a: Any, **k: Any) -> Any:
            marks.setdefault(mark, time.perf_counter_ns())
            return inner(*a, **k)

        setattr(obj, name, stamped)

    runner = paper_runner(
        laya_provider="cpu", kev_min_interval_ms=10**9, kev_url="", tick_keep_warm=True, busy_poll=True
    )  # Kev never asked
    st = runner.syms["BTCUSDT"]
    eng, paper = st.engine, st.paper
    decode = runner.tick.decode

    def decoded(raw: bytes, ts: int, counters: Any) -> list[Any]:
        evs = list(decode(raw, ts, counters))
        marks.setdefault("decoded", time.perf_counter_ns())
        return evs

    runner.tick.decode = decoded
    wrap(runner, "dispatch", "dispatch")
    wrap(paper, "on_book", "paper_book")
    wrap(eng, "on_book", "on_book")
    wrap(eng, "on_label", "on_label")
    import engine.core

    wrap(engine.core.K, "step_label", "step")
    wrap(eng, "_after", "after")
    wrap(eng, "_intent", "intent")
    wrap(paper, "submit", "submit")
    runner.feeding = True
    pump = asyncio.create_task(runner._pump())
    poller = asyncio.create_task(runner.busy_poll())
    frames = [f for _, f in simulator_frames(["BTCUSDT"], minutes=60, seed=11)][:n_frames]
    orders: list[dict[str, float]] = []
    quiet: list[dict[str, float]] = []
    try:
        for i, raw in enumerate(frames):
            marks.clear()
            t0 = time.perf_counter_ns()
            runner.deliver(raw, runner.clock.stamp())
            if i >= warmup and "step" in marks:
                rel = {k: (v - t0) / 1000 for k, v in marks.items() if v >= t0}
                (orders if "submit" in marks else quiet).append(rel)
            await asyncio.sleep(gap_s)
    finally:
        for t in (pump, poller):
            t.cancel()
        await asyncio.gather(pump, poller, return_exceptions=True)

    def med(rows: list[dict[str, float]]) -> dict[str, float]:
        return {
            m: statistics.median(r[m] for r in rows if m in r) for m in MARKS if any(m in r for r in rows)
        }

    return {"orders": med(orders), "n_orders": len(orders), "quiet": med(quiet), "n_quiet": len(quiet)}


def _child(args: argparse.Namespace) -> None:
    import live.runner

    r = asyncio.run(_measure(args.frames, args.gap_ms / 1000, args.warmup))
    print(json.dumps({**r, "code": live.runner.__file__}))


def _run(cwd: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in a fresh process running the code of the tree ``cwd`` (first on its path)."""
    argv = [
        "--child",
        "--frames",
        str(args.frames),
        "--gap-ms",
        str(args.gap_ms),
        "--warmup",
        str(args.warmup),
    ]
    p = subprocess.run(
        [sys.executable, __file__, *argv],
        cwd=cwd,
        env={**child_env(), "PYTHONPATH": str(cwd)},
        capture_output=True,
        text=True,
        check=True,
    )
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["code"].startswith(str(cwd)), (r["code"], cwd)  # the tree meant ran
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=20000, help="simulator frames (about 1 in 5 a book)")
    ap.add_argument("--gap-ms", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--peer", help="git revision measured alternately with this tree")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    with peer_tree(args.peer) as peer:
        trees = [("this tree", ROOT)] + ([(args.peer, peer)] if peer is not None else [])
        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
        for i in range(args.runs):
            for name, cwd in trees:
                r = _run(cwd, args)
                results[name].append(r)
                print(f"run {i} {name}: {r['n_orders']} frames sent an order, {r['n_quiet']} did not")
    print("median us from the frame's stamp to each mark (frames that sent an order | frames that did not)")
    print(f"{'mark':12s}" + "".join(f"{name:>28s}" for name in results))
    for m in MARKS:
        cells = []
        for rs in results.values():
            o = statistics.median(r["orders"].get(m, float("nan")) for r in rs)
            q = statistics.median(r["quiet"].get(m, float("nan")) for r in rs)
            cells.append(f"{o:12.1f} | {q:8.1f}    ")
        print(f"{m:12s}" + "".join(f"{c:>28s}" for c in cells))


if __name__ == "__main__":
    main()
