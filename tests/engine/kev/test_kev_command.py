"""The Kev command gate on hostile values: whatever an LLM, a cassette or a caller hands it, one reason
comes back, short, without paying for the value's size or depth, and never an exception."""

from __future__ import annotations

import json

from engine.kev.command import CommandFields, validate_command, validate_command_v2

GOOD = {
    "action": "LEAN_BUY",
    "target_position": 0.01,
    "hedge_ratio": 0.5,
    "max_slippage_bps": 5.0,
    "reason": "ok",
}


def test_a_reason_with_a_lone_surrogate_is_refused():
    """The grammar's \\uXXXX escapes let an LLM write "\\ud800", which JSON decodes to a lone surrogate
    that no UTF-8 writer (the event log, a report) can encode."""
    cmd = json.loads('{"action": "HOLD", "target_position": 0, "hedge_ratio": 0.5, '
                     '"max_slippage_bps": 5, "reason": "bad \\ud800 text"}')  # fmt: skip
    got = validate_command(cmd)
    assert isinstance(got, str) and "surrogate" in got
    assert isinstance(validate_command({**GOOD, "reason": "ça va \u00e9 \U0001f600"}), CommandFields)
    v2 = {
        "schema_version": 2,
        "action": "HOLD",
        "targets": {"BTCUSDT": 0.0},
        "pairs": [],
        "max_slippage_bps": 5.0,
        "reason": "\udfff",
    }
    got2 = validate_command_v2(v2, ("BTCUSDT",))
    assert isinstance(got2, str) and "surrogate" in got2


def test_a_huge_or_deep_action_is_refused_by_its_type_alone():
    """A 10**7-element action was repr'd whole (0.47 s) before the reason cut it to 40 characters; a
    200 000-deep nested one raised RecursionError."""
    big = list(range(10**7))
    got = validate_command({**GOOD, "action": big})
    assert got == "action a list not one of HOLD, LEAN_BUY, LEAN_SELL, EMERGENCY_FLATTEN"
    deep: list = []
    for _ in range(200_000):
        deep = [deep]
    got = validate_command({**GOOD, "action": deep})
    assert isinstance(got, str) and got.startswith("action a list not one of")
    got = validate_command_v2({"schema_version": deep}, ("BTCUSDT",))
    assert got == "schema_version a list not supported (expected 2)"
    # a string keeps its start, quoted, as before
    assert validate_command({**GOOD, "action": "BUY" * 100}).startswith("action 'BUYBUYBUY")
