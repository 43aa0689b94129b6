"""``dualhub sweep`` on a real local Ray instance: complete results, serial digests, failures as rows,
resume (also after a kill), file:// URLs for sessions and results, joining a cluster by address."""

import os
import signal
import subprocess
import sys
import time

import duckdb
import pyarrow.parquet as pq
import pytest
import ray  # the dev extra installs it (dualhub[scale]); a missing Ray fails, never skips

from dualhub.cli import main
from replay.ray_sweep import ray_sweep
from replay.sweep import parse_grid, run_one
from tests.helpers import REPO
from venue.simulator import simulate_session

pytestmark = pytest.mark.slow  # starts Ray clusters

GRID_TOML = """
[base]
seed = 3
laya_provider = "cpu"

[grid]
fill_model = ["touch", "through"]
"risk.max_position" = [0.02, 0.05]
scale_kev = [1, 2, 4]
"""
# A part of GRID_TOML: the same parameter sets, so the same keys and digests.
SMALL_TOML = """
[base]
seed = 3
laya_provider = "cpu"
fill_model = "touch"
"risk.max_position" = 0.02

[grid]
scale_kev = [1, 2, 4]
"""
N_RUNS = 2 * 12
RAY_INIT = {"num_cpus": 2, "include_dashboard": False, "object_store_memory": 100 << 20}
MEMORY = ["--memory-mb", "512"]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", logging_level="WARNING", **RAY_INIT)
    # the fault-injecting runners below travel to the workers by value (tests/ is not importable there)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray.get_runtime_context().gcs_address
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.shutdown()


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-sweep") / "sessions"
    for seed in (1, 2):
        simulate_session(root / f"s{seed}", minutes=0.3, seed=seed)
    return root


@pytest.fixture(scope="module")
def serial(sessions, tmp_path_factory):
    """The grid run serially in this process (--serial): {(session digest, param hash): row}."""
    tmp = tmp_path_factory.mktemp("serial")
    (tmp / "grid.toml").write_text(GRID_TOML)
    out = tmp / "results.parquet"
    cmd = ["sweep", str(tmp / "grid.toml"), "--sessions", str(sessions / "*"), "--out", str(out)]
    assert main([*cmd, "--serial", "--no-progress"]) == 0
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == N_RUNS and not any(r["error"] for r in rows)
    assert {r["peak_rss_scope"] for r in rows} == {"process"}  # this process's peak so far
    return {(r["session_digest"], r["param_hash"]): r for r in rows}


def _cmd(tmp_path, sessions, grid=GRID_TOML, out=None):
    (tmp_path / "grid.toml").write_text(grid)
    out = out or str(tmp_path / "sweep" / "results.parquet")
    return ["sweep", str(tmp_path / "grid.toml"), "--sessions", str(sessions / "*"), "--out", out], out


def _same_digests(rows, serial):
    for r in rows:
        assert r["error"] == "", r["error"]
        ref = serial[(r["session_digest"], r["param_hash"])]
        assert (r["digest"], r["fills"], r["pnl_usdt"]) == (ref["digest"], ref["fills"], ref["pnl_usdt"])


def test_ray_sweep_matches_serial_and_resume_skips_everything(local_ray, sessions, serial, tmp_path, capsys):
    cmd, out = _cmd(tmp_path, sessions)
    assert main([*cmd, *MEMORY, "--no-progress"]) == 0
    assert "24 run, 0 skipped (--resume), 0 failed" in capsys.readouterr().out
    rows = pq.read_table(out).to_pylist()
    # one row per run, in the grid's order whatever order the tasks finished in
    assert len(rows) == N_RUNS
    assert [(r["session_digest"], r["param_hash"]) for r in rows] == list(serial)
    _same_digests(rows, serial)
    for r in rows:
        assert r["run_dir"].startswith(str(tmp_path / "sweep" / "runs"))
        assert r["peak_rss_scope"] == "task" and 50 < r["peak_rss_mb"] < 2048
        assert r["worker"].split(":")[1] != str(os.getpid())  # ran in a Ray worker
        assert r["wall_s"] > 0 and r["kev_drops"] is not None and r["risk_rejections"] is not None
    con = duckdb.connect()
    n, sessions_n, typ = con.execute(
        "SELECT count(*), count(DISTINCT session), any_value(typeof(pnl_usdt)) FROM read_parquet(?) "
        "WHERE error = ''",
        [out],
    ).fetchall()[0]
    assert (n, sessions_n, typ) == (N_RUNS, 2, "DECIMAL(18,4)")

    # everything is done: a second invocation submits nothing and rewrites nothing
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "sweep" / "runs").iterdir()}
    assert main([*cmd, *MEMORY, "--no-progress", "--resume"]) == 0
    assert "0 run, 24 skipped (--resume), 0 failed" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "sweep" / "runs").iterdir()} == mtimes
    assert pq.read_table(out).to_pylist() == rows


def faulty_runner(session, params, *, runs_dir, version):
    """run_one, except that scale_kev=2 raises out of the task and scale_kev=4 kills the worker."""
    if params["scale_kev"] == 2:
        raise RuntimeError("boom in the worker")
    if params["scale_kev"] == 4:
        os._exit(3)
    return run_one(session, params, runs_dir=runs_dir, version=version)


