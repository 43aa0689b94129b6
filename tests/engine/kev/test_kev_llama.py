"""Kev against a real llama-server (SmolLM2-135M), fault injection with a local fake server, cassettes,
request keys and the fitted lag model.

Real calls take ~2 s each on a 2-core machine, so the real-server tests share one recording
(``recorded``) and the whole file stays well under two minutes.
"""

import asyncio
import os
import subprocess
import sys
import time

import numpy as np
import orjson
import pyarrow as pa
import pytest

from dualhub.cli import main as dualhub_main
from engine.events import KevRequest, KevResponse, events_to_table
from engine.kev.advisor import KevContext, KevReply
from engine.kev.breaker import CircuitBreaker
from engine.kev.cassette import (
    CASSETTE_FILE,
    Cassette,
    CassetteAdvisor,
    CassetteEntry,
    CassetteError,
    RecordingAdvisor,
)
from engine.kev.command import CommandFields, validate_command
from engine.kev.lag import EmpiricalLag, fit_lag
from engine.kev.llama import LlamaAdvisor, LlamaConfig, parse_prometheus
from engine.kev.prompt import COMMAND_GRAMMAR, PROMPT_TEMPLATE_SHA256, request_key
from engine.kev.rules import RuleKev
from engine.kev.server import LlamaNotInstalled, LlamaServer, find_binary
from engine.store import atomic_write_parquet


def make_ctx(
    rid=1,
    *,
    symbol="BTCUSDT",
    label="LEAN_BUY",
    p=0.81,
    mid=67012.5,
    spread=0.1,
    imb=0.42,
    position=0.0,
    max_position=1.0,
    ts=1_000,
):
    return KevContext(
        request_id=rid,
        ts_ns=ts,
        symbol=symbol,
        label=label,
        label_seq=rid,
        p_label=p,
        mid=mid,
        spread=spread,
        imbalance=imb,
        position=position,
        max_position=max_position,
    )


CTXS = [
    make_ctx(1),
    make_ctx(
        2,
        symbol="ETHUSDT",
        label="LEAN_SELL",
        p=0.66,
        mid=3456.78,
        spread=0.01,
        imb=-0.35,
        position=0.5,
        max_position=2.0,
    ),
    make_ctx(3, label="EMERGENCY", p=0.93, mid=65001.0, spread=2.5, imb=-0.9, position=0.8),
]


def real_config(url, **kw):
    return LlamaConfig(base_url=url, timeout_s=30.0, **kw)


def is_valid(reply):
    return reply.raw is not None and isinstance(validate_command(reply.raw), CommandFields)


# ---------------------------------------------------------------------------------------------------
# Against the real llama-server


@pytest.fixture(scope="module")
def recorded(llama_server):
    """Three contexts plus a repeat of the first, recorded through RecordingAdvisor; endpoints too."""

    async def go():
        async with LlamaAdvisor(real_config(llama_server.url)) as kev:
            rec = RecordingAdvisor(kev)
            replies = [await rec.advise(c) for c in [*CTXS, make_ctx(9, ts=5_000)]]
            return {
                "replies": replies,
                "cassette": rec.cassette,
                "health": await kev.health(),
                "props": await kev.props(),
                "metrics": await kev.metrics(),
                "stats": dict(kev.stats),
                "key_fn": kev.key,
            }

    return asyncio.run(go())


def test_real_server_returns_schema_valid_commands(recorded):
    replies = recorded["replies"]
    for ctx, reply in zip([*CTXS, CTXS[0]], replies, strict=True):
        assert reply.error == "", reply.error
        assert is_valid(reply), (reply.raw, validate_command(reply.raw))
        assert reply.key == recorded["key_fn"](ctx)
    assert recorded["stats"]["ok"] == 4 and recorded["stats"]["errors"] == 0


def test_identical_requests_give_identical_output_at_temperature_0(recorded):
    first, repeat = recorded["replies"][0], recorded["replies"][3]
    # Same prompt input (request id and time differ), same key, byte-identical answer.
    assert first.key == repeat.key
    assert orjson.dumps(first.raw) == orjson.dumps(repeat.raw)


