"""One engine over two instruments (engine/instruments.py): real cores, real simulated exchanges, the
rule advisor as Kev, driven per event on a replay clock. The portfolio's risk rules bind on the sum
of the instruments, EMERGENCY and the kill switch act on all of them, ids are unique across them."""

from __future__ import annotations

from dataclasses import replace

import duckdb
import numpy as np
import pytest

from engine.clock import ReplayClock
from engine.contract import ContractConfig
from engine.core import Engine, EngineConfig
from engine.eventlog import EventLog
from engine.instruments import Portfolio
from engine.kev.rules import RuleKev
from engine.kev.sim import SimKevBackend
from engine.latency.models import ConstantLatency
from engine.risk import RiskLimits
from engine.strategy import QuoteConfig
from tests.helpers import make_book
from venue.exchange import SimExchange
from venue.fills import FILL_MODELS

S = 1_000_000_000
HOLD, BUY, SELL, EMERGENCY = 0, 1, 2, 3
LIMIT_USD = 250.0  # the portfolio's net delta limit: 2.5 BTC at 100, 5 ETH at 50


def _probs(label: int) -> np.ndarray:
    p = np.full(4, 0.02, dtype=np.float32)
    p[label] = 0.94
    return p


class _Run:
    """BTCUSDT (100.0/100.1) and ETHUSDT (50.00/50.01) in one portfolio; ``label(symbol, t, label)``
    delivers a book and its label at time t."""

    def __init__(self, tmp_path, **limits: float) -> None:
        (tmp_path / "events").mkdir()
        self.clock = clock = ReplayClock(start_ns=0)
        self.log = EventLog(tmp_path / "events")
        self.dir = tmp_path / "events"
        kev = SimKevBackend(RuleKev(), ConstantLatency(1_000_000), clock)
        self.pf = Portfolio(["BTCUSDT", "ETHUSDT"])
        risk = RiskLimits(max_net_delta_usd=1e9, portfolio_max_net_delta_usd=LIMIT_USD, **limits)
        quotes = QuoteConfig(quote_qty=0.01)
        self.books = {"BTCUSDT": (100.0, 100.1, 0.1), "ETHUSDT": (50.0, 50.01, 0.01)}
        self.next_label: dict[str, int] = {}
        self.engines: dict[str, Engine] = {}
        self.exchanges: dict[str, SimExchange] = {}
        self.seq = 0
        for sym, pos, qty, tick, step in (
            ("BTCUSDT", 10.0, 1.0, 0.1, 0.001),
            ("ETHUSDT", 10.0, 2.0, 0.01, 0.01),
        ):
            ex = SimExchange(
                clock,
                fill_model=FILL_MODELS["queue_power2"](),
                entry_latency=ConstantLatency(1_000_000),
                response_latency=ConstantLatency(1_000_000),
                cancel_latency=ConstantLatency(1_000_000),
                size_step=step,
                tick=tick,
            )
            cfg = EngineConfig(
                symbol=sym,
                contract=ContractConfig(symbol=sym, tick=tick, size_step=step, min_qty=step),
                risk=replace(risk, max_position=pos, max_order_qty=qty),
                quotes=quotes,
            )
            e = Engine(
                cfg,
                clock=clock,
                log=self.log,
                labeler=lambda book, s=sym: (self.next_label[s], _probs(self.next_label[s])),
                kev=kev,
                execution=ex,
                advisor_name="rules",
                portfolio=self.pf,
            )
            ex.engine = e
            self.engines[sym], self.exchanges[sym] = e, ex

    def settle(self, t: int) -> None:
        """Every timer due before ``t`` runs; the clock moves to ``t``."""
        self.clock.run_before(t, 0)
        self.clock.advance_to(t)

    def label(self, symbol: str, t: int, label: int) -> None:
        self.settle(t)
        bid, ask, tick = self.books[symbol]
        self.seq += 1
        book = make_book(bid, ask, ts=t, seq=self.seq, size=5.0, tick=tick, symbol=symbol)
        self.exchanges[symbol].on_book(book)
        self.next_label[symbol] = label
        self.engines[symbol].on_book(book)

    def finish(self) -> None:
        self.clock.run_all()
        self.log.write()

    def sql(self, q: str) -> list[tuple]:
        return duckdb.sql(q.replace("EV/", f"{self.dir}/")).fetchall()

    def net_after_each_fill(self) -> list[float]:
        """Net delta (USD at the books' mids) after each fill, in the order they happened."""
        mids = {s: (b + a) / 2 for s, (b, a, _) in self.books.items()}
        pos = dict.fromkeys(mids, 0.0)
        out = []
        for sym, after in self.sql("select symbol, position_after from 'EV/fill.parquet' order by seq"):
            pos[sym] = after
            out.append(sum(pos[s] * mids[s] for s in mids))
        return out