def test_raising_task_and_dead_worker_become_error_rows(local_ray, sessions, serial, tmp_path):
    import tomllib

    grid = parse_grid(tomllib.loads(SMALL_TOML))
    out = tmp_path / "results.parquet"
    kw = {"memory_mb": 512, "progress": False}
    res = ray_sweep(grid, [sessions / "s1"], out, runner=faulty_runner, max_retries=1, **kw)
    assert (res.ran, res.failed, res.rows) == (3, 2, 3)
    ok, raised, died = pq.read_table(out).to_pylist()
    _same_digests([ok], serial)
    assert raised["error"] == "task raised RuntimeError: boom in the worker"
    assert died["error"].startswith("WorkerCrashedError (after 1 retries)")
    for r in (raised, died):  # keyed like any row, so that resume runs them again
        assert r["digest"] is None and r["session_digest"] == ok["session_digest"]
        assert r["code_version"] == ok["code_version"] and r["p_scale_kev"] in (2, 4)
    res = ray_sweep(grid, [sessions / "s1"], out, resume=True, **kw)
    assert (res.ran, res.skipped, res.failed, res.rows) == (2, 1, 0, 3)
    rows = pq.read_table(out).to_pylist()
    assert [r["p_scale_kev"] for r in rows] == [1, 2, 4]
    _same_digests(rows, serial)


def _run_cli(*args, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "dualhub.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def test_file_urls_for_sessions_and_results_joining_the_cluster_by_address(
    local_ray, sessions, serial, tmp_path
):
    """Another driver process joins the running cluster (--ray ADDRESS); sessions are read and run
    directories written through pyarrow.fs (file:// here; s3:// and others take the same path)."""
    url = f"file://{tmp_path}/remote/results.parquet"
    (tmp_path / "grid.toml").write_text(SMALL_TOML)
    cmd = ["sweep", str(tmp_path / "grid.toml"), "--sessions", f"file://{sessions}/s*", "--out", url]
    proc = _run_cli(*cmd, *MEMORY, "--no-progress", "--ray", local_ray)
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, log
    assert "6 run, 0 skipped (--resume), 0 failed" in log
    rows = pq.read_table(tmp_path / "remote" / "results.parquet").to_pylist()
    assert len(rows) == 6
    _same_digests(rows, serial)
    for r in rows:
        assert r["session"].startswith(f"file://{sessions}/s")
        assert r["run_dir"].startswith(f"file://{tmp_path}/remote/runs/")
        assert (tmp_path / r["run_dir"].removeprefix(f"file://{tmp_path}/") / "manifest.json").is_file()
    assert not list((tmp_path / "remote").glob("*.tmp"))


def test_killed_sweep_resumes_each_key_once_with_the_same_digests(
    local_ray, sessions, serial, tmp_path, capsys
):
    cmd, out = _cmd(tmp_path, sessions)
    # its own Ray instance (2 workers); the whole process group (driver, raylet, workers) is killed
    proc = _run_cli(*cmd, *MEMORY, "--no-progress", "--workers", "2", start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(out) and pq.read_metadata(out).num_rows > 0:
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"the sweep ended before it could be killed:\n{proc.communicate()[0]}"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    before = pq.read_table(out).to_pylist()
    assert 0 < len(before) < N_RUNS, "killed too late to test resuming"

    capsys.readouterr()
    assert main([*cmd, *MEMORY, "--no-progress", "--resume"]) == 0
    assert (
        f"{N_RUNS - len(before)} run, {len(before)} skipped (--resume), 0 failed" in capsys.readouterr().out
    )
    rows = pq.read_table(out).to_pylist()
    keys = [(r["session_digest"], r["param_hash"], r["code_version"]) for r in rows]
    assert len(keys) == len(set(keys)) == N_RUNS
    assert [k[:2] for k in keys] == list(serial)
    _same_digests(rows, serial)
    kept = {(r["session_digest"], r["param_hash"]): r for r in rows}
    for r in before:  # rows written before the kill are kept as they were
        assert kept[(r["session_digest"], r["param_hash"])] == r


def test_sweep_refuses_urls_serially_and_a_second_cluster(local_ray, sessions, tmp_path, capsys):
    cmd, _ = _cmd(tmp_path, sessions, grid=SMALL_TOML)
    assert main([*cmd, "--serial", "--out", "file:///x/results.parquet"]) == 2
    assert "URLs need Ray" in capsys.readouterr().err
    assert main([*cmd, "--ray", "127.0.0.1:1", "--no-progress"]) == 2
    assert "already initialized" in capsys.readouterr().err


def test_code_version_covers_the_replay_path_only_and_workers_check_it(sessions, tmp_path):
    from replay.ray_sweep import run_task
    from replay.sweep import code_sources, code_version

    root = REPO
    rel = {p.relative_to(root).as_posix() for p in code_sources()}
    assert {"replay/driver.py", "replay/sweep.py", "engine/store.py", "analysis/queries.sql"} <= rel
    assert {"venue/exchange.py", "venue/kernel.py", "venue/matching.py", "venue/fills.py"} <= rel  # the venue
    # not imported by a replay: the recorder, the CLI, this distribution layer
    assert not any(
        r.startswith(("recorder/", "dualhub/", "replay/ray_sweep", "replay/tools_cli")) for r in rel
    )
    assert code_version().startswith("0.") and len(code_version().split("+")[1]) == 12
    # a worker with other code refuses the run: the row is an error under the driver's key
    row = run_task(str(sessions / "s1"), {"seed": 3}, runs_dir=str(tmp_path), version="0.0.0+other")
    assert row["error"].startswith(f"worker code version {code_version()} != driver's 0.0.0+other")
    assert (row["code_version"], row["digest"]) == ("0.0.0+other", None)
    assert not list(tmp_path.iterdir())
