"""The portfolio-command contract between Kev and the engine: JSON schema and strict validation.

Whatever produces a command (the rule-based stand-in, llama-server, a cassette) hands back a plain
JSON object; :func:`validate_command` is the single gate that turns it into typed fields or a reason.
Invalid, truncated or out-of-range output is a rejection with a reason, never an exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

ACTIONS: Final = ("HOLD", "LEAN_BUY", "LEAN_SELL", "EMERGENCY_FLATTEN")
MAX_REASON_CHARS: Final = 120
# Bounds are the command's own sanity limits; the risk gateway applies the trading limits.
TARGET_POSITION_ABS_MAX: Final = 10.0
HEDGE_RATIO_RANGE: Final = (0.0, 1.0)
MAX_SLIPPAGE_BPS_RANGE: Final = (0.0, 100.0)

COMMAND_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": list(ACTIONS)},
        "target_position": {
            "type": "number",
            "minimum": -TARGET_POSITION_ABS_MAX,
            "maximum": TARGET_POSITION_ABS_MAX,
        },
        "hedge_ratio": {"type": "number", "minimum": HEDGE_RATIO_RANGE[0], "maximum": HEDGE_RATIO_RANGE[1]},
        "max_slippage_bps": {
            "type": "number",
            "minimum": MAX_SLIPPAGE_BPS_RANGE[0],
            "maximum": MAX_SLIPPAGE_BPS_RANGE[1],
        },
        "reason": {"type": "string", "maxLength": MAX_REASON_CHARS},
    },
    "required": ["action", "target_position", "hedge_ratio", "max_slippage_bps", "reason"],
    "additionalProperties": False,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandFields:
    action: str
    target_position: float
    hedge_ratio: float
    max_slippage_bps: float
    reason: str


def _bounded(obj: dict[str, Any], key: str, lo: float, hi: float) -> float | str:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        return f"{key} is {type(v).__name__}, expected number"
    try:
        f = float(v)
    except OverflowError:  # an int beyond float range (JSON allows any number of digits)
        return f"{key} is too large"
    if not math.isfinite(f):
        return f"{key} is not finite"
    if not lo <= f <= hi:
        return f"{key} {f} outside [{lo}, {hi}]"
    return f


def validate_command(obj: Any) -> CommandFields | str:
    """Return typed fields, or a human-readable rejection reason."""
    if not isinstance(obj, dict):
        return f"command is {type(obj).__name__}, expected object"
    missing = [k for k in COMMAND_SCHEMA["required"] if k not in obj]
    if missing:
        return f"missing fields: {', '.join(missing)}"
    # str(): keys of mixed types do not sort (JSON gives only strings, a Python caller may not)
    extra = sorted(str(k)[:40] for k in set(obj) - set(COMMAND_SCHEMA["properties"]))
    if extra:
        return f"unexpected fields: {', '.join(extra)}"
    action = obj["action"]
    if action not in ACTIONS:
        return f"action {repr(action)[:40]} not one of {', '.join(ACTIONS)}"
    tp = _bounded(obj, "target_position", -TARGET_POSITION_ABS_MAX, TARGET_POSITION_ABS_MAX)
    hr = _bounded(obj, "hedge_ratio", *HEDGE_RATIO_RANGE)
    ms = _bounded(obj, "max_slippage_bps", *MAX_SLIPPAGE_BPS_RANGE)
    for v in (tp, hr, ms):
        if isinstance(v, str):
            return v
    reason = obj["reason"]
    if not isinstance(reason, str):
        return f"reason is {type(reason).__name__}, expected string"
    if len(reason) > MAX_REASON_CHARS:
        return f"reason has {len(reason)} chars, limit {MAX_REASON_CHARS}"
    assert isinstance(tp, float) and isinstance(hr, float) and isinstance(ms, float)
    return CommandFields(
        action=action, target_position=tp, hedge_ratio=hr, max_slippage_bps=ms, reason=reason
    )
