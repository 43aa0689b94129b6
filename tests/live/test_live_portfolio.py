"""``dualhub live --symbols BTCUSDT,ETHUSDT``: one engine and one risk gateway over both symbols, paper
mode against the local exchange, and the run replays to the same decisions (replay/portfolio.py)."""

from __future__ import annotations

import orjson
import pyarrow.parquet as pq
import pytest

from live.runner import PORTFOLIO_RUN, LiveConfig, run_live
from replay.diff import COMPARABLE_STREAMS, diff_runs
from replay.driver import run_replay
from replay.parity import check_parity, replay_config_for
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames

SPEED = 10.0
JITTER = "lognormal:p5=1ms,p95=9ms"
SYMBOLS = ("BTCUSDT", "ETHUSDT")
# ETH at 1/30 of BTC's price: the same notional per quote and limit
ETH = {"quote_qty": 0.06, "max_position": 1.5, "max_order_qty": 0.6}


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    frames = list(simulator_frames(list(SYMBOLS), minutes=2, seed=3))
    out = tmp_path_factory.mktemp("live") / "paper"
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED, symbols=SYMBOLS)) as ex:
        res = run_live(
            LiveConfig(
                out=str(out),
                exchange_url=ex.rest_url,
                ws_url=ex.ws_url,
                laya_provider="cpu",
                duration_s=6.0,
                symbols=SYMBOLS,
                instruments={"ETHUSDT": ETH},
                latency_order_entry=JITTER,
                latency_order_response=JITTER,
                seed=7,
            )
        )
    return res


def _rows(t):
    return orjson.dumps(t.to_pylist(), default=str)  # NaN (a market order's price) as null: equal to itself


def test_two_symbols_are_one_engine_one_run(paper):
    assert paper.exit_code == 0 and paper.stopped_by == "duration"
    run = paper.run_dirs["BTCUSDT"]
    assert run == paper.run_dirs["ETHUSDT"] and run.name == PORTFOLIO_RUN
    m = orjson.loads((run / "manifest.json").read_bytes())
    assert m["symbols"] == list(SYMBOLS) and m["kind"] == "live"
    assert m["engine_configs"]["ETHUSDT"]["quotes"]["quote_qty"] == ETH["quote_qty"]
    assert m["engine_configs"]["ETHUSDT"]["contract"]["tick"] == 0.01  # the local exchange's contract
    orders = pq.read_table(run / "events" / "order.parquet").to_pylist()
    by = {s: [o for o in orders if o["symbol"] == s] for s in SYMBOLS}
    assert all(len(v) > 10 for v in by.values()), {s: len(v) for s, v in by.items()}
    oids = [o["client_oid"] for o in orders if o["kind"] == "new"]
    assert len(oids) == len(set(oids))  # one id space across the instruments
    fills = {r["symbol"] for r in pq.read_table(run / "events" / "fill.parquet").to_pylist()}
    assert fills == set(SYMBOLS)
    risk = pq.read_table(run / "events" / "risk.parquet").to_pylist()
    assert {r["symbol"] for r in risk} == set(SYMBOLS)


def test_the_portfolio_run_replays_to_the_same_decisions(paper, tmp_path):
    run = paper.run_dirs["BTCUSDT"]
    cfg = replay_config_for(run)
    assert cfg.symbols == SYMBOLS and cfg.instruments["ETHUSDT"]["quote_qty"] == ETH["quote_qty"]
    rr = run_replay(paper.session_dir, cfg, out_dir=tmp_path / "replay")
    assert rr.path.startswith("kernel (a portfolio of 2")  # recorded latencies on the compiled loop
    full = diff_runs(run, rr.run_dir, streams=COMPARABLE_STREAMS)
    assert not full.diverged, full.to_json()["divergence"]
    assert full.compared_a == full.compared_b > 100
    for stream in ("label", "order", "fill", "risk", "command", "latency", "kev_request"):
        a = pq.read_table(run / "events" / f"{stream}.parquet")
        b = pq.read_table(rr.run_dir / "events" / f"{stream}.parquet")
        assert _rows(a) == _rows(b), stream
    p = check_parity(run, tmp_path / "parity")
    assert not p.diverged and p.replay_run.name == "parity-portfolio"


def test_kev_as_the_hub_live_and_its_replay(tmp_path):
    """The pairs rule answering for the portfolio in paper live mode: one v2 command per answer sets
    both legs; the run's cassette of v2 answers replays to the same decisions."""
    frames = list(simulator_frames(list(SYMBOLS), minutes=2, seed=3))
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED, symbols=SYMBOLS)) as ex:
        res = run_live(
            LiveConfig(
                out=str(tmp_path / "hub"),
                exchange_url=ex.rest_url,
                ws_url=ex.ws_url,
                laya_provider="cpu",
                duration_s=6.0,
                symbols=SYMBOLS,
                instruments={"ETHUSDT": ETH},
                kev_hub="pairs",
                pair_half_life_ms=5_000,  # 6 s of data: a fit that warms up inside the run
                seed=7,
            )
        )
    run = res.run_dirs["BTCUSDT"]
    cmds = pq.read_table(run / "events" / "command.parquet").to_pylist()
    assert cmds and {c["symbol"] for c in cmds} == set(SYMBOLS)
    per = {}
    for c in cmds:
        per.setdefault(c["command_id"], []).append(c["symbol"])
    assert all(sorted(v) == sorted(SYMBOLS) for v in per.values())
    raw = pq.read_table(run / "events" / "kev_response.parquet").column("raw").to_pylist()
    assert all(orjson.loads(r)["schema_version"] == 2 for r in raw if r)
    cfg = replay_config_for(run)
    assert cfg.kev_hub == "pairs" and cfg.kev_mode == "cassette"
    rr = run_replay(res.session_dir, cfg, out_dir=tmp_path / "replay")
    assert rr.path.startswith("kernel (a portfolio of 2")  # the hub from its cassette, compiled loop
    d = diff_runs(run, rr.run_dir, streams=COMPARABLE_STREAMS)
    assert not d.diverged, d.to_json()["divergence"]
    assert rr.counts["command"] == len(cmds)


def test_a_quote_size_between_two_of_a_symbols_lots_is_one_error_line(tmp_path, capsys):
    """The exchange's contract sets ETHUSDT's lot (0.01): the default quote size (0.002) is no whole
    number of them, so the run stops at its start with one line naming the fix."""
    from dualhub.cli import main

    frames = list(simulator_frames(list(SYMBOLS), minutes=1, seed=3))
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED, symbols=SYMBOLS)) as ex:
        rc = main(
            ["live", "--paper", "--symbols", ",".join(SYMBOLS), "--exchange-url", ex.rest_url,
             "--ws-url", ex.ws_url, "--out", str(tmp_path / "paper"), "--duration", "2", "--provider", "cpu"]
        )  # fmt: skip
    assert rc == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "dualhub live: error: ETHUSDT: quote_qty 0.002 is not a whole number of size steps (0.01): "
        "give the instrument its own (--instrument ETHUSDT:quote_qty=Q)"
    )
    assert not (tmp_path / "paper").exists()  # BTCUSDT's run was being made: nothing of it is left
