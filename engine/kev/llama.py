"""Kev's llama-server client: an async :class:`~engine.kev.advisor.KevAdvisor` over ``/v1/chat/completions``.

One request per :class:`KevContext`: a versioned prompt template (:data:`PROMPT_VERSION`, hashed into
:data:`PROMPT_TEMPLATE_SHA256`), the portfolio-command JSON schema as ``response_format`` (or, if the
server rejects the schema with a 400, the equivalent GBNF :data:`COMMAND_GRAMMAR`), temperature 0, a
fixed seed and ``cache_prompt: false`` so identical requests give identical answers.

The client never raises for an expected fault: a timeout, a transport error, an HTTP error, a body that
is not JSON, model output that is not JSON or was cut by the token limit all become a
``KevReply(raw=None, error=..., failure=KIND)`` (kinds: :data:`engine.kev.failures.FAILURE_KINDS`).
Schema validation is the worker's job (:func:`engine.kev.command.validate_command`), so a
schema-violating object is returned as ``raw``.

Availability faults (timeouts, transport errors, 5xx, malformed bodies) are retried a bounded number of
times and feed a :class:`CircuitBreaker`; while it is open, :meth:`LlamaAdvisor.advise` answers at once
with a ``breaker_open`` reply and the engine runs on Laya and the risk gateway alone. The breaker's
cooldown runs on an injected clock (monotonic wall time by default; replay puts it on the virtual
clock, :class:`engine.kev.sim.SimKevBackend`), and each reply carries the breaker's state changes since
the previous one, which the engine logs as ``kev_breaker`` events.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal

import httpx
import orjson

from engine.kev.advisor import (
    CONTEXT_FIELDS,
    BreakerChange,
    KevContext,
    KevContextV2,
    KevReply,
    context_body_v2,
)
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
from engine.kev.server import PRODUCTION_ALIAS

log = logging.getLogger(__name__)

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


# ---------------------------------------------------------------------------------------------------
# Configuration

Constraint = Literal["json_schema", "grammar"]
DEFAULT_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaConfig:
    """How to call llama-server. Times in seconds (``*_s``); ``retries`` counts extra attempts."""

    base_url: str
    model: str = PRODUCTION_ALIAS
    temperature: float = 0.0
    seed: int = 42
    max_tokens: int = 256
    constraint: Constraint = "json_schema"
    grammar_fallback: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = 1.0
    retries: int = 1
    retry_backoff_s: float = 0.05
    retry_on_timeout: bool = False
    breaker_failures: int = 3
    breaker_cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be http(s)://..., got {self.base_url!r}")
        if self.max_tokens < 200:
            # Tiny models pad `reason`; below ~200 tokens a length stop can cut the JSON.
            raise ValueError(f"max_tokens={self.max_tokens} < 200 risks truncated JSON")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature={self.temperature}")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0 or self.retry_backoff_s < 0:
            raise ValueError(f"timeouts must be positive: {self}")
        if self.retries < 0 or self.breaker_failures < 1 or self.breaker_cooldown_s < 0:
            raise ValueError(f"bad retry/breaker settings: {self}")
        if self.constraint not in ("json_schema", "grammar"):
            raise ValueError(f"constraint={self.constraint!r}")

    def key_params(self) -> dict[str, Any]:
        """The parameters that can change the model's answer (they go into the request key)."""
        return {
            "temperature": self.temperature,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "schema_sha256": COMMAND_SCHEMA_SHA256,
        }

    def key(self, ctx: KevContext | KevContextV2) -> str:
        if isinstance(ctx, KevContextV2):
            return request_key_v2(ctx, self.model, self.key_params())
        return request_key(ctx, self.model, self.key_params())

    @classmethod
    def for_engine(cls, base_url: str, kev_timeout_ms: int) -> LlamaConfig:
        """The engine's client: its HTTP timeout outlasts the engine's Kev timeout (``--kev-timeout-ms``),
        so the engine, not the client, decides when an answer is too late, and a late answer is still
        measured."""
        return cls(base_url=base_url, timeout_s=max(DEFAULT_TIMEOUT_S, kev_timeout_ms / 1000 + 1.0))


