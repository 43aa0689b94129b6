"""``dualhub record`` reads each symbol's contract from the exchange's contracts endpoint at the start
and writes it into the session's manifest (``spec_source: exchange``); a recovery keeps it; an endpoint
that does not answer never stops a recording, and the manifest says why it names no spec."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.contract import ContractConfig, contract_of
from engine.store import open_session
from recorder.record import RecordConfig, Recorder
from recorder.recover import recover
from tests.recorder.test_recorder import fast_conn
from venue.bitget.exchange import LocalExchange
from venue.bitget.public_server import simulator_frames
from venue.bitget.rest_server import contract_row

ETH = ContractConfig(symbol="ETHUSDT", tick=0.01, size_step=0.01, min_qty=0.02)


@pytest.fixture(scope="module")
def frames():
    return list(simulator_frames(["BTCUSDT"], minutes=1, seed=3))


def _record(ex: LocalExchange | None, out: Path, rest_url: str) -> dict:
    async def go() -> dict:
        url = ex.public_url if ex is not None else "ws://127.0.0.1:9/"
        cfg = RecordConfig(out=str(out), symbols=("BTCUSDT",), duration_s=1.5, connection=fast_conn(url))
        return await asyncio.wait_for(Recorder(cfg, rest_url).run(), 20)

    return asyncio.run(go())


def test_the_exchanges_contract_goes_into_the_manifest_and_survives_recovery(frames, tmp_path: Path) -> None:
    rows = [contract_row(ContractConfig()), contract_row(ETH)]

    async def serve() -> dict:
        async with LocalExchange(frames, speed=20, contracts=rows) as ex:
            return await asyncio.to_thread(_record, ex, tmp_path / "s", ex.rest_url)

    m = asyncio.run(serve())
    spec = m["contracts"]["BTCUSDT"]
    assert spec["spec_source"] == "exchange" and spec["contract_type"] == "perpetual"
    assert contract_of("BTCUSDT", spec) == ContractConfig()  # what the endpoint listed, fees included
    assert set(m["contracts"]) == {"BTCUSDT"}  # the recorded symbols only
    # a recovery rebuilds the manifest from record.json and the journal: the spec stays
    (tmp_path / "s" / "manifest.json").unlink()  # as a crash leaves it: record.json and the journal
    recover(tmp_path / "s")
    assert open_session(tmp_path / "s").manifest["contracts"] == m["contracts"]


def test_an_endpoint_that_does_not_answer_is_said_not_fatal(tmp_path: Path) -> None:
    m = _record(None, tmp_path / "s", "http://127.0.0.1:9")
    assert "contracts" not in m and m["contracts_error"].startswith("http://127.0.0.1:9")
