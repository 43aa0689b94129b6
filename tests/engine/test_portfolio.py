"""Exact accounting in the engine's core: positions are whole lots of the size step, money integers of
1e-12 (two words: past what one int64 holds), a fill's notional and fee rounded
once, half-even, as Decimal.quantize rounds them; the fill events carry them as decimal128(38, 12) and
the engine's portfolio reads them back as exact Decimals."""

from __future__ import annotations

import random
from dataclasses import replace
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import kernel as K
from engine.clock import ReplayClock
from engine.contract import ContractConfig, step_parts
from engine.core import Engine, EngineConfig
from engine.errors import DualhubError
from engine.eventlog import EventLog
from engine.risk import RiskLimits
from engine.strategy import QuoteConfig
from tests.helpers import make_book


class _Orders:
    """An execution client that only keeps what the engine sends."""

    def __init__(self) -> None:
        self.sent: list = []

    def submit(self, intent, now_ns) -> None:
        self.sent.append(intent)

    def cancel(self, client_oid, symbol, now_ns) -> None:
        pass


def _engine(
    tmp_path,
    maker: str,
    taker: str,
    *,
    contract: ContractConfig | None = None,
    qty: float = 0.002,
    touch: tuple[float, float] = (59932.8, 59932.9),
) -> tuple[Engine, _Orders, ReplayClock, EventLog]:
    """An engine quoting ``qty`` on both sides of a book whose best bid and ask are ``touch``."""
    (tmp_path / "events").mkdir()
    clock, log, orders = ReplayClock(), EventLog(tmp_path / "events"), _Orders()
    hold = (0, np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32))
    fees = {"maker_fee_rate": Decimal(maker), "taker_fee_rate": Decimal(taker)}
    contract = replace(contract or ContractConfig(), **fees)
    big = 1e4 * qty
    cfg = EngineConfig(
        symbol=contract.symbol,
        contract=contract,
        risk=RiskLimits(
            max_position=big, max_order_qty=big, max_net_delta_usd=1e15, daily_loss_stop_usd=1e15
        ),
        quotes=QuoteConfig(quote_qty=qty),
    )
    engine = Engine(
        cfg, clock=clock, log=log, labeler=lambda book: hold, kev=None, execution=orders, advisor_name="none"
    )
    book = make_book(*touch, ts=1_000_000_000, size=1e4 * qty, tick=contract.tick)
    clock.advance_to(book.ts_recv)
    engine.on_book(book)
    clock.run_all()  # the label: the strategy quotes both sides
    assert [o.side for o in orders.sent] == ["buy", "sell"]
    return engine, orders, clock, log


def test_notional_with_more_than_12_decimals_is_rounded_half_even_and_stored(tmp_path):
    """59932.8 x 0.001911714881 (a contract of size step 1e-12) has 13 decimals: the notional is kept
    to 1e-12, rounded once, half-even."""
    engine, orders, clock, log = _engine(
        tmp_path, "0.0002", "0.0006", contract=ContractConfig(size_step=1e-12)
    )
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


def test_a_fill_of_part_of_a_lot_stops_the_engine_with_one_line(tmp_path):
    """Positions are whole lots of the size step: a venue that fills 0.0015 of a 0.001-step contract
    is not the contract the engine was configured with, and the engine says so."""
    engine, orders, clock, _ = _engine(tmp_path, "0.0002", "0.0006")
    with pytest.raises(DualhubError, match="not whole lots of the contract's size step"):
        engine.on_fill(orders.sent[0].client_oid, 59932.8, 0.0015, "maker", clock.now_ns())


def test_cash_beyond_an_int64_of_1e12_stays_exact(tmp_path):
    """Five fills of 40 BTC: 12 million USDT of cash, past the 9.2 million an int64 of 1e-12 holds."""
    engine, orders, clock, log = _engine(tmp_path, "0.0002", "0.0006", qty=40.0)
    buy = orders.sent[0]
    assert buy.qty == 40.0
    for _ in range(5):
        engine.on_fill(buy.client_oid, 59932.8, 40.0, "maker", clock.now_ns())
    notional, fee = Decimal("2397312"), Decimal("479.4624")
    pf = engine.portfolio
    assert pf.position == 200 and pf.fees == 5 * fee and pf.cash == -5 * (notional + fee)
    assert pf.cash < -9_223_372  # 2**63 / 1e12
    log.write()
    rows = pq.read_table(tmp_path / "events" / "fill.parquet").to_pylist()
    assert [(r["notional"], r["fee"], r["position_after"]) for r in rows] == [
        (notional, fee, 40.0 * k) for k in range(1, 6)
    ]


