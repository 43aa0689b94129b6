"""Kev in replay: sim, cassette and llm modes, and lag measured from recorded responses."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

import replay.fast_path as fast_path
from engine.errors import DualhubError
from engine.eventlog import OUTPUT_STREAMS
from engine.events import NON_DECISION_COLUMNS
from engine.kev.cassette import Cassette
from replay import kernel as K
from replay.config import ReplayConfig
from replay.driver import run_replay
from replay.kev_cli import fit_runs
from tests.engine.kev.test_kev_failures import GOOD, FaultServer, completion
from tests.replay.test_replay_kernel import _same as same_on_both_paths
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


# ---------------------------------------------------------------------------------------------------
# Cassette and LLM advisors on the compiled loop: it stops at each Kev request, Python answers, and the
# run is the per-event engine's, byte for byte (tests/replay/test_replay_kernel.py's _same)


def _asked(cassette: Cassette) -> list[str]:
    """The cassette's keys in the order its run asked for them."""
    return sorted(cassette.keys, key=lambda k: min(e.request_id for e in cassette.entries[k]))


def _half_cassette(run_dir: Path, path: Path) -> Path:
    """The recordings of every other key of ``run_dir``'s run, in the order it asked for them from the
    first on: a replay of it hits and misses. (A request the replay answers otherwise than the
    recording leaves the position elsewhere, so the contexts after it differ: only the requests up to
    the first miss are sure to be asked as recorded.)"""
    full = Cassette.from_run(run_dir)
    half = Cassette()
    for key in _asked(full)[::2]:
        for e in full.entries[key]:
            half.add(e)
    return half.write(path)


def test_a_cassette_replay_runs_on_the_kernel_as_on_the_engine(session, tmp_path):
    sim = run_replay(session, ReplayConfig(seed=3), out_dir=tmp_path / "sim")
    cfg = ReplayConfig(seed=99, kev_mode="cassette", kev_cassette=str(sim.run_dir))
    _, kn = same_on_both_paths(session, cfg, tmp_path, "hits")
    assert kn.kev["hits"] == kn.counts["kev_request"] > 0 and kn.counts["command"] > 0
    runtime = orjson.loads((kn.run_dir / "runtime.json").read_bytes())
    assert runtime["engine_path"].startswith("kernel")


@pytest.mark.parametrize("policy", ["fail", "sim"])
def test_cassette_misses_are_the_same_on_both_paths(session, tmp_path, policy):
    sim = run_replay(session, ReplayConfig(seed=3), out_dir=tmp_path / "sim")
    path = _half_cassette(sim.run_dir, tmp_path / "half.parquet")
    cfg = ReplayConfig(seed=3, kev_mode="cassette", kev_cassette=str(path), kev_miss_policy=policy)
    _, kn = same_on_both_paths(session, cfg, tmp_path, policy)
    assert kn.kev["hits"] > 0 and kn.kev["misses"] > 0
    resp = _rows(kn, "kev_response")
    if policy == "fail":
        failed = [r for r in resp if not r["ok"]]
        assert len(failed) == kn.kev["misses"] and {r["failure"] for r in failed} == {"cassette_miss"}
        assert all(r["error"].startswith("cassette miss: key ") and "\n" not in r["error"] for r in failed)
    else:
        assert kn.kev["fallbacks"] == kn.kev["misses"] and all(r["ok"] for r in resp)
        assert sum(r["advisor"] == "cassette>rules" for r in resp) == kn.kev["misses"]


@pytest.mark.parametrize("failure", ["schema", "invalid_json"])
def test_recorded_replies_that_are_no_command_are_the_same_on_both_paths(session, tmp_path, failure):
    # the run's first request is recorded as no command (the later ones then differ: the rules answer)
    sim = run_replay(session, ReplayConfig(seed=3), out_dir=tmp_path / "sim")
    recorded = Cassette.from_run(sim.run_dir)
    first = _asked(recorded)[0]
    bad = Cassette()
    for key in recorded.keys:
        for e in recorded.entries[key]:
            if key == first and failure == "schema":  # valid JSON, out of the command's range
                e = replace(e, raw=orjson.dumps(orjson.loads(e.raw) | {"hedge_ratio": 7}).decode())
            elif key == first:  # no JSON object
                e = replace(e, raw="[1, 2]")
            bad.add(e)
    path = bad.write(tmp_path / "bad.parquet")
    cfg = ReplayConfig(seed=3, kev_mode="cassette", kev_cassette=str(path), kev_miss_policy="sim")
    _, kn = same_on_both_paths(session, cfg, tmp_path, failure)
    failures = [r["failure"] for r in _rows(kn, "kev_response")]
    assert failures[0] == failure and "" in failures[1:]


