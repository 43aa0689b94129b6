"""Kev's command schema v2 (engine.kev.command): validation, v1 as v2, the event log's command rows."""

import math

import pytest

from engine.kev.command import (
    HEDGE_TOLERANCE,
    CommandFields,
    CommandV2,
    PairHedge,
    as_v2,
    check_pairs,
    check_sense,
    command_rows,
    validate_any,
    validate_command,
    validate_command_v2,
)

SYMS = ("BTCUSDT", "ETHUSDT", "SOLUSDT")
PAIRS = (("BTCUSDT", "ETHUSDT"), ("BTCUSDT", "SOLUSDT"))


def v2(**over):
    cmd = {
        "schema_version": 2,
        "action": "LEAN_SELL",
        "targets": {"SOLUSDT": 3.0, "ETHUSDT": -1.5, "BTCUSDT": 0.05},
        "pairs": [
            {"leader": "BTCUSDT", "follower": "SOLUSDT", "hedge_ratio": 0.9},
            {"leader": "BTCUSDT", "follower": "ETHUSDT", "hedge_ratio": 1.2},
        ],
        "max_slippage_bps": 5,
        "reason": "ETH rich",
    }
    cmd.update(over)
    return cmd


V1 = {"action": "LEAN_BUY", "target_position": 0.5, "hedge_ratio": 0.2, "max_slippage_bps": 5, "reason": "x"}


def test_a_v2_command_is_typed_in_the_configured_orders():
    cmd = validate_command_v2(v2(), SYMS, PAIRS)
    assert isinstance(cmd, CommandV2)
    assert cmd.schema_version == 2 and cmd.action == "LEAN_SELL" and cmd.max_slippage_bps == 5.0
    # targets in the instruments' order, pairs in the configured order, whatever the JSON's order
    assert cmd.targets == (("BTCUSDT", 0.05), ("ETHUSDT", -1.5), ("SOLUSDT", 3.0))
    assert [(p.follower, p.hedge_ratio) for p in cmd.pairs] == [("ETHUSDT", 1.2), ("SOLUSDT", 0.9)]
    assert isinstance(cmd.targets[0][1], float) and cmd.target("SOLUSDT") == 3.0


def test_command_rows_carry_each_followers_hedge_ratio_and_1_for_a_leader():
    cmd = validate_command_v2(v2(), SYMS, PAIRS)
    assert command_rows(cmd) == [("BTCUSDT", 0.05, 1.0), ("ETHUSDT", -1.5, 1.2), ("SOLUSDT", 3.0, 0.9)]
    # an instrument in no pair is a row too, with 1.0
    lone = validate_command_v2(v2(pairs=[v2()["pairs"][1]]), SYMS, PAIRS[:1])
    assert command_rows(lone) == [("BTCUSDT", 0.05, 1.0), ("ETHUSDT", -1.5, 1.2), ("SOLUSDT", 3.0, 1.0)]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"schema_version": 3}, "schema_version 3 not supported (expected 2)"),
        ({"schema_version": "2"}, "schema_version '2' not supported (expected 2)"),
        ({"schema_version": True}, "schema_version True not supported (expected 2)"),
        (
            {"targets": {"BTCUSDT": 0.0, "ETHUSDT": 0.0, "SOLUSDT": 0.0, "XRPUSDT": 1.0}},
            "unknown symbol XRPUSDT",
        ),
        ({"targets": {"BTCUSDT": 0.0, "ETHUSDT": 0.0}}, "targets: missing SOLUSDT"),
        (
            {"targets": {"BTCUSDT": 0.0, "ETHUSDT": 11.0, "SOLUSDT": 0.0}},
            "targets.ETHUSDT 11.0 outside [-10.0, 10.0]",
        ),
        (
            {"targets": {"BTCUSDT": "1", "ETHUSDT": 0.0, "SOLUSDT": 0.0}},
            "targets.BTCUSDT is str, expected number",
        ),
        ({"targets": [1, 2, 3]}, "targets is list, expected object"),
        ({"pairs": {}}, "pairs is dict, expected array"),
        (
            {"pairs": [{"leader": "BTCUSDT", "follower": "ETHUSDT", "hedge_ratio": 1.2}]},
            "pairs: missing SOLUSDT/BTCUSDT",
        ),
        ({"pairs": [{"leader": "BTCUSDT", "follower": "ETHUSDT"}]}, "pairs[0]: missing fields: hedge_ratio"),
        (
            {"pairs": [{"leader": "BTCUSDT", "follower": "ETHUSDT", "hedge_ratio": 10.5}]},
            "pairs[0].hedge_ratio 10.5 outside [0.0, 10.0]",
        ),
        (
            {"pairs": [{"leader": "BTCUSDT", "follower": "DOGE", "hedge_ratio": 1}]},
            "pairs[0].follower: unknown symbol 'DOGE'",
        ),
        (
            {"pairs": [{"leader": "ETHUSDT", "follower": "SOLUSDT", "hedge_ratio": 1}]},
            "SOLUSDT/ETHUSDT is not a configured pair",
        ),
        ({"pairs": [v2()["pairs"][1]] * 2}, "pairs[1]: ETHUSDT/BTCUSDT given twice"),
        (
            {"pairs": [{"leader": "BTCUSDT", "follower": "ETHUSDT", "hedge_ratio": 1, "x": 1}]},
            "pairs[0]: unexpected fields: x",
        ),
        ({"action": "BUY"}, "action 'BUY' not one of"),
        ({"max_slippage_bps": float("nan")}, "max_slippage_bps is not finite"),
        ({"reason": "r" * 121}, "reason has 121 chars, limit 120"),
        ({"target_position": 1.0}, "unexpected fields: target_position"),
    ],
)
def test_bad_v2_commands_get_one_clear_reason(change, error):
    verdict = validate_command_v2(v2(**change), SYMS, PAIRS)
    assert isinstance(verdict, str) and error in verdict, verdict


