"""Every importer writes each instrument's contract spec into the session's manifest (``contracts``):
the market's published spec where the data lies on its grids (``known``), else the grids the data shows
(``inferred``, and why), never Bitget's BTCUSDT perpetual by default."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualhub.cli import main
from engine.contract import ContractConfig, contract_of, data_spec, grid_unit, spec_of
from engine.errors import DualhubError
from engine.store import open_session
from tests.helpers import REPO
from tests.recorder.importers.spot_feeds import spot_feed

REAL = REPO / ".." / "shared" / "data" / "real"
BINANCE = REAL / "binance-usdm" / "usdm_btcusdt_20240808.gz"
BITGET_V1 = REAL / "bitget-v1" / "BITGET.ws.1.0"
FIELDS = {"tick", "size_step", "min_qty", "maker_fee_rate", "taker_fee_rate", "contract_type", "spec_source"}


def _contracts(session: Path) -> dict[str, dict]:
    c = open_session(session).manifest["contracts"]
    assert all(FIELDS <= set(spec) for spec in c.values())
    return c


def test_binance_spot_feed_gets_binance_spot_spec(tmp_path: Path, capsys) -> None:
    src = spot_feed(tmp_path / "spot.txt", seconds=20)
    assert main(["import", "binance-spot", str(src), "--out", str(tmp_path / "s")]) == 0
    spec = _contracts(tmp_path / "s")["BTCUSDT"]
    assert spec["spec_source"] == "known" and spec["contract_type"] == "spot"
    assert (spec["tick"], spec["size_step"], spec["min_qty"]) == ("0.01", "0.00001", "0.00001")
    assert (spec["maker_fee_rate"], spec["taker_fee_rate"]) == ("0.001", "0.001")


def test_low_priced_spot_feed_gets_inferred_grids(tmp_path: Path) -> None:
    src = spot_feed(tmp_path / "pepe.txt", symbol="PEPEUSDT", price="0.00001234", tick="0.00000001", step="1")
    assert main(["import", "binance-spot", str(src), "--out", str(tmp_path / "s")]) == 0
    spec = _contracts(tmp_path / "s")["PEPEUSDT"]
    assert spec["spec_source"] == "inferred" and "no published spec" in spec["why"]
    assert (spec["tick"], spec["size_step"]) == ("0.00000001", "1")


@pytest.mark.skipif(not BINANCE.exists(), reason="the shared Binance recording is absent")
def test_real_binance_futures_capture_gets_the_published_spec(tmp_path: Path) -> None:
    assert main(["import", "binance-futures", str(BINANCE), "--out", str(tmp_path / "s")]) == 0
    spec = _contracts(tmp_path / "s")["BTCUSDT"]
    assert spec["spec_source"] == "known" and spec["contract_type"] == "perpetual"
    assert (spec["tick"], spec["size_step"], spec["taker_fee_rate"]) == ("0.1", "0.001", "0.0005")


@pytest.mark.skipif(not BITGET_V1.exists(), reason="the shared Bitget v1 capture is absent")
def test_real_bitget_v1_capture_infers_each_symbols_grids(tmp_path: Path) -> None:
    assert main(["import", "bitget-v1", str(BITGET_V1), "--out", str(tmp_path / "s")]) == 0
    c = _contracts(tmp_path / "s")
    assert set(c) == set(open_session(tmp_path / "s").manifest["symbols"])
    assert all(s["spec_source"] == "inferred" and s["contract_type"] == "spot" for s in c.values())
    # a real low-priced coin: eight-decimal prices, whole-coin sizes
    assert (c["CULTUSDT"]["tick"], c["CULTUSDT"]["size_step"]) == ("0.00000001", "1")


def test_a_published_spec_the_data_breaks_falls_back_to_the_datas_grids() -> None:
    # BTCUSDT on Binance USD-M ticks in 0.1: data at 0.01 was written on another grid
    spec = data_spec(
        "BTCUSDT",
        np.array([61837.63, 61837.6]),
        np.array([0.002]),
        venue="binance",
        contract_type="perpetual",
        origin="test",
    )
    assert spec["spec_source"] == "inferred" and spec["why"].startswith("published spec does not hold")
    assert (spec["tick"], spec["size_step"], spec["taker_fee_rate"]) == ("0.01", "0.001", "0.0005")


def test_grid_unit_reads_decimals_as_the_core_does() -> None:
    assert grid_unit(np.array([61837.63, 61837.6, np.nan, 0.0])) == 0.01
    assert grid_unit(np.array([0.00012, 0.00001, 1.5])) == 0.00001
    assert grid_unit(np.array([1.234e-5, 1.2345e-5])) == 1e-9
    assert (
        grid_unit(np.array([1000.0, 200.0])) == 1.0
    )  # not their gcd: a short capture proves no coarser step
    assert grid_unit(np.array([1e-13])) is None
    assert grid_unit(np.array([np.nan])) is None
    with pytest.raises(DualhubError, match="no decimal grid"):
        data_spec("X", np.array([1e-13]), np.array([1.0]), venue="binance", contract_type="spot", origin="t")


def test_a_spec_round_trips_through_the_manifest() -> None:
    c = ContractConfig(symbol="PEPEUSDT", tick=1e-8, size_step=1.0, min_qty=1.0)
    spec = spec_of(c, contract_type="spot", source="exchange")
    assert spec["tick"] == "0.00000001" and spec["spec_source"] == "exchange"
    assert contract_of("PEPEUSDT", spec) == c
    with pytest.raises(DualhubError, match="contract spec of X is unusable"):
        contract_of("X", {"tick": "0.1"})
