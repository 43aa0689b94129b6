#!/usr/bin/env python3
"""Portfolio replay throughput and peak RSS: two instruments by default (issue 18's speed figure).

Data: ``../shared/bench/gen_books.py -n N --out DIR``. The session holds gen_books' first ``n / K``
snapshots (and their trades) K times (``--instruments K``, default 2): as BTCUSDT, and as ETHUSDT
(then SOLUSDT, XRPUSDT, ...) with every price shifted by ``--shift`` (same tick) and every time by
1 ms more each, so the books interleave: ``n`` snapshots in all.
Each run is a fresh process (peak RSS is its own; ``--runs-per-process K``: K replays in it, the median
of runs 1.. reported, warm as hftbacktest's ``--runs``), alternating the portfolio on the compiled loop with
its peers: the same portfolio with the engine driven per event, the single-instrument replay of
the ``n`` BTCUSDT snapshots on the compiled loop, and with ``--peer REV`` the portfolio on the
compiled loop of the repository at git revision REV (a worktree of its own). Medians of the warm
runs; run 0 of each is cold and printed as such.

    python bench/bench_portfolio.py --data /tmp/gb1m -n 1000000 --repeat 3 --one-core [--peer REV]

``--kev-hub``: Kev as the pairs hub, every command's legs going out as one unit (engine/legs.py).
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
from bench_replay_1m import session_from_gen_books  # noqa: E402
from peer import ROOT, child_env, peer_tree  # noqa: E402

SYMBOLS = ("BTCUSDT", "ETHUSDT", "SOLUSDT", "XRPUSDT", "DOGEUSDT", "ADAUSDT", "AVAXUSDT", "LINKUSDT")


def pair_session(data: Path, out: Path, n: int, shift: float, k: int = 2) -> Path:
    """BTCUSDT and k - 1 copies of it as ETHUSDT, SOLUSDT, ... (copy i: prices + i x ``shift``, times
    + i ms), n / k snapshots each."""
    symbols = list(SYMBOLS[:k])
    with tempfile.TemporaryDirectory() as tmp:
        one = session_from_gen_books(data, Path(tmp) / "one", n // k)
        books = pq.read_table(sorted((one / "books15").glob("*.parquet")))
        trades = pq.read_table(sorted((one / "trade").glob("*.parquet")))
    ms = 1_000_000
    px_cols = [c for c in books.column_names if "_px_" in c]

    def copy(t: pa.Table, prices: list[str], i: int) -> pa.Table:
        schema = t.schema
        for c in prices:
            t = t.set_column(t.schema.get_field_index(c), c, pc.add(t.column(c), i * shift))
        for c in ("ts_event", "ts_recv"):
            t = t.set_column(t.schema.get_field_index(c), c, pc.add(t.column(c), i * ms))
        t = t.set_column(t.schema.get_field_index("seq"), "seq", pc.add(t.column("seq"), i * t.num_rows))
        sym = t.schema.get_field_index("symbol")
        return t.set_column(sym, "symbol", pa.array([symbols[i]] * t.num_rows)).cast(schema)

    w = SessionWriter(out, source=f"gen_books:{data} as {k} instruments", symbols=symbols)
    for name, t in (
        ("books15", pa.concat_tables([books, *(copy(books, px_cols, i) for i in range(1, k))])),
        ("trade", pa.concat_tables([trades, *(copy(trades, ["px"], i) for i in range(1, k))])),
    ):
        t = t.sort_by([("ts_recv", "ascending"), ("seq", "ascending")])  # one stream, in arrival order
        t = t.set_column(t.schema.get_field_index("seq"), "seq", pa.array(range(t.num_rows), pa.int64()))
        w.add_table(name, t)
    w.close()
    return out


def run(
    session: Path,
    out: Path,
    cfg: str,
    kernel: bool,
    one_core: bool,
    cwd: Path | None = None,
    runs: int = 1,
) -> tuple[float, float, str]:
    """``runs`` replays in one fresh process (``cwd``: the tree whose code runs; this one by default):
    (rate, peak RSS, engine). One: the replay's own process, which loads the compiled core from numba's
    cache inside its wall. More: the median rate of runs 1.. (warm, as hftbacktest's ``--runs``), and the
    process's peak RSS over all of them."""
    code = (
        "import re, statistics\n"
        "from replay.driver import ReplayConfig, run_replay\n"
        "rates = []\n"
        f"for _ in range({runs}):\n"
        f"    r = run_replay({str(session)!r}, ReplayConfig({cfg}), out_dir={str(out)!r}, overwrite=True,\n"
        f"                   kernel={kernel!r})\n"
        "    rates.append(r.snapshots_per_s)\n"
        "rss = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) / 1024\n"
        "import replay.driver\n"
        "print(replay.driver.__file__)\n"
        "print(r.path)\n"
        "print(statistics.median(rates[1:] or rates), rss)\n"
    )
    cmd = [sys.executable, "-c", code]
    if one_core:
        cmd = ["taskset", "-c", "0", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=cwd or ROOT, env=child_env())
    lines = p.stdout.strip().splitlines()
    assert lines[-3].startswith(str(cwd or ROOT)), (lines[-3], cwd)  # the tree meant ran
    rate, rss = lines[-1].split()
    return float(rate), float(rss), lines[-2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("-n", type=int, default=1_000_000, help="snapshots in all (n / K per symbol)")
    ap.add_argument("--instruments", type=int, default=2, choices=range(2, len(SYMBOLS) + 1), metavar="K")
    ap.add_argument("--shift", type=float, default=1000.0, help="each copy's price offset (a tick multiple)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--one-core", action="store_true")
    ap.add_argument(
        "--runs-per-process",
        type=int,
        default=1,
        help="replays per process: > 1 reports the median of runs 1.. of each (warm: core loaded, memory "
        "paged in); 1 = a fresh process per replay, whose wall includes loading the compiled core",
    )
    ap.add_argument("--peer", help="git revision whose compiled portfolio loop runs alternated with this one")
    ap.add_argument(
        "--compiled-only", action="store_true", help="leave out the per-event and one-instrument runs"
    )
    ap.add_argument(
        "--kev-hub",
        action="store_true",
        help="Kev as the pairs hub (kev_hub='pairs'): its commands go out as units, legs checked for "
        "legging (engine/legs.py); the peer runs the same config",
    )
    a = ap.parse_args()
    with peer_tree(a.peer) as peer:
        _bench(a, peer)


def _bench(a: argparse.Namespace, peer: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ni = a.instruments
        pair = pair_session(a.data, Path(tmp) / "pair", a.n, a.shift, ni)
        pf = f"symbols={SYMBOLS[:ni]!r}" + (", kev_hub='pairs'" if a.kev_hub else "")
        runs = {f"portfolio, {ni} instruments, compiled loop": (pair, pf, True, None)}
        if not a.compiled_only:
            single = session_from_gen_books(a.data, Path(tmp) / "single", a.n)
            runs[f"portfolio, {ni} instruments, per event"] = (pair, pf, False, None)
            runs["one instrument, compiled loop"] = (single, "", True, None)
        if peer is not None:
            runs[f"portfolio, {ni} instruments, compiled loop at {a.peer}"] = (pair, pf, True, peer)
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
        for i in range(a.repeat):
            for name, (session, cfg, kernel, cwd) in runs.items():
                rate, rss, path = run(
                    session, Path(tmp) / "run", cfg, kernel, a.one_core, cwd, a.runs_per_process
                )
                got[name].append((rate, rss))
                cold = i == 0 and a.runs_per_process == 1
                print(f"run {i}{' (cold)' if cold else ''} {name}: {rate:,.0f} snapshots/s, "
                      f"peak RSS {rss / 1024:.2f} GB [{path}]", flush=True)  # fmt: skip
        k = a.runs_per_process
        kind = f"each the median of runs 1..{k - 1} of a process" if k > 1 else f"runs 1..{a.repeat - 1}"
        print(f"\n{a.n:,} snapshots in all; medians of the warm runs ({kind})")
        for name, vals in got.items():
            warm = vals if k > 1 else (vals[1:] or vals)
            rate = statistics.median(r for r, _ in warm)
            # A tree's first process may compile its core (a peer's fresh worktree always does): its peak
            # RSS is that compile's, shown apart, whether it replayed once or several times.
            rss = max(m for _, m in (vals[1:] or vals))
            cold = f" (first process {vals[0][1] / 1024:.2f} GB)" if len(vals) > 1 else ""
            print(f"  {name:52s} {rate:>10,.0f} snapshots/s   peak RSS {rss / 1024:.2f} GB{cold}")


if __name__ == "__main__":
    main()
