"""Kev failures by kind, the circuit breaker as events on the replay clock, and the decision digest.

Faults come from a tiny local HTTP server standing in for llama-server (a fake is the only way to make
a server fail on cue); the engine, the client and the replay around it are the real ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pyarrow.parquet as pq
import pytest

from analysis.report import connect, load_queries
from engine.eventlog import OUTPUT_STREAMS, EventLog, digest_tables
from engine.events import NON_DECISION_COLUMNS, events_to_table
from engine.kev.advisor import KevContext, KevReply
from engine.kev.breaker import CircuitBreaker
from engine.kev.cassette import Cassette
from engine.kev.failures import FAILURE_KINDS, classify, judge
from engine.kev.llama import LlamaAdvisor, LlamaConfig
from replay.config import ReplayConfig
from replay.diff import diff_runs
from replay.driver import run_replay
from venue.simulator import simulate_session

GOOD = orjson.dumps(
    {"action": "LEAN_BUY", "target_position": 0.01, "hedge_ratio": 0.0, "max_slippage_bps": 5, "reason": "ok"}
).decode()
HANG = "hang"
CTX = KevContext(
    request_id=1,
    ts_ns=0,
    symbol="BTCUSDT",
    label="LEAN_BUY",
    label_seq=0,
    p_label=0.9,
    mid=50_000.0,
    spread=0.1,
    imbalance=0.2,
    position=0.0,
    max_position=1.0,
)


def completion(content: str, finish: str = "stop") -> tuple[int, bytes]:
    body = {
        "choices": [
            {"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": content}}
        ],
        "usage": {"prompt_tokens": 80, "completion_tokens": 40},
        "timings": {"prompt_ms": 12.5, "predicted_ms": 30.25, "prompt_n": 80, "predicted_n": 40},
    }
    return 200, orjson.dumps(body)


class FaultServer:
    """``with FaultServer(respond) as srv``: every POST gets ``respond(n)`` (n counts POSTs from 1):
    ``(status, body)`` or :data:`HANG` (no answer until the server stops)."""

    def __init__(self, respond):
        self.respond = respond
        self.posts = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer._lock:
                    outer.posts += 1
                    n = outer.posts
                result = outer.respond(n)
                if result == HANG:
                    outer._stop.wait(30)
                    return
                status, payload = result
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FaultServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()


def advise_once(url: str, **cfg) -> KevReply:
    config = LlamaConfig(base_url=url, timeout_s=0.3, connect_timeout_s=0.3, retries=0, **cfg)

    async def go() -> KevReply:
        async with LlamaAdvisor(config) as kev:
            return await kev.advise(CTX)

    return asyncio.run(go())


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------
# failure kinds from the client


@pytest.mark.parametrize(
    ("respond", "kind"),
    [
        (lambda n: (500, b'{"error": {"message": "boom"}}'), "http_5xx"),
        (lambda n: (404, b"not here"), "http_4xx"),
        (lambda n: (200, b"<html>not json{"), "invalid_json"),
        (lambda n: completion('{"action": "HOLD", "target_'), "invalid_json"),
        (lambda n: completion('{"action": "HOLD", "reason": "risk ri', "length"), "truncated"),
        (lambda n: (200, b'{"choices": []}'), "malformed"),
        (lambda n: completion("[1, 2]"), "schema"),
        (lambda n: HANG, "timeout"),
    ],
)
def test_each_server_fault_is_a_reply_with_its_kind(respond, kind):
    with FaultServer(respond) as srv:
        reply = advise_once(srv.url)
    assert reply.raw is None and reply.error and reply.failure == kind
    command, error, failure = judge(reply)  # what the engine writes into kev_response
    assert command is None and error == reply.error and failure == kind
    assert classify(reply.error) == kind  # old cassettes without kinds get the same code from the text


def test_connection_refused_is_transport_and_a_bad_command_is_schema():
    reply = advise_once(f"http://127.0.0.1:{dead_port()}")
    assert reply.raw is None and reply.failure == "transport" and judge(reply)[2] == "transport"
    bad = orjson.loads(GOOD) | {"action": "BUY_EVERYTHING"}
    with FaultServer(lambda n: completion(orjson.dumps(bad).decode())) as srv:
        reply = advise_once(srv.url)
    assert reply.failure == "" and reply.raw == bad  # valid JSON: the client hands it on ...
    command, error, failure = judge(reply)  # ... and the engine's gate rejects it
    assert command is None and "action" in error and failure == "schema"
    with FaultServer(lambda n: completion(GOOD)) as srv:
        assert judge(advise_once(srv.url))[1:] == ("", "")
    assert set(FAILURE_KINDS) >= {"timeout", "transport", "http_5xx", "http_4xx", "breaker_open", "schema"}


def test_breaker_short_circuits_with_its_kind_and_reports_its_changes():
    now = [0]
    with FaultServer(lambda n: (500, b"down") if n <= 2 else completion(GOOD)) as srv:
        cfg = LlamaConfig(base_url=srv.url, retries=0, breaker_failures=2, breaker_cooldown_s=5.0)

        async def go() -> list[KevReply]:
            async with LlamaAdvisor(cfg, clock_ns=lambda: now[0]) as kev:
                out = [await kev.advise(CTX) for _ in range(3)]  # 500, 500 (opens), short-circuit
                now[0] = 5_000_000_000 - 1
                out.append(await kev.advise(CTX))  # one ns short of the cooldown: still open
                now[0] += 1
                out.append(await kev.advise(CTX))  # the probe: answered, the breaker closes
                return out

        replies = asyncio.run(go())
        posts = srv.posts
    assert [r.failure for r in replies] == ["http_5xx", "http_5xx", "breaker_open", "breaker_open", ""]
    assert posts == 3  # the short-circuited calls never reached the server
    assert pickle.loads(pickle.dumps(replies[4])) == replies[4]  # Kev's own process sends replies pickled
    assert [r.breaker for r in replies[:1] + replies[2:4]] == [(), (), ()]
    (opened,) = replies[1].breaker
    assert (opened.state, opened.at_ns, opened.failures) == ("open", 0, 2) and "http_5xx" in opened.reason
    assert [(c.state, c.at_ns) for c in replies[4].breaker] == [
        ("half_open", 5_000_000_000),
        ("closed", 5_000_000_000),
    ]


def test_breaker_reopens_when_the_probe_fails():
    now = [0]
    br = CircuitBreaker(failure_threshold=1, cooldown_ns=100, clock_ns=lambda: now[0])
    br.record_failure("timeout")
    now[0] = 100
    assert br.allow()
    br.record_failure("transport")
    now[0] = 150
    assert not br.allow()  # the cooldown starts again at the failed probe
    changes = br.take_changes()
    assert [(c.state, c.at_ns, c.failures) for c in changes] == [
        ("open", 0, 1),
        ("half_open", 100, 1),
        ("open", 100, 2),
    ]
    assert "probe failed (transport)" in changes[2].reason and br.take_changes() == ()


# ---------------------------------------------------------------------------------------------------
# in the replay: kev_response.failure, kev_breaker events, the virtual clock


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=1.0, seed=3)


def _rows(run_dir, stream):
    return pq.read_table(run_dir / "events" / f"{stream}.parquet").to_pylist()


def test_llm_replay_breaker_opens_and_closes_on_the_replay_clock(session, tmp_path):
    # 3 requests fail (each tried twice: retries=1), the breaker opens; the server is healthy again at
    # once, but no request reaches it until 5 s of *replayed* time have passed.
    def respond(n):
        if n <= 6:
            return 500, b'{"error": {"message": "overloaded"}}'
        if n == 7:
            return completion(orjson.dumps(orjson.loads(GOOD) | {"hedge_ratio": 7}).decode())
        return completion(GOOD)

    with FaultServer(respond) as srv:
        cfg = ReplayConfig(seed=1, laya_provider="cpu", kev_mode="llm", kev_url=srv.url)
        run = run_replay(session, cfg, out_dir=tmp_path / "llm").run_dir
    resp = _rows(run, "kev_response")
    breaker = _rows(run, "kev_breaker")
    request_ts = {r["request_id"]: r["ts_recv"] for r in _rows(run, "kev_request")}
    kinds = [r["failure"] for r in resp]
    assert kinds[:3] == ["http_5xx"] * 3 and "breaker_open" in kinds
    probe = 3 + next(i for i, k in enumerate(kinds[3:]) if k != "breaker_open")  # the first sent again
    assert probe > 3 and kinds[probe] == "schema" and set(kinds[probe + 1 :]) == {""}
    assert all(r["ok"] == (r["failure"] == "") for r in resp)
    assert all(r["error"].startswith("kev unavailable") for r in resp if r["failure"] == "breaker_open")

    assert [b["state"] for b in breaker] == ["open", "half_open", "closed"]
    opened, half, closed = breaker
    # stamped on the replay clock: the pick-up time of the request that changed the breaker
    assert opened["breaker_ns"] == request_ts[opened["request_id"]] and opened["failures"] == 3
    assert half["breaker_ns"] == request_ts[half["request_id"]] == closed["breaker_ns"]
    assert half["breaker_ns"] - opened["breaker_ns"] >= 5_000_000_000  # the cooldown, in replayed time
    # the request before the probe was still short-circuited, less than the cooldown after the opening
    before = max(r for r in request_ts if r < half["request_id"])
    assert request_ts[before] - opened["breaker_ns"] < 5_000_000_000
    assert all(b["ts_recv"] >= b["breaker_ns"] for b in breaker)


def test_timeouts_on_the_virtual_clock_have_their_kind_on_both_engine_paths(session, tmp_path):
    cfg = ReplayConfig(seed=2, laya_provider="cpu", kev_timeout_ms=250, kev_lag_p5_ms=150, kev_lag_p95_ms=400)
    fast = run_replay(session, cfg, out_dir=tmp_path / "k")
    slow = run_replay(session, cfg, out_dir=tmp_path / "p", kernel=False)
    assert fast.path.startswith("kernel") and slow.path.startswith("python")
    for stream in OUTPUT_STREAMS:
        a = (fast.run_dir / "events" / f"{stream}.parquet").read_bytes()
        assert a == (slow.run_dir / "events" / f"{stream}.parquet").read_bytes(), stream
    resp = _rows(fast.run_dir, "kev_response")
    kinds = {r["failure"] for r in resp}
    assert kinds == {"", "timeout"}
    assert all(r["lag_ns"] == 250_000_000 for r in resp if r["failure"] == "timeout")
    assert fast.decision_digest == slow.decision_digest and fast.digest == slow.digest


# ---------------------------------------------------------------------------------------------------
# decision digest


def test_decision_digest_leaves_out_server_timings_only():
    def log(prompt_ms: float, raw: str = GOOD) -> EventLog:
        lg = EventLog()
        for i in range(3):
            lg.append(
                "kev_response",
                (i, i, i, True, "", "", 5, "llm", f"k{i}", raw, prompt_ms + i, 2 * prompt_ms, 80 + i, 40),
            )
        return lg

    a, b, c = log(12.5), log(99.0), log(12.5, raw=GOOD.replace("ok", "no"))
    assert a.digest != b.digest and a.decision_digest == b.decision_digest
    assert a.decision_digest != c.decision_digest
    assert a.decision_digest != a.digest  # the timing columns are really left out
    assert {"prompt_ms", "predicted_ms"} <= NON_DECISION_COLUMNS["kev_response"]
    tables = {"kev_response": events_to_table(a.events("kev_response"), "kev_response")}
    assert digest_tables(tables) == (a.digest, a.decision_digest)


def test_runs_differing_only_in_timings_share_the_decision_digest(session, tmp_path):
    base = run_replay(session, ReplayConfig(seed=4, laya_provider="cpu"), out_dir=tmp_path / "base").run_dir
    recorded = Cassette.from_run(base)
    runs = []
    for i, ms in enumerate((10.0, 2500.0)):
        cas = Cassette(meta=recorded.meta)
        for entries in recorded.entries.values():
            for e in entries:
                cas.add(dataclasses.replace(e, prompt_ms=ms, predicted_ms=ms * 3, completion_tokens=int(ms)))
        path = cas.write(tmp_path / f"cas{i}.parquet")
        cfg = ReplayConfig(seed=4, laya_provider="cpu", kev_mode="cassette", kev_cassette=str(path))
        runs.append(run_replay(session, cfg, out_dir=tmp_path / f"r{i}"))
    a, b = runs
    assert a.counts["command"] > 0
    assert a.digest != b.digest and a.decision_digest == b.decision_digest
    manifest = orjson.loads((a.run_dir / "manifest.json").read_bytes())
    assert (manifest["digest"], manifest["decision_digest"]) == (a.digest, a.decision_digest)
    tables = {s: pq.read_table(a.run_dir / "events" / f"{s}.parquet") for s in OUTPUT_STREAMS}
    assert digest_tables(tables) == (a.digest, a.decision_digest)

    d = diff_runs(a.run_dir, b.run_dir)
    assert d.same_decision_digest and not d.same_digest and not d.diverged
    assert d.compared_a == sum(a.counts[s] for s in ("command", "risk", "order", "fill"))
    # asked to compare the timings too, diff walks the events and finds them
    strict = diff_runs(a.run_dir, b.run_dir, streams=("kev_response",), ignored={})
    assert {f.field for f in strict.divergence.differences} == {
        "prompt_ms",
        "predicted_ms",
        "completion_tokens",
    }
    # a different seed decides differently: the decision digests differ and the walk finds where
    other = run_replay(session, ReplayConfig(seed=5, laya_provider="cpu"), out_dir=tmp_path / "other")
    d = diff_runs(a.run_dir, other.run_dir)
    assert d.same_decision_digest is False and d.diverged


def test_an_inconsistent_hub_command_is_refused_counted_and_never_traded(tmp_path):
    """Issue 55: a pairs hub replayed from a cassette whose answers put both legs long. Each such
    answer is a kev_response with ok=false, kind 'inconsistent' and its command_inconsistent reason,
    the report's "Kev failures by kind" counts it, and no command row and no Kev order come of it; on
    the compiled loop and per event alike."""
    symbols = ("BTCUSDT", "ETHUSDT")
    session = simulate_session(tmp_path / "s", symbols=symbols, minutes=1.5, seed=11)
    rec = run_replay(session, ReplayConfig(symbols=symbols, kev_hub="pairs"), out_dir=tmp_path / "rec")
    assert rec.counts["command"] > 0
    recorded = Cassette.from_run(rec.run_dir)
    bad = Cassette(meta=recorded.meta)
    for key in recorded.keys:
        for e in recorded.entries[key]:
            if e.raw:
                raw = orjson.loads(e.raw)
                raw["action"], raw["targets"] = "LEAN_BUY", {"BTCUSDT": 0.002, "ETHUSDT": 0.05}
                e = dataclasses.replace(e, raw=orjson.dumps(raw, option=orjson.OPT_SORT_KEYS).decode())
            bad.add(e)
    cas = bad.write(tmp_path / "bad.parquet")
    cfg = ReplayConfig(symbols=symbols, kev_hub="pairs", kev_mode="cassette", kev_cassette=str(cas))
    runs = [run_replay(session, cfg, out_dir=tmp_path / n, kernel=k) for n, k in (("k", True), ("p", False))]
    assert runs[0].digest == runs[1].digest
    run = runs[0].run_dir / "events"
    resp = pq.read_table(run / "kev_response.parquet").to_pylist()
    refused = [r for r in resp if r["failure"] == "inconsistent"]
    assert refused and all(not r["ok"] for r in refused)
    assert all(
        r["error"].startswith("command_inconsistent: ETHUSDT/BTCUSDT hedge legs both long") for r in refused
    )
    # the recorded run traded on these answers' originals; here the rest are misses (the positions,
    # and so the keys, part from the recording's at the first refusal): nothing is traded for Kev
    assert {r["failure"] for r in resp} <= {"inconsistent", "cassette_miss"} and not any(
        r["ok"] for r in resp
    )
    assert pq.read_table(run / "command.parquet").num_rows == 0
    sources = set(pq.read_table(run / "risk.parquet").column("source").to_pylist())
    assert "kev" not in sources and "quote" in sources
    assert "kev" in set(pq.read_table(rec.run_dir / "events" / "risk.parquet").column("source").to_pylist())
    (sql,) = [q for name, _, q in load_queries() if name == "kev_failures"]
    by_kind = {kind: n for kind, n, _ in connect(runs[0].run_dir).execute(sql).fetchall()}
    assert by_kind["inconsistent"] == len(refused)
