"""Replay realism: feed latency and two timelines, latency what-ifs, Kev queue policies, timeouts,
in-flight limit, advice staleness in the risk gateway, and the look-ahead guard."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from engine.clock import ReplayClock
from engine.latency.models import ConstantLatency
from engine.store import open_session
from replay.config import ReplayConfig
from replay.driver import run_replay
from replay.fast_path import LookAheadError
from replay.labels import _BatchLabeler
from replay.tape import _Tape
from tests.helpers import make_book
from venue.simulator import simulate_session


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=1.0, seed=31)


def rows(run, stream):
    return pq.read_table(run.run_dir / "events" / f"{stream}.parquet").to_pylist()


def test_exchange_sees_market_data_before_the_engine(session):
    s = open_session(session)
    books = s.read_table("books15")
    trades = s.read_table("trade")
    tape = _Tape(books, trades, ConstantLatency(50_000_000), 1.0)
    ts, _, kind, row = (a.tolist() for a in tape.order())
    first_seen = {}
    for t, k, i in zip(ts, kind, row, strict=True):
        if k in (0, 2):
            first_seen.setdefault(i, []).append((k, t))
    for seen in list(first_seen.values())[:200]:
        assert [k for k, _ in seen] == [0, 2]  # exchange first, engine second
        assert seen[1][1] - seen[0][1] == 50_000_000
    assert ts == sorted(ts)


def test_feed_latency_model_and_scale_move_the_engine_timeline(session, tmp_path):
    run = run_replay(session, ReplayConfig(latency_feed="const:50ms"), out_dir=tmp_path / "a")
    lab = rows(run, "label")
    assert all(r["ts_recv"] - r["ts_event"] == 50_000_000 + 200_000 for r in lab)
    run2 = run_replay(
        session, ReplayConfig(latency_feed="const:50ms", scale_feed=2.0), out_dir=tmp_path / "b"
    )
    assert all(r["ts_recv"] - r["ts_event"] == 100_000_000 + 200_000 for r in rows(run2, "label"))


def test_scale_latency_what_if(session, tmp_path):
    base = run_replay(session, ReplayConfig(seed=2), out_dir=tmp_path / "base")
    slow = run_replay(
        session, ReplayConfig(seed=2, scale_kev=2.0, scale_order=3.0), out_dir=tmp_path / "slow"
    )
    lag = np.median([r["lag_ns"] for r in rows(base, "kev_response")])
    lag2 = np.median([r["lag_ns"] for r in rows(slow, "kev_response")])
    assert 1.8 < lag2 / lag < 2.2
    entry = [r["dur_ns"] for r in rows(slow, "latency") if r["name"] == "order_entry"]
    assert entry and set(entry) == {30_000_000}  # (5 ms entry + 5 ms response) x 3
    assert slow.digest != base.digest


def test_kev_timeouts_free_the_slot_and_late_replies_are_discarded(session, tmp_path):
    run = run_replay(session, ReplayConfig(seed=2, kev_timeout_ms=260), out_dir=tmp_path / "r")
    kinds = [r["kind"] for r in rows(run, "kev_queue")]
    assert "timeout" in kinds and "late_reply" in kinds
    resp = rows(run, "kev_response")
    timeouts = [r for r in resp if not r["ok"] and r["error"].startswith("timeout")]
    assert timeouts and all(r["lag_ns"] == 260_000_000 for r in timeouts)
    ok = [r for r in resp if r["ok"]]
    assert all(r["lag_ns"] <= 260_000_000 for r in ok)
    assert run.counts["command"] == len(ok)  # a timed-out request never becomes a command


def test_in_flight_limit_allows_overlapping_requests(session, tmp_path):
    one = run_replay(session, ReplayConfig(seed=2), out_dir=tmp_path / "one")
    two = run_replay(session, ReplayConfig(seed=2, kev_max_in_flight=2), out_dir=tmp_path / "two")

    def max_overlap(run):
        req = {r["request_id"]: r["ts_recv"] for r in rows(run, "kev_request")}
        spans = [(req[r["request_id"]], r["ts_recv"]) for r in rows(run, "kev_response")]
        edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
        level = peak = 0
        for _, d in edges:
            level += d
            peak = max(peak, level)
        return peak

    assert max_overlap(one) == 1 and max_overlap(two) == 2
    drops = [sum(r["kind"].startswith("dropped") for r in rows(x, "kev_queue")) for x in (one, two)]
    assert drops[1] <= drops[0]


@pytest.mark.parametrize("policy, dropped", [("conflate", "dropped_conflated"), ("fifo", "dropped_overflow")])
def test_queue_policies(session, tmp_path, policy, dropped):
    run = run_replay(
        session, ReplayConfig(seed=2, kev_queue_policy=policy, kev_queue_max=1), out_dir=tmp_path / policy
    )
    q = rows(run, "kev_queue")
    assert any(r["kind"] == dropped for r in q)
    if policy == "fifo":
        # FIFO refuses the newcomer: a dropped request was never enqueued.
        enq = {r["request_id"] for r in q if r["kind"] == "enqueued"}
        assert all(r["request_id"] not in enq for r in q if r["kind"] == "dropped_overflow")


def test_stale_advice_is_refused_by_the_risk_gateway(session, tmp_path):
    cfg = ReplayConfig(seed=2)
    run = run_replay(
        session, replace(cfg, risk=replace(cfg.risk, max_advice_age_ns=1)), out_dir=tmp_path / "r"
    )
    kev_orders = [r for r in rows(run, "risk") if r["source"] in ("kev", "flatten")]
    assert kev_orders and all(r["advice_age_ns"] >= 0 for r in kev_orders)
    kev = [r for r in kev_orders if r["source"] == "kev"]
    assert any(r["reason"] == "stale_advice" for r in kev)
    assert all(r["reason"] == "stale_advice" for r in kev if r["advice_age_ns"] > 1)
    quotes = [r for r in rows(run, "risk") if r["source"] == "quote"]
    assert quotes and all(r["advice_age_ns"] == -1 for r in quotes)


def test_look_ahead_is_refused():
    clock = ReplayClock(1_000)
    labeler = _BatchLabeler(np.array([0, 1]), np.array([1, 2]), np.zeros((2, 4), np.float32), clock)
    assert labeler(make_book(ts=900, seq=0))[0] == 1
    with pytest.raises(LookAheadError):
        labeler(make_book(ts=5_000, seq=1))  # a planted future book cannot be read


def test_modelled_latencies_stay_deterministic(session, tmp_path):
    cfg = ReplayConfig(
        seed=9,
        latency_feed="lognormal:p5=1ms,p95=20ms",
        latency_order_entry="lognormal:p5=2ms,p95=9ms",
        fill_model="queue_power2",
        kev_max_in_flight=2,
    )
    a = run_replay(session, cfg, out_dir=tmp_path / "a")
    b = run_replay(session, cfg, out_dir=tmp_path / "b")
    assert a.digest == b.digest


def test_book_chunking_does_not_change_the_run(session, tmp_path, monkeypatch):
    base = run_replay(session, ReplayConfig(seed=4), out_dir=tmp_path / "a")
    monkeypatch.setattr(_Tape, "_CHUNK_BITS", 4)  # 16-book chunks: many boundaries and evictions
    small = run_replay(session, ReplayConfig(seed=4), out_dir=tmp_path / "b")
    assert small.digest == base.digest
