"""Kev's llama-server client: an async :class:`~engine.kev.advisor.KevAdvisor` over ``/v1/chat/completions``.

One request per :class:`KevContext` (or :class:`KevContextV2`): the versioned prompt of
:mod:`engine.kev.prompt`, its portfolio-command JSON schema as ``response_format`` (or, if the server
rejects the schema with a 400, the equivalent GBNF grammar), temperature 0, a fixed seed and
``cache_prompt: false`` so identical requests give identical answers.

The client never raises for an expected fault: a timeout, a transport error, an HTTP error, a body that
is not JSON, model output that is not JSON or was cut by the token limit all become a
``KevReply(raw=None, error=..., failure=KIND)`` (kinds: :data:`engine.kev.failures.FAILURE_KINDS`).
Schema validation is the worker's job (:func:`engine.kev.command.validate_command`), so a
schema-violating object is returned as ``raw``.

Availability faults (timeouts, transport errors, 5xx, malformed bodies) are retried a bounded number of
times and feed a :class:`~engine.kev.breaker.CircuitBreaker`; while it is open,
:meth:`LlamaAdvisor.advise` answers at once with a ``breaker_open`` reply and the engine runs on Laya
and the risk gateway alone. Each reply carries the breaker's state changes since the previous one,
which the engine logs as ``kev_breaker`` events.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal

import httpx
import orjson

from engine.kev.advisor import KevContext, KevContextV2, KevReply
from engine.kev.breaker import CircuitBreaker
from engine.kev.command import COMMAND_SCHEMA
from engine.kev.prompt import (
    COMMAND_GRAMMAR,
    COMMAND_SCHEMA_SHA256,
    command_grammar_v2_for,
    command_schema_v2_for,
    render_messages,
    render_messages_v2,
    request_key,
    request_key_v2,
)
from engine.kev.server import PRODUCTION_ALIAS

log = logging.getLogger(__name__)

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
