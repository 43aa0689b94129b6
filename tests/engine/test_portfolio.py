"""Exact accounting in the engine's core: money is integers of 1e-12, a fill's notional and fee rounded
once, half-even, as Decimal.quantize rounds them; the fill events carry them as decimal128(38, 12) and
the engine's portfolio reads them back as exact Decimals."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine.clock import ReplayClock
from engine.contract import ContractConfig
from engine.core import Engine, EngineConfig
from engine.eventlog import EventLog
from engine.risk import RiskLimits
from tests.helpers import make_book


class _Orders:
    """An execution client that only keeps what the engine sends."""

    def __init__(self) -> None:
        self.sent: list = []

    def submit(self, intent, now_ns) -> None:
        self.sent.append(intent)

    def cancel(self, client_oid, symbol, now_ns) -> None:
        pass


def _engine(tmp_path, maker: str, taker: str) -> tuple[Engine, _Orders, ReplayClock, EventLog]:
    (tmp_path / "events").mkdir()
    clock, log, orders = ReplayClock(), EventLog(tmp_path / "events"), _Orders()
    hold = (0, np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32))
    cfg = EngineConfig(
        contract=ContractConfig(maker_fee_rate=Decimal(maker), taker_fee_rate=Decimal(taker)),
        risk=RiskLimits(max_position=10.0, max_order_qty=10.0, max_net_delta_usd=1e9),
    )
    engine = Engine(
        cfg, clock=clock, log=log, labeler=lambda book: hold, kev=None, execution=orders, advisor_name="none"
    )
    book = make_book(59932.8, 59932.9, ts=1_000_000_000)
    clock.advance_to(book.ts_recv)
    engine.on_book(book)
    clock.run_all()  # the label: the strategy quotes both sides
    assert [o.side for o in orders.sent] == ["buy", "sell"]
    return engine, orders, clock, log


def test_notional_with_more_than_12_decimals_is_rounded_half_even_and_stored(tmp_path):
    """A recorded trade size need not be a size-step multiple: 59932.8 x 0.001911714881 has 13
    decimals. It is kept to 1e-12."""
    engine, orders, clock, log = _engine(tmp_path, "0.0002", "0.0006")
    buy = orders.sent[0].client_oid
    engine.on_fill(buy, 59932.8, 0.001911714881, "maker", clock.now_ns())
    notional, fee = Decimal("114.574425619997"), Decimal("0.022914885124")
    pf = engine.portfolio
    assert pf.position == Decimal("0.001911714881")
    assert pf.cash == -(notional + fee) and pf.fees == fee
    log.write()
    table = pq.read_table(tmp_path / "events" / "fill.parquet")
    assert table.schema.field("notional").type == pa.decimal128(38, 12)
    row = table.to_pylist()[0]
    assert (row["notional"], row["fee"], row["liquidity"]) == (notional, fee, "maker")
    assert row["position_after"] == 0.001911714881


def test_exact_notionals_and_both_fee_rates(tmp_path):
    engine, orders, clock, _ = _engine(tmp_path, "0.0002", "0.0006")
    sell = orders.sent[1].client_oid
    engine.on_fill(sell, 27000.5, 0.004, "taker", clock.now_ns())
    pf = engine.portfolio
    assert pf.cash == Decimal("108.002") - Decimal("0.0648012") and pf.position == Decimal("-0.004")
    engine.on_fill(orders.sent[0].client_oid, 27000.4, 0.004, "maker", clock.now_ns())
    fees = Decimal("0.0648012") + Decimal("0.02160032")  # 108.002 x 0.0006, 108.0016 x 0.0002
    assert engine.portfolio.position == 0 and engine.portfolio.fees == fees
    assert engine.portfolio.pnl(27000.0) == Decimal("108.002") - Decimal("108.0016") - fees