def test_missing_fields_are_named():
    cmd = v2()
    del cmd["pairs"], cmd["reason"]
    assert validate_command_v2(cmd, SYMS, PAIRS) == "missing fields: pairs, reason"
    assert validate_command_v2(V1, SYMS, PAIRS) == "missing fields: schema_version"
    assert validate_command_v2([1], SYMS, PAIRS) == "command is list, expected object"


def test_v1_commands_validate_exactly_as_v1_through_the_one_gate():
    assert validate_any(V1, SYMS, PAIRS) == validate_command(V1)
    for bad in ({**V1, "hedge_ratio": 2.0}, {**V1, "extra": 1}, {"action": "HOLD"}, "x", None):
        assert validate_any(bad, SYMS, PAIRS) == validate_command(bad)
        assert isinstance(validate_any(bad, SYMS, PAIRS), str)
    assert isinstance(validate_any(v2(), SYMS, PAIRS), CommandV2)
    assert validate_any(v2(schema_version=1), SYMS, PAIRS).startswith("schema_version 1 not supported")


def test_a_v1_command_as_v2_gives_the_v1_row():
    v1 = validate_command(V1)
    assert isinstance(v1, CommandFields)
    cmd = as_v2(v1, "BTCUSDT")
    assert cmd == CommandV2(
        schema_version=1,
        action="LEAN_BUY",
        targets=(("BTCUSDT", 0.5),),
        pairs=(),
        max_slippage_bps=5.0,
        reason="x",
        base_hedge_ratio=0.2,
    )
    assert command_rows(cmd) == [("BTCUSDT", v1.target_position, v1.hedge_ratio)]


def test_pair_configurations_are_checked():
    assert check_pairs(SYMS, PAIRS) == ""
    assert "unknown symbol XRPUSDT" in check_pairs(SYMS, [("BTCUSDT", "XRPUSDT")])
    assert "cannot hedge itself" in check_pairs(SYMS, [("BTCUSDT", "BTCUSDT")])
    assert "ETHUSDT follows two leaders" in check_pairs(
        SYMS, [("BTCUSDT", "ETHUSDT"), ("SOLUSDT", "ETHUSDT")]
    )
    assert "both follows and leads" in check_pairs(SYMS, [("BTCUSDT", "ETHUSDT"), ("ETHUSDT", "SOLUSDT")])
    assert PairHedge(leader="a", follower="b", hedge_ratio=1.0).hedge_ratio == 1.0


# ---------------------------------------------------------------- sense (issue 55 item 3)

PAIR = (("BTCUSDT", "ETHUSDT"),)
PAIR_SYMS = ("BTCUSDT", "ETHUSDT")
MARKS = {"BTCUSDT": 90_000.0, "ETHUSDT": 3_000.0, "SOLUSDT": 150.0}
LIMITS = {"BTCUSDT": 0.1, "ETHUSDT": 3.0, "SOLUSDT": 30.0}
FLAT = {"BTCUSDT": 0.0, "ETHUSDT": 0.0, "SOLUSDT": 0.0}


