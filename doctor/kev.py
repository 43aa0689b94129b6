"""Kev checks: llama-server answers ``/health`` and ``/props``, one schema-constrained request works, it
answers within the engine's Kev timeout, and the settings give reproducible output.

Uses Kev's own client (:class:`engine.kev.llama.LlamaAdvisor`), so the request is exactly the one the
engine sends. Why determinism matters (measured in ``shared/docs/kev-server.md``): replays and golden
tests compare Kev's answers byte for byte; with several slots, identical concurrent requests are
batched together and gave 3 different outputs out of 4, and a reused prompt cache changed 2 of 8
answers. So Kev wants ``-np 1`` (``total_slots == 1``) and ``cache_prompt: false`` in every request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

import httpx
import orjson

from doctor.checks import DEFAULT_KEV_URL, Check, DoctorConfig, Status
from engine.kev.advisor import KevContext
from engine.kev.health import RECOMMEND_FACTOR, recommend_timeout_ms

# The engine's Kev timeout when none is configured (EngineConfig, and live/replay --kev-timeout-ms).
DEFAULT_ENGINE_TIMEOUT_MS: Final = 2000

# A fixed context: the same request every run, so its latency is comparable between machines.
PROBE_CONTEXT: Final = KevContext(
    request_id=0,
    ts_ns=0,
    symbol="BTCUSDT",
    label="LEAN_BUY",
    label_seq=0,
    p_label=0.81,
    mid=65000.5,
    spread=0.1,
    imbalance=0.42,
    position=0.0,
    max_position=1.0,
)
START_HINT: Final = (
    "start llama-server with the deterministic recipe (`bash .ci/ensure-llama-server.sh` builds it; "
    "`llama-server -m MODEL.gguf --port 8080 -t 1 -np 1 --cache-ram 0`, see engine/kev/server.py), "
    "or pass --kev-url"
)


def assess_determinism(
    props: Mapping[str, Any], request_body: Mapping[str, Any], timings: Mapping[str, float]
) -> tuple[Status, list[str], list[str]]:
    """(status, facts, problems) from ``/props``, the request Kev sends and the reply's timings."""
    facts: list[str] = []
    problems: list[str] = []
    slots = props.get("total_slots")
    if slots == 1:
        facts.append("total_slots=1 (one request at a time, no cross-request batching)")
    else:
        problems.append(
            f"total_slots={slots}: identical concurrent requests are batched across slots and can "
            "answer differently (start with -np 1)"
        )
    cache_prompt = request_body.get("cache_prompt")
    if cache_prompt is False:
        facts.append("Kev's requests send cache_prompt:false")
    else:
        problems.append(
            f"Kev's requests send cache_prompt={cache_prompt!r}: a reused prompt prefix changes answers "
            "(send cache_prompt:false, or run the server with --cache-ram 0)"
        )
    cache_n = timings.get("cache_n")
    if cache_n is not None:
        if cache_n > 0:
            problems.append(f"the probe reused {cache_n:g} cached prompt tokens (timings.cache_n)")
        else:
            facts.append("the probe reused no cached prompt tokens (timings.cache_n=0)")
    temp = request_body.get("temperature")
    if temp != 0:
        problems.append(f"temperature={temp!r}, not 0")
    else:
        facts.append(f"temperature 0, seed {request_body.get('seed')}")
    return ("warn" if problems else "ok"), facts, problems


async def _probe(url: str, timeout_s: float) -> dict[str, Any]:
    from engine.kev.llama import LlamaAdvisor, LlamaConfig

    cfg = LlamaConfig(base_url=url, timeout_s=timeout_s, connect_timeout_s=2.0, retries=0)
    out: dict[str, Any] = {}
    async with LlamaAdvisor(cfg) as kev:
        out["health"] = health = await kev.health()
        if health.get("http_status") != 200 or health.get("status") != "ok":
            return out
        try:
            out["props"] = await kev.props()
        except (httpx.HTTPError, orjson.JSONDecodeError) as e:
            out["props_error"] = f"{type(e).__name__}: {e}"
        out["request_body"] = kev.request_body(PROBE_CONTEXT)
        out["reply"] = await kev.advise(PROBE_CONTEXT)
        out["constraint"] = kev.constraint
    return out


def assess_latency(wall_ms: float, timeout_ms: int | None) -> Check:
    """The probe's latency against the engine's Kev timeout (``None``: the default, not asked for).

    An answer slower than the timeout is discarded by the engine (live and replay alike): Kev is never
    heard. That is a failure for a timeout the user configured and a warning for the default (as an
    unreachable URL is); a timeout without 1.5x headroom over the probe is a warning (the slow tail
    will time out)."""
    timeout = DEFAULT_ENGINE_TIMEOUT_MS if timeout_ms is None else timeout_ms
    which = "the default" if timeout_ms is None else "the configured"
    recommended = recommend_timeout_ms([wall_ms * 1e6])
    data = {"latency_ms": wall_ms, "timeout_ms": timeout, "recommended_timeout_ms": recommended}
    fix = (
        f"run live and replay with --kev-timeout-ms {recommended} ({RECOMMEND_FACTOR:g}x this answer; "
        "`dualhub kev bench` recommends one from p99 over many calls), or a faster model or machine"
    )
    name = "latency within the Kev timeout"
    if wall_ms > timeout:
        return Check(
            area="kev",
            name=name,
            status="warn" if timeout_ms is None else "fail",
            evidence=f"the answer took {wall_ms:.0f} ms, over {which} Kev timeout of {timeout} ms: the "
            "engine would discard every such answer as a timeout and trade without Kev",
            fix=fix,
            data=data,
        )
    if wall_ms * RECOMMEND_FACTOR > timeout:
        return Check(
            area="kev",
            name=name,
            status="warn",
            evidence=f"the answer took {wall_ms:.0f} ms of {which} Kev timeout of {timeout} ms: slower "
            "answers will time out",
            fix=fix,
            data=data,
        )
    return Check(
        area="kev",
        name=name,
        status="ok",
        evidence=f"the answer took {wall_ms:.0f} ms, within {which} Kev timeout of {timeout} ms",
        data=data,
    )


