"""The strategy plug-in point (engine/strategies, docs/STRATEGY.md): the registry dispatches each kind
to its own module; the worked example runs in replay on the compiled loop and per event with the same
events, decides otherwise than the baseline, runs in paper live through ``dualhub live --strategy`` and
that run replays to the same decisions; bad names and parameters are one error line."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from engine.book import WIDTH
from engine.errors import DualhubError
from engine.strategies import registry
from engine.strategy import QuoteConfig
from live.runner import LiveConfig
from replay.config import ReplayConfig
from replay.diff import COMPARABLE_STREAMS, diff_runs
from replay.driver import run_replay
from replay.parity import replay_config_for
from tests.helpers import REPO as ROOT
from tests.replay.test_golden_digests import GOLDEN
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames
from venue.simulator import simulate_session

EXAMPLE_PARAMS = {"lean_ticks": 4.0, "depth_levels": 3.0}
EXAMPLE = ("--strategy=imbalance_lean", *(f"--strategy-param={k}={v:g}" for k, v in EXAMPLE_PARAMS.items()))


def _random_book(rng: np.random.Generator) -> np.ndarray:
    bk = np.full(WIDTH, math.nan)
    n = int(rng.integers(1, 16))
    bid = float(np.round(rng.uniform(100, 50_000), 1))
    bk[0:n] = bid - 0.1 * np.arange(n)
    bk[30 : 30 + n] = bid + 0.1 * (1 + rng.integers(0, 3)) + 0.1 * np.arange(n)
    bk[15 : 15 + n] = rng.uniform(0.001, 5, n)
    bk[45 : 45 + n] = rng.uniform(0.001, 5, n)
    return bk


def test_every_kind_dispatches_to_its_own_strategy():
    rng = np.random.default_rng(3)
    differs = 0
    for _ in range(300):
        bk = _random_book(rng)
        # tick, quote lots, label, position lots, Kev's target (lots), max position lots
        args = (0.1, 2, int(rng.integers(-1, 4)), int(rng.integers(-50, 51)), 10.0, 50)
        got = {}
        for kind, module in enumerate(registry.STRATEGIES):
            params = registry.resolve(module.NAME, {})[1]
            got[kind] = registry.quote(kind, bk, *args, params)
            assert _same(got[kind], module.quote(bk, *args, params)), (module.NAME, bk, args)
        differs += got[0] != got[1]
    assert differs > 100  # the example is not the baseline under another name


def _same(a, b) -> bool:
    return tuple(map(int, a)) == tuple(map(int, b))


def test_parameters_over_defaults_and_the_quote_config():
    kind, p = registry.resolve("baseline", {})
    assert kind == registry.KINDS["baseline"] == 0 and list(p[:3]) == [1.0, 2.0, 4.0] and not p[3:].any()
    # the baseline's parameters start from the quote config; a strategy parameter overrides it
    q = QuoteConfig(offset_ticks=3, inventory_skew_ticks=1.5)
    assert list(registry.resolve("baseline", {}, q)[1][:3]) == [3.0, 2.0, 1.5]
    assert list(registry.resolve("baseline", {"offset_ticks": 0.0}, q)[1][:3]) == [0.0, 2.0, 1.5]
    kind, p = registry.resolve("imbalance_lean", {"depth_levels": 15, "lean_ticks": -2.5})
    assert kind == 1 and list(p[:4]) == [1.0, -2.5, 15.0, 4.0]


@pytest.mark.parametrize(
    "name, params, message",
    [
        ("nope", {}, "unknown strategy 'nope'; known: baseline, imbalance_lean"),
        ("imbalance_lean", {"lean": 1.0}, "imbalance_lean has no parameter 'lean'; its parameters: offset"),
        ("imbalance_lean", {"depth_levels": 16.0}, "depth_levels must be a number in [1, 15], got 16.0"),
        ("baseline", {"offset_ticks": math.nan}, "offset_ticks must be a number in [0, 1e+06], got nan"),
        ("baseline", {"offset_ticks": "1"}, "offset_ticks must be a number"),
    ],
)
def test_bad_strategy_or_parameter_is_refused_by_both_configs(name, params, message, tmp_path):
    for make in (
        lambda: ReplayConfig(strategy=name, strategy_params=params),
        lambda: LiveConfig(out=str(tmp_path), strategy=name, strategy_params=params),
    ):
        with pytest.raises(DualhubError) as e:
            make()
        assert message in str(e.value)


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("strat") / "s", minutes=1.0, seed=23)


def _manifest(run: Path) -> dict:
    return orjson.loads((run / "manifest.json").read_bytes())


@pytest.mark.slow
def test_the_example_replays_alike_on_the_kernel_and_per_event(session, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["replay", str(session), "--out", str(out), *EXAMPLE]) == 0
    assert "engine: kernel" in capsys.readouterr().out  # the compiled loop ran it
    cfg = ReplayConfig(strategy="imbalance_lean", strategy_params=EXAMPLE_PARAMS)
    per_event = run_replay(session, cfg, out_dir=tmp_path / "py", kernel=False)
    assert per_event.path.startswith("python")
    k, p = _manifest(out), _manifest(per_event.run_dir)
    assert k["digest"] == p["digest"] and k["decision_digest"] == p["decision_digest"]
    assert k["decision_digest"] != GOLDEN["default"][1]  # it decides otherwise than the baseline
    assert k["counts"]["order"] > 50 and k["counts"]["fill"] > 3  # and trades
    assert p["config"]["strategy"] == "imbalance_lean"  # what ran is recorded
    # another parameter value is another run
    other = run_replay(session, ReplayConfig(strategy="imbalance_lean"), out_dir=tmp_path / "other")
    assert other.decision_digest != k["decision_digest"]


def test_bad_strategy_on_the_command_line_is_one_error_line(session, tmp_path, capsys):
    out = tmp_path / "never"
    cases = [
        (["--strategy", "nope"], "unknown strategy 'nope'"),
        (["--strategy-param", "lean_ticks=2"], "strategy baseline has no parameter 'lean_ticks'"),
        (["--strategy", "imbalance_lean", "--strategy-param", "depth_levels=0"], "depth_levels must be"),
        (["--strategy-param", "offset_ticks"], "--strategy-param wants NAME=NUMBER, got 'offset_ticks'"),
        (["--strategy-param", "offset_ticks=x"], "--strategy-param wants NAME=NUMBER, got 'offset_ticks=x'"),
    ]
    for cmd, first in (("replay", [str(session)]), ("live", ["--paper", "--duration", "1"])):
        for extra, message in cases:
            assert main([cmd, *first, "--out", str(out), *extra]) == 2
            err = capsys.readouterr().err
            lines = err.strip().splitlines()
            assert "Traceback" not in err and len(lines) == 1, err
            assert lines[0].startswith(f"dualhub {cmd}: error: ") and message in lines[0], lines
            assert not out.exists()


def test_a_quote_size_between_two_lots_is_one_error_line(session, tmp_path, capsys):
    """The strategy counts the quote size in whole lots: a size between two is refused before the run,
    not rounded (each of its orders would have been refused by the gateway)."""
    out = tmp_path / "never"
    cmd = ["replay", str(session), "--out", str(out), "--symbols", "BTCUSDT"]
    assert main([*cmd, "--instrument", "BTCUSDT:quote_qty=0.0025"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "dualhub replay: error: BTCUSDT: quote_qty 0.0025 is not a whole number of size steps (0.001): "
        "give the instrument its own (--instrument BTCUSDT:quote_qty=Q)\n"
    )
    assert not out.exists()
    # as the hint says: on one symbol (without --symbols) too, as live mode takes it
    assert main(["replay", str(session), "--out", str(out), "--instrument", "BTCUSDT:quote_qty=0.003"]) == 0
    assert _manifest(out)["config"]["instruments"] == {"BTCUSDT": {"quote_qty": 0.003}}
    orders = pq.read_table(out / "events" / "order.parquet").to_pylist()
    quotes = {o["qty"] for o in orders if o["kind"] == "new" and o["order_type"] == "limit"}
    assert quotes == {0.003}


@pytest.mark.slow
def test_the_example_in_paper_live_replays_to_the_same_decisions(tmp_path, capsys):
    frames = list(simulator_frames(["BTCUSDT"], minutes=2, seed=3))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BITGET_")}
    out = tmp_path / "paper"
    with LocalExchangeThread(LocalExchange(frames, speed=10.0)) as ex:
        cmd = [sys.executable, "-m", "dualhub.cli", "live", "--paper", "--exchange-url", ex.rest_url,
               "--ws-url", ex.ws_url, "--out", str(out), "--duration", "4", "--provider", "cpu",
               *EXAMPLE]  # fmt: skip
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    run = out / "runs" / "live-BTCUSDT"
    m = _manifest(run)
    assert m["engine_config"]["strategy"] == "imbalance_lean"
    assert m["engine_config"]["strategy_params"] == EXAMPLE_PARAMS
    assert m["counts"]["order"] > 5
    # `dualhub parity` replays it with its strategy: every decision again
    assert main(["parity", str(out)]) == 0
    assert "no divergence: " in capsys.readouterr().out
    cfg = replay_config_for(run)
    assert cfg.strategy == "imbalance_lean" and cfg.strategy_params == EXAMPLE_PARAMS
    # ... and the strategy is what made them: the baseline on the same inputs parts ways
    baseline = replay_config_for(run, strategy="baseline", strategy_params={})
    base = run_replay(out, baseline, out_dir=tmp_path / "b")
    assert diff_runs(run, base.run_dir, streams=COMPARABLE_STREAMS).diverged
