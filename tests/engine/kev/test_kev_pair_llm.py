"""The LLM as the portfolio hub, end to end with the project's real llama-server (SmolLM2-135M):
`dualhub kev bench` times the portfolio prompt and keeps a recommendation, `dualhub replay --kev-hub llm`
picks it up, and a 5-minute pair replay acts on most of the model's answers, none of them refused as
inconsistent (the prompt offers only hedged target sets, and the schema admits only those)."""

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow


def _dualhub(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "dualhub.cli", *args], capture_output=True, text=True, env=env, timeout=900
    )


def test_an_llm_pair_replay_acts_on_most_answers(tmp_path, llama_server):
    env = {**os.environ, "DUALHUB_KEV_ADVICE_DIR": str(tmp_path / "advice")}
    bench = _dualhub("kev", "bench", "--url", llama_server.url, "-n", "3", "--prompt", "portfolio", env=env)
    assert bench.returncode == 0, bench.stderr
    assert "kept for `replay --kev-mode llm`" in bench.stdout
    assert list((tmp_path / "advice").glob("*.json")), "no recommendation kept"

    session = tmp_path / "pair"
    sim = _dualhub(
        "simulate", "--out", str(session), "--symbols", "BTCUSDT,ETHUSDT", "--minutes", "5", env=env
    )
    assert sim.returncode == 0, sim.stderr
    run = tmp_path / "run"
    rep = _dualhub(
        "replay", str(session), "--symbols", "BTCUSDT,ETHUSDT", "--kev-hub", "llm", "--kev-mode", "llm",
        "--kev-url", llama_server.url, "--kev-min-interval-ms", "20000", "--out", str(run), env=env,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr
    assert "`dualhub kev bench` measured" in rep.stderr and "portfolio prompt" in rep.stderr

    resp = pq.read_table(run / "events" / "kev_response.parquet").to_pylist()
    assert len(resp) >= 5
    ok = [r for r in resp if r["ok"]]
    failures = [r["failure"] for r in resp if not r["ok"]]
    assert len(ok) > len(resp) / 2, failures
    assert "inconsistent" not in failures and "schema_invalid" not in failures, failures
    # every answer acted on is a command row per instrument
    commands = pq.read_table(run / "events" / "command.parquet")
    assert commands.num_rows >= 2 * len(ok) - 2  # one answer may arrive after the run's last event

    report = _dualhub("report", str(run), env=env)
    assert report.returncode == 0, report.stderr
    assert "Kev failures by kind" in report.stdout
