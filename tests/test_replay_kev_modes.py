"""Kev in replay: sim, cassette and llm modes, and lag measured from recorded responses."""

from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from engine.errors import DualhubError
from engine.kev.cassette import Cassette
from replay.driver import ReplayConfig, run_replay
from replay.kev_cli import fit_runs
from venue.simulator import simulate_session

DECISIONS = ("command", "risk", "order", "fill")


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=1.0, seed=21)


def _rows(run, stream):
    return pq.read_table(run.run_dir / "events" / f"{stream}.parquet").to_pylist()


def _same(a, b):
    """Equal row lists, NaN-aware (market orders carry px = NaN)."""
    return orjson.dumps(a, default=str) == orjson.dumps(b, default=str)


def test_cassette_replay_reproduces_kev_driven_decisions(session, tmp_path):
    sim = run_replay(session, ReplayConfig(seed=3), out_dir=tmp_path / "sim")
    assert sim.counts["command"] > 0
    cas = run_replay(
        session,
        ReplayConfig(seed=99, kev_mode="cassette", kev_cassette=str(sim.run_dir)),
        out_dir=tmp_path / "cas",
    )
    # Another seed would draw other lags; the cassette's recorded lags make the decisions identical.
    assert cas.kev["misses"] == 0 and cas.kev["hits"] == sim.counts["kev_request"]
    for stream in DECISIONS:
        assert _same(_rows(sim, stream), _rows(cas, stream)), stream
    lag_sim = [r["lag_ns"] for r in _rows(sim, "kev_response")]
    assert lag_sim == [r["lag_ns"] for r in _rows(cas, "kev_response")]


def test_cassette_miss_policies(session, tmp_path):
    empty = tmp_path / "empty.parquet"
    Cassette().write(empty)
    fail = run_replay(
        session, ReplayConfig(kev_mode="cassette", kev_cassette=str(empty)), out_dir=tmp_path / "fail"
    )
    assert fail.counts["command"] == 0
    errors = {r["error"] for r in _rows(fail, "kev_response")}
    assert errors and all("cassette miss" in e for e in errors)
    sim = run_replay(
        session,
        ReplayConfig(kev_mode="cassette", kev_cassette=str(empty), kev_miss_policy="sim"),
        out_dir=tmp_path / "sim",
    )
    assert sim.counts["command"] == sim.counts["kev_request"] > 0
    with pytest.raises(DualhubError, match="--kev-url"):
        ReplayConfig(kev_mode="cassette", kev_cassette=str(empty), kev_miss_policy="live")


def test_measured_lag_fit_drives_replay_lag(session, tmp_path):
    base = run_replay(session, ReplayConfig(seed=3), out_dir=tmp_path / "base")
    fit = fit_runs([base.run_dir], allow_modelled=True)  # base: a sim replay, its lags modelled
    lag_json = tmp_path / "lag.json"
    lag_json.write_bytes(orjson.dumps(fit))
    run = run_replay(session, ReplayConfig(seed=4, kev_lag_fit=str(lag_json)), out_dir=tmp_path / "fit")
    lags = np.array([r["lag_ns"] for r in _rows(run, "kev_response")])
    measured = np.array([r["lag_ns"] for r in _rows(base, "kev_response")])
    assert lags.min() >= measured.min() - 1 and lags.max() <= measured.max() + 1
    assert abs(np.median(lags) - np.median(measured)) < 0.15 * np.median(measured)


def test_llm_mode_against_real_llama_server_then_cassette_without_it(session, tmp_path, llama_server):
    # Few, spaced requests: each real call takes seconds on this machine.
    cfg = ReplayConfig(
        seed=3, kev_mode="llm", kev_url=llama_server.url, kev_min_interval_ms=20_000, kev_lag_source="model"
    )
    llm = run_replay(session, cfg, out_dir=tmp_path / "llm")
    responses = _rows(llm, "kev_response")
    assert 1 <= len(responses) <= 5
    assert all(r["advisor"] == "llm" for r in responses)
    ok = [r for r in responses if r["ok"]]
    assert ok, [r["error"] for r in responses]
    assert all(r["prompt_ms"] > 0 and r["completion_tokens"] > 0 for r in ok)
    # The lag on the replay clock comes from the model, not from the server's wall time.
    assert all(50e6 < r["lag_ns"] < 2e9 for r in responses)
    # Replayed from its own event log, with no server at all: same decisions.
    cas = run_replay(
        session,
        ReplayConfig(seed=3, kev_mode="cassette", kev_cassette=str(llm.run_dir), kev_min_interval_ms=20_000),
        out_dir=tmp_path / "cas",
    )
    assert cas.kev["misses"] == 0
    for stream in DECISIONS:
        assert _same(_rows(llm, stream), _rows(cas, stream)), stream
