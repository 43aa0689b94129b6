"""A strategy written as a plain Python function (engine/strategies/plugin.py): the compiled registry
calls it at the same point with the same inputs as a compiled strategy, in the replay's compiled loop,
per event and in paper live; a Python copy of the baseline gives the baseline's golden digests; an
edited strategy is another run; what a broken one does ends in one error line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from engine.core import engine_identity
from engine.errors import DualhubError
from engine.strategies import plugin, registry
from live.runner import LiveConfig
from replay.config import ReplayConfig
from replay.diff import COMPARABLE_STREAMS, diff_runs
from replay.driver import run_replay
from replay.parity import replay_config_for
from tests.engine.strategies.test_strategy_plugin import _random_book
from tests.helpers import REPO as ROOT
from tests.replay.test_golden_digests import GOLDEN
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames
from venue.simulator import simulate_session

EXAMPLE = f"{ROOT / 'docs' / 'examples' / 'microprice.py'}:quote"

# The baseline, called from Python: the same decisions through the Python branch of the dispatch.
BASELINE_IN_PYTHON = """
from engine.strategies import baseline
PARAMS = baseline.PARAMS
CALLS = []

def quote(book, tick, qty, label, position, target, max_position, params):
    CALLS.append(label)
    return baseline.quote.py_func(book, tick, qty, label, position, target, max_position, params)
"""


def _manifest(run: Path) -> dict:
    return orjson.loads((run / "manifest.json").read_bytes())


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("pystrat") / "s", minutes=1.0, seed=23)


@pytest.fixture
def module_file(tmp_path):
    def write(text: str, name: str = "strat.py") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


def test_the_registry_hands_a_python_function_the_strategy_inputs_and_returns_its_answer():
    kind, params = registry.resolve(EXAMPLE, {"half_spread_ticks": 3.0})
    assert kind >= plugin.FIRST_KIND and list(params[:2]) == [3.0, 4.0]
    assert registry.resolve(EXAMPLE, {})[0] == kind  # loaded once per process
    example = sys.modules[plugin._loaded[kind - plugin.FIRST_KIND][1].__module__]
    rng = np.random.default_rng(5)
    differs = 0
    for _ in range(300):
        book = _random_book(rng)
        pos, target = int(rng.integers(-100, 101)), float(rng.uniform(-100, 100))
        args = (book, 0.1, 10, int(rng.integers(-1, 4)), pos, target, 100, params)
        got = registry.quote(kind, *args)
        assert got == example.quote(*args) and all(type(x) is int for x in got)
        differs += got != registry.quote(0, *args[:-1], registry.resolve("baseline", {})[1])
    assert differs > 100  # and it is its own strategy, not the baseline's


def test_the_function_cannot_write_into_the_engines_book(module_file):
    path = module_file("def quote(book, *rest):\n    book[0] = 1.0\n    return 0, 0, 0, 0\n")
    kind, params = registry.resolve(f"{path}:quote", {})
    book = _random_book(np.random.default_rng(1))
    before = book.copy()
    with pytest.raises(DualhubError, match="raised ValueError: assignment destination is read-only"):
        registry.quote(kind, book, 0.1, 10, 0, 0, 0.0, 100, params)
    assert np.array_equal(book, before, equal_nan=True)


@pytest.mark.slow
def test_the_baseline_in_python_gives_its_golden_digests_on_both_engines(session, module_file, tmp_path):
    spec = f"{module_file(BASELINE_IN_PYTHON)}:quote"
    kernel = run_replay(session, ReplayConfig(strategy=spec), out_dir=tmp_path / "k")
    per_event = run_replay(session, ReplayConfig(strategy=spec), out_dir=tmp_path / "p", kernel=False)
    assert kernel.path.startswith("kernel") and per_event.path.startswith("python")
    for run in (kernel, per_event):
        assert (run.decision_digest, run.digest) == GOLDEN["default"][1:]
    kind, _ = registry.resolve(spec, {})
    calls = sys.modules[plugin._loaded[kind - plugin.FIRST_KIND][1].__module__].CALLS
    assert len(calls) > 100 and set(calls) <= {-1, 0, 1, 2, 3}  # it was asked, with label codes


def _on_both_engines(session: Path, spec: str, tmp_path: Path) -> Path:
    """The run directory of ``spec`` replayed on the compiled loop, after checking that the per-event
    engine gives the same digest."""
    runs = [
        run_replay(session, ReplayConfig(strategy=spec), out_dir=tmp_path / name, kernel=kernel)
        for name, kernel in (("k", True), ("p", False))
    ]
    assert runs[0].digest == runs[1].digest
    return runs[0].run_dir


SIZED = """
from engine.contract import tick_index

