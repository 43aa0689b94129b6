import asyncio

import numpy as np
import pytest

from engine.kev.advisor import KevContext
from engine.kev.command import validate_command
from engine.kev.queue import KevQueue
from engine.kev.rules import RuleKev
from engine.latency.models import ConstantLatency, LognormalLatency


def ctx(rid, ts=0, label="LEAN_BUY", p=0.9, imbalance=0.3, position=0.0):
    return KevContext(
        request_id=rid,
        ts_ns=ts,
        symbol="BTCUSDT",
        label=label,
        label_seq=rid,
        p_label=p,
        mid=100.0,
        spread=0.1,
        imbalance=imbalance,
        position=position,
        max_position=0.05,
    )


def test_offer_never_blocks_and_keeps_latest():
    q = KevQueue(maxsize=2)
    kinds = [n.kind for r in range(1, 5) for n in q.offer(ctx(r))]
    assert kinds == ["enqueued", "enqueued", "dropped_overflow", "enqueued", "dropped_overflow", "enqueued"]
    assert q.drops["dropped_overflow"] == 2
    got, _ = q.take(0)
    assert got.request_id == 3  # the two oldest were dropped


def test_stale_requests_are_dropped_on_take():
    q = KevQueue(maxsize=4, stale_after_ns=100)
    q.offer(ctx(1, ts=0))
    q.offer(ctx(2, ts=150))
    got, notes = q.take(200)
    assert got.request_id == 2
    assert [(n.request_id, n.kind) for n in notes] == [(1, "dropped_stale")]
    assert q.take(200) == (None, [])


def test_fifo_refuses_the_newcomer_and_keeps_the_order():
    q = KevQueue(maxsize=2, policy="fifo")
    notes = [(n.request_id, n.kind, n.depth) for r in range(1, 4) for n in q.offer(ctx(r))]
    assert notes == [(1, "enqueued", 1), (2, "enqueued", 2), (3, "dropped_overflow", 2)]
    assert [q.take(0)[0].request_id for _ in range(2)] == [1, 2]


def test_conflate_keeps_only_the_latest_whatever_maxsize():
    q = KevQueue(maxsize=4, policy="conflate")
    q.offer(ctx(1))
    notes = [(n.request_id, n.kind, n.depth) for n in q.offer(ctx(2))]
    assert notes == [(1, "dropped_conflated", 0), (2, "enqueued", 1)]
    assert q.drops == {"dropped_overflow": 0, "dropped_stale": 0, "dropped_conflated": 1}
    assert q.take(0)[0].request_id == 2 and len(q) == 0


def test_a_request_exactly_stale_after_ns_old_is_still_taken():
    q = KevQueue(stale_after_ns=100)
    q.offer(ctx(1, ts=0))
    assert q.take(100)[0].request_id == 1


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="policy"):
        KevQueue(policy="keep_forever")


def test_rules_produce_valid_commands_for_every_label():
    kev = RuleKev()
    for label in ("LEAN_BUY", "LEAN_SELL", "EMERGENCY"):
        for p in (0.2, 0.9):
            reply = asyncio.run(kev.advise(ctx(1, label=label, p=p)))
            fields = validate_command(reply.raw)
            assert not isinstance(fields, str), fields
    buy = validate_command(RuleKev().decide(ctx(1, label="LEAN_BUY", p=0.9)))
    sell = validate_command(RuleKev().decide(ctx(1, label="LEAN_SELL", p=0.9, imbalance=-0.3)))
    emergency = validate_command(RuleKev().decide(ctx(1, label="EMERGENCY", position=0.03)))
    assert buy.target_position > 0 > sell.target_position
    assert emergency.action == "EMERGENCY_FLATTEN" and emergency.target_position == 0.0
    capped = validate_command(RuleKev().decide(ctx(1, position=0.05)))
    assert capped.target_position == 0.05


@pytest.mark.parametrize(
    "obj, reason",
    [
        ("x", "expected object"),
        ({"action": "BUY"}, "missing fields"),
        (
            {"action": "YOLO", "target_position": 0, "hedge_ratio": 0, "max_slippage_bps": 1, "reason": ""},
            "not one of",
        ),
        (
            {
                "action": "HOLD",
                "target_position": 1e15,
                "hedge_ratio": 0,
                "max_slippage_bps": 1,
                "reason": "",
            },
            "outside",
        ),
        (
            {"action": "HOLD", "target_position": "1", "hedge_ratio": 0, "max_slippage_bps": 1, "reason": ""},
            "expected number",
        ),
        (
            {
                "action": "HOLD",
                "target_position": 0,
                "hedge_ratio": 0,
                "max_slippage_bps": 1,
                "reason": "x" * 121,
            },
            "limit 120",
        ),
        (
            {
                "action": "HOLD",
                "target_position": 0,
                "hedge_ratio": 0,
                "max_slippage_bps": 1,
                "reason": "",
                "z": 1,
            },
            "unexpected",
        ),
        (
            {
                "action": "HOLD",
                "target_position": float("nan"),
                "hedge_ratio": 0,
                "max_slippage_bps": 1,
                "reason": "",
            },
            "not finite",
        ),
    ],
)
def test_invalid_commands_are_rejected_with_a_reason(obj, reason):
    v = validate_command(obj)
    assert isinstance(v, str) and reason in v


def test_lognormal_lag_hits_its_percentiles_and_is_seeded():
    m = LognormalLatency(p5_ms=200, p95_ms=350, rng=np.random.default_rng(3))
    x = np.array([m.sample_ns(0) for _ in range(20000)]) / 1e6
    assert abs(np.percentile(x, 5) - 200) < 5 and abs(np.percentile(x, 95) - 350) < 8
    a = [LognormalLatency(p5_ms=200, p95_ms=350, rng=np.random.default_rng(9)).sample_ns(0) for _ in range(2)]
    assert a[0] == a[1]
    with pytest.raises(ValueError):
        LognormalLatency(p5_ms=300, p95_ms=200, rng=np.random.default_rng(0))
    with pytest.raises(ValueError):
        ConstantLatency(-1)
