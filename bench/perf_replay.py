#!/usr/bin/env python3
"""Where a replay's CPU goes, compiled code included: ``perf record`` of warm replays, with numba's
functions named (run by hand; needs Linux ``perf``).

perf names the samples of C libraries (Arrow, Parquet, zstd, CPython) by itself, but numba's code lives
in anonymous memory: without a map it is a column of bare addresses. This writes the map perf reads
(``/tmp/perf-<pid>.map``: start, size, name of each function) from the object code of every compiled
library of the loaded ``engine``/``replay``/``venue`` modules, then profiles replays in that process.

Libraries loaded from numba's cache keep no object code, so the child compiles everything afresh into a
temporary cache (``NUMBA_CACHE_DIR``: about a minute on this machine, not in the profile). A function
that numba inlined into its caller counts as the caller (the loop, ``run_pf``, holds most of the core).

    python bench/perf_replay.py --data /tmp/gb1m --loss-stop-usd 1e12 --runs 3 --top 40
    python bench/perf_replay.py --session SESSION_DIR --runs 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

CHILD = r"""
import os, subprocess, sys, tempfile, time
from pathlib import Path
from numba.core.registry import CPUDispatcher
from engine.risk import RiskLimits
from replay.driver import ReplayConfig, run_replay

session, out, ready, runs, loss = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
risk = {} if loss == "none" else {"risk": RiskLimits(daily_loss_stop_usd=float(loss))}
cfg = ReplayConfig(fill_model="queue_power2", **risk)
run_replay(session, cfg, out_dir=out, overwrite=True)  # compiles into the fresh cache: not profiled
# the compiler's millions of objects out of the collector's way: a replay of a process that loaded its
# core from the cache does not have them (with them, full collections took ~9% of the samples)
import gc
gc.collect()
gc.freeze()

rows, seen = set(), set()
for name, mod in list(sys.modules.items()):
    if name.split(".")[0] not in ("engine", "replay", "venue"):
        continue
    for obj in list(vars(mod).values()):
        if not isinstance(obj, CPUDispatcher) or id(obj) in seen:
            continue
        seen.add(id(obj))
        for cres in obj.overloads.values():
            lib = cres.library
            try:
                code = lib._get_compiled_object()  # the object file numba wrote to its cache
            except RuntimeError:
                continue
            with tempfile.NamedTemporaryFile(suffix=".o") as f:
                f.write(code)
                f.flush()
                nm = subprocess.run(["nm", "-S", "--defined-only", f.name], capture_output=True, text=True)
            for line in nm.stdout.splitlines():
                parts = line.split()
                if len(parts) == 4 and parts[2] in "TtWw":
                    try:
                        addr = lib.get_pointer_to_function(parts[3])
                    except Exception:
                        continue
                    if addr:
                        rows.add((addr, int(parts[1], 16), f"{name}.{obj.__name__}:{parts[3][:90]}"))
with open(f"/tmp/perf-{os.getpid()}.map", "w") as f:
    for addr, size, label in sorted(rows):
        f.write(f"{addr:x} {size:x} {label}\n")
Path(ready).write_text(f"{os.getpid()} {len(rows)}")
time.sleep(2)  # perf attaches
for _ in range(runs):
    r = run_replay(session, cfg, out_dir=out, overwrite=True)
    print(f"run {r.wall_s:.3f} s, {r.snapshots_per_s:,.0f} snapshots/s", flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--session", type=Path, help="a dualhub session directory")
    src.add_argument("--data", type=Path, help="a gen_books directory (books_wide.parquet, trades.parquet)")
    ap.add_argument("-n", type=int, default=0, help="gen_books snapshots to take (0: all)")
    ap.add_argument("--loss-stop-usd", default="none", help="the gateway's loss stop (1e12: kept trading)")
    ap.add_argument("--runs", type=int, default=3, help="warm replays profiled")
    ap.add_argument("--freq", type=int, default=1999, help="perf samples a second")
    ap.add_argument("--top", type=int, default=40, help="symbols printed")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        session = args.session
        if session is None:
            from bench_replay_1m import session_from_gen_books

            session = session_from_gen_books(args.data, tmp / "session", args.n or None)
        ready = tmp / "ready"
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp / "numba"))
        cmd = ["taskset", "-c", "0", sys.executable, "-c", CHILD]
        cmd += [str(session), str(tmp / "run"), str(ready), str(args.runs), args.loss_stop_usd]
        print("compiling the core into a fresh cache (about a minute) ...", flush=True)
        child = subprocess.Popen(cmd, cwd=ROOT, env=env)
        while not ready.exists():
            if child.poll() is not None:
                print("perf_replay: error: the replay process ended before it was ready", file=sys.stderr)
                return 2
            time.sleep(0.5)
        pid, mapped = ready.read_text().split()
        print(f"{mapped} compiled functions mapped; recording pid {pid}", flush=True)
        data = tmp / "perf.data"
        perf = subprocess.Popen(["perf", "record", "-F", str(args.freq), "-p", pid, "-o", str(data)])
        child.wait()
        perf.wait()
        cmd = ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "-g", "none"]
        report = subprocess.run([*cmd, "--stdio"], capture_output=True, text=True)
        Path(f"/tmp/perf-{pid}.map").unlink(missing_ok=True)
        lines = [ln for ln in report.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
        print("\n".join(ln[:200] for ln in lines[: args.top]))
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
