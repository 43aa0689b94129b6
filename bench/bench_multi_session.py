#!/usr/bin/env python3
"""Several consecutive sessions replayed as one run (replay/sessions.py): wall time and peak RSS for a
range of 2 sessions against one of 10 (flat memory is the target: a range's RSS should not grow with
its number of sessions), with two peers: one session's replay, and one session as long as the longest
range; alternated, medians reported.

Data: ``../shared/bench/gen_books.py -n N --out DIR`` (written here into a temporary folder when
``--data`` is not given). Each session is gen_books' first ``--per-session`` snapshots and their
trades, shifted in time past the one before (an hour between sessions), seqs from 0 in each, as a
recorder writes them: the range renumbers them on. Each replay is a fresh process
(``bench_replay_1m.run_dualhub``: peak RSS is the process's VmHWM); the range directory is written
once per range before its replays (its build time and peak RSS reported apart, in a process of its
own), so the replays compare the walks alone.

    python bench/bench_multi_session.py --per-session 20000 --sessions 2,10 --repeat 2
"""

from __future__ import annotations

import argparse
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
from bench_replay_1m import SHARED_BENCH, run_dualhub, session_from_gen_books  # noqa: E402
from peer import ROOT, child_env  # noqa: E402

HOUR_NS = 3_600_000_000_000


def _tables(data: Path, n: int) -> tuple[pa.Table, pa.Table]:
    """gen_books' first ``n`` snapshots and their trades as a session's books15 and trade columns."""
    books = pq.read_table(data / "books_wide.parquet").slice(0, n)
    last = books.column("ts")[-1].as_py()
    trades = pq.read_table(data / "trades.parquet")
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
    return b, t


def write_sessions(data: Path, folder: Path, n: int, count: int) -> list[Path]:
    """``count`` sessions of ``n`` snapshots each, one after another (an hour apart), seqs from 0."""
    b, t = _tables(data, n)
    lo = min(pc.min(b.column("ts_event")).as_py(), pc.min(t.column("ts_event")).as_py())
    hi = max(pc.max(b.column("ts_recv")).as_py(), pc.max(t.column("ts_recv")).as_py())
    span = hi - lo + HOUR_NS
    out = []
    for k in range(count):
        path = folder / f"s{k:02d}"
        if not (path / "manifest.json").exists():
            w = SessionWriter(path, source=f"gen_books:{data} part {k}", symbols=["BTCUSDT"])
            for stream, table in (("books15", b), ("trade", t)):
                shifted = table
                for c in ("ts_event", "ts_recv"):
                    i = shifted.schema.get_field_index(c)
                    shifted = shifted.set_column(i, c, pc.add(shifted.column(c), k * span))
                if stream == "trade" and k:
                    i = shifted.schema.get_field_index("trade_id")
                    ids = pc.binary_join_element_wise(shifted.column("trade_id"), pa.scalar(f"-{k}"), "")
                    shifted = shifted.set_column(i, "trade_id", ids)
                w.add_table(stream, shifted)
            w.close()
        out.append(path)
    return out


def build_range(folder: Path) -> tuple[Path, float, float]:
    """The range directory of the sessions in ``folder``, written in a process of its own: (path, wall s,
    peak RSS MB)."""
    code = (
        "import re, sys, time\n"
        "from replay.sessions import resolve\n"
        "t0 = time.perf_counter()\n"
        f"p = resolve({str(folder)!r})\n"
        "wall = time.perf_counter() - t0\n"
        "rss = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) / 1024\n"
        "print(p, wall, rss)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=child_env()
    )
    path, wall, rss = p.stdout.strip().splitlines()[-1].rsplit(" ", 2)
    return Path(path), float(wall), float(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, help="gen_books.py output directory (default: generated here)")
    ap.add_argument("--per-session", type=int, default=20_000, help="snapshots per session")
    ap.add_argument("--sessions", default="2,10", help="range sizes to compare, comma-separated")
    ap.add_argument("--repeat", type=int, default=2, help="alternated rounds (medians reported)")
    ap.add_argument("--fill-model", default="queue_power2")
    ap.add_argument("--work", type=Path, help="keep the sessions here (default: a temporary folder)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sessions.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-multi-") as tmp:
        work = args.work or Path(tmp)
        data = args.data
        if data is None:
            data = work / "gen_books"
            if not (data / "books_wide.parquet").exists():
                subprocess.run(
                    [
                        sys.executable,
                        str(SHARED_BENCH / "gen_books.py"),
                        "-n",
                        str(args.per_session),
                        "--out",
                        str(data),
                        "--no-json",
                    ],
                    check=True,
                    capture_output=True,
                )
        # one folder per range size, each holding that many sessions (the same first ones)
        ranges: dict[int, Path] = {}
        for count in sizes:
            folder = work / f"range{count}"
            write_sessions(data, folder, args.per_session, count)
            path, wall, rss = build_range(folder)
            ranges[count] = path
            print(f"range of {count}: written in {wall:.2f} s, peak RSS {rss:.0f} MB ({path.name})")
        single = work / f"range{sizes[0]}" / "s00"
        # the peer of the longest range: one session as long (the same snapshots end to end, seqs
        # continued), so what the range adds is told from what the driver holds for a longer tape
        long = work / f"long{sizes[-1]}"
        if not (long / "manifest.json").exists():
            session_from_gen_books(data, long, args.per_session, tile=sizes[-1])
        runs = {
            "1 session": single,
            **{f"{c} sessions": ranges[c] for c in sizes},
            f"1 session x{sizes[-1]} long": long,
        }
        walls: dict[str, list[float]] = {k: [] for k in runs}
        rsss: dict[str, list[float]] = {k: [] for k in runs}
        books: dict[str, int] = {}
        run_dualhub(single, work / "out", args.fill_model)  # warm-up: a compile (an edited tree) is not timed
        for r in range(args.repeat):
            order = list(runs) if r % 2 == 0 else list(reversed(runs))  # alternated
            for name in order:
                w, _, rss, _, digest, path = run_dualhub(runs[name], work / "out", args.fill_model)
                walls[name].append(w[0])
                rsss[name].append(rss)
                books[name] = int(
                    sum(pq.read_metadata(f).num_rows for f in (runs[name] / "books15").glob("part-*.parquet"))
                )
                print(f"  round {r + 1} {name}: {w[0]:.2f} s, {rss:.0f} MB, {path}", flush=True)
        print(f"\nper session {args.per_session:,} snapshots; medians of {args.repeat} (fresh process each):")
        for name in runs:
            wm, rm = statistics.median(walls[name]), statistics.median(rsss[name])
            print(
                f"  {name:>20}: {books[name]:>10,} snapshots  {wm:7.2f} s  "
                f"({books[name] / wm:,.0f} snapshots/s)  peak RSS {rm:6.0f} MB"
            )
        a, b = f"{sizes[0]} sessions", f"{sizes[-1]} sessions"
        ratio = statistics.median(rsss[b]) / statistics.median(rsss[a])
        print(f"  peak RSS {b} / {a}: {ratio:.2f}x (flat memory: ~1x)")
        same = statistics.median(rsss[b]) / statistics.median(rsss[f"1 session x{sizes[-1]} long"])
        print(f"  peak RSS {b} / one session as long: {same:.2f}x (what the range itself adds)")


if __name__ == "__main__":
    main()
