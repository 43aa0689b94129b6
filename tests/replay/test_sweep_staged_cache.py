"""A session behind a URL is copied once per node and its market cache built once there, then reused
by the node's later tasks (replay/ray_sweep.py node_session), without starting Ray: the task itself."""

from replay.ray_sweep import NODE_SESSIONS_ENV, run_task
from replay.sweep import code_version
from venue.simulator import simulate_session


def test_a_url_session_is_staged_and_its_cache_built_once_per_node(tmp_path, monkeypatch):
    session = simulate_session(tmp_path / "remote" / "s", minutes=0.3, seed=3)
    monkeypatch.setenv(NODE_SESSIONS_ENV, str(tmp_path / "node"))
    url = f"file://{session}"
    rows = [
        run_task(
            url,
            {"laya_provider": "cpu", "seed": seed},
            runs_dir=str(tmp_path / "runs"),
            version=code_version(),
        )
        for seed in (1, 2, 3)
    ]
    assert [r["error"] for r in rows] == ["", "", ""]
    assert [r["market_cache"] for r in rows] == ["built", "reused", "reused"]
    assert all(r["session"] == url for r in rows)
    staged = [p for p in (tmp_path / "node").iterdir() if p.is_dir()]
    assert len(staged) == 1 and (staged[0] / "manifest.json").is_file()