def test_a_low_priced_contract_trades_in_lots_of_whole_coins(tmp_path):
    """DOGEUSDT (Bitget: pricePlace 6, volumePlace 0): 250 000 DOGE a quote. Sizes in units of 1e-12
    would hold no more than 4 503 coins of position."""
    doge = ContractConfig(symbol="DOGEUSDT", tick=0.000001, size_step=1.0, min_qty=1.0)
    engine, orders, clock, _ = _engine(
        tmp_path, "0.0002", "0.0006", contract=doge, qty=250_000.0, touch=(0.123456, 0.123457)
    )
    buy, sell = orders.sent
    assert (buy.px, buy.qty, sell.px) == (0.123455, 250_000.0, 0.123458)
    for _ in range(4):
        engine.on_fill(buy.client_oid, 0.123455, 250_000.0, "maker", clock.now_ns())
    engine.on_fill(sell.client_oid, 0.123458, 1.0, "taker", clock.now_ns())
    pf = engine.portfolio
    bought, sold = Decimal("123455"), Decimal("0.123458")
    fees = bought * Decimal("0.0002") + sold * Decimal("0.0006")
    assert pf.position == 999_999 and pf.fees == fees and pf.cash == sold - bought - fees


def test_the_position_reaches_the_risk_rules_as_exact_words_of_1e12():
    """position_words: lots x step in integers of 1e-12 as hi * 2**32 + lo, past 2**63 too."""
    rng = random.Random(3)
    S = np.zeros(K.S_SIZE, dtype=np.int64)
    C = np.zeros(K.C_SIZE, dtype=np.int64)
    for step in (0.001, 1.0, 0.01, 1e-12, 5.0, 0.005, 100.0):
        C[K.C_STEP_NUM], C[K.C_STEP_DEC] = step_parts(step)
        unit = int(C[K.C_STEP_NUM]) * 10 ** (12 - int(C[K.C_STEP_DEC]))
        bound = (1 << 52) // int(C[K.C_STEP_NUM])
        for lots in [0, 1, -1, bound, -bound, *(rng.randint(-bound, bound) for _ in range(300))]:
            S[K.S_POS] = lots
            hi, lo = K.position_words(S, C)
            assert 0 <= lo < 2**32 and (int(hi) << 32) + int(lo) == lots * unit, (step, lots)
            assert K.size_of(lots, C) == float(Decimal(lots) * Decimal(repr(step)))


def test_a_contract_priced_in_12_decimals_fills_exactly(tmp_path):
    """A tick of 1e-12 (BABYDOGEUSDT's priceScale in Bitget's product list, ../shared/data/real): a
    fill price is an integer of 1e-12: 1.5 billion coins at 0.000001234567 USDT (or a tick below) are
    about 1 852 USDT."""
    baby = ContractConfig(symbol="BABYDOGEUSDT", tick=1e-12, size_step=1e8, min_qty=1e8)
    engine, orders, clock, _ = _engine(
        tmp_path, "0.0002", "0.0006", contract=baby, qty=1.5e9, touch=(1.234567e-6, 1.234568e-6)
    )
    buy = orders.sent[0]
    engine.on_fill(buy.client_oid, buy.px, 1.5e9, "maker", clock.now_ns())
    notional = Decimal(repr(buy.px)) * 1_500_000_000
    assert engine.portfolio.position == 1_500_000_000
    assert engine.portfolio.cash == -(notional + (notional * Decimal("0.0002")).quantize(Decimal("1e-12")))


def test_a_tick_of_more_than_12_decimals_is_one_error_line(tmp_path):
    with pytest.raises(DualhubError, match="tick 1e-13 is not a positive decimal of at most 12"):
        _engine(tmp_path, "0.0002", "0.0006", contract=ContractConfig(tick=1e-13), touch=(1e-9, 1.1e-9))