def test_one_leg_alone_stops_at_the_portfolio_net_delta_limit(tmp_path):
    run = _Run(tmp_path)
    for r in range(6):
        run.label("BTCUSDT", S + 2 * r * S, BUY)
        run.label("ETHUSDT", S + 2 * r * S + S // 2, HOLD)
    run.finish()
    pos = dict(run.sql("select symbol, last(position_after order by seq) from 'EV/fill.parquet' group by 1"))
    assert pos == {"BTCUSDT": 2.0}  # a third BTC would be 300 USD of delta
    refused = run.sql(
        "select symbol, source, count(*) from 'EV/risk.parquet' "
        "where reason = 'portfolio_net_delta' group by all"
    )
    assert refused == [("BTCUSDT", "kev", refused[0][2])] and refused[0][2] >= 2
    assert max(run.net_after_each_fill()) <= LIMIT_USD


def test_a_hedged_pair_stays_inside_net_delta_while_each_leg_alone_would_breach(tmp_path):
    run = _Run(tmp_path)
    for r in range(6):
        run.label("BTCUSDT", S + 2 * r * S, BUY)
        run.label("ETHUSDT", S + 2 * r * S + S // 2, SELL)
    run.finish()
    pos = dict(run.sql("select symbol, last(position_after order by seq) from 'EV/fill.parquet' group by 1"))
    # each leg alone is worth more than the limit; together they net out
    assert pos["BTCUSDT"] * 100.05 > LIMIT_USD and pos["ETHUSDT"] * 50.005 < -LIMIT_USD
    assert all(abs(n) <= LIMIT_USD for n in run.net_after_each_fill())
    assert abs(run.pf.net_delta_usd()) <= LIMIT_USD
    assert run.pf.net_delta_usd() == pytest.approx(pos["BTCUSDT"] * 100.05 + pos["ETHUSDT"] * 50.005)


def test_the_portfolio_loss_stop_halts_both_legs(tmp_path):
    """Buying at the ask and marking at the mid loses half the spread and the fees on every fill: a
    stop of 0.2 USD is passed after a few fills, and from then on neither instrument adds risk."""
    run = _Run(tmp_path, portfolio_loss_stop_usd=0.2)
    for r in range(6):
        run.label("BTCUSDT", S + 2 * r * S, BUY)
        run.label("ETHUSDT", S + 2 * r * S + S // 2, SELL)
    run.finish()
    stopped = run.sql(
        "select symbol, min(ts_recv) from 'EV/risk.parquet' where reason = 'portfolio_loss_stop' group by 1"
    )
    assert {s for s, _ in stopped} == {"BTCUSDT", "ETHUSDT"}
    first = min(t for _, t in stopped)
    # after the stop first bound, no order that adds risk was accepted on either leg (BTC is long,
    # ETH short): only orders that shrink a leg pass
    late = run.sql(
        "select symbol, side from 'EV/risk.parquet' "
        f"where accepted and intent = 'new' and ts_recv > {first} order by seq"
    )
    assert late and set(late) <= {("BTCUSDT", "sell"), ("ETHUSDT", "buy")}
    refused = run.sql(
        "select distinct symbol, source from 'EV/risk.parquet' where reason = 'portfolio_loss_stop'"
    )
    assert sorted(refused) == [("BTCUSDT", "kev"), ("ETHUSDT", "kev")]
    assert run.pf.pnl() < -0.2


def test_emergency_on_one_instrument_pulls_the_quotes_of_both(tmp_path):
    run = _Run(tmp_path)
    run.label("BTCUSDT", S, HOLD)
    run.label("ETHUSDT", S + S // 2, HOLD)
    run.settle(2 * S - 1)
    assert run.engines["BTCUSDT"].open_orders == 2 and run.engines["ETHUSDT"].open_orders == 2
    run.label("ETHUSDT", 2 * S, EMERGENCY)
    run.label("BTCUSDT", 2 * S + S // 2, HOLD)  # within the emergency hold: no new quotes
    run.finish()
    cancels = run.sql(
        "select symbol, count(*) from 'EV/order.parquet' where kind = 'cancel' group by 1 order by 1"
    )
    assert cancels == [("BTCUSDT", 2), ("ETHUSDT", 2)]
    assert run.engines["BTCUSDT"].open_orders == 0 and run.engines["ETHUSDT"].open_orders == 0
    news = run.sql("select count(*) from 'EV/order.parquet' where kind = 'new' and ts_recv > 2000000000")
    assert news == [(0,)]


def test_the_kill_switch_acts_on_every_instrument_and_ids_are_unique_across_them(tmp_path):
    run = _Run(tmp_path)
    run.label("BTCUSDT", S, HOLD)
    run.label("ETHUSDT", S + S // 2, HOLD)
    run.settle(2 * S)
    run.pf.kill()
    assert run.pf.kill_switch and all(e.kill_switch for e in run.engines.values())
    run.label("BTCUSDT", 3 * S, BUY)
    run.finish()
    oids = run.sql("select client_oid, symbol from 'EV/order.parquet' where kind = 'new' order by seq")
    assert [s for _, s in oids] == ["BTCUSDT", "BTCUSDT", "ETHUSDT", "ETHUSDT"]
    assert [o for o, _ in oids] == ["dh-1", "dh-2", "dh-3", "dh-4"]
    assert run.sql("select count(*) from 'EV/order.parquet' where kind = 'cancel'") == [(4,)]
    refused = run.sql("select distinct reason from 'EV/risk.parquet' where not accepted")
    assert refused == [("kill_switch",)]
    # the rows of every stream are in the order the steps ran
    ts = [t for (t,) in run.sql("select ts_recv from 'EV/order.parquet' order by seq")]
    assert ts == sorted(ts)


def test_a_portfolio_needs_each_symbol_once_in_order(tmp_path):
    with pytest.raises(ValueError):
        Portfolio(["BTCUSDT", "BTCUSDT"])
    pf = Portfolio(["BTCUSDT", "ETHUSDT"])
    clock = ReplayClock()
    (tmp_path / "events").mkdir()
    with pytest.raises(ValueError, match="joins a portfolio"):
        Engine(
            EngineConfig(symbol="ETHUSDT"),
            clock=clock,
            log=EventLog(tmp_path / "events"),
            labeler=lambda book: (0, _probs(0)),
            kev=None,
            execution=None,
            advisor_name="none",
            portfolio=pf,
        )


def test_instrument_flags_are_checked_settings():
    from engine.errors import DualhubError
    from engine.instruments import instrument_args, instrument_config

    got = instrument_args(["ETHUSDT:quote_qty=0.06,max_position=1.5", "SOLUSDT:tick=0.001"])
    assert got == {"ETHUSDT": {"quote_qty": 0.06, "max_position": 1.5}, "SOLUSDT": {"tick": 0.001}}
    e = instrument_config(EngineConfig(symbol="ETHUSDT"), got["ETHUSDT"])
    assert (e.quotes.quote_qty, e.risk.max_position, e.risk.max_order_qty) == (0.06, 1.5, 0.02)
    for bad, why in (
        ("ETHUSDT", "expected SYMBOL:FIELD=VALUE"),
        ("ETHUSDT:size=1", "unknown"),
        ("ETHUSDT:quote_qty=x", "not FIELD=NUMBER"),
        ("ETHUSDT:quote_qty=-1", "finite number > 0"),
        ("ETHUSDT:quote_qty=nan", "finite number > 0"),
    ):
        with pytest.raises(DualhubError, match=why):
            instrument_args([bad])


def test_resolve_instruments_scales_sizes_to_each_size_step_and_names_the_way_out():
    """The one resolution replay and live share: sizes in the first instrument's units, scaled to the
    same notional at the reference mids, down to each size step (at least its minimum order), the
    named settings over them; a size to scale without a price is one line naming the flag."""
    from engine.errors import DualhubError
    from engine.instruments import resolve_instruments

    btc = ContractConfig(symbol="BTCUSDT", tick=0.1, size_step=0.001, min_qty=0.001)
    eth = ContractConfig(symbol="ETHUSDT", tick=0.01, size_step=0.01, min_qty=0.01)
    sol = ContractConfig(symbol="SOLUSDT", tick=0.001, size_step=0.1, min_qty=1.0)
    contracts = {c.symbol: c for c in (btc, eth, sol)}
    base = EngineConfig(symbol="BTCUSDT", contract=btc)  # quote 0.002, max position 0.05, max order 0.02
    syms = ["BTCUSDT", "ETHUSDT", "SOLUSDT"]
    mids = {"BTCUSDT": 100_000.0, "ETHUSDT": 3_000.0, "SOLUSDT": 20_000.0}

    def sizes(e: EngineConfig) -> tuple[float, float, float]:
        return e.quotes.quote_qty, e.risk.max_position, e.risk.max_order_qty

    b, e, s = resolve_instruments(base, syms, contracts, mids, {})
    assert [x.symbol for x in (b, e, s)] == syms and (b.contract, e.contract, s.contract) == (btc, eth, sol)
    assert sizes(b) == (0.002, 0.05, 0.02)
    assert sizes(e) == (0.06, 1.66, 0.66)  # x 33.33: 0.0667, 1.6667, 0.6667 down to 0.01
    assert sizes(s) == (1.0, 1.0, 1.0)  # x 5: 0.01, 0.25, 0.1, each under SOL's minimum order of 1
    # named settings over the scaled ones (the first instrument's named sizes are its own: the others
    # scale the config's)
    named = {"ETHUSDT": {"quote_qty": 0.05}, "BTCUSDT": {"max_position": 0.1}}
    b, e, _ = resolve_instruments(base, syms, contracts, mids, named)
    assert sizes(b) == (0.002, 0.1, 0.02) and sizes(e) == (0.05, 1.66, 0.66)

    lines = []
    for gone, named in (("ETHUSDT", {}), ("BTCUSDT", {"ETHUSDT": {"quote_qty": 0.05}})):
        with pytest.raises(DualhubError) as err:
            resolve_instruments(base, syms[:2], contracts, {**mids, gone: float("nan")}, named)
        lines.append(str(err.value))
    assert lines == [
        "ETHUSDT: no reference price of ETHUSDT to scale the first instrument's sizes to it: give them "
        "(--instrument ETHUSDT:quote_qty=Q,max_position=P,max_order_qty=O)",
        "ETHUSDT: no reference price of BTCUSDT to scale the first instrument's sizes to it: give them "
        "(--instrument ETHUSDT:max_position=P,max_order_qty=O)",
    ]
    # every size named: no price needed (a run with no ticker starts with them)
    given = {"ETHUSDT": {"quote_qty": 0.05, "max_position": 1.0, "max_order_qty": 0.5}}
    _, e = resolve_instruments(base, syms[:2], contracts, {}, given)
    assert sizes(e) == (0.05, 1.0, 0.5) and e.contract == eth