def test_server_timings_and_endpoints_are_captured(recorded):
    for reply in recorded["replies"]:
        t = reply.timings
        assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0
        assert t["prompt_tokens"] > 50 and t["completion_tokens"] > 5
        assert t["prompt_n"] > 0 and t["predicted_n"] > 0
        assert t["wall_ms"] >= t["predicted_ms"]
        assert t["attempts"] == 1.0
    assert recorded["health"]["status"] == "ok"
    props = recorded["props"]
    assert props["total_slots"] == 1
    assert props["model_path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    m = recorded["metrics"]
    assert m["llamacpp:prompt_tokens_total"] >= sum(r.timings["prompt_tokens"] for r in recorded["replies"])


def test_grammar_constraint_works_on_the_real_server(llama_server):
    async def go():
        async with LlamaAdvisor(real_config(llama_server.url, constraint="grammar")) as kev:
            assert "grammar" in kev.request_body(CTXS[1]) and "response_format" not in kev.request_body(
                CTXS[1]
            )
            return await kev.advise(CTXS[1])

    reply = asyncio.run(go())
    assert is_valid(reply), (reply.error, reply.raw)
    assert reply.timings["grammar"] == 1.0


def test_cassette_record_replay_and_miss_policies(recorded, llama_server, tmp_path):
    cas = recorded["cassette"]
    assert len(cas) == 4 and len(cas.keys) == 3  # the repeat is a second occurrence of one key
    path = cas.write(tmp_path)
    assert path.name == CASSETTE_FILE
    loaded = Cassette.read(path)
    key_fn = recorded["key_fn"]

    async def replay(advisor, ctxs):
        return [await advisor.advise(c) for c in ctxs]

    # Replay: identical answers, keys and server timings; recorded lag delivered in timings.
    replayer = CassetteAdvisor(loaded, key_fn=key_fn, miss_policy="fail")
    again = asyncio.run(replay(replayer, [*CTXS, make_ctx(9, ts=5_000)]))
    for orig, rep in zip(recorded["replies"], again, strict=True):
        assert rep.raw == orig.raw and rep.error == orig.error and rep.key == orig.key
        for name in ("prompt_ms", "predicted_ms", "prompt_tokens", "completion_tokens"):
            assert rep.timings[name] == orig.timings[name]
        assert rep.timings["cassette_hit"] == 1.0 and rep.timings["lag_ns"] > 0
    assert (replayer.hits, replayer.misses, replayer.deterministic) == (4, 0, True)

    # From the engine's kev_response events (raw as the engine writes it: sorted-key JSON text).
    events = [
        KevResponse(
            ts_event=i,
            ts_recv=i,
            seq=i,
            request_id=i,
            ok=r.raw is not None,
            error=r.error,
            lag_ns=1_000_000 * (i + 1),
            advisor="llm",
            key=r.key,
            raw=orjson.dumps(r.raw, option=orjson.OPT_SORT_KEYS).decode(),
            prompt_ms=r.timings["prompt_ms"],
            predicted_ms=r.timings["predicted_ms"],
            prompt_tokens=int(r.timings["prompt_tokens"]),
            completion_tokens=int(r.timings["completion_tokens"]),
        )
        for i, r in enumerate(recorded["replies"])
    ]
    from_events = CassetteAdvisor(Cassette.from_events(events), key_fn=key_fn)
    again = asyncio.run(replay(from_events, [*CTXS, CTXS[0]]))
    assert [r.raw for r in again] == [r.raw for r in recorded["replies"]]
    assert [r.timings["lag_ns"] for r in again] == [1e6, 2e6, 3e6, 4e6]  # n-th occurrence, n-th lag

    unseen = make_ctx(7, symbol="SOLUSDT", mid=145.321, spread=0.02, imb=0.1, position=-1.0, max_position=3.0)
    # Miss policy "fail": an error reply marked as a miss, nothing called.
    miss = asyncio.run(replayer.advise(unseen))
    assert (
        miss.raw is None and miss.error.startswith("cassette miss") and miss.timings["cassette_miss"] == 1.0
    )
    assert replayer.misses == 1 and replayer.deterministic
    # "sim": the rule-based stand-in answers; still deterministic.
    sim = CassetteAdvisor(loaded, key_fn=key_fn, miss_policy="sim", fallback=RuleKev())
    reply = asyncio.run(sim.advise(unseen))
    assert (
        reply.raw == RuleKev().decide(unseen) and reply.timings["cassette_miss"] == 1.0 and sim.deterministic
    )
    # "live": the real server answers, the run is flagged non-deterministic, the answer is cached.
    with pytest.raises(ValueError, match="fallback"):
        CassetteAdvisor(loaded, key_fn=key_fn, miss_policy="live")

    async def live_twice():
        async with LlamaAdvisor(real_config(llama_server.url)) as kev:
            live = CassetteAdvisor(
                Cassette.read(path), key_fn=key_fn, miss_policy="live", fallback=kev, record_misses=True
            )
            return live, await live.advise(unseen), await live.advise(unseen)

    live, first, second = asyncio.run(live_twice())
    assert is_valid(first) and first.timings["live"] == 1.0
    assert live.deterministic is False and live.live_calls == 1
    assert second.timings.get("cassette_hit") == 1.0 and second.raw == first.raw


def test_tick_loop_keeps_its_cadence_while_a_real_kev_call_is_in_flight(llama_server):
    cadence_s = 0.01

    async def go():
        async with LlamaAdvisor(real_config(llama_server.url)) as kev:
            call = asyncio.create_task(kev.advise(CTXS[2]))
            ticks = [time.perf_counter()]
            while not call.done():
                await asyncio.sleep(cadence_s)  # the tick path: a label, an offer, never an await on Kev
                ticks.append(time.perf_counter())
            return await call, np.diff(ticks)

    reply, gaps = asyncio.run(go())
    call_s = reply.timings["wall_ms"] / 1e3
    assert is_valid(reply)
    assert call_s > 0.3, "a real call should take a good fraction of a second on this machine"
    assert len(gaps) >= call_s / cadence_s * 0.5
    # The loop kept ticking at its cadence; its worst gap is a small fraction of the call.
    assert np.median(gaps) < 3 * cadence_s, np.median(gaps)
    assert gaps.max() < call_s / 5, (gaps.max(), call_s)


def test_real_server_killed_mid_call_then_restarted_client_recovers(tmp_path):
    srv = LlamaServer(log_path=tmp_path / "restart.log").start()
    port = srv.port
    try:

        async def go():
            cfg = real_config(
                srv.url, retries=1, retry_backoff_s=0.05, breaker_failures=2, breaker_cooldown_s=0.2
            )
            async with LlamaAdvisor(cfg) as kev:
                call = asyncio.create_task(kev.advise(CTXS[0]))
                await asyncio.sleep(0.4)  # the request is being processed
                await asyncio.to_thread(srv.kill)
                killed = await call
                refused = await kev.advise(CTXS[0])
                assert kev.breaker.state == "open"
                t0 = time.perf_counter()
                short = await kev.advise(CTXS[0])
                short_s = time.perf_counter() - t0
                await asyncio.to_thread(srv.start)
                await asyncio.sleep(0.25)  # past the cool-down: the next call is the half-open probe
                recovered = await kev.advise(CTXS[0])
                return killed, refused, short, short_s, recovered, kev.breaker.state

        killed, refused, short, short_s, recovered, state = asyncio.run(go())
    finally:
        srv.stop()
    assert srv.port == port
    assert killed.raw is None and "transport error" in killed.error, killed.error
    assert refused.raw is None and "transport error" in refused.error and refused.timings["attempts"] == 2
    assert short.raw is None and "circuit open" in short.error and short_s < 0.05
    assert "Laya + risk" in short.error
    assert is_valid(recovered) and state == "closed"


def test_bench_cli_against_the_real_server(llama_server, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = dualhub_main(
        ["kev", "bench", "--url", llama_server.url, "-n", "1", "--warmup", "0", "--out", str(out)]
    )
    assert rc == 0
    result = orjson.loads(out.read_bytes())
    # both prompts timed, one call each; every answer one the engine would act on
    assert set(result["prompts"]) == {"single", "portfolio"}
    for fig in result["prompts"].values():
        assert fig["ok"] == 1 and fig["usable"] == 1 and fig["wall_ms"]["p50"] > 0
    assert (
        result["prompts"]["portfolio"]["prompt_tokens"]["p50"]
        > result["prompts"]["single"]["prompt_tokens"]["p50"]
    )
    assert result["ok"] == 2 and result["schema_valid"] == 1
    printed = capsys.readouterr().out
    assert "portfolio" in printed and "kept for `replay --kev-mode llm`" in printed


# ---------------------------------------------------------------------------------------------------
# Fault injection: a small local HTTP server speaking just enough HTTP/1.1

HANG = object()


def completion(content, finish="stop", *, prompt_n=80, predicted_n=40):
    return 200, orjson.dumps(
        {
            "choices": [
                {"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": content}}
            ],
            "usage": {"prompt_tokens": prompt_n, "completion_tokens": predicted_n},
            "timings": {
                "prompt_n": prompt_n,
                "prompt_ms": 12.5,
                "predicted_n": predicted_n,
                "predicted_ms": 30.25,
            },
        }
    )


GOOD = orjson.dumps(
    {"action": "HOLD", "target_position": 0.0, "hedge_ratio": 0.0, "max_slippage_bps": 5, "reason": "quiet"}
).decode()


class FakeLlama:
    """``async with FakeLlama(handler) as fake``: ``handler(n, path, body) -> (status, bytes) | HANG``."""

    def __init__(self, handler):
        self.handler = handler
        self.requests = []
        self._tasks = set()

    async def __aenter__(self):
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _conn(self, reader, writer):
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            path = lines[0].split()[1]
            length = next(
                (
                    int(v)
                    for k, _, v in (ln.partition(":") for ln in lines[1:])
                    if k.lower() == "content-length"
                ),
                0,
            )
            body = orjson.loads(await reader.readexactly(length)) if length else None
            self.requests.append((path, body))
            result = self.handler(len(self.requests), path, body)
            if asyncio.iscoroutine(result):
                result = await result
            if result is HANG:
                await asyncio.sleep(3600)
            status, payload = result
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: "
                f"{len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)


def fault_config(url, **kw):
    base = {"timeout_s": 0.3, "connect_timeout_s": 0.3, "retries": 0, "retry_backoff_s": 0.01}
    return LlamaConfig(base_url=url, **{**base, **kw})


def run_fake(handler, calls=1, **cfg):
    """Start the fake, make ``calls`` advise() calls; return (replies, fake, advisor)."""

    async def go():
        async with FakeLlama(handler) as fake, LlamaAdvisor(fault_config(fake.url, **cfg)) as kev:
            replies = [await kev.advise(CTXS[0]) for _ in range(calls)]
            return replies, fake, kev

    return asyncio.run(go())


def test_fake_good_answer_and_request_shape():
    (reply,), fake, _ = run_fake(lambda n, p, b: completion(GOOD))
    assert is_valid(reply) and reply.timings["prompt_ms"] == 12.5 and reply.timings["completion_tokens"] == 40
    path, body = fake.requests[0]
    assert path == "/v1/chat/completions"
    assert body["temperature"] == 0 and body["seed"] == 42 and body["cache_prompt"] is False
    assert body["max_tokens"] >= 200 and body["model"] == "qwen2.5-coder-7b"
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"]["required"][0] == "action"


def test_timeout_is_an_error_reply_not_an_exception():
    async def slow(n, p, b):
        await asyncio.sleep(2)
        return completion(GOOD)

    t0 = time.perf_counter()
    (reply,), fake, _ = run_fake(slow)
    assert reply.raw is None and reply.error.startswith("timeout") and time.perf_counter() - t0 < 1.5
    assert len(fake.requests) == 1  # timeouts are not retried by default: the advice would be stale


def test_hung_connection_times_out():
    t0 = time.perf_counter()
    (reply,), _, kev = run_fake(lambda n, p, b: HANG)
    assert reply.raw is None and "timeout" in reply.error and time.perf_counter() - t0 < 1.5
    assert kev.breaker.consecutive_failures == 1


def test_5xx_is_retried_a_bounded_number_of_times():
    (reply,), fake, kev = run_fake(lambda n, p, b: (500, b'{"error":{"message":"boom"}}'), retries=2)
    assert reply.raw is None and reply.error == "HTTP 500: boom" and len(fake.requests) == 3
    assert reply.timings["attempts"] == 3 and kev.stats["retries"] == 2
    # A transient 503 then a good answer: the retry succeeds.
    (reply,), fake, _ = run_fake(lambda n, p, b: (503, b"loading") if n == 1 else completion(GOOD), retries=1)
    assert is_valid(reply) and reply.timings["attempts"] == 2


def test_malformed_body_invalid_json_and_truncation_are_error_replies():
    (reply,), _, kev = run_fake(lambda n, p, b: (200, b"<html>not json{"))
    assert reply.raw is None and reply.error.startswith("malformed response body")
    assert kev.breaker.consecutive_failures == 1  # a broken server counts against the breaker
    (reply,), _, kev = run_fake(lambda n, p, b: completion('{"action": "HOLD", "target_'))
    assert reply.raw is None and reply.error.startswith("invalid JSON from model")
    assert kev.breaker.consecutive_failures == 0  # the server is fine, the answer is not
    (reply,), _, _ = run_fake(
        lambda n, p, b: completion('{"action": "HOLD", "reason": "risk risk ri', "length")
    )
    assert reply.raw is None and reply.error.startswith("truncated: finish_reason=length")
    assert reply.timings["completion_tokens"] == 40


def test_schema_violating_answer_is_returned_raw_and_rejected_by_the_gate():
    bad = orjson.dumps(
        {
            "action": "BUY_EVERYTHING",
            "target_position": 1e15,
            "hedge_ratio": 0.0,
            "max_slippage_bps": 5,
            "reason": "x",
        }
    ).decode()
    (reply,), _, kev = run_fake(lambda n, p, b: completion(bad))
    assert reply.error == "" and reply.raw["action"] == "BUY_EVERYTHING"
    verdict = validate_command(reply.raw)
    assert isinstance(verdict, str) and "action" in verdict
    assert kev.breaker.consecutive_failures == 0


def test_schema_rejected_with_400_falls_back_to_grammar():
    def handler(n, path, body):
        if "response_format" in body:
            return 400, b'{"error":{"code":400,"message":"JSON schema error at #: unsupported","type":"x"}}'
        assert body["grammar"] == COMMAND_GRAMMAR
        return completion(GOOD)

    replies, fake, kev = run_fake(handler, calls=2)
    assert all(is_valid(r) for r in replies) and kev.constraint == "grammar"
    assert ["response_format" in b for _, b in fake.requests] == [True, False, False]
    assert kev.stats["grammar_fallbacks"] == 1
    # A 400 for a too-long prompt is not a schema problem: no fallback, no breaker count.
    too_long = b'{"error":{"code":400,"message":"exceeds","type":"exceed_context_size_error"}}'
    (reply,), fake, kev = run_fake(lambda n, p, b: (400, too_long))
    assert reply.error.startswith("HTTP 400") and kev.constraint == "json_schema" and len(fake.requests) == 1
    assert kev.breaker.consecutive_failures == 0


def test_connection_refused_is_retried_then_an_error_reply():
    async def go():
        async with FakeLlama(lambda n, p, b: completion(GOOD)) as fake:
            url = fake.url
        async with LlamaAdvisor(fault_config(url, retries=2)) as kev:  # nothing listens any more
            return await kev.advise(CTXS[0])

    reply = asyncio.run(go())
    assert reply.raw is None and reply.error.startswith("transport error: ConnectError")
    assert reply.timings["attempts"] == 3


def test_circuit_breaker_opens_short_circuits_and_recovers_via_half_open_probe():
    now = [0]
    healthy = [False]

    def handler(n, p, b):
        return completion(GOOD) if healthy[0] else (500, b"down")

    async def go():
        async with FakeLlama(handler) as fake:
            cfg = fault_config(fake.url, breaker_failures=3, breaker_cooldown_s=5.0)
            async with LlamaAdvisor(cfg, clock_ns=lambda: now[0]) as kev:
                out = [await kev.advise(CTXS[0]) for _ in range(3)]
                assert kev.breaker.state == "open" and len(fake.requests) == 3
                short = await kev.advise(CTXS[0])
                assert len(fake.requests) == 3  # not sent
                now[0] += 5_000_000_000  # cool-down over: half-open, one probe; it fails -> open again
                probe = await kev.advise(CTXS[0])
                assert kev.breaker.state == "open" and len(fake.requests) == 4
                now[0] += 5_000_000_000
                healthy[0] = True
                # Two concurrent calls in half-open state: one probe goes out, the other short-circuits.
                a, b = await asyncio.gather(kev.advise(CTXS[0]), kev.advise(CTXS[0]))
                after = await kev.advise(CTXS[0])
                return out, short, probe, a, b, after, kev

    out, short, probe, a, b, after, kev = asyncio.run(go())
    assert all(r.error.startswith("HTTP 500") for r in out)
    assert short.raw is None and short.timings["circuit_open"] == 1.0 and "circuit open" in short.error
    assert probe.error.startswith("HTTP 500")
    assert is_valid(a) and b.timings.get("circuit_open") == 1.0
    assert is_valid(after) and kev.breaker.state == "closed" and kev.stats["short_circuited"] == 2


def test_breaker_unit_states():
    now = [0]
    br = CircuitBreaker(failure_threshold=2, cooldown_ns=100, clock_ns=lambda: now[0])
    br.record_failure()
    assert br.state == "closed" and br.allow()
    br.record_failure()
    assert br.state == "open" and not br.allow() and br.retry_in_s() > 0
    now[0] = 100
    assert br.state == "half_open" and br.allow() and not br.allow()
    br.abort_probe()  # a cancelled probe lets the next call probe
    assert br.allow()
    br.record_success()
    assert br.state == "closed" and br.consecutive_failures == 0 and br.times_opened == 1


# ---------------------------------------------------------------------------------------------------
# Request keys


GOLDEN_KEY = "b184a9243afad77ddbd3c3aa90619f8e4288071eab061a87730a34729d463672"


def test_request_keys_are_stable_and_order_independent():
    cfg = LlamaConfig(base_url="http://127.0.0.1:1")
    params = cfg.key_params()
    k = request_key(CTXS[0], "qwen2.5-coder-7b", params)
    assert k == cfg.key(CTXS[0]) == request_key(CTXS[0], "qwen2.5-coder-7b", dict(reversed(params.items())))
    # Ids and times are not model input: same key. Any prompt input, the model or a param: new key.
    assert request_key(make_ctx(99, ts=123456789), "qwen2.5-coder-7b", params) == k
    assert request_key(make_ctx(1, mid=67012.6), "qwen2.5-coder-7b", params) != k
    assert request_key(CTXS[0], "other-model", params) != k
    assert request_key(CTXS[0], "qwen2.5-coder-7b", {**params, "seed": 43}) != k
    assert len(PROMPT_TEMPLATE_SHA256) == 64
    # Same key in another process with another hash seed; pinned so a template change is deliberate.
    code = (
        "from engine.kev.advisor import KevContext; from engine.kev.llama import LlamaConfig; "
        "print(LlamaConfig(base_url='http://x:1').key(KevContext(request_id=5, ts_ns=0, symbol='BTCUSDT', "
        "label='LEAN_BUY', label_seq=5, p_label=0.81, mid=67012.5, spread=0.1, imbalance=0.42, "
        "position=0.0, max_position=1.0)))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    ).stdout.strip()
    assert other == k == GOLDEN_KEY


# ---------------------------------------------------------------------------------------------------
# Cassette file, lag model, fit-lag CLI, server helpers


def test_cassette_file_round_trip_and_refuses_other_files(tmp_path):
    cas = Cassette(meta={"model": "qwen2.5-coder-7b"})
    reply = KevReply(
        raw={
            "action": "HOLD",
            "target_position": 0.0,
            "hedge_ratio": 0.0,
            "max_slippage_bps": 1,
            "reason": 'é "q"',
        },
        timings={"prompt_ms": 1.5},
        key="k1",
    )
    cas.add(CassetteEntry.from_reply("k1", reply, lag_ns=7))
    err = KevReply(raw=None, error="timeout: no answer within 10 s")
    cas.add(CassetteEntry.from_reply("k2", err, lag_ns=10_000_000_000))
    cas.add(CassetteEntry.from_reply("", err, lag_ns=1))  # no key: skipped
    back = Cassette.read(cas.write(tmp_path / "c.parquet"))
    assert back.meta == {"model": "qwen2.5-coder-7b"} and back.skipped == 0 and cas.skipped == 1
    assert back.get("k1").to_reply().raw == reply.raw and back.get("k1").lag_ns == 7
    assert back.get("k2").to_reply().error == err.error and back.get("k2").to_reply().raw is None
    assert back.get("nope") is None
    atomic_write_parquet(events_to_table([], "kev_request"), tmp_path / "other.parquet")
    with pytest.raises(CassetteError, match="not a Kev cassette"):
        Cassette.read(tmp_path / "other.parquet")


def test_a_damaged_cassette_or_run_is_one_cassette_error_naming_the_file(tmp_path):
    """Truncated bytes, or the cassette's marks on a table without its columns: a CassetteError (the CLI's
    one line) naming the file, never pyarrow's traceback."""
    good = Cassette()
    good.add(CassetteEntry.from_reply("k", KevReply(raw=None, error="timeout"), lag_ns=1))
    path = good.write(tmp_path / "c.parquet")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CassetteError, match=r"c\.parquet: cannot read it"):
        Cassette.read(path)
    marks = good.to_table().schema.metadata
    atomic_write_parquet(pa.table({"key": ["k"]}).replace_schema_metadata(marks), tmp_path / "cols.parquet")
    with pytest.raises(CassetteError, match=r"cols\.parquet: a Kev cassette without its columns"):
        Cassette.read(tmp_path / "cols.parquet")
    (tmp_path / "run" / "events").mkdir(parents=True)
    (tmp_path / "run" / "events" / "kev_response.parquet").write_bytes(b"PAR1")
    with pytest.raises(CassetteError, match=r"kev_response\.parquet: cannot read it"):
        Cassette.from_run(tmp_path / "run")


def test_empirical_lag_interpolates_and_is_seeded():
    lag = EmpiricalLag([100, 200, 300, 400, 500], rng=np.random.default_rng(7))
    assert lag.quantile(0.0) == 100 and lag.quantile(0.5) == 300 and lag.quantile(1.0) == 500
    assert lag.quantile(0.125) == 150  # halfway between the first two order statistics
    one_by_one = [lag.sample_ns(0) for _ in range(1000)]
    many = EmpiricalLag([100, 200, 300, 400, 500], rng=np.random.default_rng(7)).sample_many(1000)
    assert one_by_one == many.tolist()  # scalar and vector paths agree
    assert min(one_by_one) >= 100 and max(one_by_one) <= 500
    assert abs(np.median(many) - 300) < 20
    with pytest.raises(ValueError):
        EmpiricalLag([-1, 5], rng=np.random.default_rng(0))


def test_fit_lag_separates_queue_from_service():
    service = np.array([200, 250, 300, 350, 400]) * 1_000_000
    wait = np.array([0, 0, 50, 100, 500]) * 1_000_000
    fit = fit_lag(service, wait)
    assert fit["service_ns"]["p50"] == 300_000_000 and fit["queue_wait_ns"]["max"] == 500_000_000
    assert fit["total_ns"]["max"] == 900_000_000
    assert fit["queue_share"] == pytest.approx(650 / 2150)
    inclusive = fit_lag(service + wait, wait, lag_includes_queue=True)
    assert inclusive["service_ns"]["quantiles_ns"] == fit["service_ns"]["quantiles_ns"]
    assert fit_lag([10], [20], lag_includes_queue=True)["negative_service"] == 1
    sampled = EmpiricalLag.from_fit(fit, rng=np.random.default_rng(0)).sample_many(200)
    assert sampled.min() >= 200_000_000 and sampled.max() <= 400_000_000


def _write_run(run, rows):
    """rows: (request_id, ok, lag_ns, queue_wait_ns) -> events/kev_request + kev_response Parquet."""
    reqs = [
        KevRequest(
            ts_event=0,
            ts_recv=0,
            seq=i,
            request_id=rid,
            symbol="BTCUSDT",
            label="LEAN_BUY",
            label_seq=rid,
            mid=1.0,
            spread=0.1,
            imbalance=0.0,
            position=0.0,
            queue_wait_ns=w,
        )
        for i, (rid, _, _, w) in enumerate(rows)
    ]
    resps = [
        KevResponse(
            ts_event=0,
            ts_recv=0,
            seq=i,
            request_id=rid,
            ok=ok,
            error="",
            lag_ns=lag,
            advisor="llm",
            key=f"k{rid}",
            raw="",
            prompt_ms=0.0,
            predicted_ms=0.0,
            prompt_tokens=0,
            completion_tokens=0,
        )
        for i, (rid, ok, lag, _) in enumerate(rows)
    ]
    atomic_write_parquet(events_to_table(reqs, "kev_request"), run / "events" / "kev_request.parquet")
    atomic_write_parquet(events_to_table(resps, "kev_response"), run / "events" / "kev_response.parquet")


def test_fit_lag_cli_reads_runs_and_sessions(tmp_path, capsys):
    _write_run(tmp_path / "s1" / "runs" / "r1", [(1, True, 300_000_000, 10_000_000), (2, False, 9, 0)])
    _write_run(tmp_path / "r2", [(1, True, 500_000_000, 0), (2, True, 400_000_000, 20_000_000)])
    out = tmp_path / "lag.json"
    assert (
        dualhub_main(["kev", "fit-lag", str(tmp_path / "s1"), str(tmp_path / "r2"), "--out", str(out)]) == 0
    )
    result = orjson.loads(out.read_bytes())
    assert len(result["runs"]) == 2 and result["fit"]["n"] == 3  # the failed response is left out
    assert (
        result["fit"]["service_ns"]["max"] == 500_000_000
        and result["fit"]["queue_wait_ns"]["max"] == 20_000_000
    )
    assert "service_ns" in capsys.readouterr().out
    assert EmpiricalLag.from_fit(result, rng=np.random.default_rng(1)).sample_ns(0) >= 300_000_000
    assert dualhub_main(["kev", "fit-lag", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_missing_llm_venv_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALHUB_LLM_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(LlamaNotInstalled, match="ensure-llama-server.sh"):
        find_binary()


def test_parse_prometheus():
    text = "# HELP x\n# TYPE x counter\nllamacpp:prompt_tokens_total 272\nbad line x\n"
    assert parse_prometheus(text) == {"llamacpp:prompt_tokens_total": 272.0}


def test_process_advisor_gives_the_in_process_answers_from_its_own_process(recorded, llama_server):
    """Live mode's default: the llama-server client in a child process answers exactly as in process."""
    from engine.kev.process import ProcessAdvisor

    async def go():
        kev = ProcessAdvisor.llama(real_config(llama_server.url))
        try:
            return [await kev.advise(c) for c in [*CTXS, make_ctx(9, ts=5_000)]], kev.pid
        finally:
            await kev.aclose()

    replies, pid = asyncio.run(go())
    assert pid != os.getpid()
    for mine, theirs in zip(replies, recorded["replies"], strict=True):
        assert mine.error == "" and mine.key == theirs.key
        assert orjson.dumps(mine.raw) == orjson.dumps(theirs.raw)
        assert mine.timings["wall_ms"] > 0
