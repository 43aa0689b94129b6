"""The replay's fast paths give the same events as the plain ones: batch-drawn Laya latencies, labels
delivered by the walk and kept as columns, slot-set constructors, the row-based event log and its
column-wise digest, and the replay clock's timer loop."""

from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import replay.driver as driver
from engine.clock import ReplayClock
from engine.eventlog import OUTPUT_STREAMS, EventLog
from engine.events import BookSnapshot, Fill, LatencySpan, OrderEvent, Trade
from engine.fastinit import frozen_maker
from engine.latency.batch import sample_many
from engine.latency.models import ConstantLatency, ScaledLatency
from engine.risk import OrderIntent, RiskLimits
from replay.config import ReplayConfig
from replay.driver import run_replay
from venue.simulator import simulate_session


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=1.0, seed=23)


def _files(run) -> dict[str, bytes]:
    return {s: (run.run_dir / "events" / f"{s}.parquet").read_bytes() for s in OUTPUT_STREAMS}


@pytest.mark.parametrize("factor", [1.0, 1.5, 0.0])
def test_recorded_table_lookups_equal_sample_ns(factor):
    """A recorded model's table, as the replay kernel holds it, looked up key after key: what the model's
    ``sample_ns`` answers, keys recorded once, several times, used up or never recorded alike."""
    from engine.latency.batch import recorded_table
    from engine.latency.recorded import RecordedLatency
    from replay import fast_path
    from replay import kernel as K

    rng = np.random.default_rng(12)
    keys = rng.integers(0, 400, 600).tolist()  # repeats: a key answers its durations in recorded order
    durs = rng.integers(1, 9_000_000, 600).tolist()

    def model():
        m = RecordedLatency("order_entry", keys, durs)
        return m if factor == 1.0 else ScaledLatency(m, factor)

    asked = rng.integers(-5, 420, 3_000).tolist()  # hits, keys used up, keys never recorded
    one = model()
    want = [one.sample_ns(t) for t in asked]
    row = fast_path._keyed_row(recorded_table(model()))
    got = [int(K._recorded(row, t)) for t in asked]
    assert got == want
    inner = getattr(one, "inner", one)
    assert row[K.KEY_MISSES] == inner.misses > 100 and len(set(want)) > 300 * (factor > 0)
    assert recorded_table(ConstantLatency(5)) is None


@pytest.mark.parametrize("factor", [1.0, 1.5])
def test_batch_draws_of_a_fitted_kev_lag_equal_one_at_a_time(factor):
    """``dualhub kev fit-lag``'s model (101 quantiles, ties and a long tail) on the Kev lag's own
    stream: drawn in batches of any size, the same lags as one per request."""
    from engine.kev.lag import EmpiricalLag, fit_lag

    rng = np.random.default_rng(4)
    lag = np.concatenate([rng.lognormal(18.5, 0.6, 3_000), np.full(200, 9e7), [3e9]]).astype(np.int64)
    fit = {"fit": fit_lag(lag, np.zeros(len(lag), dtype=np.int64))}

    def model():
        m = EmpiricalLag.from_fit(fit, rng=driver._rng(11, 1))
        return m if factor == 1.0 else ScaledLatency(m, factor)

    one = model()
    want = [one.sample_ns(0) for _ in range(6_000)]
    batched, drawn = model(), []
    for size in (1, 4_096, 7, 0, 1_896):
        drawn += sample_many(batched, np.zeros(size, dtype=np.int64)).tolist()
    assert drawn == want and len(set(want)) > 1_000


@pytest.mark.parametrize(
    "cfg",
    [
        ReplayConfig(seed=5),
        ReplayConfig(seed=5, fill_model="queue_power2", latency_laya="lognormal:p5=50us,p95=3ms"),
        ReplayConfig(seed=2, laya_mode="tick", latency_laya="lognormal:p5=1ms,p95=9ms", scale_laya=2.0),
    ],
    ids=["const", "lognormal", "tick-scaled"],
)
def test_walk_labels_and_label_columns_equal_engine_timers(session, tmp_path, monkeypatch, cfg):
    fast = run_replay(session, cfg, out_dir=tmp_path / "fast")
    # Without batch-drawn latencies the engine schedules every label itself and appends it as a row.
    monkeypatch.setattr(driver, "_label_due", lambda tape, model: None)
    slow = run_replay(session, cfg, out_dir=tmp_path / "slow")
    assert fast.counts == slow.counts and fast.counts["label"] > 0
    assert _files(fast) == _files(slow)
    assert fast.digest == slow.digest


