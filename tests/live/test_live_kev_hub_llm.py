"""``dualhub live --symbols A,B --kev-hub llm --kev-url URL``: the project's real llama-server answers
for the whole portfolio in paper live mode (the same v2 question replay's --kev-hub llm asks), and the
run's cassette of its answers replays to the same decisions."""

from __future__ import annotations

import orjson
import pyarrow.parquet as pq

from live.runner import LiveConfig, run_live
from replay.diff import COMPARABLE_STREAMS, diff_runs
from replay.driver import run_replay
from replay.parity import replay_config_for
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames

SYMBOLS = ("BTCUSDT", "ETHUSDT")
ETH = {"quote_qty": 0.06, "max_position": 1.5, "max_order_qty": 0.6}


def test_the_llm_hub_live_and_its_replay(tmp_path, llama_server):
    frames = list(simulator_frames(list(SYMBOLS), minutes=2, seed=3))
    with LocalExchangeThread(LocalExchange(frames, speed=10.0, symbols=SYMBOLS)) as ex:
        res = run_live(
            LiveConfig(
                out=str(tmp_path / "hub"),
                exchange_url=ex.rest_url,
                ws_url=ex.ws_url,
                laya_provider="cpu",
                duration_s=12.0,
                symbols=SYMBOLS,
                instruments={"ETHUSDT": ETH},
                kev_hub="llm",
                kev_url=llama_server.url,
                kev_timeout_ms=30_000,  # a loaded CI machine: the answers, not the timeout, are tested
                pair_half_life_ms=5_000,
                seed=7,
            )
        )
    run = res.run_dirs["BTCUSDT"]
    resp = pq.read_table(run / "events" / "kev_response.parquet").to_pylist()
    answered = [r for r in resp if r["ok"]]
    assert answered, [r["error"] for r in resp]
    assert all(r["advisor"] == "llm" for r in answered)
    assert all(orjson.loads(r["raw"])["schema_version"] == 2 for r in answered)
    assert not [r for r in resp if r["failure"] in ("inconsistent", "schema_invalid")]
    cmds = pq.read_table(run / "events" / "command.parquet").to_pylist()
    per: dict[int, list[str]] = {}
    for c in cmds:
        per.setdefault(c["command_id"], []).append(c["symbol"])
    assert per and all(sorted(v) == sorted(SYMBOLS) for v in per.values())
    cfg = replay_config_for(run)
    assert cfg.kev_hub == "llm" and cfg.kev_mode == "cassette"
    rr = run_replay(res.session_dir, cfg, out_dir=tmp_path / "replay")
    d = diff_runs(run, rr.run_dir, streams=COMPARABLE_STREAMS)
    assert not d.diverged, d.to_json()["divergence"]
