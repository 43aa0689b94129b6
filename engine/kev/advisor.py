"""The interface every Kev implementation provides (rule-based stand-in, llama-server client, cassette)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from engine.events import Nanos


@dataclass(frozen=True, slots=True, kw_only=True)
class KevContext:
    """The small context snapshot a non-HOLD label pushes onto the Kev queue."""

    request_id: int
    ts_ns: Nanos
    symbol: str
    label: str
    label_seq: int
    p_label: float
    mid: float
    spread: float
    imbalance: float
    position: float
    max_position: float


# The fields that describe the market and the position (no ids, no times): what a prompt shows and
# what request keys hash.
CONTEXT_FIELDS: tuple[str, ...] = (
    "symbol",
    "label",
    "p_label",
    "mid",
    "spread",
    "imbalance",
    "position",
    "max_position",
)


def context_body(ctx: KevContext) -> dict[str, Any]:
    return {k: getattr(ctx, k) for k in CONTEXT_FIELDS}


@dataclass(frozen=True, slots=True)
class BreakerChange:
    """A Kev circuit breaker changed state (``closed``, ``open``, ``half_open``) at ``at_ns`` on the
    breaker's own clock, with ``failures`` consecutive failures behind it."""

    at_ns: Nanos
    state: str
    reason: str
    failures: int


@dataclass(frozen=True, slots=True, kw_only=True)
class KevReply:
    """What an advisor returns: the raw JSON object it produced, or an error.

    ``raw`` is validated by :func:`engine.kev.command.validate_command` in the worker, so every
    advisor goes through the same gate. ``timings`` carries server-side measurements where there are
    any (llama-server: prompt_ms, predicted_ms, token counts). ``failure`` is the error's kind code
    (:data:`engine.kev.failures.FAILURE_KINDS`), set by whoever produced the error; ``breaker`` the
    circuit breaker's state changes since the previous reply, for the engine's ``kev_breaker`` events.
    ``advisor`` names who really answered when that is not the engine's advisor (a cassette's fallback:
    ``cassette>rules``, ``cassette>llm``); "" = the engine's advisor, as usual.
    """

    raw: dict[str, Any] | None
    error: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    key: str = ""  # request key for cassettes (prompt template, input, model, params); "" = none
    failure: str = ""
    breaker: tuple[BreakerChange, ...] = ()
    advisor: str = ""


class KevAdvisor(Protocol):
    name: str

    async def advise(self, ctx: KevContext) -> KevReply: ...


# ---------------------------------------------------------------------------------------------------
# Context v2: the portfolio Kev commands (engine.kev.command schema v2)

CONTEXT_SCHEMA_VERSION_V2 = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class InstrumentState:
    """One instrument as Kev sees it: position and limit (contract units), mark (mid), spread, and
    its latest labels, oldest first."""

    symbol: str
    position: float
    mark: float
    spread: float
    labels: tuple[str, ...]
    max_position: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PairState:
    """A configured pair (:mod:`engine.kev.pairs`): the spread ``log f - alpha - beta log l``, its
    z-score (NaN until the fit is warm) and the fitted hedge ratio (beta; NaN before one)."""

    leader: str
    follower: str
    spread: float
    z: float
    hedge_ratio: float


@dataclass(frozen=True, slots=True, kw_only=True)
class KevContextV2:
    """The portfolio snapshot a label pushes onto the Kev queue: the label that asked (``symbol``,
    ``label``, ``label_seq``, ``p_label``), every instrument in the engine's order and every
    configured pair in its order."""

    request_id: int
    ts_ns: Nanos
    symbol: str
    label: str
    label_seq: int
    p_label: float
    instruments: tuple[InstrumentState, ...]
    pairs: tuple[PairState, ...]

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(i.symbol for i in self.instruments)

    @property
    def pair_keys(self) -> tuple[tuple[str, str], ...]:
        return tuple((p.leader, p.follower) for p in self.pairs)


def context_body_v2(ctx: KevContextV2) -> dict[str, Any]:
    """What a v2 prompt shows and a v2 request key hashes (no ids, no times). Lists keep the
    instruments' and pairs' orders: the order is part of the question (a command's rows follow it)."""
    return {
        "schema_version": CONTEXT_SCHEMA_VERSION_V2,
        "symbol": ctx.symbol,
        "label": ctx.label,
        "p_label": ctx.p_label,
        "instruments": [
            {
                "symbol": i.symbol,
                "position": i.position,
                "mark": i.mark,
                "spread": i.spread,
                "labels": list(i.labels),
                "max_position": i.max_position,
            }
            for i in ctx.instruments
        ],
        "pairs": [
            {
                "leader": p.leader,
                "follower": p.follower,
                "spread": p.spread,
                "z": p.z,
                "hedge_ratio": p.hedge_ratio,
            }
            for p in ctx.pairs
        ],
    }


def context_json_v2(ctx: KevContextV2) -> bytes:
    """:func:`context_body_v2` as canonical JSON: keys sorted at every level, shortest float repr, a
    non-finite number (a z-score not warm yet) as null."""
    return orjson.dumps(context_body_v2(ctx), option=orjson.OPT_SORT_KEYS)
