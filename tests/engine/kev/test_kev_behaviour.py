"""Kev as it really behaves: measured lags in LLM replays, timeouts on the virtual clock, the Kev
timeout as a setting (with a warning when most answers time out, and a recommended value from bench
and doctor), ``fit-lag`` on recorded answer times, cassette hit/miss/fallback counts, and progress per
Kev answer.

Without the real server, a small local HTTP server stands in for llama-server where a latency must
be set on cue; the tests marked by the ``llama_server`` fixture run the real one.
"""

from __future__ import annotations

import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from doctor import kev as kev_diag
from doctor.checks import DoctorConfig
from dualhub.cli import main
from engine.clock import ReplayClock
from engine.kev.advisor import KevContext, KevReply
from engine.kev.cassette import Cassette, answered_by
from engine.kev.health import answer_times_ns, recommend_timeout_ms
from engine.kev.sim import SimKevBackend
from engine.latency.models import ConstantLatency
from engine.latency.recorded import RECORDED_FILE
from live.runner import LiveConfig, run_live
from replay import driver
from replay.config import ReplayConfig
from replay.driver import run_replay
from replay.kev_cli import fit_runs
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames
from venue.simulator import simulate_session

GOOD = orjson.dumps(
    {"action": "LEAN_BUY", "target_position": 0.01, "hedge_ratio": 0.0, "max_slippage_bps": 5, "reason": "ok"}
).decode()