# ---------------------------------------------------------------------------------------------------
# Circuit breaker

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Opens after ``failure_threshold`` consecutive failures; after ``cooldown_ns`` one probe may pass
    (half-open): its success closes the breaker, its failure opens it again. Time from ``clock_ns``
    (settable: the replay backend moves it onto the virtual clock). State changes queue up as
    :class:`~engine.kev.advisor.BreakerChange` until :meth:`take_changes`.
    """

    def __init__(
        self,
        *,
        failure_threshold: int,
        cooldown_ns: int,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown_ns = cooldown_ns
        self.clock_ns = clock_ns
        self._state: BreakerState = "closed"
        self._opened_at_ns = 0
        self._probe_in_flight = False
        self.consecutive_failures = 0
        self.times_opened = 0
        self._changes: list[BreakerChange] = []

    def _change(self, state: BreakerState, reason: str) -> None:
        self._state = state
        self._changes.append(BreakerChange(self.clock_ns(), state, reason, self.consecutive_failures))

    def take_changes(self) -> tuple[BreakerChange, ...]:
        """The state changes since the last call, oldest first."""
        out, self._changes = tuple(self._changes), []
        return out

    @property
    def state(self) -> BreakerState:
        if self._state == "open" and self.clock_ns() - self._opened_at_ns >= self.cooldown_ns:
            return "half_open"
        return self._state

    def retry_in_s(self) -> float:
        left = self.cooldown_ns - (self.clock_ns() - self._opened_at_ns)
        return max(0.0, left / 1e9) if self._state == "open" else 0.0

    def allow(self) -> bool:
        """May a request go out now? In half-open state only one probe at a time."""
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self._probe_in_flight:
            if self._state != "half_open":
                self._change("half_open", f"cooldown of {self.cooldown_ns / 1e9:g} s over: one probe")
            self._probe_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        self._probe_in_flight = False
        self.consecutive_failures = 0
        if self._state != "closed":
            log.warning("Kev circuit closed: llama-server answers again")
            self._change("closed", "probe answered")

    def record_failure(self, failure: str = "") -> None:
        """One more consecutive failure (of kind ``failure``)."""
        self.consecutive_failures += 1
        self._probe_in_flight = False
        if self._state == "half_open" or self.consecutive_failures >= self.failure_threshold:
            if self._state != "open":
                self.times_opened += 1
                log.warning(
                    "Kev circuit open after %d consecutive failures: the engine runs on Laya and the "
                    "risk gateway alone for at least %.1f s",
                    self.consecutive_failures,
                    self.cooldown_ns / 1e9,
                )
                kind = failure or "error"
                if self._state == "half_open":
                    what = f"probe failed ({kind})"
                else:
                    what = f"{self.consecutive_failures} consecutive failures, the last {kind}"
                self._change("open", f"{what}; cooldown {self.cooldown_ns / 1e9:g} s")
            self._opened_at_ns = self.clock_ns()

    def abort_probe(self) -> None:
        """A probe was cancelled without an answer: let the next call probe instead."""
        self._probe_in_flight = False


# ---------------------------------------------------------------------------------------------------
# The client


@dataclass(frozen=True, slots=True)
class _Outcome:
    reply: KevReply
    retryable: bool = False
    server_failure: bool = False  # counts against the circuit breaker


def _error_message(resp: httpx.Response) -> str:
    try:
        body = orjson.loads(resp.content)
        msg = body.get("error", {}).get("message") if isinstance(body, dict) else None
    except orjson.JSONDecodeError:
        msg = None
    text = msg if isinstance(msg, str) else resp.text
    return text[:200]


def _server_timings(body: Mapping[str, Any]) -> dict[str, float]:
    """prompt_ms, predicted_ms and token counts from llama-server's ``timings`` and ``usage``."""
    out: dict[str, float] = {}
    t = body.get("timings")
    if isinstance(t, dict):
        for name in ("prompt_ms", "predicted_ms", "prompt_n", "predicted_n", "cache_n"):
            v = t.get(name)
            if isinstance(v, int | float) and not isinstance(v, bool):
                out[name] = float(v)
    u = body.get("usage")
    if isinstance(u, dict):
        for name in ("prompt_tokens", "completion_tokens"):
            v = u.get(name)
            if isinstance(v, int | float) and not isinstance(v, bool):
                out[name] = float(v)
    # Fill token counts from timings when usage is absent, and the other way round.
    if "prompt_tokens" not in out and "prompt_n" in out:
        out["prompt_tokens"] = out["prompt_n"]
    if "completion_tokens" not in out and "predicted_n" in out:
        out["completion_tokens"] = out["predicted_n"]
    return out


