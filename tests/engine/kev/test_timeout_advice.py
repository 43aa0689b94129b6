"""The Kev timeout a run takes from `dualhub kev bench`'s figures for the server's model."""

import json

import pytest

from engine.kev import timeout_advice as ta


def _bench(p50=4900.0, p99=6000.0, rec=9000, model="/x/venv/SmolLM2-135M-Instruct.Q4_1.gguf"):
    fig = {"wall_ms": {"p50": p50, "p99": p99}, "recommended_kev_timeout_ms": rec, "ok": 5}
    single = {"wall_ms": {"p50": 2500.0, "p99": 2900.0}, "recommended_kev_timeout_ms": 4400, "ok": 5}
    return {
        "model_path": model,
        "measured": "2026-12-07T20:00:00Z",
        "prompts": {"single": single, "portfolio": fig},
    }


@pytest.fixture(autouse=True)
def advice_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALHUB_KEV_ADVICE_DIR", str(tmp_path / "advice"))
    return tmp_path / "advice"


def test_a_measured_model_gets_its_prompts_recommendation():
    path = ta.save(_bench())
    assert path is not None and path.exists()
    # the same model file in another venv is the same model
    model = "/elsewhere/SmolLM2-135M-Instruct.Q4_1.gguf"
    hub = ta.choose(None, model, "portfolio")
    assert hub.timeout_ms == 9000 and "p50 4900 ms" in hub.line and not hub.below_p50
    assert ta.choose(None, model, "single").timeout_ms == 4400


def test_a_given_timeout_below_the_measured_p50_is_said():
    ta.save(_bench())
    low = ta.choose(2000, "SmolLM2-135M-Instruct.Q4_1.gguf", "portfolio")
    assert low.timeout_ms == 2000 and low.below_p50
    assert "below the p50 of 4900 ms" in low.line and "most answers will be discarded" in low.line
    ok = ta.choose(6000, "SmolLM2-135M-Instruct.Q4_1.gguf", "portfolio")
    assert ok.timeout_ms == 6000 and not ok.below_p50


def test_no_figures_or_no_server_means_the_default_and_how_to_measure():
    for model in (None, "other.gguf"):
        c = ta.choose(None, model, "portfolio")
        assert c.timeout_ms == ta.DEFAULT_TIMEOUT_MS and "dualhub kev bench --url URL" in c.line


@pytest.mark.parametrize(
    "body", ["{not json", json.dumps({"prompts": {"portfolio": {"p50_ms": -1, "recommended_ms": 5}}}), "[]"]
)
def test_a_damaged_advice_file_is_ignored_never_trusted(advice_dir, body):
    advice_dir.mkdir(parents=True)
    (advice_dir / "m.gguf.json").write_text(body)
    assert ta.load("m.gguf") is None
    assert ta.choose(None, "m.gguf", "portfolio").timeout_ms == ta.DEFAULT_TIMEOUT_MS


def test_an_unreachable_server_has_no_model():
    assert ta.server_model("http://127.0.0.1:9", timeout_s=0.5) is None


def test_live_kev_hub_llm_needs_a_server(capsys):
    from dualhub.cli import main

    assert main(["live", "--symbols", "BTCUSDT,ETHUSDT", "--kev-hub", "llm", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert "dualhub live: error: --kev-hub llm asks llama-server: pass its --kev-url" in err
