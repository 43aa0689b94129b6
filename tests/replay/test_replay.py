"""End to end: simulated session -> replay through Laya, Kev queue, risk, simulated exchange -> report."""

import gc
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import duckdb
import orjson
import pyarrow.parquet as pq
import pytest

from analysis.report import run_report
from engine.errors import DualhubError
from engine.eventlog import OUTPUT_STREAMS
from engine.laya.model import DEFAULT_MODEL
from engine.store import open_session
from replay.config import ReplayConfig
from replay.driver import run_replay
from tests.helpers import REPO
from venue.simulator import simulate_session

ROOT = REPO


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=2.0, seed=11)


@pytest.fixture(scope="module")
def run_a(session, tmp_path_factory):
    return run_replay(session, ReplayConfig(seed=5), out_dir=tmp_path_factory.mktemp("a") / "run")


def _events(run, stream):
    return pq.read_table(run.run_dir / "events" / f"{stream}.parquet")


def test_same_inputs_same_digest_and_identical_parquet(session, run_a, tmp_path):
    run_b = run_replay(session, ReplayConfig(seed=5), out_dir=tmp_path / "run")
    assert run_a.digest == run_b.digest
    for stream in OUTPUT_STREAMS:
        a = (run_a.run_dir / "events" / f"{stream}.parquet").read_bytes()
        b = (run_b.run_dir / "events" / f"{stream}.parquet").read_bytes()
        assert a == b, stream
    assert (run_a.run_dir / "manifest.json").read_bytes() == (run_b.run_dir / "manifest.json").read_bytes()


