"""A replay trades the contract its session names (the manifest's ``contracts``), says which in the run's
config (``contract`` and ``contract_source``), takes an override from the command line, and refuses an
instrument the core's integers cannot hold before the run starts, in one line naming the limit and the
instrument. Through the real CLI, on Binance spot feeds written as Binance writes them."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from tests.recorder.importers.spot_feeds import spot_feed

PEPE_SIZES = "PEPEUSDT:quote_qty=2000000,max_order_qty=4000000,max_position=10000000"


@pytest.fixture(scope="module")
def spot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Binance spot BTCUSDT session: cent prices, a lot of 0.00001."""
    d = tmp_path_factory.mktemp("spot")
    src = spot_feed(d / "spot.txt", seconds=120)
    assert main(["import", "binance-spot", str(src), "--out", str(d / "s")]) == 0
    return d / "s"


def _config(run: Path) -> dict:
    return orjson.loads((run / "manifest.json").read_bytes())["config"]


def _fills(run: Path) -> list[dict]:
    return pq.read_table(run / "events" / "fill.parquet", columns=["px", "qty", "fee"]).to_pylist()


def _on(x: float, unit: str) -> bool:
    return Decimal(repr(x)) % Decimal(unit) == 0


def test_binance_spot_session_replays_with_fills_on_its_own_contract(
    spot: Path, tmp_path: Path, capsys
) -> None:
    run = tmp_path / "r"
    assert main(["replay", str(spot), "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert (
        "contract BTCUSDT: tick 0.01, size step 1e-05, fees maker 0.001 taker 0.001, from the session (known)"
        in out
    )
    cfg = _config(run)
    assert cfg["contract_source"] == "session:known"
    c = cfg["contract"]
    assert (c["tick"], c["size_step"], c["min_qty"]) == (0.01, 1e-05, 1e-05)
    assert (c["maker_fee_rate"], c["taker_fee_rate"]) == ("0.001", "0.001")
    fills = _fills(run)
    assert fills
    assert all(_on(f["px"], "0.01") and _on(f["qty"], "0.00001") for f in fills)
    assert any(not _on(f["px"], "0.1") for f in fills)  # cent prices: Bitget's 0.1 tick could not fill these


def test_override_flags_replace_the_sessions_contract(spot: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "r"
    argv = ["--contract-defaults", "--contract", "tick=0.01,taker_fee_rate=0.0004"]
    assert main(["replay", str(spot), *argv, "--out", str(run)]) == 0
    assert "fees maker 0.0002 taker 0.0004, as the command line set it" in capsys.readouterr().out
    cfg = _config(run)
    assert cfg["contract_source"] == "flag"
    c = cfg["contract"]
    assert (c["tick"], c["size_step"], c["maker_fee_rate"], c["taker_fee_rate"]) == (
        0.01,
        0.001,
        "0.0002",
        "0.0004",
    )
    assert _fills(run) and all(_on(f["qty"], "0.001") for f in _fills(run))


def test_low_priced_instrument_replays_with_fills(tmp_path: Path, capsys) -> None:
    src = spot_feed(
        tmp_path / "pepe.txt",
        symbol="PEPEUSDT",
        price="0.00001234",
        tick="0.00000001",
        step="1",
        seconds=120,
        trade_lots=3_000_000,
        level_lots=50_000_000,
    )
    assert main(["import", "binance-spot", str(src), "--out", str(tmp_path / "s")]) == 0
    run = tmp_path / "r"
    # the config's sizes are BTC's: an instrument of another price names its own
    assert main(["replay", str(tmp_path / "s"), "--instrument", PEPE_SIZES, "--out", str(run)]) == 0
    assert "from the session (inferred)" in capsys.readouterr().out
    cfg = _config(run)
    assert cfg["contract_source"] == "session:inferred" and cfg["contract"]["tick"] == 1e-08
    fills = _fills(run)
    assert fills and all(_on(f["px"], "0.00000001") and f["px"] < 2e-5 for f in fills)
    assert all(f["fee"] > 0 for f in fills)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--contract", "tick=0.000000000001"], "BTCUSDT: a price of 618"),
        (
            ["--contract", "tick=0.0000000000001"],
            "BTCUSDT: tick 1e-13 is not a positive decimal of at most 12",
        ),
        (
            ["--instrument", "BTCUSDT:size_step=0.000000000001,max_position=100000"],
            "BTCUSDT: max_position 100000.0",
        ),
        (["--instrument", "BTCUSDT:max_order_qty=1e9,max_position=1e9"], "money units per fill"),
        (["--contract", "tick=-1"], "tick must be a finite number > 0"),
        # Bitget's 0.1 tick on cent prices: the first taker fill would stop the core mid-run
        (["--contract-defaults"], "BTCUSDT: the book's prices have more decimals than the tick 0.1"),
        (["--contract", "lot=1"], "'lot=1' is not FIELD=VALUE"),
        (["--symbols", "BTCUSDT", "--contract-defaults"], "with --symbols"),
    ],
)
def test_what_the_core_cannot_hold_is_one_line_before_the_run(
    spot: Path, tmp_path: Path, capsys, argv, says
) -> None:
    run = tmp_path / "r"
    assert main(["replay", str(spot), *argv, "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dualhub replay: error: ") and says in err[0], err
    assert not run.exists() and not (tmp_path / "r.tmp").exists()


def test_a_program_replaying_the_session_trades_its_spec_too(spot: Path, tmp_path: Path) -> None:
    from engine.contract import ContractConfig
    from replay.config import ReplayConfig
    from replay.driver import run_replay

    run = run_replay(spot, out_dir=tmp_path / "r").run_dir
    assert _config(run)["contract_source"] == "session:known" and _config(run)["contract"]["tick"] == 0.01
    # a contract the program names is kept, and said
    forced = ReplayConfig(contract=ContractConfig(tick=0.05), contract_source="flag")
    run = run_replay(spot, forced, out_dir=tmp_path / "r2").run_dir
    assert _config(run)["contract_source"] == "flag" and _config(run)["contract"]["tick"] == 0.05
