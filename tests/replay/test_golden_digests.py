"""Golden digests: fixed sessions replayed under fixed configurations give these exact run digests.

A change to any decision (risk rule, quoting, Kev policy, fill model, matching, latency draw) or to the
run's layout changes a digest here. When the change is intended, replace the pinned value in the same
commit and say why in its message; when it is not, this is the test that catches it.
"""

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from engine.risk import RiskLimits
from replay.driver import ReplayConfig, run_replay
from venue.simulator import simulate_session

GOLDEN = {
    # name: (config, decisions digest, full run digest)
    "default": (
        ReplayConfig(),
        "b6987428e09d3d2971a9188941331ce719a81cf09cea5231fd658f10b47ab378",
        "420d47b235a74b0ef2c07d36405a54ff261e55ca78c6a663b77565f9a9444eed",
    ),
    "touch_lognormal_entry": (
        ReplayConfig(fill_model="touch", latency_order_entry="lognormal:p5=1ms,p95=8ms"),
        "85c5934a1efffaf6365b8f10f278faba573c4adbd57ef0c870fe54ae9cbe3441",
        "7a58463efd63c96b9a755677489b6c44aad08f577f19e00c8da3196e9b33627a",
    ),
    "conflating_kev_queue": (
        ReplayConfig(kev_queue_policy="conflate", kev_queue_max=1, seed=5),
        "6a6c1cc53bb22951078b399a106d372bea5aaaa6f42fed7ed4848430b10621fd",
        "9b096d68c0f7bb7be74a6d06b8bb8e603662b5c80f7d050dba2b7ccc6c81abfb",
    ),
}


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("gold") / "s", minutes=1.0, seed=23)


@pytest.mark.parametrize("name", sorted(GOLDEN))
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled_loop", "per_event"])
def test_fixed_session_replays_to_its_golden_digest(session, tmp_path, name, compiled):
    config, decisions, digest = GOLDEN[name]
    run = run_replay(session, config, out_dir=tmp_path / "run", kernel=compiled)
    manifest = orjson.loads((run.run_dir / "manifest.json").read_bytes())
    assert manifest["decision_digest"] == decisions
    assert manifest["digest"] == digest
    orders = (run.run_dir / "events" / "order.parquet").stat().st_size
    assert orders > 1_000  # the session trades: the digests cover orders and fills, not an empty run


def test_a_loss_stop_that_binds_changes_the_decisions(session, tmp_path):
    tight = ReplayConfig(risk=RiskLimits(daily_loss_stop_usd=1e-6))
    run = run_replay(session, tight, out_dir=tmp_path / "run")
    manifest = orjson.loads((run.run_dir / "manifest.json").read_bytes())
    assert manifest["decision_digest"] != GOLDEN["default"][1]


def test_the_compiled_core_read_as_plain_python_gives_the_same_run(session, tmp_path):
    # NUMBA_DISABLE_JIT=1 runs the very source the compiler reads as ordinary Python: the readable
    # reference of the compiled decisions is that source, not a second copy.
    script = (
        "import sys, orjson; from pathlib import Path; from replay.driver import run_replay, ReplayConfig\n"
        "for k in (True, False):\n"
        "    out = Path(sys.argv[2]) / str(k)\n"
        "    r = run_replay(Path(sys.argv[1]), ReplayConfig(), out_dir=out, kernel=k)\n"
        "    print(orjson.loads((r.run_dir / 'manifest.json').read_bytes())['decision_digest'])"
    )
    env = os.environ | {"NUMBA_DISABLE_JIT": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(session), str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert out.stdout.split()[-2:] == [GOLDEN["default"][1]] * 2  # the compiled loop and per event