class SlowServer:
    """A llama-server stand-in answering every completion with a valid command after ``delay_s``
    (settable), plus ``/health`` and ``/props``."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.posts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, body: dict) -> None:
                payload = orjson.dumps(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send({"status": "ok"})
                else:
                    self._send(
                        {
                            "total_slots": 1,
                            "model_path": "/models/fake.gguf",
                            "default_generation_settings": {"n_ctx": 2048},
                        }
                    )

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.posts += 1
                time.sleep(outer.delay_s)
                self._send(
                    {
                        "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": GOOD}}],
                        "usage": {"prompt_tokens": 80, "completion_tokens": 40},
                        "timings": {"prompt_ms": 1.0, "predicted_ms": 2.0, "prompt_n": 80, "predicted_n": 40},
                    }
                )

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> SlowServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=1.0, seed=21)


def _table(run: Path, stream: str):
    return pq.read_table(run / "events" / f"{stream}.parquet")


def _rows(run: Path, stream: str) -> list[dict]:
    return _table(run, stream).to_pylist()


def _manifest(run: Path) -> dict:
    return orjson.loads((run / "manifest.json").read_bytes())


def _late(run: Path) -> int:
    return int(pc.sum(pc.equal(_table(run, "kev_queue").column("kind"), "late_reply")).as_py() or 0)


def _recorded_kev(run: Path) -> list[int]:
    t = pq.read_table(run / RECORDED_FILE)
    return t.filter(pc.equal(t.column("kind"), "kev")).column("dur_ns").to_pylist()


# ---------------------------------------------------------------------------------------------------
# measured lag, timeouts on the virtual clock (a stand-in server with a set latency)


def test_measured_lag_is_the_wall_time_times_the_scale():
    ticks = iter([0, 7_000_000, 7_000_000])  # a call measured at 7 ms, then one answered from the cache

    class Live:
        name = "llm"

        def __init__(self) -> None:
            self.calls = 0

        async def advise(self, ctx: KevContext) -> KevReply:
            self.calls += 1
            return KevReply(raw={}, timings={"live": 1.0} if self.calls == 1 else {"lag_ns": 5e6})

    clock = ReplayClock(start_ns=0)
    backend = SimKevBackend(
        Live(),
        ConstantLatency(123),
        clock,
        use_recorded_lag=True,
        recorded_lag_scale=3.0,
        measure=True,
        wall_ns=lambda: next(ticks),
    )
    got: list[int] = []
    ctx = KevContext(
        request_id=1, ts_ns=0, symbol="X", label="LEAN_BUY", label_seq=0, p_label=0.9, mid=1.0,
        spread=0.1, imbalance=0.0, position=0.0, max_position=1.0,
    )  # fmt: skip
    for _ in range(2):
        backend.start(ctx, 0, lambda c, r, lag: got.append(lag))
    clock.run_all()
    assert got == [15_000_000, 21_000_000]  # delivered by due time: 5 ms recorded x 3, 7 ms measured x 3
    assert backend.recorded.dur == [21_000_000, 15_000_000] and backend.answers == 2


def test_llm_replay_lags_are_measured_and_timeouts_fire_on_the_virtual_clock(session, tmp_path):
    with SlowServer(delay_s=0.3) as srv:
        base = dict(seed=2, laya_provider="cpu", kev_mode="llm", kev_url=srv.url, kev_min_interval_ms=8000)
        slow = run_replay(session, ReplayConfig(**base, scale_kev=2.0), out_dir=tmp_path / "slow").run_dir
        resp = _rows(slow, "kev_response")
        assert resp and all(r["ok"] for r in resp)
        # 0.3 s of wall time x 2 on the replay clock, not the lag model's 200-350 ms
        assert all(600e6 <= r["lag_ns"] < 1.6e9 for r in resp), [r["lag_ns"] for r in resp]
        assert _recorded_kev(slow) == [r["lag_ns"] for r in resp]
        m = _manifest(slow)
        assert m["config"]["kev_lag_source"] == "measured" and m["advisor"]["lag"] == "measured x2"
        assert m["advisor"]["health"]["warning"] == ""

        # a timeout below the server's latency: every request times out at exactly the timeout on the
        # replay clock, and every answer still arrives, later, as a late reply
        timed = run_replay(session, ReplayConfig(**base, kev_timeout_ms=100), out_dir=tmp_path / "t").run_dir
    resp = _rows(timed, "kev_response")
    assert resp and {r["failure"] for r in resp} == {"timeout"}
    assert {r["lag_ns"] for r in resp} == {100_000_000}
    assert _late(timed) == len(resp) and len(_recorded_kev(timed)) == len(resp)
    assert min(_recorded_kev(timed)) >= 300e6
    health = _manifest(timed)["advisor"]["health"]
    assert health["timeouts"] == health["requests"] == len(resp) and health["late_replies"] == len(resp)
    assert f"recommended --kev-timeout-ms {health['recommended_timeout_ms']}" in health["warning"]
    assert health["recommended_timeout_ms"] >= 500  # 1.5 x >= 300 ms, rounded up to 100 ms

    # fit-lag fits the answer times (late ones included), not the timeout
    fit = fit_runs([timed])
    assert fit["late_answers"] == len(resp) and fit["fit"]["n"] == len(resp)
    assert fit["fit"]["service_ns"]["max"] == max(_recorded_kev(timed))


def test_replay_cli_warns_when_most_answers_time_out(session, tmp_path, capsys):
    with SlowServer(delay_s=0.2) as srv:
        args = ["replay", str(session), "--out", str(tmp_path / "r"), "--provider", "cpu"]
        args += [
            "--kev-mode",
            "llm",
            "--kev-url",
            srv.url,
            "--kev-min-interval-ms",
            "15000",
            "--kev-timeout-ms",
            "50",
        ]
        assert main([*args, "--kev-lag-scale", "2"]) == 0
    out = capsys.readouterr().out
    assert "Kev llm:" in out and "lag measured x2" in out
    [warning] = [line for line in out.splitlines() if line.startswith("WARNING: Kev:")]
    assert "timed out after 50 ms" in warning and "recommended --kev-timeout-ms" in warning
    assert _manifest(tmp_path / "r")["config"]["kev_timeout_ms"] == 50
    assert main([*args, "--kev-lag-scale", "2", "--scale-latency", "kev=3", "--overwrite"]) == 2
    assert "disagree" in capsys.readouterr().err


def test_progress_moves_per_kev_answer(session, tmp_path, monkeypatch):
    calls: list[tuple[int, int | None]] = []

    class Bar:
        def update(self, n: int, kev: int | None = None) -> None:
            calls.append((n, kev))

        def close(self) -> None:
            pass

    monkeypatch.setattr(driver, "_progress", lambda enabled, total: Bar() if enabled else None)
    with SlowServer() as srv:
        cfg = ReplayConfig(laya_provider="cpu", kev_mode="llm", kev_url=srv.url, kev_min_interval_ms=2000)
        res = run_replay(session, cfg, out_dir=tmp_path / "p", progress=True)
    per_answer = [(n, k) for n, k in calls if k is not None]
    assert [k for _, k in per_answer] == list(range(1, res.counts["kev_request"] + 1))
    positions = [n for n, _ in per_answer]
    assert positions == sorted(positions) and positions[0] > 0 and len(set(positions)) > 1
    # the session is one walk chunk: without the per-answer updates the bar would sit at 0
    assert [n for n, k in calls if k is None] == [0]


# ---------------------------------------------------------------------------------------------------
# cassettes: hits, misses, fallbacks


def test_cassette_counts_hits_misses_and_marks_fallback_answers(session, tmp_path, capsys):
    sim = run_replay(session, ReplayConfig(seed=3, laya_provider="cpu"), out_dir=tmp_path / "sim")
    full = Cassette.from_run(sim.run_dir)
    keep = full.keys[: len(full.keys) // 2]
    half = Cassette()
    for k in keep:
        for e in full.entries[k]:
            half.add(e)
    path = half.write(tmp_path / "half.parquet")
    args = ["replay", str(session), "--provider", "cpu", "--seed", "3", "--kev-mode", "cassette"]
    args += ["--kev-cassette", str(path), "--kev-miss", "sim", "--out", str(tmp_path / "cas")]
    assert main(args) == 0
    out = capsys.readouterr().out
    m = _manifest(tmp_path / "cas")["advisor"]
    assert m["hits"] > 0 and m["misses"] > 0 and m["fallbacks"] == m["misses"]
    assert f"Kev cassette: {m['hits']} hits, {m['misses']} misses, {m['fallbacks']} answered by" in out
    resp = _rows(tmp_path / "cas", "kev_response")
    by = {a: sum(r["advisor"] == a for r in resp) for a in {r["advisor"] for r in resp}}
    assert by == {"cassette": m["hits"], "cassette>rules": m["fallbacks"]}
    assert all((r["key"] in half) == (r["advisor"] == "cassette") for r in resp)
    assert answered_by("cassette>rules") == "rules" and answered_by("llm") == "llm"

    # miss policy fail: misses counted, none answered by a fallback, nothing marked
    fail = run_replay(
        session,
        ReplayConfig(seed=3, laya_provider="cpu", kev_mode="cassette", kev_cassette=str(path)),
        out_dir=tmp_path / "fail",
    )
    assert fail.kev["misses"] > 0 and fail.kev["fallbacks"] == 0
    assert fail.kev["hits"] + fail.kev["misses"] == fail.counts["kev_request"]
    assert {r["advisor"] for r in _rows(fail.run_dir, "kev_response")} == {"cassette"}


# ---------------------------------------------------------------------------------------------------
# fit-lag refuses modelled lags


def test_fit_lag_refuses_runs_whose_lags_were_modelled(session, tmp_path, capsys):
    sim = run_replay(session, ReplayConfig(seed=5, laya_provider="cpu"), out_dir=tmp_path / "runs" / "sim")
    cas = run_replay(
        session,
        ReplayConfig(seed=5, laya_provider="cpu", kev_mode="cassette", kev_cassette=str(sim.run_dir)),
        out_dir=tmp_path / "runs" / "cas",
    )
    for run, why in ((sim.run_dir, "drawn from a lag model (kev_mode sim"), (cas.run_dir, "cassette")):
        assert main(["kev", "fit-lag", str(run)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and why in err and "Traceback" not in err
    assert main(["kev", "fit-lag", str(tmp_path)]) == 2  # a session of modelled runs only
    assert "no run with measured Kev lags" in capsys.readouterr().err
    assert fit_runs([sim.run_dir], allow_modelled=True)["fit"]["n"] > 0


# ---------------------------------------------------------------------------------------------------
# doctor and bench recommend a timeout


def test_recommended_timeout_is_p99_times_one_and_a_half_rounded_up():
    assert recommend_timeout_ms([2_500_000_000] * 10) == 3800
    assert recommend_timeout_ms([1_000_000]) == 100
    assert recommend_timeout_ms([]) is None


def test_doctor_does_not_rate_kev_ok_when_it_is_slower_than_the_timeout():
    with SlowServer(delay_s=0.4) as srv:
        rows = {t: _latency_row(srv.url, t) for t in (200, None, 550, 5000)}
    over, default, tight, fine = rows[200], rows[None], rows[550], rows[5000]
    assert over.status == "fail" and "over the configured Kev timeout of 200 ms" in over.evidence
    wall = over.data["latency_ms"]
    assert wall >= 400 and over.data["recommended_timeout_ms"] == math.ceil(wall * 1.5 / 100) * 100
    assert f"--kev-timeout-ms {over.data['recommended_timeout_ms']}" in over.fix
    # the default timeout (2000 ms) is not exceeded by 0.4 s; a 400+ ms answer against 550 ms has
    # no headroom
    assert default.status == "ok" and default.data["timeout_ms"] == 2000
    assert tight.status == "warn" and fine.status == "ok"
    assert kev_diag.assess_latency(2500.0, None).status == "warn"  # default exceeded: a warning
    assert kev_diag.assess_latency(2500.0, 2000).status == "fail"  # asked for: a failure


def _latency_row(url: str, timeout_ms: int | None):
    rows = kev_diag.kev_checks(DoctorConfig(kev_url=url, kev_engine_timeout_ms=timeout_ms))
    return next(r for r in rows if r.name == "latency within the Kev timeout")


# ---------------------------------------------------------------------------------------------------
# the real llama-server


def test_real_llm_replay_virtual_lags_are_the_measured_ones(session, llama_server, tmp_path):
    base = dict(seed=3, laya_provider="cpu", kev_mode="llm", kev_url=llama_server.url)
    base["kev_min_interval_ms"] = 25_000
    run = run_replay(
        session, ReplayConfig(**base, kev_timeout_ms=60_000, scale_kev=0.5), out_dir=tmp_path / "a"
    )
    resp = [r for r in _rows(run.run_dir, "kev_response") if r["ok"]]
    assert resp, _rows(run.run_dir, "kev_response")
    for r in resp:  # lag = measured wall time x 0.5: at least the server's own time, plus little
        server_ns = (r["prompt_ms"] + r["predicted_ms"]) * 1e6
        assert server_ns <= 2 * r["lag_ns"] <= server_ns + 1e9, r
    assert _recorded_kev(run.run_dir) == [r["lag_ns"] for r in _rows(run.run_dir, "kev_response")]

    # a timeout below the server's latency fires on the virtual clock; the answers come late
    timed = run_replay(session, ReplayConfig(**base, kev_timeout_ms=300), out_dir=tmp_path / "t").run_dir
    resp = _rows(timed, "kev_response")
    assert resp and all(r["failure"] == "timeout" and r["lag_ns"] == 300_000_000 for r in resp)
    assert _late(timed) == len(resp)
    fit = fit_runs([timed])  # the recorded answer times, not the 300 ms timeout
    recorded = _recorded_kev(timed)
    assert fit["fit"]["service_ns"]["p50"] == round(float(np.percentile(recorded, 50)))
    assert fit["fit"]["service_ns"]["min"] > 300_000_000


@pytest.fixture(scope="module")
def frames():
    return list(simulator_frames(["BTCUSDT"], minutes=4, seed=3))


def test_paper_live_kev_answers_become_commands_with_a_timeout_above_the_latency(
    frames, llama_server, tmp_path, capsys
):
    # A real answer takes seconds here (more while other work shares the two cores): a run long
    # enough for a few, and a drain that waits for the one in flight at the stop.
    with LocalExchangeThread(LocalExchange(frames, speed=10.0)) as ex:
        cfg = LiveConfig(
            out=str(tmp_path / "long"),
            exchange_url=ex.rest_url,
            ws_url=ex.ws_url,
            laya_provider="cpu",
            duration_s=20.0,
            drain_timeout_s=20.0,
            kev_url=llama_server.url,
            kev_timeout_ms=60_000,
        )
        long = run_live(cfg)
    # through the CLI, a timeout below any answer the server gives (as the replay test above): the
    # default 2 s was, until an hour when this machine answered in less
    with LocalExchangeThread(LocalExchange(frames, speed=10.0)) as ex:
        out = tmp_path / "default"
        args = ["live", "--paper", "--exchange-url", ex.rest_url, "--ws-url", ex.ws_url, "--out", str(out)]
        main(
            [
                *args,
                "--duration",
                "10",
                "--provider",
                "cpu",
                "--kev-url",
                llama_server.url,
                "--kev-timeout-ms",
                "300",
            ]
        )
    run = long.run_dirs["BTCUSDT"]
    resp = _rows(run, "kev_response")
    assert long.counts["BTCUSDT"]["command"] >= 1 and any(r["ok"] for r in resp)
    assert not any(r["failure"] == "timeout" for r in resp)
    assert long.summary["kev_health"]["BTCUSDT"]["warning"] == ""
    assert _manifest(run)["config"]["kev_timeout_ms"] == 60_000
    answers = answer_times_ns(Cassette.read(run))
    fit = fit_runs([run])  # the answer times recorded in latency_recorded.parquet
    assert fit["sources"] == [RECORDED_FILE] and fit["fit"]["n"] == len(answers)
    assert fit["fit"]["service_ns"]["p50"] == round(float(np.percentile(answers, 50)))
    assert set(answers) <= set(_recorded_kev(run))

    err = capsys.readouterr().err
    run = out / "runs" / "live-BTCUSDT"
    resp = _rows(run, "kev_response")
    health = orjson.loads((out / "live.json").read_bytes())["summary"]["kev_health"]["BTCUSDT"]
    assert resp and 2 * sum(r["failure"] == "timeout" for r in resp) > len(resp)
    assert health["warning"] and _manifest(run)["advisor"]["health"] == health
    assert f"WARNING  BTCUSDT {health['warning']}" in err
    # the late answers' real times (on this CPU some are the client's own 10 s timeout: errors,
    # included here), not the engine's 300 ms timeout
    answers = answer_times_ns(Cassette.read(run), include_errors=True)
    fit = fit_runs([run], include_errors=True)["fit"]
    assert fit["n"] == len(answers) >= 1 and fit["service_ns"]["p50"] == round(
        float(np.percentile(answers, 50))
    )
    assert fit["service_ns"]["min"] > 300_000_000
