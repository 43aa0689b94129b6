"""Research you can trust: replay's defaults and what its manifest states.

Every fill model on the command line and a queue-aware default; run directories keyed by the model's
content; the feature version read from the model; in-sample runs flagged; the real Binance session's
clock offset estimated at import and replayed with a feed latency that is never negative (both engine
paths agreeing); ONNX Runtime's CUDA load errors kept off the terminal."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from dualhub.cli import build_parser, main
from engine.errors import DualhubError
from engine.laya.labels import LabelConfig
from engine.laya.model import DEFAULT_MODEL, Laya, LayaConfig
from engine.optional import has_nvidia_gpu
from engine.store import SessionError, open_session
from replay import fast_path
from replay.cli import FILL_MODEL_HELP
from replay.config import ReplayConfig
from replay.driver import run_replay
from replay.finish import _in_sample
from replay.tape import _Tape
from replay.tape_stream import FeedClock, exchange_times
from tests.helpers import REPO
from venue.fills import FILL_MODELS
from venue.simulator import simulate_session

REAL_FILE = REPO.parent / "shared" / "data" / "real" / "binance-usdm" / "usdm_btcusdt_20240808.gz"
CPU = {"laya_provider": "cpu"}


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sims")
    return {
        "tiny": simulate_session(root / "tiny", minutes=0.5, seed=3),
        "train": simulate_session(root / "train", minutes=1.5, seed=31),
    }


@pytest.fixture(scope="module")
def v1_model(sims: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A v1 model trained by `dualhub train`'s function on the "train" session only."""
    from replay.train_cli import train

    out = tmp_path_factory.mktemp("model") / "laya-v1.onnx"
    train([sims["train"]], out, features="v1", labels=LabelConfig(lean_bps=1.0, emergency_bps=3.0), folds=2)
    return out