def kev_checks(cfg: DoctorConfig) -> list[Check]:
    from engine.kev.command import CommandFields, validate_command

    url = cfg.kev_url or DEFAULT_KEV_URL
    unreachable: Status = "fail" if cfg.kev_url else "warn"
    res = asyncio.run(_probe(url, cfg.kev_timeout_s))
    health = res["health"]
    if health.get("status") == "unreachable":
        note = "" if cfg.kev_url else " (the default URL; pass --kev-url)"
        return [
            Check(
                area="kev",
                name="llama-server /health",
                status=unreachable,
                evidence=f"{url}{note} cannot be reached: {health.get('error', '')}",
                fix=START_HINT,
                data={"url": url, "health": health},
            )
        ]
    http = health.get("http_status")
    if not (http == 200 and health.get("status") == "ok"):
        # Loading (503), or something that is not llama-server answers at this URL.
        loading = http == 503
        return [
            Check(
                area="kev",
                name="llama-server /health",
                status="warn" if loading or not cfg.kev_url else "fail",
                evidence=f"{url}: HTTP {http} {dict(health)}",
                fix="wait until the model is loaded" if loading else "is this llama-server? " + START_HINT,
                data={"url": url, "health": health},
            )
        ]
    rows = [
        Check(
            area="kev",
            name="llama-server /health",
            status="ok",
            evidence=f'{url}: HTTP 200 {{"status":"ok"}}',
            data={"url": url, "health": health},
        )
    ]

    props = res.get("props") or {}
    if props:
        params = props.get("default_generation_settings", {})
        n_ctx = params.get("n_ctx") if isinstance(params, dict) else None
        model = props.get("model_alias") or props.get("model_path", "?")
        path = str(props.get("model_path", ""))
        rows.append(
            Check(
                area="kev",
                name="llama-server /props",
                status="ok",
                evidence=f"model {model} ({path.rsplit('/', 1)[-1] or '?'}), n_ctx {n_ctx}, "
                f"total_slots {props.get('total_slots')}, build {props.get('build_info', '?')}",
                data={
                    "model_alias": props.get("model_alias"),
                    "model_path": path,
                    "n_ctx": n_ctx,
                    "total_slots": props.get("total_slots"),
                    "build_info": props.get("build_info"),
                },
            )
        )
    else:
        rows.append(
            Check(
                area="kev",
                name="llama-server /props",
                status="warn",
                evidence=f"/props did not answer: {res.get('props_error', 'empty')}",
                fix="llama-server disables /props with --no-props? start it without",
            )
        )

    reply = res["reply"]
    timings = dict(reply.timings)
    wall_ms = timings.get("wall_ms", 0.0)
    if reply.raw is None:
        rows.append(
            Check(
                area="kev",
                name="schema-constrained request",
                status="fail",
                evidence=f"POST /v1/chat/completions failed after {wall_ms:.0f} ms: {reply.error}",
                fix="see the server log; the model must answer within --kev timeout "
                f"({cfg.kev_timeout_s:g} s)",
                data={"error": reply.error, "timings": timings},
            )
        )
    else:
        verdict = validate_command(reply.raw)
        tokens = (
            f"{timings.get('prompt_tokens', 0):.0f} prompt + {timings.get('completion_tokens', 0):.0f} "
            "generated tokens"
        )
        how = "JSON schema" if res.get("constraint") == "json_schema" else "GBNF grammar (schema rejected)"
        if isinstance(verdict, CommandFields):
            rows.append(
                Check(
                    area="kev",
                    name="schema-constrained request",
                    status="ok",
                    evidence=f"valid command {verdict.action} in {wall_ms:.0f} ms ({tokens}, "
                    f"constrained by {how})",
                    data={"latency_ms": wall_ms, "timings": timings, "command": reply.raw},
                )
            )
        else:
            rows.append(
                Check(
                    area="kev",
                    name="schema-constrained request",
                    status="fail",
                    evidence=f"answer in {wall_ms:.0f} ms ({tokens}) fails the command contract: {verdict}",
                    fix="the server ignored the schema: use llama.cpp's llama-server (not "
                    "llama-cpp-python), which honours response_format json_schema",
                    data={"latency_ms": wall_ms, "timings": timings, "command": reply.raw},
                )
            )
        rows.append(assess_latency(wall_ms, cfg.kev_engine_timeout_ms))

    status, facts, problems = assess_determinism(props, res["request_body"], timings)
    why = "replays and golden tests compare Kev's answers byte for byte"
    rows.append(
        Check(
            area="kev",
            name="deterministic output",
            status=status,
            evidence=("; ".join(problems) + "; ok: " if problems else "") + "; ".join(facts) + f" ({why})",
            fix="restart llama-server with -np 1 --cache-ram 0 (and a pinned -t)" if problems else "",
            data={"facts": facts, "problems": problems},
        )
    )
    return rows
