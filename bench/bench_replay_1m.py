#!/usr/bin/env python3
"""1M-snapshot replay throughput, side by side with hftbacktest on the same data.

Data: ``../shared/bench/gen_books.py -n 1000000 --out DIR`` (Bitget-like books15 snapshots and
trades, seeded). This script turns ``books_wide.parquet`` and ``trades.parquet`` into a dualhub
session (columnar, untimed), then times ``run_replay`` end to end (Parquet in -> event log out) with
Laya labelling every snapshot, the Kev queue, the risk gateway and the queue-aware fill model, and
reports peak RSS. Pass ``--hbt-python`` (a venv with hftbacktest 2.4.4) to run the reference in the
same script, alternating, and print the ratio of medians. ``--peer REV`` runs the same replay with
the code of git revision REV (a worktree of its own) after each of ours: this tree against that one.
hftbacktest's warm figure is the median of its ``--runs`` in one process; ``--runs-per-process 3``
measures dualhub the same way (without it each replay is a fresh process that also loads the
compiled core from numba's cache).

    python bench/bench_replay_1m.py --data /tmp/gb1m --repeat 3 --runs-per-process 3 \
        --hbt-python ~/.cache/dualhub/hbt-venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.store import SessionWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import ROOT, child_env, peer_tree  # noqa: E402

SHARED_BENCH = Path(__file__).resolve().parents[2] / "shared" / "bench"


def session_from_gen_books(data: Path, out: Path, n: int | None, tile: int = 1) -> Path:
    """A dualhub session of gen_books' first ``n`` snapshots and their trades, ``tile`` times end to end
    (each copy shifted in time past the one before, seqs and trade ids continued): a longer session of
    the same market, to show how memory grows with length."""
    books = pq.read_table(data / "books_wide.parquet")
    trades = pq.read_table(data / "trades.parquet")
    if n:
        books = books.slice(0, n)
        last = books.column("ts")[-1].as_py()
        trades = trades.filter(pc.less_equal(trades.column("ts"), last))
    ms = 1_000_000
    b = books.rename_columns(["ts_event", "ts_recv", "exch_seq", *books.column_names[3:]])
    b = b.set_column(0, "ts_event", pc.multiply(b.column("ts_event"), ms))
    b = b.set_column(1, "ts_recv", pc.multiply(b.column("ts_recv"), ms))
    b = b.append_column("seq", pa.array(range(b.num_rows), pa.int64()))
    b = b.append_column("symbol", pa.array(["BTCUSDT"] * b.num_rows))
    t = pa.table(
        {
            "ts_event": pc.multiply(trades.column("ts"), ms),
            "ts_recv": pc.multiply(trades.column("recv_ts"), ms),
            "seq": pa.array(range(trades.num_rows), pa.int64()),
            "symbol": pa.array(["BTCUSDT"] * trades.num_rows),
            "trade_id": pc.cast(trades.column("trade_id"), pa.string()),
            "px": trades.column("price"),
            "sz": trades.column("size"),
            "side": pc.cast(trades.column("side"), pa.string()),
        }
    )
    w = SessionWriter(
        out, source=f"gen_books:{data}" + (f" x{tile}" if tile > 1 else ""), symbols=["BTCUSDT"]
    )
    span = max(pc.max(b.column("ts_recv")).as_py(), pc.max(t.column("ts_recv")).as_py())
    span = span - min(pc.min(b.column("ts_event")).as_py(), pc.min(t.column("ts_event")).as_py()) + 10**9
    for k in range(tile):
        w.add_table("books15", _shifted(b, k * span, k * b.num_rows, ["exch_seq"]))
        tk = _shifted(t, k * span, k * t.num_rows, [])
        if k:
            ids = pc.binary_join_element_wise(tk.column("trade_id"), pa.scalar(f"-{k}"), "")
            tk = tk.set_column(tk.schema.get_field_index("trade_id"), "trade_id", ids)
        w.add_table("trade", tk)
    w.close()
    return out


def _shifted(t: pa.Table, dt: int, dseq: int, more_seqs: list[str]) -> pa.Table:
    if not dt and not dseq:
        return t
    for c, d in [("ts_event", dt), ("ts_recv", dt), ("seq", dseq)] + [(m, dseq) for m in more_seqs]:
        t = t.set_column(t.schema.get_field_index(c), c, pc.add(t.column(c), d))
    return t


def run_dualhub(
    session: Path,
    out: Path,
    fill_model: str,
    loss_stop_usd: float | None = None,
    *,
    kernel: bool = True,
    one_core: bool = False,
    cwd: Path | None = None,
    runs: int = 1,
    config: str = "",
) -> tuple[list[float], list[float], float, int, str, str]:
    """``runs`` replays in one fresh process: ([wall], [rate], peak rss, events, digest, path), one wall
    and rate per run. ``runs`` = 1: a process of its own per replay, so peak RSS is this run's and the
    run loads the compiled core from numba's cache (and pages its memory in) inside its wall. ``runs``
    > 1: runs 1.. are warm in the sense of hftbacktest's ``--runs`` (code loaded, memory paged in);
    peak RSS is then the process's over all of them. ``cwd``: the tree whose code runs. ``config``:
    more ``ReplayConfig`` arguments, as Python source (``"laya_mode='tick'"``)."""
    risk = "" if loss_stop_usd is None else f", risk=RiskLimits(daily_loss_stop_usd={loss_stop_usd!r})"
    code = (
        "import re, sys\n"
        "from engine.risk import RiskLimits\n"
        "from replay.driver import ReplayConfig, run_replay\n"
        f"cfg = ReplayConfig(fill_model={fill_model!r}{risk}{', ' + config if config else ''})\n"
        f"for _ in range({runs}):\n"
        f"    r = run_replay({str(session)!r}, cfg, out_dir={str(out)!r}, overwrite=True,\n"
        f"                   kernel={kernel!r})\n"
        "    print('run', r.wall_s, r.snapshots_per_s, flush=True)\n"
        # VmHWM is this process's peak (ru_maxrss would carry the parent's peak across exec).
        "rss = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) / 1024\n"
        "import replay.driver\n"
        "print(replay.driver.__file__)\n"
        "print(r.path)\n"
        "print(rss, sum(r.counts.values()), r.digest)\n"
    )
    cmd = [sys.executable, "-c", code]
    if one_core:  # the whole process, its writer thread included, on CPU 0
        cmd = ["taskset", "-c", "0", *cmd]
    # the previous run's dirty pages (hftbacktest writes ~GB of npz) are not written back during this one
    os.sync()
    p = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=cwd or ROOT, env=child_env())
    lines = p.stdout.strip().splitlines()
    assert lines[-3].startswith(str(cwd or ROOT)), (lines[-3], cwd)  # the tree meant ran
    each = [ln.split()[1:] for ln in lines if ln.startswith("run ")]
    rss, events, digest = lines[-1].split()
    walls, rates = [float(w) for w, _ in each], [float(r) for _, r in each]
    return walls, rates, float(rss), int(events), digest, lines[-2]


def workload(run: Path) -> str:
    """What the run did, so its rate can be read: orders, fills and risk decisions by reason."""
    ev = run / "events"
    n = {k: pq.ParquetFile(ev / f"{k}.parquet").metadata.num_rows for k in ("order", "fill", "kev_request")}
    risk = pq.read_table(ev / "risk.parquet", columns=["accepted", "reason"])
    by = risk.group_by(["accepted", "reason"]).aggregate([("reason", "count")]).to_pylist()
    by.sort(key=lambda r: -r["reason_count"])
    reasons = ", ".join(f"{r['reason']} {r['reason_count']:,}" for r in by)
    return (
        f"workload: {n['order']:,} order events, {n['fill']:,} fills, {n['kev_request']:,} Kev requests; "
        f"{risk.num_rows:,} risk decisions ({reasons})"
    )


def run_hbt(
    python: str, data: Path, one_core: bool = False, runs: int = 1
) -> tuple[float, float | None] | None:
    """hftbacktest end to end from Parquet, snapshots/s: (feed loop, orders every 100 ms). The first is
    the figure its script reports and the issue quotes; the second, conversion + its order strategy's
    backtest, is the one to set beside a dualhub run that trades. ``runs`` > 1: its script's medians of
    that many conversions and backtests in one process (warm: its arrays paged in, its code compiled);
    1: a single cold run in a fresh process."""
    script = SHARED_BENCH / "bench_hftbacktest.py"
    cmd = [python, str(script), "--runs", str(runs), "--data", str(data)]
    os.sync()
    p = subprocess.run(
        ["taskset", "-c", "0", *cmd] if one_core else cmd,
        capture_output=True,
        text=True,
        env={"BENCH_DIR": str(data.parent), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    out = p.stdout + p.stderr
    # "from 1000000 snapshots x 32 + ..." and "end-to-end parquet -> events -> feed loop: 17.43 s = ...,
    # 57 k snapshots/s": snapshots / seconds (the printed rate is rounded to thousands).
    n = re.search(r"from (\d+) snapshots", out)
    m = re.search(r"end[- ]to[- ]end[^\n]*?:\s*([\d.]+)\s*s\b", out)
    if not (n and m):
        print(out[-2000:])
        return None
    conv = re.search(r"parquet -> events \(read[^:]*:\s*([\d.]+)\s*s", out)
    orders = re.search(r"orders every 100ms[^\n]*\|\s*total\s+([\d.]+)\s*s", out)
    snaps = int(n.group(1))
    with_orders = snaps / (float(conv.group(1)) + float(orders.group(1))) if conv and orders else None
    return snaps / float(m.group(1)), with_orders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="gen_books.py output directory")
    ap.add_argument("-n", type=int, default=0, help="use the first n snapshots (0 = all)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--tile",
        type=int,
        default=1,
        help="replay the data this many times end to end (a K-times longer session; hftbacktest still "
        "runs the data once): peak RSS against length shows whether memory stays flat",
    )
    ap.add_argument("--fill-model", default="queue_power2")
    ap.add_argument("--hbt-python", help="python of a venv with hftbacktest 2.4.4")
    ap.add_argument(
        "--hbt-runs",
        type=int,
        default=3,
        help="hftbacktest's own --runs: its medians of that many runs in one process (warm); 1 = a cold "
        "single run (default 3, the fair comparison with --runs-per-process 3)",
    )
    ap.add_argument(
        "--runs-per-process",
        type=int,
        default=1,
        help="dualhub replays per process, as hftbacktest's --runs: > 1 takes the median of runs 1.. of "
        "each process (warm: compiled core loaded, memory paged in); 1 = a fresh process per replay, "
        "whose wall includes loading the compiled core from numba's cache",
    )
    ap.add_argument(
        "--loss-stop-usd",
        type=float,
        help="the risk gateway's daily loss stop (default: RiskLimits' 100 USD, which this data trips early, "
        "after which most quotes are rejected); a large value keeps the strategy trading",
    )
    ap.add_argument(
        "--one-core",
        action="store_true",
        help="pin each run (dualhub with its Parquet writer thread, and hftbacktest) to CPU 0 with taskset",
    )
    ap.add_argument(
        "--python-engine",
        action="store_true",
        help="drive the engine per event instead of the compiled loop (run_replay(kernel=False)): the A/B",
    )
    ap.add_argument("--peer", help="git revision whose code runs the same replay after each of ours")
    args = ap.parse_args()
    with peer_tree(args.peer) as peer:
        _bench(args, peer)


def _bench(args: argparse.Namespace, peer: Path | None) -> None:
    with tempfile.TemporaryDirectory() as td:
        session = session_from_gen_books(args.data, Path(td) / "s", args.n or None, args.tile)
        ours, theirs, theirs_orders, digests, peers = [], [], [], set(), []
        hbt_kind = f"warm, median of its {args.hbt_runs} runs" if args.hbt_runs > 1 else "cold single run"
        k = args.runs_per_process
        kind = f"median of runs 1..{k - 1} of one process" if k > 1 else "a fresh process"
        for i in range(args.repeat):
            walls, rates, rss, events, digest, path = run_dualhub(
                session,
                Path(td) / "run",
                args.fill_model,
                args.loss_stop_usd,
                kernel=not args.python_engine,
                one_core=args.one_core,
                runs=k,
            )
            rate = statistics.median(rates[1:]) if k > 1 else rates[0]
            ours.append(rate)
            digests.add(digest)
            print(
                f"dualhub run {i} ({kind}): {rate:,.0f} snapshots/s (each run: "
                f"{', '.join(f'{w:.1f} s' for w in walls)}), "
                f"peak RSS {rss:,.0f} MB, {events:,} events out; engine: {path}"
            )
            if i == 0:
                print(workload(Path(td) / "run"))
            if peer is not None:
                walls, rates, rss, events, digest, path = run_dualhub(
                    session, Path(td) / "run", args.fill_model, args.loss_stop_usd,
                    kernel=not args.python_engine, one_core=args.one_core, cwd=peer, runs=k,
                )  # fmt: skip
                rate = statistics.median(rates[1:]) if k > 1 else rates[0]
                peers.append(rate)
                print(
                    f"  {args.peer} run {i}{' (cold)' if i == 0 and k == 1 else ''}: {rate:,.0f} snapshots/s "
                    f"(each run: {', '.join(f'{w:.1f} s' for w in walls)}), peak RSS {rss:,.0f} MB, "
                    f"{events:,} events out; same digest: {digest in digests}"
                )
            if args.hbt_python:
                r = run_hbt(args.hbt_python, args.data, args.one_core, args.hbt_runs)
                if r:
                    theirs.append(r[0])
                    line = f"hftbacktest run {i} ({hbt_kind}): {r[0]:,.0f} snapshots/s end to end (feed loop)"
                    if r[1]:
                        theirs_orders.append(r[1])
                        line += f", {r[1]:,.0f} with its order strategy"
                    print(line)
        med = statistics.median(ours)
        print(
            f"dualhub median: {med:,.0f} snapshots/s (fill model {args.fill_model}"
            f"{', one core' if args.one_core else ''}); "
            f"digests identical: {len(digests) == 1}"
        )

        # With one replay per process, our run 0 compiles whatever its tree's cache lacks (cold after an
        # edit to the core): it is set aside. With several per process every figure is already warm.
        def warm(v: list[float]) -> list[float]:
            return v if k > 1 else (v[1:] or v)

        if peers:
            mine = statistics.median(warm(ours))
            print(
                f"warm medians: this tree {mine:,.0f}, {args.peer} {statistics.median(warm(peers)):,.0f} "
                f"snapshots/s; ratio {mine / statistics.median(warm(peers)):.3f}"
            )
        if theirs and args.hbt_runs > 1:
            med = statistics.median(warm(ours))
            print(f"dualhub warm median ({kind}): {med:,.0f} snapshots/s")
        if theirs:
            ref = statistics.median(theirs)
            print(
                f"hftbacktest ({hbt_kind}) median: {ref:,.0f} snapshots/s; "
                f"ratio dualhub/hftbacktest = {med / ref:.3f}"
            )
        if theirs_orders:
            ref = statistics.median(theirs_orders)
            print(
                f"hftbacktest ({hbt_kind}) with orders every 100 ms, median: {ref:,.0f} snapshots/s; "
                f"ratio dualhub/that = {med / ref:.3f}"
            )
        print(f"this process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")


if __name__ == "__main__":
    main()
