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
from replay.config import ReplayConfig
from replay.driver import run_replay
from venue.simulator import simulate_session

GOLDEN = {
    # name: (config, decisions digest, full run digest)
    "default": (
        ReplayConfig(),
        "61e600ae8e4ef7da4103a481253d0dfa9f085372ea224691fd1a871eb8dfc7ff",
        "2676f9c31993072395145d14bc4d7c53a24a4459f0940ea4e9bd21e8be1ce47d",
    ),
    "touch_lognormal_entry": (
        ReplayConfig(fill_model="touch", latency_order_entry="lognormal:p5=1ms,p95=8ms"),
        "6ae9f4893163bfa0f58e3bb05b940eb9a2912af65dcdf8b25ca162bb9d202851",
        "4cc6d4ff76c613300c3010796d75c235443417185f8df01b4a5ce96a333f0a20",
    ),
    "conflating_kev_queue": (
        ReplayConfig(kev_queue_policy="conflate", kev_queue_max=1, seed=5),
        "9925cae43c0ed70aa08f69e545094bb7211e5d37082a3754cd37ea663ebadeb2",
        "67d53b867c4a8c6308b9794be35aeeab129f1f3970f025e0174d36116681b05d",
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
