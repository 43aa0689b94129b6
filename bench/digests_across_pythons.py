#!/usr/bin/env python3
"""The golden sessions' digests under other Python interpreters (run by hand; CI has 3.11 only).

Each interpreter needs the project's dependencies installed (a venv with ``pip install numpy==X
onnxruntime==Y ...`` at the versions of the project's venv: ONNX Runtime and numpy versions can move
the labels or the draws, the interpreter must not). Prints one row per interpreter, configuration and
path (compiled loop / per event) with the decision and run digests, and whether they equal the pinned
ones in ``tests/replay/test_golden_digests.py``.

    python bench/digests_across_pythons.py /tmp/v3.12/bin/python /tmp/v3.13/bin/python
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
sys.path.insert(0, sys.argv[2] + "/tests")
from test_golden_digests import GOLDEN
from replay.driver import run_replay
from venue.simulator import simulate_session
tmp = Path(sys.argv[1])
s = simulate_session(tmp / "s", minutes=1.0, seed=23)
rows = []
for name, (cfg, decisions, digest) in sorted(GOLDEN.items()):
    for compiled in (True, False):
        r = run_replay(s, cfg, out_dir=tmp / f"{name}-{compiled}", kernel=compiled)
        m = json.loads((r.run_dir / "manifest.json").read_text())
        rows.append([sys.version.split()[0], name, r.path.split(" (")[0],
                     m["decision_digest"] == decisions, m["digest"] == digest])
print(json.dumps(rows))
"""


def main() -> int:
    pythons = sys.argv[1:] or [sys.executable]
    print(f"{'python':8} {'config':24} {'path':8} {'decisions':9} {'run':5}")
    ok = True
    for py in pythons:
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                [py, "-c", CHILD, tmp, str(ROOT)],
                capture_output=True,
                text=True,
                env=os.environ | {"PYTHONPATH": str(ROOT)},
                check=True,
            ).stdout
        for ver, name, path, dec, run in json.loads(out.strip().splitlines()[-1]):
            ok &= dec and run
            verdict = ["equal" if x else "DIFFERS" for x in (dec, run)]
            print(f"{ver:8} {name:24} {path:8} {verdict[0]:9} {verdict[1]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