def pair_cmd(btc, eth, hedge=1.2, action="LEAN_SELL"):
    raw = {
        "schema_version": 2,
        "action": action,
        "targets": {"BTCUSDT": btc, "ETHUSDT": eth},
        "pairs": [{"leader": "BTCUSDT", "follower": "ETHUSDT", "hedge_ratio": hedge}],
        "max_slippage_bps": 5,
        "reason": "x",
    }
    cmd = validate_command_v2(raw, PAIR_SYMS, PAIR)
    assert isinstance(cmd, CommandV2), cmd
    return cmd


def sense(cmd, positions=FLAT, marks=MARKS, limits=LIMITS):
    return check_sense(cmd, positions, marks, limits)


def test_a_hedge_sized_by_its_ratio_makes_sense():
    # the leader's notional is hedge_ratio x the follower's, on the other side
    assert sense(pair_cmd(0.04, -1.0)) == ""  # 3600 USD against 1.2 x 3000
    assert sense(pair_cmd(-0.04, 1.0)) == ""
    assert sense(pair_cmd(0.0, 0.0)) == ""  # flat
    assert sense(pair_cmd(0.0, 0.0, action="EMERGENCY_FLATTEN")) == ""
    assert sense(pair_cmd(0.043, -1.0)) == ""  # 7.5% off: within the tolerance
    assert HEDGE_TOLERANCE == 0.1


def test_a_flatten_with_a_position_left_is_inconsistent():
    why = sense(pair_cmd(0.0, -0.5, action="EMERGENCY_FLATTEN"))
    assert why == "command_inconsistent: EMERGENCY_FLATTEN with non-zero targets (ETHUSDT -0.5)"
    lone = validate_any(
        {**v2(), "action": "EMERGENCY_FLATTEN", "targets": {"BTCUSDT": 0.0, "ETHUSDT": 0.0, "SOLUSDT": 1.0}},
        SYMS,
        PAIRS,
    )
    assert sense(lone).startswith("command_inconsistent: EMERGENCY_FLATTEN with non-zero targets (SOLUSDT 1)")


def test_hedge_legs_on_the_same_side_are_inconsistent():
    # the LLM's answer in issue 55: both long, "ETH rich against BTC"
    why = sense(pair_cmd(0.032, 2.048, hedge=1.0, action="LEAN_BUY"))
    assert why.startswith(
        "command_inconsistent: ETHUSDT/BTCUSDT hedge legs both long (BTCUSDT 0.032, ETHUSDT 2.048"
    )
    assert "both short" in sense(pair_cmd(-0.01, -1.0))


def test_hedge_legs_that_disagree_with_the_hedge_ratio_are_inconsistent():
    why = sense(pair_cmd(0.02, -1.0))  # 1800 USD where 1.2 x 3000 = 3600 asks
    assert why.startswith(
        "command_inconsistent: BTCUSDT target 0.02 is 1800.00 USD, its hedge of 1.2 x ETHUSDT -1"
    )
    assert "asks 3600.00 USD (tolerance 10%)" in why
    assert sense(pair_cmd(0.05, -1.0)) != ""  # too much leader
    assert sense(pair_cmd(0.0, -1.0)) != ""  # an unhedged follower
    assert sense(pair_cmd(0.04, 0.0)) != ""  # an unhedged leader
    assert sense(pair_cmd(0.04, 0.0, hedge=0.0)) != ""  # a ratio of 0 hedges nothing: the leader is alone
    assert sense(pair_cmd(0.0, -1.0, hedge=0.0)) == ""  # ... and a follower with ratio 0 needs no leader


def test_a_leader_of_two_pairs_nets_its_followers_legs():
    ok = validate_command_v2(v2(targets={"BTCUSDT": 0.0, "ETHUSDT": -0.3, "SOLUSDT": 8.0}), SYMS, PAIRS)
    # 1.2 x -900 + 0.9 x 1200 = 0: the leader is flat, its legs cancel
    assert sense(ok, limits=LIMITS) == ""
    bad = validate_command_v2(v2(targets={"BTCUSDT": 0.05, "ETHUSDT": -0.3, "SOLUSDT": 8.0}), SYMS, PAIRS)
    assert sense(bad, limits=LIMITS).startswith("command_inconsistent: BTCUSDT target 0.05")


def test_targets_beyond_an_instruments_limit_are_inconsistent():
    why = sense(pair_cmd(0.12, -3.0, hedge=1.2))
    assert why == "command_inconsistent: BTCUSDT target 0.12 beyond its position limit 0.1"
    assert sense(pair_cmd(0.1, -2.5)) == ""  # at the limit
    assert sense(pair_cmd(0.04, -1.0), limits={"BTCUSDT": 0.1, "ETHUSDT": 0.5}).endswith(
        "ETHUSDT target -1 beyond its position limit 0.5"
    )
    # no usable limit: not judged
    assert sense(pair_cmd(0.04, -1.0), limits={"BTCUSDT": math.nan, "ETHUSDT": 0.0}) == ""