def test_digest_is_identical_in_a_separate_process(session, run_a, tmp_path):
    out = tmp_path / "proc"
    subprocess.run(
        [sys.executable, "-m", "dualhub.cli", "replay", str(session), "--seed", "5", "--out", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    assert orjson.loads((out / "manifest.json").read_bytes())["digest"] == run_a.digest


def test_another_seed_changes_kev_lag_and_the_digest(session, run_a, tmp_path):
    run_c = run_replay(session, ReplayConfig(seed=6), out_dir=tmp_path / "run")
    assert run_c.digest != run_a.digest
    lags_a = _events(run_a, "kev_response").column("lag_ns").to_pylist()
    lags_c = _events(run_c, "kev_response").column("lag_ns").to_pylist()
    assert lags_a[:5] != lags_c[:5]


def test_every_snapshot_is_labelled_after_laya_latency(session, run_a):
    books = open_session(session).read_table("books15")
    labels = _events(run_a, "label")
    assert labels.num_rows == books.num_rows
    assert labels.column("book_seq").to_pylist() == books.column("seq").to_pylist()
    lat = 200_000  # ReplayConfig().latency_laya = "const:200us"
    recv = dict(zip(books.column("seq").to_pylist(), books.column("ts_recv").to_pylist(), strict=True))
    assert all(
        t == recv[s] + lat
        for s, t in zip(
            labels.column("book_seq").to_pylist(), labels.column("ts_recv").to_pylist(), strict=True
        )
    )
    assert len(set(labels.column("label").to_pylist())) >= 2


def test_kev_replies_arrive_after_their_lag_and_never_block_labels(run_a):
    req = {r["request_id"]: r for r in _events(run_a, "kev_request").to_pylist()}
    resp = _events(run_a, "kev_response").to_pylist()
    assert resp, "no Kev traffic"
    for r in resp:
        assert r["ts_recv"] == req[r["request_id"]]["ts_recv"] + r["lag_ns"]
        assert 50e6 < r["lag_ns"] < 2e9
    # While a request was in flight, labels kept coming at book cadence.
    labels = _events(run_a, "label").column("ts_recv").to_pylist()
    r0 = resp[0]
    start = req[r0["request_id"]]["ts_recv"]
    in_flight = [t for t in labels if start < t < r0["ts_recv"]]
    assert len(in_flight) >= 1
    # One worker: requests never overlap.
    spans = sorted((req[r["request_id"]]["ts_recv"], r["ts_recv"]) for r in resp)
    assert all(b_start >= a_end for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))


def test_commands_come_only_from_valid_replies_and_orders_only_after_risk(run_a):
    ok = sum(_events(run_a, "kev_response").column("ok").to_pylist())
    assert _events(run_a, "command").num_rows == ok
    risk = _events(run_a, "risk").to_pylist()
    accepted_new = {r["client_oid"] for r in risk if r["accepted"] and r["intent"] == "new"}
    orders = _events(run_a, "order").to_pylist()
    assert {o["client_oid"] for o in orders if o["kind"] == "new"} == accepted_new
    assert {f["client_oid"] for f in _events(run_a, "fill").to_pylist()} <= accepted_new
    assert _events(run_a, "fill").num_rows > 0


def test_emergency_pulls_quotes_without_waiting_for_kev(run_a):
    labels = _events(run_a, "label").to_pylist()
    orders = _events(run_a, "order").to_pylist()
    emergencies = [lab["ts_recv"] for lab in labels if lab["label"] == "EMERGENCY"]
    cancels_at = {o["ts_recv"] for o in orders if o["kind"] == "cancel"}
    assert emergencies, "simulated session should contain EMERGENCY labels"
    assert any(t in cancels_at for t in emergencies)


def test_batch_and_tick_laya_give_identical_labels(session, run_a, tmp_path):
    tick = run_replay(session, ReplayConfig(seed=5, laya_mode="tick"), out_dir=tmp_path / "tick")
    assert (
        _events(tick, "label").column("label").to_pylist()
        == _events(run_a, "label").column("label").to_pylist()
    )


def test_report_agrees_with_the_event_log(run_a):
    sections = {s.name: s for s in run_report(run_a.run_dir)}
    label_total = sum(r[1] for r in sections["labels"].rows)
    assert label_total == run_a.books
    kev = dict(zip(sections["kev"].columns, sections["kev"].rows[0], strict=True))
    assert kev["requests"] == _events(run_a, "kev_request").num_rows
    assert 150 <= kev["lag_p50_ms"] <= 400
    fills = _events(run_a, "fill").num_rows
    assert sum(r[2] for r in sections["fills"].rows) == fills
    [pnl] = sections["pnl"].rows
    assert pnl[0] == pytest.approx(
        sum((f["qty"] if f["side"] == "buy" else -f["qty"]) for f in _events(run_a, "fill").to_pylist()),
        abs=1e-9,
    )
    names = {r[0] for r in sections["latency"].rows}
    assert {"laya", "kev", "kev_queue"} <= names


def test_money_is_exact_decimal_in_parquet_and_duckdb(run_a):
    p = run_a.run_dir / "events" / "fill.parquet"
    assert str(pq.read_schema(p).field("fee").type) == "decimal128(38, 12)"
    [(t,)] = duckdb.sql(f"SELECT typeof(sum(fee)) FROM '{p}'").fetchall()
    assert t.startswith("DECIMAL")


def test_run_manifest_names_its_inputs(session, run_a):
    m = orjson.loads((run_a.run_dir / "manifest.json").read_bytes())
    assert m["digest"] == run_a.digest
    assert m["session"]["digest"] == open_session(session).digest()
    assert len(m["model"]["sha256"]) == 64 and m["model"]["feature_version"] == "v0"
    assert m["seeds"]["replay"] == 5 and m["config"]["seed"] == 5
    rt = orjson.loads((run_a.run_dir / "runtime.json").read_bytes())
    assert rt["active_provider"] in rt["requested_providers"]


def test_refuses_to_overwrite_and_bad_inputs_are_clear_errors(session, run_a, tmp_path):
    with pytest.raises(DualhubError, match="exists"):
        run_replay(session, ReplayConfig(seed=5), out_dir=run_a.run_dir)
    with pytest.raises(DualhubError, match="not a finished session"):
        run_replay(tmp_path, ReplayConfig())
    with pytest.raises(DualhubError, match="no books15 rows for ETHUSDT"):
        run_replay(session, ReplayConfig(symbol="ETHUSDT"), out_dir=tmp_path / "x")
    with pytest.raises(DualhubError, match="fill model"):
        ReplayConfig(fill_model="magic")


def test_loss_stop_rejects_opening_orders(session, tmp_path):
    cfg = ReplayConfig(seed=5)
    limits = replace(cfg.risk, daily_loss_stop_usd=1e-9)  # any loss stops opening trades
    run = run_replay(session, replace(cfg, risk=limits), out_dir=tmp_path / "r")
    reasons = _events(run, "risk").column("reason").to_pylist()
    assert "loss_stop" in reasons


def test_default_model_exists_and_is_used():
    assert DEFAULT_MODEL.exists()


# -- multi-symbol sessions: one symbol per run ------------------------------------------------------

REAL_BITGET_V1 = REPO / ".." / "shared" / "data" / "real" / "bitget-v1"


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from dualhub.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _run_dir(out: str) -> Path:
    (line,) = [ln for ln in out.splitlines() if ln.startswith("run: ")]
    return Path(line.removeprefix("run: "))


@pytest.fixture(scope="module")
def two_symbols(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("multi") / "s"
    simulate_session(out, symbols=["BTCUSDT", "ETHUSDT"], minutes=1.0, seed=5)
    return out


def test_a_multi_symbol_session_replays_the_symbol_asked_each_a_run_of_its_own(two_symbols, capsys):
    rc, out, err = _cli(capsys, "replay", str(two_symbols), "--provider", "cpu")
    assert rc == 2 and err.strip().splitlines() == [
        f"dualhub replay: error: {two_symbols} holds 2 symbols (BTCUSDT, ETHUSDT): pick one with --symbol"
    ]
    rc, out, err = _cli(capsys, "replay", str(two_symbols), "--provider", "cpu", "--symbol", "SOLUSDT")
    assert rc == 2 and err.strip().splitlines() == [
        f"dualhub replay: error: {two_symbols} has no books15 rows for SOLUSDT; its symbols: BTCUSDT, ETHUSDT"
    ]
    books = pq.read_table(two_symbols / "books15").column("symbol").to_pylist()
    runs = {}
    for symbol in ("BTCUSDT", "ETHUSDT"):
        sized = ["--instrument", "ETHUSDT:quote_qty=0.01"] if symbol == "ETHUSDT" else []  # its 0.01 lots
        rc, out, err = _cli(
            capsys, "replay", str(two_symbols), "--provider", "cpu", "--symbol", symbol, *sized
        )
        assert rc == 0, err
        runs[symbol] = run = _run_dir(out)
        m = orjson.loads((run / "manifest.json").read_bytes())
        assert m["config"]["symbol"] == symbol == m["config"]["contract"]["symbol"]
        labels = pq.read_table(run / "events" / "label.parquet").column("symbol").to_pylist()
        assert set(labels) == {symbol} and len(labels) == books.count(symbol)  # its books, every one
        assert set(pq.read_table(run / "events" / "order.parquet").column("symbol").to_pylist()) == {symbol}
        assert m["counts"]["fill"] > 0  # it trades: on the symbol's own contract (tick, size step)
    truth = open_session(two_symbols).manifest["simulator"]["instruments"]["ETHUSDT"]
    eth = orjson.loads((runs["ETHUSDT"] / "manifest.json").read_bytes())["config"]["contract"]
    assert (eth["tick"], eth["size_step"]) == (float(truth["tick"]), float(truth["size_step"]))
    assert runs["BTCUSDT"] != runs["ETHUSDT"]  # the symbol is part of the config: two runs


def test_the_real_eight_symbol_bitget_capture_replays_one_symbol(tmp_path, capsys):
    from recorder.importers.bitget_v1 import import_bitget_v1

    session = tmp_path / "bitget"
    symbols = import_bitget_v1(REAL_BITGET_V1 / "BITGET.ws.1.0", session)["symbols"]
    assert len(symbols) == 8
    rc, out, err = _cli(capsys, "replay", str(session), "--provider", "cpu")
    assert rc == 2 and err.strip().splitlines() == [
        f"dualhub replay: error: {session} holds 8 symbols ({', '.join(symbols)}): pick one with --symbol"
    ]
    books = pq.read_table(session / "books15").column("symbol").to_pylist()
    symbol = max(symbols, key=books.count)
    rc, out, err = _cli(capsys, "replay", str(session), "--provider", "cpu", "--symbol", symbol)
    assert rc == 0, err
    run = _run_dir(out)
    labels = pq.read_table(run / "events" / "label.parquet").column("symbol").to_pylist()
    assert set(labels) == {symbol} and len(labels) == books.count(symbol)
    assert orjson.loads((run / "manifest.json").read_bytes())["config"]["symbol"] == symbol


OURS = ("engine", "replay", "venue", "live", "wire", "recorder")  # the project's packages


@pytest.mark.parametrize("kernel", [True, False], ids=["compiled loop", "per event"])
def test_a_replay_leaves_no_cyclic_garbage_behind(session: Path, tmp_path: Path, kernel: bool) -> None:
    """The run's reference cycles (its event log, with the buffers that hang off it) are freed when it
    returns, not left for a full collection that may come long after: in a process that replays again
    they added up (~37 MB a run of 1M snapshots)."""
    cfg = ReplayConfig()
    run_replay(session, cfg, out_dir=tmp_path / "a", kernel=kernel)  # the first loads what stays loaded
    gc.collect()
    was = gc.isenabled()
    gc.disable()  # nothing collects behind the test's back
    try:
        r = run_replay(session, cfg, out_dir=tmp_path / "b", kernel=kernel)
        assert r.path.startswith("kernel") == kernel
        # only the run's own objects count: numba may leave IR of its own after a refused compile
        # earlier in the process (tests/engine/test_jit.py)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ours = [type(o).__qualname__ for o in gc.garbage if type(o).__module__.split(".")[0] in OURS]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert ours == []
