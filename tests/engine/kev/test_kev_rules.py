"""The rule advisor's decision (engine.kev.rules.rule_decide) and the command RuleKev builds from it."""

import hashlib

import orjson
import pytest

from engine.kev.advisor import KevContext, context_body
from engine.kev.command import validate_command
from engine.kev.rules import RULES_VERSION, RuleKev


def ctx(label="LEAN_BUY", p=0.9, imbalance=0.3, position=0.0, spread=0.1, mid=100.0, max_position=0.05):
    return KevContext(
        request_id=1,
        ts_ns=0,
        symbol="BTCUSDT",
        label=label,
        label_seq=1,
        p_label=p,
        mid=mid,
        spread=spread,
        imbalance=imbalance,
        position=position,
        max_position=max_position,
    )


def decide(**kw):
    return RuleKev().decide(ctx(**kw))


def test_emergency_flattens_fully_hedged():
    cmd = decide(label="EMERGENCY", p=0.1, position=0.03)
    assert (cmd["action"], cmd["target_position"], cmd["hedge_ratio"]) == ("EMERGENCY_FLATTEN", 0.0, 1.0)
    assert cmd["reason"] == "emergency label: flatten"


def test_a_weak_label_holds_the_position():
    cmd = decide(label="LEAN_SELL", p=0.39, position=0.0123)
    assert (cmd["action"], cmd["target_position"], cmd["hedge_ratio"]) == ("HOLD", 0.0123, 0.0)
    assert cmd["reason"] == "weak LEAN_SELL p=0.39: hold"
    assert decide(p=0.4)["action"] == "LEAN_BUY"  # min_prob itself is strong enough


def test_a_lean_steps_the_target_towards_its_side():
    buy = decide(label="LEAN_BUY", position=0.01, imbalance=0.2)
    assert (buy["action"], buy["target_position"]) == ("LEAN_BUY", 0.035)  # + step_fraction * max_position
    assert buy["reason"] == "LEAN_BUY p=0.90 imb=+0.20"
    sell = decide(label="LEAN_SELL", position=0.01, imbalance=-0.2)
    assert (sell["action"], sell["target_position"]) == ("LEAN_SELL", -0.015)


def test_an_imbalance_against_the_label_halves_the_step():
    assert decide(label="LEAN_BUY", imbalance=-0.1)["target_position"] == 0.0125
    assert decide(label="LEAN_SELL", imbalance=0.1)["target_position"] == -0.0125
    assert decide(label="LEAN_BUY", imbalance=0.0)["target_position"] == 0.025  # neutral book agrees


def test_the_target_stays_within_max_position_and_is_rounded():
    assert decide(label="LEAN_BUY", position=0.04)["target_position"] == 0.05
    assert decide(label="LEAN_SELL", position=-0.04, imbalance=-0.1)["target_position"] == -0.05
    assert decide(label="LEAN_BUY", position=0.0012345678)["target_position"] == 0.026235


@pytest.mark.parametrize(
    "spread, mid, slip",
    [(0.1, 100.0, 10.0), (0.0, 100.0, 1.0), (0.01, 100.0, 2.0), (0.0123, 100.0, 2.46), (1.0, 0.0, 1.0)],
)
def test_slippage_is_twice_the_spread_in_bps_between_1_and_10(spread, mid, slip):
    assert decide(spread=spread, mid=mid)["max_slippage_bps"] == slip


def test_every_decision_is_a_valid_command():
    for label in ("HOLD", "LEAN_BUY", "LEAN_SELL", "EMERGENCY"):
        for p in (0.0, 0.5, 1.0):
            for position in (-0.05, 0.0, 0.05):
                v = validate_command(decide(label=label, p=p, position=position))
                assert not isinstance(v, str), v


def test_the_key_hashes_every_context_field_and_the_rule_parameters():
    """key_of (the replay's batch) takes the fields one by one: it must hash exactly what a context
    shows (CONTEXT_FIELDS), so a field added to the context changes the key or fails here."""
    kev = RuleKev(step_fraction=0.25, min_prob=0.5)
    c = ctx("LEAN_SELL", 0.7, imbalance=-0.3)
    body = {"rules": RULES_VERSION, "params": [0.25, 0.5], **context_body(c)}
    want = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert kev.key(c) == want
    assert kev.key(c) != RuleKev().key(c)  # the parameters are in it
    assert kev.key(c) != kev.key(ctx("LEAN_SELL", 0.7, imbalance=-0.2))