def parse_prometheus(text: str) -> dict[str, float]:
    """``name value`` lines of Prometheus text (no labels in llama-server's metrics)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) >= 2:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                continue
    return out


class LlamaAdvisor:
    """:class:`~engine.kev.advisor.KevAdvisor` backed by llama-server (``name = "llm"``).

    Use ``async with LlamaAdvisor(cfg) as kev:`` (or call :meth:`aclose`); the HTTP connection pool
    belongs to the event loop that first used it. ``transport`` and ``clock_ns`` are for tests.
    """

    name = "llm"

    def __init__(
        self,
        config: LlamaConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.config = config
        self.breaker = CircuitBreaker(
            failure_threshold=config.breaker_failures,
            cooldown_ns=int(config.breaker_cooldown_s * 1e9),
            clock_ns=clock_ns,
        )
        self.constraint: Constraint = config.constraint
        self.stats: dict[str, int] = {
            "calls": 0,
            "ok": 0,
            "errors": 0,
            "attempts": 0,
            "retries": 0,
            "short_circuited": 0,
            "grammar_fallbacks": 0,
        }
        self._client = httpx.AsyncClient(
            base_url=config.base_url.rstrip("/"),
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            transport=transport,
            headers={"Content-Type": "application/json"},
        )

    # -- keys and requests -------------------------------------------------------------------------

    def key(self, ctx: KevContext | KevContextV2) -> str:
        """The cassette key of ``ctx`` under this client's model and parameters."""
        return self.config.key(ctx)

    def request_body(
        self, ctx: KevContext | KevContextV2, constraint: Constraint | None = None
    ) -> dict[str, Any]:
        """The chat request for ``ctx``: v1 for a :class:`KevContext`, the portfolio prompt, schema
        and grammar for a :class:`KevContextV2`."""
        cfg = self.config
        v2 = isinstance(ctx, KevContextV2)
        body: dict[str, Any] = {
            "model": cfg.model,
            "messages": render_messages_v2(ctx) if v2 else render_messages(ctx),
            "temperature": cfg.temperature,
            "seed": cfg.seed,
            "max_tokens": cfg.max_tokens,
            "cache_prompt": False,
            "stream": False,
        }
        if (constraint or self.constraint) == "json_schema":
            schema = command_schema_v2_for(ctx) if v2 else COMMAND_SCHEMA
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "portfolio_command", "strict": True, "schema": schema},
            }
        else:
            body["grammar"] = command_grammar_v2_for(ctx) if v2 else COMMAND_GRAMMAR
        return body

    # -- the advisor protocol ----------------------------------------------------------------------

    async def advise(self, ctx: KevContext | KevContextV2) -> KevReply:
        self.stats["calls"] += 1
        key = self.key(ctx)
        if not self.breaker.allow():
            self.stats["short_circuited"] += 1
            self.stats["errors"] += 1
            return KevReply(
                raw=None,
                key=key,
                error=(
                    f"kev unavailable: circuit open after {self.breaker.consecutive_failures} consecutive "
                    f"failures (next probe in {self.breaker.retry_in_s():.1f} s); "
                    "engine runs on Laya + risk gateway alone"
                ),
                failure="breaker_open",
                timings={"circuit_open": 1.0, "wall_ms": 0.0},
                breaker=self.breaker.take_changes(),
            )
        t0 = time.perf_counter_ns()
        attempts = 0
        outcome: _Outcome | None = None
        try:
            for attempt in range(self.config.retries + 1):
                if attempt:
                    self.stats["retries"] += 1
                    await asyncio.sleep(self.config.retry_backoff_s * (2 ** (attempt - 1)))
                attempts += 1
                outcome = await self._attempt(ctx)
                if not outcome.retryable:
                    break
        except BaseException:  # cancelled: no verdict on the server's health
            self.breaker.abort_probe()
            raise
        assert outcome is not None
        self.stats["attempts"] += attempts
        if outcome.server_failure:
            self.breaker.record_failure(outcome.reply.failure)
        else:
            self.breaker.record_success()
        reply = outcome.reply
        timings = dict(reply.timings)
        timings["wall_ms"] = (time.perf_counter_ns() - t0) / 1e6
        timings["attempts"] = float(attempts)
        if self.constraint == "grammar":
            timings["grammar"] = 1.0
        self.stats["ok" if reply.raw is not None else "errors"] += 1
        return KevReply(
            raw=reply.raw,
            error=reply.error,
            timings=timings,
            key=key,
            failure=reply.failure,
            breaker=self.breaker.take_changes(),
        )

    async def _post(self, body: dict[str, Any]) -> httpx.Response:
        async with asyncio.timeout(self.config.timeout_s):
            return await self._client.post("/v1/chat/completions", content=orjson.dumps(body))

    async def _attempt(self, ctx: KevContext | KevContextV2) -> _Outcome:
        cfg = self.config
        try:
            resp = await self._post(self.request_body(ctx))
            if (
                resp.status_code == 400
                and self.constraint == "json_schema"
                and cfg.grammar_fallback
                and "exceed_context_size" not in resp.text
            ):
                log.warning(
                    "llama-server rejected the JSON schema (%s); falling back to the GBNF grammar",
                    _error_message(resp),
                )
                self.constraint = "grammar"
                self.stats["grammar_fallbacks"] += 1
                resp = await self._post(self.request_body(ctx))
        except TimeoutError:
            return _Outcome(
                KevReply(raw=None, error=f"timeout: no answer within {cfg.timeout_s:g} s", failure="timeout"),
                retryable=cfg.retry_on_timeout,
                server_failure=True,
            )
        except httpx.TimeoutException as e:
            return _Outcome(
                KevReply(
                    raw=None,
                    error=f"timeout: {type(e).__name__} after {cfg.timeout_s:g} s",
                    failure="timeout",
                ),
                retryable=cfg.retry_on_timeout or isinstance(e, httpx.ConnectTimeout),
                server_failure=True,
            )
        except httpx.TransportError as e:
            return _Outcome(
                KevReply(
                    raw=None, error=f"transport error: {type(e).__name__}: {e}"[:300], failure="transport"
                ),
                retryable=True,
                server_failure=True,
            )
        return self._parse(resp)

    def _parse(self, resp: httpx.Response) -> _Outcome:
        status = resp.status_code
        if status >= 500:
            return _Outcome(
                KevReply(raw=None, error=f"HTTP {status}: {_error_message(resp)}", failure="http_5xx"),
                retryable=True,
                server_failure=True,
            )
        if status != 200:
            # A 400 is this request's problem (e.g. context too long), not the server's health.
            return _Outcome(
                KevReply(raw=None, error=f"HTTP {status}: {_error_message(resp)}", failure="http_4xx"),
                server_failure=status != 400,
            )
        try:
            body = orjson.loads(resp.content)
        except orjson.JSONDecodeError as e:
            return _Outcome(
                KevReply(
                    raw=None,
                    error=f"malformed response body (not JSON: {e}): {resp.text[:120]!r}",
                    failure="invalid_json",
                ),
                retryable=True,
                server_failure=True,
            )
        try:
            choice = body["choices"][0]
            content = choice["message"]["content"]
            finish = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError):
            return _Outcome(
                KevReply(
                    raw=None,
                    error=f"malformed response: no choices[0].message: {resp.text[:120]!r}",
                    failure="malformed",
                ),
                server_failure=True,
            )
        timings = _server_timings(body) if isinstance(body, dict) else {}
        if not isinstance(content, str):
            return _Outcome(
                KevReply(
                    raw=None,
                    error="malformed response: content is not text",
                    timings=timings,
                    failure="malformed",
                )
            )
        if finish == "length":
            n = int(timings.get("completion_tokens", 0))
            return _Outcome(
                KevReply(
                    raw=None,
                    error=f"truncated: finish_reason=length after {n} tokens: {content[:80]!r}",
                    timings=timings,
                    failure="truncated",
                )
            )
        try:
            obj = orjson.loads(content)
        except orjson.JSONDecodeError as e:
            return _Outcome(
                KevReply(
                    raw=None,
                    error=f"invalid JSON from model ({e}): {content[:80]!r}",
                    timings=timings,
                    failure="invalid_json",
                )
            )
        if not isinstance(obj, dict):
            return _Outcome(
                KevReply(
                    raw=None,
                    error=f"model answered JSON {type(obj).__name__}, expected object",
                    timings=timings,
                    failure="schema",
                )
            )
        return _Outcome(KevReply(raw=obj, timings=timings))

    # -- other endpoints ---------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """``/health`` as a dict; ``{"status": "unreachable", "error": ...}`` if the server is down."""
        try:
            r = await self._client.get("/health")
            body = orjson.loads(r.content) if r.content else {}
            return {"http_status": r.status_code, **(body if isinstance(body, dict) else {})}
        except (httpx.HTTPError, orjson.JSONDecodeError) as e:
            return {"status": "unreachable", "error": f"{type(e).__name__}: {e}"}

    async def props(self) -> dict[str, Any]:
        """``/props``: generation defaults, slots, model path, chat template, build info."""
        r = await self._client.get("/props")
        r.raise_for_status()
        body = orjson.loads(r.content)
        return body if isinstance(body, dict) else {}

    async def metrics(self) -> dict[str, float]:
        """``/metrics`` (server started with ``--metrics``) as ``{name: value}``."""
        r = await self._client.get("/metrics")
        r.raise_for_status()
        return parse_prometheus(r.text)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> LlamaAdvisor:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
