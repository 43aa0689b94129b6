"""Kev's prompts for llama-server: the versioned templates, their hashes, the command schemas and
GBNF grammars the answer is constrained by, and the request keys a cassette files answers under.

v1 (:data:`PROMPT_VERSION`) asks about one instrument (:class:`~engine.kev.advisor.KevContext`); v2
(:data:`PROMPT_VERSION_V2`) about the portfolio (:class:`~engine.kev.advisor.KevContextV2`), offering the
answer choices of :mod:`engine.kev.choices` and narrowing the schema and grammar to them. Any change to a
template's text is a new version and a new hash, so a cassette never replays an answer to another
question. Pure functions of the context: the client (:mod:`engine.kev.llama`) sends what they build.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any, Final

import orjson

from engine.kev.advisor import CONTEXT_FIELDS, KevContext, KevContextV2, context_body_v2
from engine.kev.choices import CHOICES_VERSION, FLATTEN, TRADING_ACTIONS, choices, pair_hedges
from engine.kev.command import (
    ACTIONS,
    COMMAND_SCHEMA,
    HEDGE_RATIO_RANGE,
    MAX_REASON_CHARS,
    MAX_SLIPPAGE_BPS_RANGE,
    SCHEMA_VERSION_V2,
    TARGET_POSITION_ABS_MAX,
    command_schema_v2,
)

# ---------------------------------------------------------------------------------------------------
# Prompt template (versioned: any change to the text is a new version and a new hash)

PROMPT_VERSION: Final = "kev-prompt-v1"
SYSTEM_PROMPT: Final = (
    "You are Kev, the portfolio advisor of a crypto futures trading engine. A fast classifier "
    "flagged the market state the user sends. Answer with one JSON object and nothing else, with "
    "exactly these fields:\n"
    f"action: one of {', '.join(ACTIONS)}\n"
    f"target_position: number from -{TARGET_POSITION_ABS_MAX:g} to {TARGET_POSITION_ABS_MAX:g}, "
    "the position to move towards, in the same units as position\n"
    f"hedge_ratio: number from {HEDGE_RATIO_RANGE[0]:g} to {HEDGE_RATIO_RANGE[1]:g}\n"
    f"max_slippage_bps: number from {MAX_SLIPPAGE_BPS_RANGE[0]:g} to {MAX_SLIPPAGE_BPS_RANGE[1]:g}\n"
    f"reason: a few words, at most {MAX_REASON_CHARS} characters\n"
    'Example: {"action": "LEAN_BUY", "target_position": 0.5, "hedge_ratio": 0.2, '
    '"max_slippage_bps": 5, "reason": "buy pressure in the book"}'
)
USER_TEMPLATE: Final = (
    "symbol: {symbol}\n"
    "signal: {label} (probability {p_label})\n"
    "mid price: {mid}\n"
    "spread: {spread}\n"
    "book imbalance: {imbalance}\n"
    "position: {position} (limit {max_position})"
)
# The KevContext fields the prompt shows; the request key hashes exactly these.
PROMPT_FIELDS: Final = CONTEXT_FIELDS


def _canonical(obj: Any) -> bytes:
    """Canonical JSON: sorted keys at every level, no whitespace, shortest float repr."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


PROMPT_TEMPLATE_SHA256: Final = sha256_hex(
    _canonical(
        {
            "version": PROMPT_VERSION,
            "system": SYSTEM_PROMPT,
            "user": USER_TEMPLATE,
            "fields": list(PROMPT_FIELDS),
        }
    )
)
COMMAND_SCHEMA_SHA256: Final = sha256_hex(_canonical(COMMAND_SCHEMA))

# GBNF equivalent of COMMAND_SCHEMA, for servers that reject ``response_format`` json_schema.
# Numbers are bounded by their syntax (llama.cpp's schema converter ignores number bounds).
COMMAND_GRAMMAR: Final = r"""
root ::= "{" ws f-action "," ws f-position "," ws f-ratio "," ws f-bps "," ws f-reason "}"
f-action ::= "\"action\"" ws ":" ws action ws
f-position ::= "\"target_position\"" ws ":" ws position ws
f-ratio ::= "\"hedge_ratio\"" ws ":" ws ratio ws
f-bps ::= "\"max_slippage_bps\"" ws ":" ws bps ws
f-reason ::= "\"reason\"" ws ":" ws reason ws
action ::= "\"HOLD\"" | "\"LEAN_BUY\"" | "\"LEAN_SELL\"" | "\"EMERGENCY_FLATTEN\""
position ::= "-"? ("10" ("." "0"{1,3})? | [0-9] ("." [0-9]{1,3})?)
ratio ::= "0" ("." [0-9]{1,3})? | "1" ("." "0"{1,3})?
bps ::= "100" ("." "0"{1,2})? | [1-9]? [0-9] ("." [0-9]{1,2})?
reason ::= "\"" char{0,120} "\""
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
ws ::= [ \t\n]{0,2}
""".strip()


