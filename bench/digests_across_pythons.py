#!/usr/bin/env python3
"""Fixed sessions' run digests under several Python interpreters (run by hand; CI has 3.11 only).

Each interpreter needs the project's dependencies and pytest installed (a venv with ``pip install
numpy==X onnxruntime==Y ...`` at the versions of the project's venv: ONNX Runtime and numpy versions can
move the labels or the draws, the interpreter must not). Prints one row per interpreter, configuration
and path (compiled loop / per event): the golden configurations against the digests pinned in
``tests/replay/test_golden_digests.py``, and a portfolio (BTCUSDT and DOGEUSDT, Kev as the pairs hub:
the sums over instruments, the pair fit, sizes in lots of two contracts) against the first
interpreter's digest.

    python bench/digests_across_pythons.py .venv/bin/python /tmp/v3.12/bin/python /tmp/v3.13/bin/python
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.replay.test_golden_digests import GOLDEN
from replay.driver import ReplayConfig, run_replay
from venue.simulator import simulate_session
tmp = Path(sys.argv[1])
one = simulate_session(tmp / "s", minutes=1.0, seed=23)
pair = simulate_session(tmp / "p", symbols=("BTCUSDT", "DOGEUSDT"), minutes=1.0, seed=23)
runs = [(name, one, cfg, decisions, digest) for name, (cfg, decisions, digest) in sorted(GOLDEN.items())]
runs.append(("pairs_hub_btc_doge", pair, ReplayConfig(symbols=("BTCUSDT", "DOGEUSDT"), kev_hub="pairs"),
             None, None))
rows = []
for name, s, cfg, decisions, digest in runs:
    for compiled in (True, False):
        r = run_replay(s, cfg, out_dir=tmp / f"{name}-{compiled}", kernel=compiled)
        m = json.loads((r.run_dir / "manifest.json").read_text())
        rows.append([sys.version.split()[0], name, r.path.split(" (")[0], m["decision_digest"], m["digest"],
                     decisions, digest])
print(json.dumps(rows))
"""


def main() -> int:
    pythons = sys.argv[1:] or [sys.executable]
    print(f"{'python':8} {'config':24} {'path':8} {'run digest':18} {'against':8} verdict")
    ok = True
    first: dict[tuple[str, str], tuple[str, str]] = {}
    for py in pythons:
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run(
                [py, "-c", CHILD, tmp, str(ROOT)],
                capture_output=True,
                text=True,
                env=os.environ | {"PYTHONPATH": str(ROOT)},
            )
        if done.returncode != 0:
            print(f"{py}: exit {done.returncode}\n{done.stderr[-3000:]}")
            return 1
        for ver, name, path, dec, run, pin_dec, pin_run in json.loads(done.stdout.strip().splitlines()[-1]):
            if pin_run is None:
                want, against = first.setdefault((name, path), (dec, run)), "first"
            else:
                want, against = (pin_dec, pin_run), "pinned"
            same = (dec, run) == want
            ok &= same
            print(f"{ver:8} {name:24} {path:8} {run[:16]:18} {against:8} {'equal' if same else 'DIFFERS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