def test_a_command_that_keeps_the_positions_is_not_judged_as_a_hedge():
    legging = {"BTCUSDT": 0.0, "ETHUSDT": -1.0}  # one leg filled, the other not yet
    assert sense(pair_cmd(0.0, -1.0, action="HOLD"), positions=legging) == ""
    assert sense(pair_cmd(0.0, -1.0 + 1e-16, action="HOLD"), positions=legging) == ""
    assert sense(pair_cmd(0.0, -2.0), positions=legging) != ""  # but a change is judged


def test_without_marks_only_the_signs_are_judged():
    no_mark = {**MARKS, "BTCUSDT": math.nan}
    assert sense(pair_cmd(0.02, -1.0), marks=no_mark) == ""
    assert "both long" in sense(pair_cmd(0.02, 1.0), marks=no_mark)


def test_the_pairs_rules_commands_make_sense():
    """Every command the rule hub answers, entries scaled to a leader's limit included, passes."""
    from engine.kev.advisor import InstrumentState, KevContextV2, PairState
    from engine.kev.pairs import RulePairsKev

    rule = RulePairsKev()
    seen = 0
    for z in (-3.0, -1.0, 0.1, 1.0, 2.5, float("nan")):
        for pos in ((0.0, 0.0), (0.04, -1.0), (0.0, -1.0), (0.01, 0.3)):
            for max_l in (0.1, 0.01):
                insts = (
                    InstrumentState(
                        symbol="BTCUSDT",
                        position=pos[0],
                        mark=90_000.0,
                        spread=0.1,
                        labels=(),
                        max_position=max_l,
                    ),
                    InstrumentState(
                        symbol="ETHUSDT",
                        position=pos[1],
                        mark=3_000.0,
                        spread=0.01,
                        labels=(),
                        max_position=2.0,
                    ),
                )
                ctx = KevContextV2(
                    request_id=1,
                    ts_ns=0,
                    symbol="ETHUSDT",
                    label="LEAN_SELL",
                    label_seq=0,
                    p_label=0.8,
                    instruments=insts,
                    pairs=(
                        PairState(leader="BTCUSDT", follower="ETHUSDT", spread=0.0, z=z, hedge_ratio=1.23),
                    ),
                )
                cmd = validate_command_v2(rule.decide(ctx), PAIR_SYMS, PAIR)
                assert isinstance(cmd, CommandV2)
                limits = {"BTCUSDT": max(max_l, abs(pos[0])), "ETHUSDT": 2.0}
                positions = dict(zip(PAIR_SYMS, pos, strict=True))
                assert check_sense(cmd, positions, MARKS, limits) == "", (z, pos, max_l, cmd)
                seen += 1
    assert seen == 48


def test_the_gate_refuses_an_inconsistent_command_with_its_reason_and_kind():
    from engine.kev.advisor import InstrumentState, KevReply
    from engine.kev.failures import FAILURE_KINDS, classify, judge

    insts = (
        InstrumentState(
            symbol="BTCUSDT", position=0.0, mark=90_000.0, spread=0.1, labels=(), max_position=0.1
        ),
        InstrumentState(
            symbol="ETHUSDT", position=0.0, mark=3_000.0, spread=0.01, labels=(), max_position=3.0
        ),
    )
    raw = {
        "schema_version": 2,
        "action": "LEAN_BUY",
        "targets": {"BTCUSDT": 0.032, "ETHUSDT": 2.048},
        "pairs": [{"leader": "BTCUSDT", "follower": "ETHUSDT", "hedge_ratio": 1.0}],
        "max_slippage_bps": 5,
        "reason": "ETH rich against BTC",
    }
    verdict, error, failure = judge(KevReply(raw=raw), PAIR_SYMS, PAIR, insts)
    assert verdict is None and failure == "inconsistent" and error.startswith("command_inconsistent: ")
    assert "inconsistent" in FAILURE_KINDS and classify(error) == "inconsistent"
    # without the instruments (a v1 gate, or a caller with no context) the schema is all that is judged
    assert isinstance(judge(KevReply(raw=raw), PAIR_SYMS, PAIR)[0], CommandV2)
    good = {
        **raw,
        "targets": {"BTCUSDT": 0.04, "ETHUSDT": -1.2},
        "pairs": [{**raw["pairs"][0], "hedge_ratio": 1.0}],
    }
    assert isinstance(judge(KevReply(raw=good), PAIR_SYMS, PAIR, insts)[0], CommandV2)
