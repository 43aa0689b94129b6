"""The portfolio-command contract between Kev and the engine: JSON schema and strict validation.

Whatever produces a command (the rule-based stand-in, llama-server, a cassette) hands back a plain
JSON object; :func:`validate_command` is the single gate that turns it into typed fields or a reason.
Invalid, truncated or out-of-range output is a rejection with a reason, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from engine.jit import njit

ACTIONS: Final = ("HOLD", "LEAN_BUY", "LEAN_SELL", "EMERGENCY_FLATTEN")
MAX_REASON_CHARS: Final = 120
# Bounds are the command's own sanity limits; the risk gateway applies the trading limits.
TARGET_POSITION_ABS_MAX: Final = 10.0
HEDGE_RATIO_RANGE: Final = (0.0, 1.0)
# A pair's hedge ratio (v2): the leader's USD notional per USD of the follower, a fitted beta.
PAIR_HEDGE_RATIO_RANGE: Final = (0.0, 10.0)
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


@njit(inline="always")
def within(f: float, lo: float, hi: float) -> bool:
    """A command number's range test: the gate below, and the compiled rule's verdict on its own
    command (engine/kernel/kev.py), which never goes through the gate."""
    return lo <= f <= hi


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
    if not within(f, lo, hi):
        return f"{key} {f} outside [{lo}, {hi}]"
    return f


def _brief(v: Any, limit: int = 40) -> str:
    """A value for a rejection reason: a string's first characters as a repr, anything else by its type
    alone, so that neither a huge value's repr nor a deeply nested one's recursion is ever paid for."""
    if isinstance(v, str):
        return repr(v[:limit])[:limit]
    if v is None or isinstance(v, bool | int | float):
        return repr(v)[:limit] if not isinstance(v, int) or abs(v) < 10**30 else "a huge integer"
    return f"a {type(v).__name__}"


def _text_ok(text: str) -> str | None:
    """None for text that can be written as UTF-8; else the reason (a lone surrogate, which the
    grammar's \\uXXXX escapes allow, cannot be written to the event log or a report)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text (a lone surrogate)"
    return None


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
    if not isinstance(action, str) or action not in ACTIONS:
        return f"action {_brief(action)} not one of {', '.join(ACTIONS)}"
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
    if (bad := _text_ok(reason)) is not None:
        return f"reason {bad}"
    assert isinstance(tp, float) and isinstance(hr, float) and isinstance(ms, float)
    return CommandFields(
        action=action, target_position=tp, hedge_ratio=hr, max_slippage_bps=ms, reason=reason
    )


# ---------------------------------------------------------------------------------------------------
# Schema v2: Kev's command over a portfolio of instruments.
#
# {"schema_version": 2, "action": ..., "targets": {SYMBOL: target_position, ...},
#  "pairs": [{"leader": SYMBOL, "follower": SYMBOL, "hedge_ratio": beta}, ...],
#  "max_slippage_bps": ..., "reason": ...}
# A command without schema_version is a v1 command (validate_command, unchanged).

SCHEMA_VERSION_V2: Final = 2
V2_FIELDS: Final = ("schema_version", "action", "targets", "pairs", "max_slippage_bps", "reason")
PAIR_FIELDS: Final = ("leader", "follower", "hedge_ratio")


def command_schema_v2(symbols: Sequence[str], pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The JSON schema of a v2 command over ``symbols`` (every one needs a target) and ``pairs``
    (``(leader, follower)``, each needs a hedge ratio, in this order)."""
    bound = {"type": "number", "minimum": -TARGET_POSITION_ABS_MAX, "maximum": TARGET_POSITION_ABS_MAX}
    pair_items = [
        {
            "type": "object",
            "properties": {
                "leader": {"type": "string", "enum": [leader]},
                "follower": {"type": "string", "enum": [follower]},
                "hedge_ratio": {
                    "type": "number",
                    "minimum": PAIR_HEDGE_RATIO_RANGE[0],
                    "maximum": PAIR_HEDGE_RATIO_RANGE[1],
                },
            },
            "required": list(PAIR_FIELDS),
            "additionalProperties": False,
        }
        for leader, follower in pairs
    ]
    # exactly these pairs, in order: the item count bounds the array (llama-server's schema converter
    # refuses the boolean schema "items": false)
    count = {"minItems": len(pair_items), "maxItems": len(pair_items)}
    return {
        "type": "object",
        "properties": {
            "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION_V2]},
            "action": COMMAND_SCHEMA["properties"]["action"],
            "targets": {
                "type": "object",
                "properties": {s: bound for s in symbols},
                "required": list(symbols),
                "additionalProperties": False,
            },
            # prefixItems must not be empty: no pairs is an array of none
            "pairs": {"type": "array", **({"prefixItems": pair_items} if pair_items else {}), **count},
            "max_slippage_bps": COMMAND_SCHEMA["properties"]["max_slippage_bps"],
            "reason": COMMAND_SCHEMA["properties"]["reason"],
        },
        "required": list(V2_FIELDS),
        "additionalProperties": False,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class PairHedge:
    leader: str
    follower: str
    hedge_ratio: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandV2:
    """A portfolio command: a target per instrument (in the instruments' order) and a hedge ratio per
    pair (in the pairs' order).

    ``schema_version`` is the version it arrived in: 1 for a v1 command seen through :func:`as_v2`.
    ``base_hedge_ratio`` is the hedge ratio of an instrument that is no pair's follower: 1.0 for a v2
    command (a leader hedges nothing), a v1 command's own ``hedge_ratio`` through :func:`as_v2`, so
    that :func:`command_rows` of it is the v1 command's row."""

    schema_version: int
    action: str
    targets: tuple[tuple[str, float], ...]
    pairs: tuple[PairHedge, ...]
    max_slippage_bps: float
    reason: str
    base_hedge_ratio: float = 1.0

    def target(self, symbol: str) -> float:
        for s, t in self.targets:
            if s == symbol:
                return t
        raise KeyError(symbol)


def as_v2(cmd: CommandFields, symbol: str) -> CommandV2:
    """A v1 command as the v2 command over the one instrument ``symbol`` it was given for."""
    return CommandV2(
        schema_version=1,
        action=cmd.action,
        targets=((symbol, cmd.target_position),),
        pairs=(),
        max_slippage_bps=cmd.max_slippage_bps,
        reason=cmd.reason,
        base_hedge_ratio=cmd.hedge_ratio,
    )


def command_rows(cmd: CommandV2) -> list[tuple[str, float, float]]:
    """``(symbol, target_position, hedge_ratio)`` per instrument, in the command's instruments order:
    the event log's ``command`` rows of one command (one ``command_id``). A pair's follower carries
    that pair's hedge ratio, every other instrument ``base_hedge_ratio`` (1.0 in v2)."""
    hedge = {p.follower: p.hedge_ratio for p in cmd.pairs}
    return [(s, t, hedge.get(s, cmd.base_hedge_ratio)) for s, t in cmd.targets]


def validate_command_v2(
    obj: Any, symbols: Sequence[str], pairs: Sequence[tuple[str, str]] = ()
) -> CommandV2 | str:
    """A v2 command over the instruments ``symbols`` and the configured ``pairs`` (leader, follower),
    or one human-readable rejection reason. Every instrument needs a target and every configured pair
    a hedge ratio (any order in the JSON; the command keeps the configured orders); an unknown symbol
    or an unconfigured pair is refused."""
    if not isinstance(obj, dict):
        return f"command is {type(obj).__name__}, expected object"
    if "schema_version" not in obj:
        return "missing fields: schema_version"
    version = obj["schema_version"]
    if isinstance(version, bool) or version != SCHEMA_VERSION_V2:
        return f"schema_version {_brief(version, 20)} not supported (expected {SCHEMA_VERSION_V2})"
    missing = [k for k in V2_FIELDS if k not in obj]
    if missing:
        return f"missing fields: {', '.join(missing)}"
    extra = sorted(str(k)[:40] for k in set(obj) - set(V2_FIELDS))
    if extra:
        return f"unexpected fields: {', '.join(extra)}"
    action = obj["action"]
    if not isinstance(action, str) or action not in ACTIONS:
        return f"action {_brief(action)} not one of {', '.join(ACTIONS)}"
    ms = _bounded(obj, "max_slippage_bps", *MAX_SLIPPAGE_BPS_RANGE)
    if isinstance(ms, str):
        return ms
    reason = obj["reason"]
    if not isinstance(reason, str):
        return f"reason is {type(reason).__name__}, expected string"
    if len(reason) > MAX_REASON_CHARS:
        return f"reason has {len(reason)} chars, limit {MAX_REASON_CHARS}"
    if (bad := _text_ok(reason)) is not None:
        return f"reason {bad}"
    targets = obj["targets"]
    if not isinstance(targets, dict):
        return f"targets is {type(targets).__name__}, expected object"
    unknown = sorted(str(k)[:40] for k in set(targets) - set(symbols))
    if unknown:
        return f"targets: unknown symbol {', '.join(unknown)} (instruments: {', '.join(symbols)})"
    missing = [s for s in symbols if s not in targets]
    if missing:
        return f"targets: missing {', '.join(missing)}"
    typed_targets = []
    for s in symbols:
        v = _bounded(targets, s, -TARGET_POSITION_ABS_MAX, TARGET_POSITION_ABS_MAX)
        if isinstance(v, str):
            return f"targets.{v}"
        typed_targets.append((s, v))
    got = obj["pairs"]
    if not isinstance(got, list):
        return f"pairs is {type(got).__name__}, expected array"
    ratios: dict[tuple[str, str], float] = {}
    for i, p in enumerate(got):
        where = f"pairs[{i}]"
        if not isinstance(p, dict):
            return f"{where} is {type(p).__name__}, expected object"
        missing = [k for k in PAIR_FIELDS if k not in p]
        if missing:
            return f"{where}: missing fields: {', '.join(missing)}"
        extra = sorted(str(k)[:40] for k in set(p) - set(PAIR_FIELDS))
        if extra:
            return f"{where}: unexpected fields: {', '.join(extra)}"
        leader, follower = p["leader"], p["follower"]
        for name, sym in (("leader", leader), ("follower", follower)):
            if not isinstance(sym, str) or sym not in symbols:
                return f"{where}.{name}: unknown symbol {_brief(sym)} (instruments: {', '.join(symbols)})"
        if (leader, follower) not in pairs:
            return f"{where}: {follower}/{leader} is not a configured pair"
        if (leader, follower) in ratios:
            return f"{where}: {follower}/{leader} given twice"
        hr = _bounded(p, "hedge_ratio", *PAIR_HEDGE_RATIO_RANGE)
        if isinstance(hr, str):
            return f"{where}.{hr}"
        ratios[(leader, follower)] = hr
    absent = [f"{f}/{lead}" for lead, f in pairs if (lead, f) not in ratios]
    if absent:
        return f"pairs: missing {', '.join(absent)}"
    return CommandV2(
        schema_version=SCHEMA_VERSION_V2,
        action=action,
        targets=tuple(typed_targets),
        pairs=tuple(PairHedge(leader=lead, follower=f, hedge_ratio=ratios[(lead, f)]) for lead, f in pairs),
        max_slippage_bps=ms,
        reason=reason,
    )


def check_pairs(symbols: Sequence[str], pairs: Sequence[tuple[str, str]]) -> str:
    """ "" for a usable pair configuration, else why not: every leg a known instrument, a pair's legs
    distinct, no follower in two pairs (its command row carries one hedge ratio) and no follower that
    leads another pair (its target would be two pairs' at once)."""
    followers: set[str] = set()
    leaders = {lead for lead, _ in pairs}
    for lead, f in pairs:
        for sym in (lead, f):
            if sym not in symbols:
                return f"pair {f}/{lead}: unknown symbol {sym} (instruments: {', '.join(symbols)})"
        if lead == f:
            return f"pair {f}/{lead}: a symbol cannot hedge itself"
        if f in followers:
            return f"pair {f}/{lead}: {f} follows two leaders"
        if f in leaders:
            return f"pair {f}/{lead}: {f} both follows and leads"
        followers.add(f)
    return ""


# ---------------------------------------------------------------------------------------------------
# Sense: a v2 command that passes the schema can still contradict itself or the instruments.

INCONSISTENT: Final = "command_inconsistent"
# A hedge's legs may differ from its hedge ratio by this share of the larger notional: the legs are
# rounded to whole contract digits, and a model writes its numbers with few digits.
HEDGE_TOLERANCE: Final = 0.1
_LIMIT_SLACK: Final = 1e-9  # a target at its limit, written through a float, is at its limit


def _finite_positive(v: float) -> bool:
    return math.isfinite(v) and v > 0.0


def _same(target: float, position: float) -> bool:
    """A target that is the position as written in the context (a position is a whole number of
    size steps, which its decimal text may round in the last bit)."""
    return math.isclose(target, position, rel_tol=1e-9, abs_tol=1e-12)


def check_sense(
    cmd: CommandV2,
    positions: Mapping[str, float],
    marks: Mapping[str, float],
    limits: Mapping[str, float],
    tolerance: float = HEDGE_TOLERANCE,
) -> str:
    """ "" for a v2 command that makes sense for the instruments as they are, else why not, starting
    ``command_inconsistent: ``. ``positions``, ``marks`` (mids) and ``limits`` (each instrument's
    position limit, contract units) are the context's, per symbol.

    - An EMERGENCY_FLATTEN has every target 0.
    - Every target is within its instrument's limit (an instrument with no usable limit: not checked).
    - A hedge: a pair's hedge ratio is the leader's USD notional per USD of the follower, on the
      other side, so a leader's target notional is ``-sum(hedge_ratio x follower's target
      notional)`` over the pairs it leads, within ``tolerance`` of the larger of the two sides. The
      two legs of a leader's only pair both long or both short are named as such. A leader whose
      target and whose followers' targets all equal their positions is not judged: the command
      trades nothing there, whatever a legging position looks like. Without a usable mark on a leg
      only the signs are judged.
    """
    why = _why_inconsistent(cmd, positions, marks, limits, tolerance)
    return f"{INCONSISTENT}: {why}" if why else ""


def _why_inconsistent(
    cmd: CommandV2,
    positions: Mapping[str, float],
    marks: Mapping[str, float],
    limits: Mapping[str, float],
    tolerance: float,
) -> str:
    targets = dict(cmd.targets)
    if cmd.action == "EMERGENCY_FLATTEN":
        held = [f"{s} {t:g}" for s, t in cmd.targets if t != 0.0]
        if held:
            return f"EMERGENCY_FLATTEN with non-zero targets ({', '.join(held)})"
    for s, t in cmd.targets:
        lim = limits.get(s, math.nan)
        if _finite_positive(lim) and abs(t) > lim * (1.0 + _LIMIT_SLACK):
            return f"{s} target {t:g} beyond its position limit {lim:g}"
    leaders: dict[str, list[PairHedge]] = {}
    for p in cmd.pairs:
        leaders.setdefault(p.leader, []).append(p)
    for lead, hedges in leaders.items():
        legs = [lead, *(p.follower for p in hedges)]
        if all(_same(targets[s], positions.get(s, math.nan)) for s in legs):
            continue
        t_l = targets[lead]
        if len(hedges) == 1:  # a leader of several pairs nets their legs: only the sum is judged
            p = hedges[0]
            t_f = targets[p.follower]
            if t_l * t_f > 0.0:
                side = "long" if t_l > 0.0 else "short"
                return (
                    f"{p.follower}/{lead} hedge legs both {side} ({lead} {t_l:g}, {p.follower} {t_f:g}, "
                    f"hedge_ratio {p.hedge_ratio:g}): a hedge's legs are on opposite sides"
                )
        if not all(_finite_positive(marks.get(s, math.nan)) for s in legs):
            continue  # no price to weigh the legs with: the signs were all there was to judge
        n_l = t_l * marks[lead]
        implied = -math.fsum(p.hedge_ratio * targets[p.follower] * marks[p.follower] for p in hedges)
        scale = max(
            abs(n_l), math.fsum(abs(p.hedge_ratio * targets[p.follower]) * marks[p.follower] for p in hedges)
        )
        if abs(n_l - implied) > tolerance * scale:
            followers = ", ".join(f"{p.hedge_ratio:g} x {p.follower} {targets[p.follower]:g}" for p in hedges)
            return (
                f"{lead} target {t_l:g} is {n_l:.2f} USD, its hedge of {followers} asks {implied:.2f} USD "
                f"(tolerance {tolerance:.0%})"
            )
    return ""


def validate_any(
    obj: Any, symbols: Sequence[str], pairs: Sequence[tuple[str, str]] = ()
) -> CommandFields | CommandV2 | str:
    """The one gate for both versions: no ``schema_version`` is a v1 command (:func:`validate_command`,
    exactly as ever), ``schema_version`` 2 a v2 command over ``symbols`` and ``pairs``."""
    if isinstance(obj, dict) and "schema_version" in obj:
        return validate_command_v2(obj, symbols, pairs)
    return validate_command(obj)