def test_label_columns_across_flushes(session, tmp_path, monkeypatch):
    base = run_replay(session, ReplayConfig(seed=4), out_dir=tmp_path / "a")
    real = EventLog.__init__

    def small(self, events_dir=None, *, flush_rows=16_384):
        real(self, events_dir, flush_rows=7)  # many flushes, label tables cut mid-stream

    monkeypatch.setattr(EventLog, "__init__", small)
    cut = run_replay(session, ReplayConfig(seed=4), out_dir=tmp_path / "b")
    monkeypatch.setattr(driver, "_label_due", lambda tape, model: None)
    rows = run_replay(session, ReplayConfig(seed=4), out_dir=tmp_path / "c")
    assert cut.digest == base.digest == rows.digest  # the digest does not depend on flush points
    assert _files(cut) == _files(rows)  # same row groups whether labels are columns or rows
    for s in OUTPUT_STREAMS:  # other row groups, the same rows (NaN prices of market orders included)
        a, b = (repr(pq.read_table(r.run_dir / "events" / f"{s}.parquet").to_pylist()) for r in (base, cut))
        assert a == b, s


def test_frozen_maker_equals_the_dataclass_constructor():
    make = frozen_maker(OrderIntent)
    args = ("dh-1", "BTCUSDT", "new", "buy", "limit", 100.5, 0.002, False, None, "quote", -1)
    built = make(*args)
    assert built == OrderIntent(
        client_oid="dh-1",
        symbol="BTCUSDT",
        intent="new",
        side="buy",
        order_type="limit",
        px=100.5,
        qty=0.002,
        reduce_only=False,
        max_slippage_bps=None,
        source="quote",
        advice_age_ns=-1,
    )
    with pytest.raises(AttributeError):
        built.px = 1.0  # type: ignore[misc]  # still frozen
    t = frozen_maker(Trade)(1, 2, 3, "BTCUSDT", "t1", 100.0, 0.5, "buy")
    assert t == Trade(
        ts_event=1, ts_recv=2, seq=3, symbol="BTCUSDT", trade_id="t1", px=100.0, sz=0.5, side="buy"
    )
    assert frozen_maker(BookSnapshot).__doc__
    with pytest.raises(TypeError):
        frozen_maker(RiskLimits)  # __post_init__ validates: a maker would skip it


def _log_with(tmp: Path, *, px: float = 100.0, swap: bool = False, flush_rows: int = 3) -> EventLog:
    log = EventLog(tmp, flush_rows=flush_rows)
    spans = [("kev", "kev:1", 10, 20), ("tick_to_order", "dh-1", 15, 30)]
    for name, ref, a, b in reversed(spans) if swap else spans:
        log.append("latency", (a, b, name, ref, a, b, b - a))
    for i in range(5):
        log.append("order", (i, i, f"dh-{i}", "BTCUSDT", "new", "buy", "limit", px + i, 0.002, ""))
    log.emit(
        Fill,
        ts_event=7,
        ts_recv=8,
        client_oid="dh-1",
        symbol="BTCUSDT",
        side="buy",
        px=px,
        qty=0.002,
        liquidity="maker",
        notional=Decimal("0.2"),
        fee=Decimal("0.00004"),
        position_after=0.002,
    )
    return log


def test_columnar_digest_tracks_every_field_and_order(tmp_path):
    dirs = iter(tmp_path / str(i) for i in range(100))

    def digest(**kw) -> str:
        d = next(dirs)
        d.mkdir()
        log = _log_with(d, **kw)
        before = log.digest  # readable before the end, with events still buffered
        log.write()
        assert log.digest == before
        return before

    base = digest()
    assert digest() == base
    assert digest(flush_rows=1) == base == digest(flush_rows=1000)  # flush points do not matter
    assert digest(px=100.5) != base  # a field
    assert digest(swap=True) != base  # the order within a stream


