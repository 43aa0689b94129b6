"""Kev's command schema v2 (engine.kev.command): validation, v1 as v2, the event log's command rows."""

import pytest

from engine.kev.command import (
    CommandFields,
    CommandV2,
    PairHedge,
    as_v2,
    check_pairs,
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