@pytest.fixture(scope="module")
def binance(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from recorder.importers.binance import import_binance

    if not REAL_FILE.exists():
        pytest.fail(f"{REAL_FILE} is missing (../shared/data/real/SOURCES.md)")
    out = tmp_path_factory.mktemp("real") / "binance"
    import_binance(REAL_FILE, out)
    return out


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


# -- fill models ----------------------------------------------------------------------------------


def test_every_fill_model_is_offered_and_a_queue_model_is_the_default() -> None:
    parser = build_parser()
    assert parser.parse_args(["replay", "s"]).fill_model == ReplayConfig().fill_model == "queue_power2"
    for name in FILL_MODELS:
        assert parser.parse_args(["replay", "s", "--fill-model", name]).fill_model == name
        assert ReplayConfig(fill_model=name).fill_model == name
    with pytest.raises(SystemExit):
        parser.parse_args(["replay", "s", "--fill-model", "magic"])
    assert set(FILL_MODEL_HELP) == set(FILL_MODELS)  # the help says what each one assumes
    assert "queue_power2" in fast_path.FILL_MODEL_CODES  # the default runs on the compiled kernel


def test_default_config_replays_on_the_kernel_and_the_sweep_reads_it(sims: dict[str, Path], tmp_path) -> None:
    from replay.sweep import build_config

    res = run_replay(sims["tiny"], ReplayConfig(**CPU), out_dir=tmp_path / "r")
    assert res.path.startswith("kernel"), res.path
    m = _manifest(res.run_dir)
    assert m["config"]["fill_model"] == "queue_power2" and m["config"]["laya_features"] == "auto"
    assert build_config({"fill_model": "risk_averse"}).fill_model == "risk_averse"
    assert build_config({}).fill_model == "queue_power2"


# -- run directories ------------------------------------------------------------------------------


def test_run_dir_follows_the_model_content(sims: dict[str, Path], tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    shutil.copyfile(DEFAULT_MODEL, model)
    cfg = ReplayConfig(model_path=model, **CPU)
    first = run_replay(sims["tiny"], cfg)
    with pytest.raises(DualhubError, match="exists"):  # the same model again: the same run
        run_replay(sims["tiny"], cfg)
    retrained = onnx.load(model)  # another model in the same file
    onnx.helper.set_model_props(
        retrained, {**{p.key: p.value for p in retrained.metadata_props}, "producer": "retrained"}
    )
    onnx.save(retrained, model)
    second = run_replay(sims["tiny"], cfg)
    assert second.run_dir != first.run_dir and second.run_dir.parent == first.run_dir.parent
    a, b = _manifest(first.run_dir), _manifest(second.run_dir)
    assert a["model"]["file"] == b["model"]["file"] == "m.onnx"
    assert a["model"]["sha256"] != b["model"]["sha256"]


# -- feature version and in-sample flag -----------------------------------------------------------


def test_features_come_from_the_model_and_in_sample_runs_are_flagged(
    sims: dict[str, Path], v1_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    digest = open_session(sims["train"]).digest()
    cfg = ReplayConfig(model_path=v1_model, **CPU)  # laya_features "auto"
    inside = run_replay(sims["train"], cfg, out_dir=tmp_path / "in")
    m = _manifest(inside.run_dir)
    assert m["model"]["feature_version"] == "v1" and m["config"]["laya_features"] == "auto"
    trained = [{"name": "train", "session_digest": digest}]
    assert m["in_sample"] == inside.in_sample == {"in_sample": True, "training_sessions": trained}
    assert any(w.startswith("IN-SAMPLE") for w in inside.warnings)

    outside = run_replay(sims["tiny"], cfg, out_dir=tmp_path / "out")
    assert _manifest(outside.run_dir)["in_sample"] == {"in_sample": False, "training_sessions": trained}
    assert not any("IN-SAMPLE" in w for w in outside.warnings)

    # an explicit version that disagrees with the model stays a one-line error
    base = ["replay", str(sims["train"]), "--model", str(v1_model), "--provider", "cpu"]
    assert main([*base, "--features", "v0", "--out", str(tmp_path / "v0")]) == 2
    err = capsys.readouterr().err
    assert "trained on features 'v1' but this engine computes 'v0'" in err and "Traceback" not in err
    assert main([*base, "--out", str(tmp_path / "cli")]) == 0
    out, err = capsys.readouterr()
    assert "features v1" in out
    assert [ln for ln in err.splitlines() if "IN-SAMPLE" in ln] == [
        f"WARNING: IN-SAMPLE run: model {v1_model.name} was trained on this session; its results say "
        "nothing about how it does on data it has not seen"
    ]


def test_the_default_model_knows_its_simulator_sessions() -> None:
    laya = Laya(LayaConfig(model_path=DEFAULT_MODEL, provider="cpu", warmup_runs=1))

    class _Session:
        def __init__(self, sim: dict | None) -> None:
            self.manifest = {"simulator": sim} if sim else {}

        def digest(self) -> str:
            return "0" * 64

    seeds = [e["simulator_seed"] for e in _in_sample(laya, _Session(None))["training_sessions"]]
    assert seeds and all(isinstance(s, int) for s in seeds)
    used = {"seed": seeds[0], "symbol": "BTCUSDT", "minutes": 10.0}
    assert _in_sample(laya, _Session(used))["in_sample"]
    assert not _in_sample(laya, _Session({**used, "seed": 7}))["in_sample"]  # the demo's seed
    assert not _in_sample(laya, _Session({**used, "minutes": 2.0}))["in_sample"]


def test_a_multi_symbol_simulator_session_of_a_training_seed_is_in_sample(tmp_path: Path) -> None:
    """A multi-symbol simulator manifest names ``symbols``, not ``symbol``: the training run counts when
    its seed and length match and its symbol is one of the session's."""
    laya = Laya(LayaConfig(model_path=DEFAULT_MODEL, provider="cpu", warmup_runs=1))
    trained = _in_sample(laya, _Stub({}))["training_sessions"][0]
    seed, minutes, symbol = trained["simulator_seed"], trained["minutes"], trained["symbol"]
    session = open_session(
        simulate_session(tmp_path / "s", symbols=[symbol, "ETHUSDT"], minutes=0.2, seed=seed)
    )
    sim = session.manifest["simulator"]
    assert "symbol" not in sim and sim["symbols"] == [symbol, "ETHUSDT"] and sim["minutes"] == 0.2
    assert not _in_sample(laya, session)["in_sample"]  # a shorter run of that seed: other data
    as_trained = {**sim, "minutes": minutes}  # the same session at the training length
    assert _in_sample(laya, _Stub(as_trained))["in_sample"]
    assert not _in_sample(laya, _Stub({**as_trained, "seed": 7}))["in_sample"]  # the demo seed
    assert not _in_sample(laya, _Stub({**as_trained, "symbols": ["ETHUSDT", "SOLUSDT"]}))["in_sample"]
    # one-symbol simulator sessions as before
    assert _in_sample(laya, _Stub({"seed": seed, "symbol": symbol, "minutes": minutes}))["in_sample"]
    assert not _in_sample(laya, _Stub({"seed": seed, "symbol": "ETHUSDT", "minutes": minutes}))["in_sample"]


class _Stub:
    """A session as ``_in_sample`` reads it: the manifest's ``simulator`` and a digest."""

    def __init__(self, sim: dict) -> None:
        self.manifest = {"simulator": sim} if sim else {}

    def digest(self) -> str:
        return "0" * 64


# -- clocks and feed latency ----------------------------------------------------------------------


def test_binance_clock_offset_is_estimated_at_import(binance: Path) -> None:
    manifest = open_session(binance).manifest
    clock = manifest["clock"]
    lags = clock["recv_minus_exchange_ns"]
    # the recording's local clock runs ~1.27 s behind the exchange (SOURCES.md)
    assert -1_300_000_000 < clock["local_minus_exchange_ns"] < -1_250_000_000
    assert clock["min_feed_latency_ns"] > 0
    assert clock["local_minus_exchange_ns"] == lags["q0.01"] - clock["min_feed_latency_ns"]
    assert lags["min"] <= lags["q0.01"] <= lags["median"] <= lags["max"]
    assert FeedClock.of_session(manifest) == FeedClock(
        clock["local_minus_exchange_ns"], clock["min_feed_latency_ns"]
    )


def test_binance_replay_has_a_feed_latency_and_both_paths_agree(
    binance: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = open_session(binance)
    books, trades = s.read_table("books15"), s.read_table("trade")
    clock = FeedClock.of_session(s.manifest)
    tape = _Tape(books, trades, None, 1.0, clock=clock)
    for loc, exch in ((tape.b_loc, tape.b_exch), (tape.t_loc, tape.t_exch)):
        latency = loc - exch
        assert latency.min() >= clock.floor_ns  # never negative, never under the floor
        assert np.median(latency) > clock.floor_ns  # a real delay, not the floor everywhere
    # without the clock the exchange would see every row the instant the engine does
    one = _Tape(books, trades, None, 1.0)
    assert np.array_equal(one.b_exch, one.b_loc) and np.array_equal(one.t_exch, one.t_loc)

    cfg = ReplayConfig(**CPU)
    py = run_replay(binance, cfg, out_dir=tmp_path / "py", kernel=False)
    kn = run_replay(binance, cfg, out_dir=tmp_path / "k")
    assert py.path.startswith("python") and kn.path.startswith("kernel"), (py.path, kn.path)
    assert py.digest == kn.digest
    assert (py.run_dir / "manifest.json").read_bytes() == (kn.run_dir / "manifest.json").read_bytes()
    feed = _manifest(kn.run_dir)["feed"]
    assert feed["clock_offset_ns"] == clock.offset_ns and feed["min_latency_ns"] == clock.floor_ns
    assert feed["clamped"] == tape.clamped and sum(tape.clamped.values()) > 0
    assert feed == kn.feed
    assert any(w.startswith("session clocks disagree: local - exchange = -127") for w in kn.warnings)

    # a session imported without the estimate replays on one clock, and says so
    old = tmp_path / "old"
    shutil.copytree(binance, old, ignore=shutil.ignore_patterns("runs"))
    m = json.loads((old / "manifest.json").read_text())
    del m["clock"]
    (old / "manifest.json").write_text(json.dumps(m))
    res = run_replay(old, cfg, out_dir=tmp_path / "old-run")
    assert res.feed["clock_offset_ns"] == 0 and res.digest != kn.digest
    assert any("no clock estimate" in w for w in res.warnings)

    assert main(["replay", str(binance), "--provider", "cpu", "--out", str(tmp_path / "cli")]) == 0
    err = capsys.readouterr().err
    assert sum(ln.startswith("WARNING: session clocks disagree") for ln in err.splitlines()) == 1


def test_clean_simulated_sessions_keep_one_clock(sims: dict[str, Path], tmp_path: Path) -> None:
    s = open_session(sims["tiny"])
    assert "clock" not in s.manifest and FeedClock.of_session(s.manifest) == FeedClock()
    books = s.read_table("books15")
    evt, loc = (books.column(c).to_numpy().astype(np.int64) for c in ("ts_event", "ts_recv"))
    exch, clamped = exchange_times(evt, loc, "event")
    assert np.array_equal(exch, np.minimum(evt, loc)) and clamped == 0
    res = run_replay(sims["tiny"], ReplayConfig(**CPU), out_dir=tmp_path / "r")
    assert res.feed["clock_offset_ns"] == 0 and res.feed["clamped"] == {"books15": 0, "trade": 0}
    assert not res.warnings


def test_a_bad_clock_in_the_session_manifest_is_refused() -> None:
    for bad in ({"local_minus_exchange_ns": 1.5, "min_feed_latency_ns": 0}, {"local_minus_exchange_ns": 0}):
        with pytest.raises(SessionError, match="clock"):
            FeedClock.of_session({"clock": bad})


# -- ONNX Runtime's output ------------------------------------------------------------------------


def test_replay_stderr_has_one_provider_line_and_no_onnxruntime_log(sims: dict[str, Path], tmp_path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "dualhub.cli", "replay", str(sims["tiny"]), "--out", str(run)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[E:onnxruntime" not in proc.stderr and "[W:onnxruntime" not in proc.stderr, proc.stderr
    runtime = json.loads((run / "runtime.json").read_text())
    about = [ln for ln in proc.stderr.splitlines() if "Provider" in ln or "CUDA" in ln]
    quiet = [ln for ln in proc.stdout.splitlines() if ln.startswith("Laya runs on CPU")]
    if not has_nvidia_gpu():
        # no GPU at all: the fallback is no news, one quiet line on stdout says CPU runs (doctor and
        # runtime.json keep the why)
        assert about == [] and len(quiet) == (1 if runtime["fallback_reason"] else 0), (
            proc.stdout,
            proc.stderr,
        )
        return
    # a machine where CUDA comes up says nothing; one where it falls back says so once, with why
    assert len(about) == (1 if runtime["fallback_reason"] else 0), proc.stderr
    if about:
        assert runtime["active_provider"] in about[0] and runtime["fallback_reason"] in about[0]


def test_doctor_still_collects_onnxruntime_lines() -> None:
    import onnxruntime as ort

    from doctor.onnx import capture_output

    with capture_output() as out:
        laya = Laya(LayaConfig(model_path=DEFAULT_MODEL, warmup_runs=1))
    if laya.fallback_reason and "CUDAExecutionProvider" in ort.get_available_providers():
        assert "onnxruntime" in out[0] and "CUDA" in out[0]  # ORT's own error, for `dualhub doctor`