def test_cassette_timeouts_and_late_replies_are_the_same_on_both_paths(session, tmp_path):
    # recorded with slow answers and a long timeout; replayed with a short one: the slow answers time
    # out and come late, and the requests that then differ are misses the rules answer
    slow = ReplayConfig(
        seed=3, kev_lag_p5_ms=300.0, kev_lag_p95_ms=3000.0, kev_timeout_ms=10_000, kev_max_in_flight=2
    )
    rec = run_replay(session, slow, out_dir=tmp_path / "slow")
    cfg = replace(slow, kev_mode="cassette", kev_cassette=str(rec.run_dir), kev_miss_policy="sim")
    _, kn = same_on_both_paths(session, replace(cfg, kev_timeout_ms=900), tmp_path, "late")
    kinds = {r["kind"] for r in _rows(kn, "kev_queue")}
    assert {"timeout", "late_reply"} <= kinds and kn.kev["hits"] > 0 and kn.counts["command"] > 0


def test_kev_stops_at_every_request_change_nothing(session, tmp_path, monkeypatch):
    """The rule advisor answered from Python at a Kev stop, amid stops for room, growth and lags,
    gives the run its compiled twin gives (two in flight, timeouts, late replies)."""
    cfg = ReplayConfig(seed=5, kev_max_in_flight=2, kev_timeout_ms=300, kev_lag_p95_ms=600.0)
    compiled = run_replay(session, cfg, out_dir=tmp_path / "compiled")
    monkeypatch.setattr(fast_path, "RULES_COMPILED", False)
    monkeypatch.setattr(fast_path, "OUT_CAP", K.MARGIN + 40)
    monkeypatch.setattr(fast_path, "WALK_CHUNK", 1000)
    monkeypatch.setattr(fast_path, "INITIAL_ROWS", K.MARGIN + 8)
    monkeypatch.setattr(fast_path, "LAG_BATCH", 3)
    answer, asked = fast_path.KernelRun._answer_kev, []

    def count(self):
        asked.append(int(self.S[K.S_KEV_ASKED]))
        answer(self)

    monkeypatch.setattr(fast_path.KernelRun, "_answer_kev", count)
    stopped = run_replay(session, cfg, out_dir=tmp_path / "stopped")
    assert stopped.path.startswith("kernel") and sum(asked) == stopped.counts["kev_request"] > 0
    assert {"timeout", "late_reply"} <= {r["kind"] for r in _rows(stopped, "kev_queue")}
    assert stopped.digest == compiled.digest
    for s in OUTPUT_STREAMS:
        a = (compiled.run_dir / "events" / f"{s}.parquet").read_bytes()
        assert a == (stopped.run_dir / "events" / f"{s}.parquet").read_bytes(), s
    manifests = [(r.run_dir / "manifest.json").read_bytes() for r in (compiled, stopped)]
    assert manifests[0] == manifests[1]


def test_an_llm_replay_with_a_failing_server_is_the_same_on_both_paths(session, tmp_path):
    """Server errors open the circuit breaker on the replay clock; a probe then gets an answer that is
    no command; then good answers: the same kev_breaker, kev_response and decision events either way."""

    def respond(n):
        if n <= 6:
            return 500, b'{"error": {"message": "overloaded"}}'
        if n == 7:
            return completion(orjson.dumps(orjson.loads(GOOD) | {"hedge_ratio": 7}).decode())
        return completion(GOOD)

    runs = {}
    for kernel in (False, True):
        with FaultServer(respond) as srv:
            cfg = ReplayConfig(seed=1, kev_mode="llm", kev_url=srv.url, kev_lag_source="model")
            runs[kernel] = run_replay(session, cfg, out_dir=tmp_path / str(kernel), kernel=kernel)
    py, kn = runs[False], runs[True]
    assert kn.path.startswith("kernel") and py.path.startswith("python")
    assert [b["state"] for b in _rows(kn, "kev_breaker")] == ["open", "half_open", "closed"]
    for s in OUTPUT_STREAMS:
        a = (py.run_dir / "events" / f"{s}.parquet").read_bytes()
        assert a == (kn.run_dir / "events" / f"{s}.parquet").read_bytes(), s
    assert kn.digest == py.digest and kn.kev == py.kev


def test_an_llm_replay_runs_on_the_kernel_as_on_the_engine(session, tmp_path, llama_server):
    # Lags from the lag model (measured wall times differ between any two runs). The server answers
    # with temperature 0 and a fixed seed: both runs get the same replies; only its own timings
    # (prompt_ms, predicted_ms: wall time on the server) differ, so the runs share the decision digest.
    cfg = ReplayConfig(
        seed=3, kev_mode="llm", kev_url=llama_server.url, kev_min_interval_ms=20_000, kev_lag_source="model"
    )
    py = run_replay(session, cfg, out_dir=tmp_path / "py", kernel=False)
    kn = run_replay(session, cfg, out_dir=tmp_path / "k")
    assert kn.path.startswith("kernel") and py.path.startswith("python")
    assert kn.decision_digest == py.decision_digest and kn.counts == py.counts
    for s in OUTPUT_STREAMS:
        a, b = (pq.read_table(r.run_dir / "events" / f"{s}.parquet") for r in (py, kn))
        wall = sorted(NON_DECISION_COLUMNS.get(s, ()))
        assert _same(a.drop_columns(wall).to_pylist(), b.drop_columns(wall).to_pylist()), s
    resp = _rows(kn, "kev_response")
    assert resp and any(r["ok"] for r in resp) and {r["advisor"] for r in resp} == {"llm"}
