"""Why a Kev request gave no command: one stable kind code per failed ``kev_response``.

The code is set where the failure is known: the llama-server client (:mod:`engine.kev.llama`) for
transport, HTTP, breaker and parsing faults; the engine for its own timeout, for a command that
fails :func:`~engine.kev.command.validate_command` (``schema``) and for a v2 command that makes no
sense (``inconsistent``, :func:`~engine.kev.command.check_sense`); the cassette for a miss. An error
without a code (a reply built elsewhere, a cassette recorded before codes existed) is classified from
its text by :func:`classify`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from engine.events import Nanos
from engine.kev.advisor import InstrumentState, KevReply
from engine.kev.command import (
    INCONSISTENT,
    CommandFields,
    CommandV2,
    check_sense,
    validate_any,
    validate_command,
)

FAILURE_KINDS: Final[dict[str, str]] = {
    "timeout": "no answer in time (the engine's Kev timeout, or the HTTP client's)",
    "transport": "no HTTP exchange: connection refused or reset, DNS, protocol error",
    "http_5xx": "the server answered 5xx",
    "http_4xx": "the server refused the request (4xx)",
    "breaker_open": "not sent: the circuit breaker is open after repeated failures",
    "invalid_json": "the response body or the model's output is not JSON",
    "malformed": "a JSON response without an answer where one belongs (no choices[0].message)",
    "truncated": "the model hit the token limit before the JSON ended",
    "schema": "a JSON answer that is not a valid portfolio command",
    "inconsistent": "a valid v2 command that contradicts itself or its instruments (command_inconsistent)",
    "cassette_miss": "the cassette holds no answer for the request (miss policy fail)",
    "error": "any other failure (the advisor raised, the run stopped first)",
}

# Prefixes of the error texts this package writes, for replies that carry no code.
_PREFIXES: Final = (
    ("timeout", "timeout"),
    ("transport error", "transport"),
    ("kev unavailable: circuit open", "breaker_open"),
    ("malformed response body", "invalid_json"),
    ("invalid JSON", "invalid_json"),
    ("malformed response", "malformed"),
    ("truncated", "truncated"),
    ("model answered JSON", "schema"),
    ("cassette miss", "cassette_miss"),
    (INCONSISTENT, "inconsistent"),
)


def classify(error: str) -> str:
    """The kind of an error text this package wrote ("error" for any other)."""
    if error.startswith("HTTP "):
        code = error[5:8]
        return "http_5xx" if code.startswith("5") else "http_4xx" if code.startswith("4") else "error"
    return next((kind for prefix, kind in _PREFIXES if error.startswith(prefix)), "error")


def judge(
    reply: KevReply,
    symbols: Sequence[str] | None = None,
    pairs: Sequence[tuple[str, str]] = (),
    instruments: Sequence[InstrumentState] = (),
) -> tuple[CommandFields | CommandV2 | None, str, str]:
    """``(command, error, failure)`` for one reply: the validated command and two empty strings, or
    None with the error text and its kind. ``symbols``: the reply answers a portfolio's context, so
    a v2 command over them (and ``pairs``) is valid too (``validate_any``). ``instruments``: the
    context's instruments (position, mark, limit); a v2 command is then also judged for sense
    (:func:`~engine.kev.command.check_sense`): one that does not make sense is refused with its
    ``command_inconsistent: ...`` reason, kind ``inconsistent``. The one gate every Kev reply of the
    engine passes (engine/core.py ``reply_verdict``): the LLM's, the cassette's, the rule hub's."""
    if reply.raw is None:
        error = reply.error or "no reply"
        return None, error, reply.failure or classify(error)
    verdict = validate_command(reply.raw) if symbols is None else validate_any(reply.raw, symbols, pairs)
    if isinstance(verdict, CommandV2) and instruments:
        why = check_sense(
            verdict,
            {i.symbol: i.position for i in instruments},
            {i.symbol: i.mark for i in instruments},
            {i.symbol: i.max_position for i in instruments},
        )
        if why:
            return None, why, "inconsistent"
    if isinstance(verdict, CommandFields | CommandV2):
        return verdict, "", ""
    return None, verdict or "invalid", "schema"


def breaker_rows(reply: KevReply, now: Nanos, request_id: int) -> list[tuple[Any, ...]]:
    """``kev_breaker`` rows (schema order, no seq) for the breaker changes ``reply`` carries; the engine
    sees them ``now``, with the reply of ``request_id``."""
    return [(now, now, request_id, c.state, c.reason, c.failures, c.at_ns) for c in reply.breaker]