def test_rows_give_the_same_files_as_events(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = EventLog(tmp_path / "a", flush_rows=2), EventLog(tmp_path / "b", flush_rows=2)
    for i in range(5):
        fields = dict(
            ts_event=i, ts_recv=i + 1, name="kev", ref=f"kev:{i}", start_ns=i, end_ns=i + 1, dur_ns=1
        )
        a.emit(LatencySpan, **fields)
        b.append("latency", tuple(fields.values()))
        a.emit(
            OrderEvent,
            ts_event=i,
            ts_recv=i,
            client_oid="x",
            symbol="BTCUSDT",
            kind="new",
            side="sell",
            order_type="market",
            px=float("nan"),
            qty=0.1,
            reason="",
        )
        b.append("order", (i, i, "x", "BTCUSDT", "new", "sell", "market", float("nan"), 0.1, ""))
    assert a.digest == b.digest and a.counts() == b.counts()
    assert a.write() == b.write()
    mem = EventLog()
    mem.append("latency", (1, 2, "kev", "r", 1, 2, 1))
    assert mem.events("latency") == [
        LatencySpan(ts_event=1, ts_recv=2, seq=0, name="kev", ref="r", start_ns=1, end_ns=2, dur_ns=1)
    ]


def test_run_before_runs_earlier_timers_in_order():
    clock = ReplayClock(0)
    seen: list[str] = []
    for ts, prio, name in [(10, 62, "report"), (10, 40, "label"), (5, 52, "kev"), (10, 40, "label2")]:
        clock.schedule(ts, prio, lambda n=name: seen.append(n))
    clock.run_before(10, 40)  # market data at (10, 40) comes after (5, 52), before both labels
    assert seen == ["kev"] and clock.now_ns() == 10
    clock.run_before(10, 61)
    assert seen == ["kev", "label", "label2"]
    clock.schedule(12, 40, lambda: clock.schedule(12, 41, lambda: seen.append("chained")))
    clock.run_all()
    assert seen[-2:] == ["report", "chained"] and clock.pending == 0 and clock.now_ns() == 12


def test_loss_stop_regime_keeps_rejecting_the_same_way(session, tmp_path):
    """The cached position/PnL in the risk state follow fills: a tight loss stop trips mid-run."""
    cfg = ReplayConfig(seed=7, fill_model="queue_power3")
    cfg = replace(cfg, risk=replace(cfg.risk, daily_loss_stop_usd=0.5, max_orders_per_s=3))
    run = run_replay(session, cfg, out_dir=tmp_path / "r")
    risk = pq.read_table(run.run_dir / "events" / "risk.parquet").to_pylist()
    reasons = {r["reason"] for r in risk}
    assert "loss_stop" in reasons and "ok" in reasons


def test_skipped_trades_change_nothing(session, tmp_path, monkeypatch):
    """Trades reach the exchange only while an order rests (a trade can fill nothing else):
    delivering every trade to the exchange, as the engine driven per event can, gives the same run."""
    from venue.exchange import SimExchange

    cfg = ReplayConfig(seed=8, fill_model="queue_power2")
    skipped = run_replay(session, cfg, out_dir=tmp_path / "a")
    monkeypatch.setattr(SimExchange, "resting", property(lambda self: True))
    delivered = run_replay(session, cfg, out_dir=tmp_path / "b", kernel=False)
    assert skipped.counts["fill"] > 0
    assert _files(skipped) == _files(delivered)


def test_compiled_price_rounding_equals_the_python_expression():
    from engine.contract import ContractConfig

    rng = np.random.default_rng(0)
    for tick in (0.1, 0.01, 0.5):
        c = ContractConfig(tick=tick)
        for px in [0.0, -0.0, *(rng.uniform(1, 100_000, 300).round(rng.integers(0, 6)).tolist())] * 2:
            got, want = c.round_px(px), round(round(px / tick) * tick, 10)
            assert got == want and str(got) == str(want)


def test_one_type_makes_a_tuple_the_portfolio_loop_can_index_by_instrument():
    """One instrument's column read-only (from Arrow as it is), another's writable (a copy): numba
    cannot index such a tuple at run time, so they become read-only views of one type."""
    from numba import njit

    from replay.fast_path import one_type

    ro = np.arange(3.0)
    ro.flags.writeable = False
    rw = np.arange(3.0) + 10

    @njit
    def pick(t, j):
        return t[j][1]

    got = one_type([ro, rw])
    assert [pick(got, j) for j in (0, 1)] == [1.0, 11.0]
    assert rw.flags.writeable  # the caller's arrays are left as they were
    same = [np.zeros(2), np.ones(2)]
    assert all(a is b for a, b in zip(one_type(same), same, strict=True))  # one type already: as they are
