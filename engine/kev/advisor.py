"""The interface every Kev implementation provides (rule-based stand-in, llama-server client, cassette)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

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