def _num(x: float) -> str:
    return format(x, ".6g")


def context_input(ctx: KevContext) -> dict[str, Any]:
    """The part of the context the prompt shows (what the request key hashes)."""
    return {name: getattr(ctx, name) for name in PROMPT_FIELDS}


def render_messages(ctx: KevContext) -> list[dict[str, str]]:
    """The chat messages for ``ctx`` under template :data:`PROMPT_VERSION`."""
    user = USER_TEMPLATE.format(
        symbol=ctx.symbol,
        label=ctx.label,
        p_label=_num(ctx.p_label),
        mid=_num(ctx.mid),
        spread=_num(ctx.spread),
        imbalance=_num(ctx.imbalance),
        position=_num(ctx.position),
        max_position=_num(ctx.max_position),
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def request_key(ctx: KevContext, model_id: str, params: Mapping[str, Any]) -> str:
    """Cassette key: sha256 over the prompt-template hash, the canonical input, the model id and params.

    Independent of dict insertion order (sorted keys at every level) and of the process (no ``hash()``).
    """
    payload = {
        "template": PROMPT_TEMPLATE_SHA256,
        "input": context_input(ctx),
        "model": model_id,
        "params": dict(params),
    }
    return sha256_hex(_canonical(payload))


# ---------------------------------------------------------------------------------------------------
# Prompt v2: the portfolio (a KevContextV2), answered with a v2 command (engine.kev.command)

PROMPT_VERSION_V2: Final = "kev-prompt-v3"
# a reason is for people reading the log; a small model left 120 characters fills them, one token each
CHOICE_REASON_CHARS: Final = 40
SYSTEM_PROMPT_V2: Final = (
    "You are Kev, the portfolio advisor of a crypto futures trading engine that trades hedged pairs. "
    "A fast classifier flagged one instrument; the user sends every instrument, every pair and the "
    "target positions you may choose from. Answer with one JSON object and nothing else, with exactly "
    "these fields:\n"
    f"schema_version: {SCHEMA_VERSION_V2}\n"
    f"action: one of {', '.join(ACTIONS)} (EMERGENCY_FLATTEN only with the flat targets)\n"
    "targets: one of the target choices, copied exactly\n"
    "pairs: the pairs as given, each with its hedge_ratio\n"
    f"max_slippage_bps: number from {MAX_SLIPPAGE_BPS_RANGE[0]:g} to {MAX_SLIPPAGE_BPS_RANGE[1]:g}\n"
    f"reason: a few words, at most {CHOICE_REASON_CHARS} characters\n"
    "A pair's z-score above 2 means its follower is rich against its leader: sell the follower and buy "
    "the leader; below -2 the other way round; near 0 the spread is back: go flat. Otherwise hold."
)
USER_TEMPLATE_V2: Final = (
    "signal: {label} on {symbol} (probability {p_label})\n"
    "instruments:\n{instruments}\n"
    "pairs (spread = log follower - alpha - hedge_ratio * log leader):\n{pairs}\n"
    "target choices:\n{choices}"
)
INSTRUMENT_LINE_V2: Final = (
    "- {symbol}: position {position} (limit {max_position}), mark {mark}, spread {spread}, "
    "recent labels {labels}"
)
PAIR_LINE_V2: Final = (
    "- {follower} on {leader}: spread {spread}, z-score {z}, fitted hedge_ratio {hedge_ratio}"
)
CHOICE_LINE_V2: Final = "- {name}: {targets}"
PROMPT_TEMPLATE_V2_SHA256: Final = sha256_hex(
    _canonical(
        {
            "version": PROMPT_VERSION_V2,
            "system": SYSTEM_PROMPT_V2,
            "user": USER_TEMPLATE_V2,
            "instrument": INSTRUMENT_LINE_V2,
            "pair": PAIR_LINE_V2,
            "choice": CHOICE_LINE_V2,
            "choices": CHOICES_VERSION,
        }
    )
)


def _num_v2(x: float) -> str:
    return _num(x) if math.isfinite(x) else "n/a"


def _json(obj: Any) -> str:
    """The compact JSON text a choice is offered, constrained and parsed as."""
    return orjson.dumps(obj).decode()


def render_messages_v2(ctx: KevContextV2) -> list[dict[str, str]]:
    """The chat messages for a portfolio context under template :data:`PROMPT_VERSION_V2`."""
    instruments = "\n".join(
        INSTRUMENT_LINE_V2.format(
            symbol=i.symbol,
            position=_num_v2(i.position),
            max_position=_num_v2(i.max_position),
            mark=_num_v2(i.mark),
            spread=_num_v2(i.spread),
            labels=", ".join(i.labels) or "none",
        )
        for i in ctx.instruments
    )
    pairs = (
        "\n".join(
            PAIR_LINE_V2.format(
                leader=p.leader,
                follower=p.follower,
                spread=_num_v2(p.spread),
                z=_num_v2(p.z),
                hedge_ratio=_num_v2(p.hedge_ratio),
            )
            for p in ctx.pairs
        )
        or "- none"
    )
    offered = "\n".join(
        CHOICE_LINE_V2.format(name=c.name, targets=_json(dict(c.targets))) for c in choices(ctx)
    )
    user = USER_TEMPLATE_V2.format(
        label=ctx.label,
        symbol=ctx.symbol,
        p_label=_num(ctx.p_label),
        instruments=instruments,
        pairs=pairs,
        choices=offered,
    )
    return [{"role": "system", "content": SYSTEM_PROMPT_V2}, {"role": "user", "content": user}]


def _pairs_answer(ctx: KevContextV2) -> list[dict[str, Any]]:
    return [
        {"leader": h.leader, "follower": h.follower, "hedge_ratio": h.hedge_ratio} for h in pair_hedges(ctx)
    ]


def command_schema_v2_for(ctx: KevContextV2) -> dict[str, Any]:
    """The v2 command schema narrowed to ``ctx``'s choices (:mod:`engine.kev.choices`): the flat
    targets with EMERGENCY_FLATTEN, any offered targets with another action, the pairs' hedge ratios
    as given. Every command it admits is one :func:`command_schema_v2` admits."""
    offered = choices(ctx)
    flat = [dict(c.targets) for c in offered if c.name == "flat"]
    pairs = _pairs_answer(ctx)

    def variant(actions: tuple[str, ...], targets: list[dict[str, float]]) -> dict[str, Any]:
        full = command_schema_v2(ctx.symbols, ctx.pair_keys)
        props = dict(full["properties"])
        props["action"] = {"type": "string", "enum": list(actions)}
        props["targets"] = {"enum": targets}
        props["pairs"] = {"enum": [pairs]}
        props["reason"] = {**props["reason"], "maxLength": CHOICE_REASON_CHARS}
        return {**full, "properties": props}

    return {
        "anyOf": [
            variant((FLATTEN,), flat),
            variant(TRADING_ACTIONS, [dict(c.targets) for c in offered]),
        ]
    }


def _gbnf_literal(text: str) -> str:
    """``text`` as a JSON string inside a GBNF string literal."""
    js = orjson.dumps(text).decode()
    return '"' + js.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _gbnf_raw(text: str) -> str:
    """``text`` itself (JSON already) as a GBNF string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _v1_rules(*names: str) -> list[str]:
    """The named rules of :data:`COMMAND_GRAMMAR`: a v2 command's numbers, action and reason are v1's."""
    rules = {line.split(" ::= ")[0]: line for line in COMMAND_GRAMMAR.splitlines()}
    return [rules[n] for n in names]


def command_grammar_v2_for(ctx: KevContextV2) -> str:
    """GBNF of :func:`command_schema_v2_for` (for servers that refuse ``response_format``): the fields
    in the schema's order, the targets one of ``ctx``'s choices, EMERGENCY_FLATTEN only with flat."""
    offered = choices(ctx)
    flat = next(k for k, c in enumerate(offered) if c.name == "flat")
    trading = " | ".join(_gbnf_literal(a) for a in TRADING_ACTIONS)
    lines = [
        'root ::= "{" ws f-version "," ws (a-flat "," ws t-flat | a-trade "," ws t-any) "," ws f-pairs '
        '"," ws f-bps "," ws f-reason "}"',
        f'f-version ::= "\\"schema_version\\"" ws ":" ws "{SCHEMA_VERSION_V2}" ws',
        f'a-flat ::= "\\"action\\"" ws ":" ws {_gbnf_literal(FLATTEN)} ws',
        f'a-trade ::= "\\"action\\"" ws ":" ws ({trading}) ws',
        f't-flat ::= "\\"targets\\"" ws ":" ws c-{flat} ws',
        't-any ::= "\\"targets\\"" ws ":" ws (' + " | ".join(f"c-{k}" for k in range(len(offered))) + ") ws",
        f'f-pairs ::= "\\"pairs\\"" ws ":" ws {_gbnf_raw(_json(_pairs_answer(ctx)))} ws',
    ]
    lines += [f"c-{k} ::= {_gbnf_raw(_json(dict(c.targets)))}" for k, c in enumerate(offered)]
    lines += _v1_rules("f-bps", "f-reason", "bps", "char", "ws")
    lines.append(f'reason ::= "\\"" char{{0,{CHOICE_REASON_CHARS}}} "\\""')
    return "\n".join(lines)


def request_key_v2(ctx: KevContextV2, model_id: str, params: Mapping[str, Any]) -> str:
    """Cassette key of a portfolio context: as :func:`request_key`, over the v2 template and body."""
    payload = {
        "template": PROMPT_TEMPLATE_V2_SHA256,
        "input": context_body_v2(ctx),
        "model": model_id,
        "params": dict(params),
        "schema_sha256": sha256_hex(_canonical(command_schema_v2_for(ctx))),
    }
    return sha256_hex(_canonical(payload))