def quote(book, tick, qty, label, position, target, max_position, params):
    bid, ask = int(tick_index(book[0], tick)), int(tick_index(book[30], tick))
    if not 0 < bid < ask:
        return 0, 0, 0, 0
    # three quote sizes on the bid, one on the ask, each a tick behind its touch, while within the limit
    buy = 3 * qty if position + 3 * qty <= max_position else 0
    sell = qty if position - qty >= -max_position else 0
    return buy, bid - 1, sell, ask + 1
"""


def test_the_strategy_sets_each_sides_size_in_lots_and_price_in_ticks(session, module_file, tmp_path):
    """The strategy answers in the core's integers: the orders carry exactly its lots and ticks, on
    both engines alike."""
    run = _on_both_engines(session, f"{module_file(SIZED, 'sized.py')}:quote", tmp_path)
    orders = pq.read_table(run / "events" / "order.parquet").to_pylist()
    quotes = [o for o in orders if o["kind"] == "new" and o["order_type"] == "limit"]
    assert {(o["side"], o["qty"]) for o in quotes} == {("buy", 0.006), ("sell", 0.002)}
    assert all(round(o["px"] * 10) == o["px"] * 10 for o in quotes)  # whole ticks of 0.1


UNDER_ONE_TICK = "def quote(*args):\n    return 1, 0, 1, -3  # a lot at 0 ticks, a lot at -3\n"


def test_a_price_under_one_tick_is_refused_by_the_gateway_on_both_engines(session, module_file, tmp_path):
    """Integers the exchange takes no price for (0 ticks, or fewer) reach the gateway as no price:
    it refuses them (bad_order) and no limit order is sent."""
    run = _on_both_engines(session, f"{module_file(UNDER_ONE_TICK, 'zero.py')}:quote", tmp_path)
    risk = pq.read_table(run / "events" / "risk.parquet").to_pylist()
    quotes = [r for r in risk if r["source"] == "quote"]
    assert len(quotes) > 100 and {(r["accepted"], r["reason"]) for r in quotes} == {(False, "bad_order")}
    orders = pq.read_table(run / "events" / "order.parquet").to_pylist()
    assert all(o["order_type"] == "market" for o in orders)


@pytest.mark.parametrize(
    "body, message",
    [
        ("return True, book[0] - tick / 2, True, book[30]", "returned (True, "),  # the float signature
        ("return 2, 1000.5, 2, 1003", "returned (2, 1000.5, 2, 1003)"),  # a price between two ticks
        ("return -2, 1000, 2, 1003", "returned (-2, 1000, 2, 1003)"),
        ("return 2, 1 << 70, 2, 1003", "returned (2, 1180591620717411303424, 2, 1003)"),
        ("return 2, 1000, True, 1003", "returned (2, 1000, True, 1003)"),  # a bool is no lot count
        ("return 2, 1000, 1 << 62, 1003", "returned (2, 1000, 4611686018427387904, 1003)"),
        ("return [2, 1000, 2, 1003.0]", "returned [2, 1000, 2, 1003.0]"),
    ],
)
def test_an_answer_not_in_whole_lots_and_ticks_is_one_error_line(body, message, session, tmp_path, capsys):
    path = tmp_path / "floaty.py"
    path.write_text(f"def quote(book, tick, *rest):\n    {body}\n")
    out = tmp_path / "run"
    assert main(["replay", str(session), "--out", str(out), "--strategy", f"{path}:quote"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dualhub replay: error: strategy "), lines
    assert message in lines[0] and lines[0].endswith("integers, lots >= 0"), lines
    assert not out.exists()


@pytest.mark.slow
def test_the_example_replays_alike_on_the_kernel_and_per_event(session, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["replay", str(session), "--out", str(out), "--strategy", EXAMPLE]) == 0
    assert "engine: kernel" in capsys.readouterr().out
    per_event = run_replay(session, ReplayConfig(strategy=EXAMPLE), out_dir=tmp_path / "py", kernel=False)
    k, p = _manifest(out), _manifest(per_event.run_dir)
    assert k["digest"] == p["digest"] and k["decision_digest"] == p["decision_digest"]
    assert k["decision_digest"] != GOLDEN["default"][1]  # it decides otherwise than the baseline
    assert k["counts"]["order"] > 50 and k["counts"]["fill"] > 3
    assert p["config"]["strategy"] == EXAMPLE and len(p["config"]["strategy_sha256"]) == 64


def test_a_relative_file_is_recorded_by_its_absolute_path(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = ReplayConfig(strategy="docs/examples/microprice.py:quote")
    assert cfg.strategy == EXAMPLE


def test_an_edited_strategy_is_another_run(module_file):
    path = module_file(BASELINE_IN_PYTHON, "edited.py")
    spec = f"{path}:quote"
    before = ReplayConfig(strategy=spec).sha256()
    assert ReplayConfig(strategy=spec).sha256() == before
    path.write_text(BASELINE_IN_PYTHON + "\n# an edit\n")
    assert ReplayConfig(strategy=spec).sha256() != before
    assert LiveConfig(out="x", strategy=spec).to_json()["strategy_sha256"] == plugin.source_sha256(spec)


@pytest.mark.parametrize(
    "text, fn, message",
    [
        (None, "quote", "no such file"),
        ("x = 1\n", "quote", "has no function 'quote'"),
        ("x = 1\n", "not a name", "want MODULE:FUNCTION"),
        ("raise RuntimeError('boom')\n", "quote", "importing bad.py failed: RuntimeError: boom"),
        (
            "PARAMS = ('a',)\ndef quote(*a): pass\n",
            "quote",
            "PARAMS must be a tuple of engine",
        ),
    ],
)
def test_a_strategy_that_cannot_load_is_refused_by_both_configs(text, fn, message, tmp_path):
    path = tmp_path / "bad.py"
    if text is not None:
        path.write_text(text)
    for make in (
        lambda: ReplayConfig(strategy=f"{path}:{fn}"),
        lambda: LiveConfig(out=str(tmp_path), strategy=f"{path}:{fn}"),
    ):
        with pytest.raises(DualhubError, match=message):
            make()
    with pytest.raises(DualhubError, match="cannot import no_such_module_anywhere"):
        ReplayConfig(strategy="no_such_module_anywhere:quote")


@pytest.mark.parametrize(
    "body, message",
    [
        ("return 1 / 0", "raised ZeroDivisionError: division by zero"),
        ("return None", "returned None: want (bid_lots, bid_ticks, ask_lots, ask_ticks)"),
        ("return 1, 'x', 0, 0", "returned (1, 'x', 0, 0)"),
    ],
)
def test_a_strategy_that_breaks_during_the_replay_is_one_error_line_and_no_run(
    body, message, session, tmp_path, capsys
):
    path = tmp_path / "broken.py"
    path.write_text(f"def quote(*args):\n    {body}\n")
    out = tmp_path / "run"
    assert main(["replay", str(session), "--out", str(out), "--strategy", f"{path}:quote"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("dualhub replay: error: strategy ") and message in lines[0], lines
    assert not out.exists()


@pytest.mark.slow
def test_the_example_in_paper_live_replays_to_the_same_decisions(tmp_path, capsys):
    frames = list(simulator_frames(["BTCUSDT"], minutes=2, seed=3))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BITGET_")}
    out = tmp_path / "paper"
    with LocalExchangeThread(LocalExchange(frames, speed=10.0)) as ex:
        cmd = [sys.executable, "-m", "dualhub.cli", "live", "--paper", "--exchange-url", ex.rest_url,
               "--ws-url", ex.ws_url, "--out", str(out), "--duration", "4", "--provider", "cpu",
               "--strategy", EXAMPLE, "--strategy-param", "half_spread_ticks=2"]  # fmt: skip
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    run = out / "runs" / "live-BTCUSDT"
    m = _manifest(run)
    assert m["engine_config"]["strategy"] == EXAMPLE
    assert m["engine_config"]["strategy_params"] == {"half_spread_ticks": 2.0}
    assert m["counts"]["order"] > 5
    # live ran the engine a replay runs: the same core, by the hash of its sources
    runtime = orjson.loads((run / "runtime.json").read_bytes())
    assert {k: runtime[k] for k in ("engine", "engine_sha256")} == engine_identity()
    assert main(["parity", str(out)]) == 0  # every decision again, the Python strategy's included
    assert "no divergence: " in capsys.readouterr().out
    baseline = run_replay(
        out, replay_config_for(run, strategy="baseline", strategy_params={}), out_dir=tmp_path / "b"
    )
    assert diff_runs(run, baseline.run_dir, streams=COMPARABLE_STREAMS).diverged  # the strategy made them
