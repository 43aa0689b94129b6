"""Exact accounting: money stays Decimal, rounded once per fill to the schema's 1e-12."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq

from engine.eventlog import EventLog
from engine.events import Fill
from engine.portfolio import Portfolio


def test_notional_with_more_than_12_decimals_is_rounded_half_even_and_stored(tmp_path):
    """A recorded trade size need not be a size-step multiple: 59932.8 x 0.001911714881 has 13
    decimals. It is kept to 1e-12 (it used to crash the event log's decimal128(38, 12) write)."""
    p = Portfolio()
    notional, fee = p.apply_fill("buy", 59932.8, 0.001911714881, Decimal("0.0002"))
    assert notional == Decimal("114.574425619997")
    assert fee == Decimal("0.022914885124")
    assert p.cash == -(notional + fee) and p.position == Decimal("0.001911714881")
    log = EventLog()
    log.emit(
        Fill,
        ts_event=1,
        ts_recv=1,
        client_oid="dh-1",
        symbol="BTCUSDT",
        side="buy",
        px=59932.8,
        qty=0.001911714881,
        liquidity="maker",
        notional=notional,
        fee=fee,
        position_after=0.001911714881,
    )
    log.write(tmp_path)
    table = pq.read_table(tmp_path / "fill.parquet")
    assert table.column("notional")[0].as_py() == notional
    assert table.schema.field("notional").type == pa.decimal128(38, 12)


def test_exact_notionals_are_unchanged():
    p = Portfolio()
    notional, _ = p.apply_fill("sell", 27000.5, 0.004, Decimal("0.0006"))
    assert notional == Decimal("108.002")
    assert p.cash == Decimal("108.002") - Decimal("0.0648012")
