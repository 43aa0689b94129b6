"""The compiled replay kernel gives the Python engine's events exactly: the same Parquet files, byte for
byte, the same manifest and digest, over fill models, Kev queue policies, timeouts, latencies and the
loss stop. It is the one way a replay runs: what it cannot take is refused before the run in one line,
and what only shows mid-run stops the run, its directory removed."""

import statistics
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import numpy as np
import orjson
import pytest

import replay.fast_path as fast_path
from engine.contract import ContractConfig
from engine.errors import DualhubError
from engine.eventlog import OUTPUT_STREAMS
from engine.jit import njit
from engine.risk import RiskLimits
from replay import kernel as K
from replay.config import ReplayConfig
from replay.driver import run_replay
from replay.fast_path import LookAheadError
from venue.simulator import simulate_session


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=2.0, seed=31)


def _same(session: Path, cfg: ReplayConfig, tmp: Path, name: str, per_event: bool = False) -> tuple:
    """Run ``cfg`` on the Python engine and on the kernel; assert identical output; return both.
    ``per_event``: the Python engine labels each book as it arrives and schedules the label itself
    (no Laya latencies drawn ahead, no labels delivered by the walk)."""
    with pytest.MonkeyPatch.context() as m:
        if per_event:
            import replay.driver as driver

            m.setattr(driver, "_label_due", lambda tape, model: None)
        py = run_replay(session, cfg, out_dir=tmp / f"{name}-py", kernel=False)
    kn = run_replay(session, cfg, out_dir=tmp / f"{name}-k")
    assert kn.path.startswith("kernel"), kn.path
    assert py.path.startswith("python")
    assert kn.digest == py.digest
    assert kn.counts == py.counts
    for s in OUTPUT_STREAMS:
        a = (py.run_dir / "events" / f"{s}.parquet").read_bytes()
        b = (kn.run_dir / "events" / f"{s}.parquet").read_bytes()
        assert a == b, f"{s}.parquet differs"
    assert (py.run_dir / "manifest.json").read_bytes() == (kn.run_dir / "manifest.json").read_bytes()
    assert orjson.loads((kn.run_dir / "runtime.json").read_bytes())["engine_path"] == kn.path
    return py, kn


@pytest.mark.parametrize("x", [0.0, -0.0, 0.5, 1.5, 2.5, -2.5, 2.675, 0.125, 1e-7, 37000.15, 1e15, -1e-300])
@pytest.mark.parametrize("nd", [0, 2, 6, 10, 12])
def test_pyround_is_cpythons_round(x, nd):
    got = K.pyround(x, nd)
    want = round(x, nd)
    assert got == want and np.copysign(1.0, got) == np.copysign(1.0, want), (x, nd, got, want)


def test_pyround_matches_on_random_values_and_ties():
    rng = np.random.default_rng(5)
    xs = np.concatenate(
        [
            rng.uniform(-1e5, 1e5, 20_000),
            rng.uniform(0, 1, 20_000),
            np.round(rng.uniform(0, 5e4, 20_000) / 0.05) * 0.05,  # prices a tick apart, mids
            (rng.integers(0, 10**6, 20_000) + 0.5) / 10**6,  # decimal ties, inexact in binary
        ]
    )
    for nd in (2, 6, 10, 12):
        for x in xs.tolist():
            if abs(x) * 10.0**nd < 2.0**52:
                assert K.pyround(x, nd) == round(x, nd), (x, nd)


def test_default_run_is_identical(session, tmp_path):
    py, kn = _same(session, ReplayConfig(seed=3), tmp_path, "default")
    assert py.counts["order"] > 100 and py.counts["kev_response"] > 10


@pytest.mark.parametrize("fill_model", sorted(fast_path.FILL_MODEL_CODES))
def test_every_fill_model_is_identical(session, tmp_path, fill_model):
    cfg = ReplayConfig(seed=4, fill_model=fill_model, risk=RiskLimits(daily_loss_stop_usd=1e9))
    py, _ = _same(session, cfg, tmp_path, fill_model)
    assert py.counts["fill"] > 0


SLOW_KEV = {"kev_lag_p5_ms": 1500.0, "kev_lag_p95_ms": 3000.0, "kev_timeout_ms": 5000}


@pytest.mark.parametrize(
    "change, expect",
    [
        ({**SLOW_KEV, "kev_queue_policy": "fifo", "kev_queue_max": 1}, ("kev_queue", "dropped_overflow")),
        ({**SLOW_KEV, "kev_queue_policy": "drop_oldest"}, ("kev_queue", "dropped_overflow")),
        ({**SLOW_KEV, "kev_queue_policy": "conflate"}, ("kev_queue", "dropped_conflated")),
        ({**SLOW_KEV, "kev_stale_after_ms": 300}, ("kev_queue", "dropped_stale")),
        ({"kev_max_in_flight": 3, "kev_timeout_ms": 260}, ("kev_queue", "late_reply")),
        ({"kev_min_interval_ms": 500, "kev_advice_ttl_ms": 800}, ("order", "new")),
        (
            {"exchange_feed": "local", "latency_order_entry": "const:0ns", "latency_cancel": "const:1ms"},
            ("order", "cancel_ack"),
        ),
        ({"scale_order": 0.5, "scale_kev": 2.0, "latency_order_response": "const:3ms"}, ("order", "ack")),
        ({"latency_laya": "lognormal:p5=100us,p95=20ms"}, ("order", "ack")),
        ({"latency_feed": "lognormal:p5=1ms,p95=20ms"}, ("order", "ack")),
    ],
)
def test_engine_settings_are_identical(session, tmp_path, change, expect):
    # (features v1: tests/engine/laya/test_research.py compares a v1 batch replay, the kernel's, with a
    # tick one)
    cfg = replace(ReplayConfig(seed=6, risk=RiskLimits(daily_loss_stop_usd=1e9)), **change)
    py, _ = _same(session, cfg, tmp_path, "x")
    stream, kind = expect
    assert kind in set(_column(py.run_dir, stream, "kind"))  # the branch was taken, not just agreed on


def test_a_kev_queue_longer_than_the_kernels_first_table_stays_on_the_kernel(session, tmp_path):
    cfg = ReplayConfig(
        seed=6,
        risk=RiskLimits(daily_loss_stop_usd=1e9),
        kev_queue_policy="fifo",
        kev_queue_max=K.KQ_CAP + 8,
        kev_stale_after_ms=600_000,
        kev_lag_p5_ms=8000.0,
        kev_lag_p95_ms=12000.0,
        kev_timeout_ms=30_000,
    )
    py, _ = _same(session, cfg, tmp_path, "tables")
    assert max(_column(py.run_dir, "kev_queue", "depth")) > K.KQ_CAP


def _drawn_latencies(tmp: Path, kind: str) -> dict:
    """Entry, response and cancel latencies, each a model drawn from its own stream."""
    if kind == "lognormal":
        return {
            "latency_order_entry": "lognormal:p5=1ms,p95=30ms",
            "latency_order_response": "lognormal:p5=500us,p95=12ms",
            "latency_cancel": "lognormal:p5=2ms,p95=40ms",
            "scale_order": 1.5,
        }
    specs = {}
    for name, lo, hi in (("entry", 1, 30), ("response", 0.5, 12), ("cancel", 2, 40)):
        path = tmp / f"{name}.json"
        path.write_bytes(orjson.dumps(np.geomspace(lo * 1e6, hi * 1e6, 23).tolist()))
        specs[name] = f"empirical:{path}"
    if kind == "mixed":
        return {
            "latency_order_entry": specs["entry"],
            "latency_order_response": "lognormal:p5=500us,p95=12ms",
            "latency_cancel": specs["cancel"],
        }
    return {
        "latency_order_entry": specs["entry"],
        "latency_order_response": specs["response"],
        "latency_cancel": specs["cancel"],
    }


@pytest.mark.parametrize("kind", ["lognormal", "empirical", "mixed"])
def test_drawn_order_latencies_are_identical(session, tmp_path, kind):
    """Order entry, response and cancel latencies that vary, drawn ahead by the kernel: the Python
    engine's run, which draws each when SimExchange asks."""
    cfg = ReplayConfig(seed=9, risk=RiskLimits(daily_loss_stop_usd=1e9), **_drawn_latencies(tmp_path, kind))
    py, _ = _same(session, cfg, tmp_path, kind)
    kinds = set(_column(py.run_dir, "order", "kind"))
    assert {"ack", "cancel_ack", "done"} <= kinds and py.counts["fill"] > 0
    names, durs = _column(py.run_dir, "latency", "name"), _column(py.run_dir, "latency", "dur_ns")
    entry = [d for n, d in zip(names, durs, strict=True) if n == "order_entry"]
    assert len(set(entry)) > len(entry) // 2  # the latencies really vary


def test_stopping_for_order_latencies_at_every_step_changes_nothing(session, tmp_path, monkeypatch):
    """Order latencies drawn a handful at a time: the kernel stops to refill after nearly every draw,
    and the run is still the Python engine's."""
    monkeypatch.setattr(fast_path, "LATENCY_BATCH", K.MARGIN + 2)
    refills = []
    more = fast_path.KernelRun._more_latencies

    def count(self):
        refills.append([int(u) for u in self.S[K.S_OLAT_USED : K.S_OLAT_USED + 3]])
        more(self)

    monkeypatch.setattr(fast_path.KernelRun, "_more_latencies", count)
    latencies = _drawn_latencies(tmp_path, "mixed")
    cfg = ReplayConfig(seed=5, risk=RiskLimits(daily_loss_stop_usd=1e9), **latencies)
    py, _ = _same(session, cfg, tmp_path, "refill")
    # one draw per new order, cancel and report (every other order event, and each fill)
    draws = py.counts["order"] + py.counts["fill"]
    assert 10 * len(refills) > draws  # a refill every few draws
    assert all(max(used) >= 3 for used in refills[1:])  # each refill came when a model ran short


def test_order_latencies_sharing_a_stream_are_refused(session, tmp_path, monkeypatch):
    """Models that draw from one generator interleave their draws: they cannot be drawn ahead, and the
    run is refused before it starts (the replay gives each model its own stream: only a bug shares one)."""
    import replay.driver as driver

    real, shared = driver._rng, np.random.default_rng([9, 4])
    monkeypatch.setattr(driver, "_rng", lambda seed, c: shared if c in (4, 5, 6) else real(seed, c))
    cfg = ReplayConfig(seed=9, **_drawn_latencies(tmp_path, "lognormal"))
    with pytest.raises(
        DualhubError, match="order response latency draws from another order latency's random"
    ):
        run_replay(session, cfg, out_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


ORDER_KINDS = {
    "order entry": "order_entry",
    "latency_order_response": "order_response",
    "latency_cancel": "cancel",
}


def _recording_models(monkeypatch, sink) -> None:
    """Make the driver's order latency models record every draw into ``sink``, as live mode's do."""
    import replay.driver as driver
    from engine.latency.recorded import RecordingLatency

    real = driver._checked_latency

    def checked(spec, rng, name):
        m = real(spec, rng, name)
        return RecordingLatency(m, ORDER_KINDS[name], sink) if name in ORDER_KINDS else m

    monkeypatch.setattr(driver, "_checked_latency", checked)


@pytest.mark.parametrize("scale", [1.0, 1.5])
def test_recorded_order_latencies_are_identical(session, tmp_path, monkeypatch, scale):
    """Recorded order entry, response and cancel latencies, looked up by the time of each draw: the
    per-event engine's run, hits, fallbacks (keys never recorded or used up) and all. Replayed from a
    run that recorded them, unscaled, they give that run's events back."""
    from engine.latency.recorded import LatencySink

    base = ReplayConfig(
        seed=9, risk=RiskLimits(daily_loss_stop_usd=1e9), **_drawn_latencies(tmp_path, "lognormal")
    )
    base = replace(base, scale_order=1.0)
    sink = LatencySink()
    with pytest.MonkeyPatch.context() as m:
        _recording_models(m, sink)
        src = run_replay(session, base, out_dir=tmp_path / "src", kernel=False)
    assert {"order_entry", "order_response", "cancel"} == set(sink.kind)
    full, part = tmp_path / "full", tmp_path / "part"
    for d in (full, part):
        d.mkdir()
    sink.write(full)
    thinned = LatencySink()  # every seventh draw missing, every eleventh recorded twice
    for i, (k, t, d) in enumerate(zip(sink.kind, sink.ts, sink.dur, strict=True)):
        if i % 7:
            thinned.add(k, t, d)
        if i % 11 == 3:
            thinned.add(k, t, d + 1_000)
    thinned.write(part)
    specs = lambda run: {  # noqa: E731
        "latency_order_entry": f"recorded:order_entry@{run}",
        "latency_order_response": f"recorded:order_response@{run}",
        "latency_cancel": f"recorded:cancel@{run}",
        "scale_order": scale,
    }
    py, kn = _same(session, replace(base, **specs(full)), tmp_path, "full")
    if scale == 1.0:  # the recorded run again, event for event
        for s in OUTPUT_STREAMS:
            assert _column(py.run_dir, s, "ts_recv") == _column(src.run_dir, s, "ts_recv"), s
        assert py.digest == src.digest
    from venue.exchange import SimExchange

    runs, exchanges = [], []
    real_init, real_exchange = fast_path.KernelRun.__init__, SimExchange.__init__
    monkeypatch.setattr(
        fast_path.KernelRun, "__init__", lambda self, *a, **k: runs.append(self) or real_init(self, *a, **k)
    )
    monkeypatch.setattr(
        SimExchange, "__init__", lambda self, *a, **k: exchanges.append(self) or real_exchange(self, *a, **k)
    )
    py, kn = _same(session, replace(base, **specs(part)), tmp_path, "part")
    assert py.counts["order"] > 100
    x = exchanges[0]  # the Python run's: its recorded models count their fallbacks
    models = (x.entry_latency, x.response_latency, x.cancel_latency)
    py_misses = [getattr(m, "inner", m).misses for m in models]
    (run,) = [r for r in runs if r.olat_models is not None]  # the compiled loop's (the other: per event)
    kn_misses = [int(run.olat[k, K.KEY_MISSES]) for k in (K.OLAT_ENTRY, K.OLAT_RESPONSE, K.OLAT_CANCEL)]
    assert kn_misses == py_misses and min(py_misses) > 0


def test_risk_limits_and_quotes_are_identical(session, tmp_path):
    risk = RiskLimits(
        max_position=0.006,
        max_order_qty=0.004,
        max_orders_per_s=3,
        price_band_bps=2.0,
        max_slippage_bps=0.005,  # below half a spread: market orders are refused
        daily_loss_stop_usd=1e9,
    )
    cfg = ReplayConfig(seed=8, risk=risk)
    cfg = replace(cfg, quotes=replace(cfg.quotes, requote_min_ns=20_000_000, offset_ticks=0, quote_qty=0.003))
    py, _ = _same(session, cfg, tmp_path, "limits")
    reasons = {r for r in _column(py.run_dir, "risk", "reason")}
    assert {"max_position", "order_rate", "max_slippage"} <= reasons


def test_loss_stop_and_fees_are_identical(session, tmp_path):
    contract = ContractConfig(maker_fee_rate=Decimal("0.00013"), taker_fee_rate=Decimal("0.00075"))
    cfg = ReplayConfig(seed=2, contract=contract, risk=RiskLimits(daily_loss_stop_usd=0.05))
    py, _ = _same(session, cfg, tmp_path, "loss")
    assert "loss_stop" in set(_column(py.run_dir, "risk", "reason"))


def test_a_rule_command_the_schema_refuses_is_refused_on_the_kernel_too(session, tmp_path):
    # A position limit beyond the command's own bound (10 units): the rule leans past it, the schema
    # refuses the command, and the engine goes on without it, on either path.
    risk = RiskLimits(max_position=40.0, max_order_qty=40.0, daily_loss_stop_usd=1e9)
    cfg = ReplayConfig(seed=4, risk=risk)
    py, _ = _same(session, cfg, tmp_path, "schema")
    failures = _column(py.run_dir, "kev_response", "failure")
    assert "schema" in failures and "" in failures
    errors = {e for e in _column(py.run_dir, "kev_response", "error") if e}
    assert any(e.startswith("target_position ") and e.endswith("outside [-10.0, 10.0]") for e in errors)


def _column(run_dir: Path, stream: str, name: str) -> list:
    import pyarrow.parquet as pq

    return pq.read_table(run_dir / "events" / f"{stream}.parquet", columns=[name]).column(0).to_pylist()


def test_stopping_and_resuming_changes_nothing(session, tmp_path, monkeypatch):
    """Tiny buffers and tables: the kernel stops for room, growth and Kev lags all the time."""
    cfg = ReplayConfig(seed=5, risk=RiskLimits(daily_loss_stop_usd=1e9))
    whole = run_replay(session, cfg, out_dir=tmp_path / "whole")
    monkeypatch.setattr(fast_path, "OUT_CAP", K.MARGIN + 40)
    monkeypatch.setattr(fast_path, "WALK_CHUNK", 1000)
    monkeypatch.setattr(fast_path, "INITIAL_ROWS", K.MARGIN + 8)
    monkeypatch.setattr(fast_path, "LAG_BATCH", 3)
    handle, grown, worked = fast_path.KernelRun.handle, [], []

    def handle_and_grow(self, status):  # the order ring and the working list also double mid-run
        if len(grown) < 3 and int(self.S[K.S_OID]) > 200 * (len(grown) + 1):
            self._grow_orders()
            grown.append(self.OI.shape[0])
        if len(worked) < 3 and int(self.S[K.S_NWORK]) >= 2:
            self._grow_work()
            worked.append(self.work.shape[0])
        return handle(self, status)

    monkeypatch.setattr(fast_path.KernelRun, "handle", handle_and_grow)
    small = run_replay(session, cfg, out_dir=tmp_path / "small")
    assert grown == [1024, 2048, 4096] and worked == [6 * K.WORK_CAP, 12 * K.WORK_CAP, 24 * K.WORK_CAP]
    assert small.path.startswith("kernel") and small.digest == whole.digest
    for s in OUTPUT_STREAMS:
        a = (whole.run_dir / "events" / f"{s}.parquet").read_bytes()
        assert a == (small.run_dir / "events" / f"{s}.parquet").read_bytes(), s


@pytest.mark.parametrize("kev", ["fast", "slow", "slow_fifo"])
def test_the_kev_request_ring_reuses_the_rows_of_finished_requests(tmp_path, monkeypatch, kev):
    """A model that labels most books non-HOLD offers Kev ~every book, so the requests wrap a
    512-row ring several times and the rows of finished ones are reused. With a Kev that answers
    after ~150 s, a queued or in-flight request outlives 512 newer ones, and the ring must grow
    around it instead. Either way the run is the Python engine's."""
    from tests.engine.laya.test_laya import _linear_onnx

    model = _linear_onnx(tmp_path / "busy.onnx")
    s = simulate_session(tmp_path / "s", minutes=5.0, seed=14)
    monkeypatch.setattr(fast_path, "INITIAL_ROWS", K.MARGIN + 8)  # rings of 512 rows
    rings = []
    ring_requests = fast_path.KernelRun._ring_requests

    def note_ring(self):
        ring_requests(self)
        rings.append((int(self.S[K.S_RID_OLDEST]), int(self.S[K.S_RID]), self.RI.shape[0]))

    monkeypatch.setattr(fast_path.KernelRun, "_ring_requests", note_ring)
    cfg = ReplayConfig(seed=4, model_path=str(model))
    if kev != "fast":
        cfg = replace(
            cfg,
            kev_lag_p5_ms=150_000.0,
            kev_lag_p95_ms=160_000.0,
            kev_timeout_ms=400_000,
            kev_stale_after_ms=10**9,
            kev_queue_policy="fifo" if kev == "slow_fifo" else "drop_oldest",
        )
    _same(s, cfg, tmp_path, "ring")
    assert rings and rings[-1][1] > 3 * 512, rings[-3:]
    if kev == "fast":  # finished requests' rows reused: the ring never grew
        assert all(rows == 512 for _, _, rows in rings) and rings[-1][0] > 512
    elif kev == "slow":  # grew around the one in flight, whose successors then freed rows again
        assert rings[-1][2] > 512 and rings[-1][0] > 512
    else:  # the FIFO queue holds an early request to the end: the ring grows around it
        assert rings[-1][2] > 512 and rings[-1][0] < 4


def test_what_the_loop_cannot_take_is_refused_in_one_line(session, tmp_path, capsys):
    from dualhub.cli import main
    from engine.latency.models import LognormalLatency
    from engine.latency.recorded import LatencySink

    sink = LatencySink()
    sink.add("cancel", 0, -1)  # the kernel cannot tell whether a negative duration will be drawn
    sink.add("cancel", 0, 3_000_000)
    sink.add("cancel", 0, 3_000_000)
    sink.write(tmp_path)
    out = tmp_path / "n"
    params = orjson.dumps({"latency_cancel": f"recorded:cancel@{tmp_path}"}).decode()
    rc = main(["replay", str(session), "--params", params, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert err.strip().splitlines() == [
        "dualhub replay: error: the recorded cancel latencies hold a delay below zero"
        " (the clock cannot go back)"
    ]

    class Custom(LognormalLatency):  # a model of its own: its draws cannot be taken ahead in a batch
        pass

    with pytest.MonkeyPatch.context() as m:
        import replay.driver as driver

        real = driver._checked_latency
        m.setattr(
            driver,
            "_checked_latency",
            lambda spec, rng, name: (
                Custom(p5_ms=1, p95_ms=5, rng=rng) if name == "latency_cancel" else real(spec, rng, name)
            ),
        )
        with pytest.raises(DualhubError, match="the cancel latency model Custom cannot be drawn ahead"):
            run_replay(session, ReplayConfig(seed=3), out_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists()
    from engine.kev.cassette import Cassette

    Cassette().write(tmp_path / "empty.parquet")
    cfg = ReplayConfig(seed=3, kev_mode="cassette", kev_cassette=str(tmp_path / "empty.parquet"))
    r = run_replay(session, cfg, out_dir=tmp_path / "b")
    assert r.path.startswith("kernel")  # Kev answered from Python through the loop's stops


def _recorded_laya(session: Path, tmp: Path) -> tuple[str, set[int]]:
    """A live run's recorded Laya latencies for this session's books, in the order they arrived: most
    books once, every tenth not at all (the recorded median stands in), a few keyed twice (only the
    first is used). Returns the spec and the durations a replay may draw."""
    import pyarrow.compute as pc

    from engine.latency.recorded import LatencySink
    from engine.store import open_session

    recv = np.sort(pc.cast(open_session(session).read_table("books15").column("ts_recv"), "int64").to_numpy())
    durs = np.random.default_rng(8).integers(50_000, 30_000_000, len(recv)).tolist()
    sink = LatencySink()
    for i, (t, d) in enumerate(zip(recv.tolist(), durs, strict=True)):
        if i % 10:
            sink.add("laya", t, d)
        if i % 97 == 1:
            sink.add("laya", t, d + 1)
    recorded = list(sink.dur)
    sink.add("cancel", 0, 1)  # another kind in the same file is not a Laya latency
    run = tmp / "live"
    run.mkdir()
    sink.write(run)
    return f"recorded:laya@{run}", {*recorded, int(statistics.median(recorded))}


@pytest.mark.parametrize("mode, recorded", [("tick", False), ("tick", True), ("batch", True)])
def test_tick_labels_and_recorded_laya_latencies_are_identical(
    session, tmp_path, monkeypatch, mode, recorded
):
    """The kernel labels every book the tick way, a block at a time as the levels stream (each row on
    its own through Laya's tick path), and draws recorded Laya latencies by key in the order the engine
    receives the books: the events of the per-event engine, which labels each book as it arrives and
    schedules its label on the clock."""
    from engine.laya.model import Laya

    cfg = ReplayConfig(seed=5, laya_mode=mode, risk=RiskLimits(daily_loss_stop_usd=1e9))
    if recorded:
        spec, durations = _recorded_laya(session, tmp_path)
        cfg = replace(cfg, latency_laya=spec)
    each: list[int] = []
    real = Laya.predict_each
    monkeypatch.setattr(Laya, "predict_each", lambda self, X: each.append(len(X)) or real(self, X))
    py, kn = _same(session, cfg, tmp_path, "x", per_event=True)
    # the kernel's run labelled every book per tick, streamed; the per-event engine labels as it goes
    assert sum(each) == (kn.books if mode == "tick" else 0)
    assert "books" in kn.path and "streamed" in kn.path
    assert py.counts["label"] > 0 and py.counts["order"] > 0
    delay = np.array(_column(py.run_dir, "label", "ts_recv")) - np.array(
        _column(py.run_dir, "label", "book_ts_recv")
    )
    if recorded:
        assert set(delay.tolist()) <= durations and len(set(delay.tolist())) > 100
    batch = run_replay(session, replace(cfg, laya_mode="batch"), out_dir=tmp_path / "batch")
    assert batch.path.startswith("kernel") and batch.digest == kn.digest  # tick and batch labels agree


def test_features_v1_per_tick_are_identical(session, tmp_path):
    from engine.laya.labels import LabelConfig
    from replay.train_cli import train

    model = tmp_path / "v1.onnx"
    train([session], model, features="v1", labels=LabelConfig(lean_bps=1.0, emergency_bps=3.0), folds=2)
    cfg = ReplayConfig(seed=4, model_path=model, laya_features="v1", laya_mode="tick", scale_feed=3.0)
    py, kn = _same(session, cfg, tmp_path, "v1", per_event=True)
    assert len(set(_column(py.run_dir, "label", "label"))) > 1
    batch = run_replay(session, replace(cfg, laya_mode="batch"), out_dir=tmp_path / "batch")
    assert batch.path.startswith("kernel") and batch.digest == kn.digest


def test_a_fitted_kev_lag_is_identical(session, tmp_path, monkeypatch):
    """``dualhub kev fit-lag``'s measured lag, drawn in batches on the kernel (a few at a time here,
    so most requests wait for a refill), one per request on the engine."""
    from replay.kev_cli import fit_runs

    base = run_replay(session, ReplayConfig(seed=3), out_dir=tmp_path / "base")
    lag_json = tmp_path / "lag.json"
    lag_json.write_bytes(orjson.dumps(fit_runs([base.run_dir], allow_modelled=True)))
    monkeypatch.setattr(fast_path, "LAG_BATCH", 3)
    cfg = ReplayConfig(
        seed=8, kev_lag_fit=str(lag_json), scale_kev=1.5, risk=RiskLimits(daily_loss_stop_usd=1e9)
    )
    py, kn = _same(session, cfg, tmp_path, "fit")
    assert "empirical lag.json x1.5" in (py.run_dir / "manifest.json").read_text()
    lags = _column(py.run_dir, "kev_response", "lag_ns")
    assert len(lags) > 10 and lags != _column(base.run_dir, "kev_response", "lag_ns")


def test_a_kernel_that_cannot_go_on_mid_run_leaves_no_run(session, tmp_path, monkeypatch):
    """Something only seen mid-run (here: a full table, forced after rows were written) stops the run
    with one line, as live's engine stops; nothing of the partial run is left."""
    cfg = ReplayConfig(seed=7)
    calls = {"n": 0}
    handle = fast_path.KernelRun.handle

    def give_up_on_the_third(self, status):
        calls["n"] += 1
        if calls["n"] == 3:
            self.S[K.S_WHY] = K.U_TABLE
            status = K.ST_UNSUPPORTED
        return handle(self, status)

    monkeypatch.setattr(fast_path, "OUT_CAP", K.MARGIN + 40)  # stops early, after writing some rows
    monkeypatch.setattr(fast_path.KernelRun, "handle", give_up_on_the_third)
    with pytest.raises(DualhubError, match="the replay cannot go on: more working orders or queued Kev"):
        run_replay(session, cfg, out_dir=tmp_path / "r")
    assert calls["n"] == 3 and not (tmp_path / "r").exists()
    assert not list(tmp_path.glob("*.tmp*"))
    assert not (tmp_path / "r.tmp").exists()


def test_the_kernel_cannot_read_a_label_before_its_book_arrived(session, tmp_path, monkeypatch):
    """A planted walk entry delivers a label earlier than its book's receipt: refused, not read."""
    real = fast_path.run_kernel

    def planted(run, walk, *args, **kw):
        next_chunk, first = walk.next_chunk, [True]

        def plant():
            chunk = next_chunk()
            if chunk is not None and first[0]:
                first[0] = False
                ts, prio, kind, row = chunk
                i = int(np.flatnonzero(kind == 4)[50])
                row[i] = row[i] + 20  # a later book's label, delivered at this label's time
            return chunk

        walk.next_chunk = plant
        return real(run, walk, *args, **kw)

    monkeypatch.setattr(fast_path, "run_kernel", planted)
    with pytest.raises(LookAheadError):
        run_replay(session, ReplayConfig(seed=1), out_dir=tmp_path / "r")


def test_streamed_levels_in_small_blocks_and_row_groups(tmp_path, monkeypatch):
    """Books read a block at a time from many small row groups: the same run as the whole table."""
    import engine.store as store
    import replay.book_source as book_source

    monkeypatch.setattr(store, "ROW_GROUP_ROWS", 37)
    s = simulate_session(tmp_path / "s", minutes=1.0, seed=12)
    import pyarrow.parquet as pq

    parts = sorted((s / "books15").glob("*.parquet"))
    assert sum(pq.ParquetFile(p).metadata.num_row_groups for p in parts) > 8
    monkeypatch.setattr(book_source, "BLOCK", 64)  # labels batched by 64 rows: still bit-identical
    monkeypatch.setattr(fast_path, "WALK_CHUNK", 150)  # walk chunks straddle blocks
    _, kn = _same(s, ReplayConfig(seed=2), tmp_path, "small")
    n_books = kn.books
    assert kn.path == f"kernel (books and tape streamed, {(n_books + 63) // 64} blocks)"


def _small_streams(monkeypatch, chunk: int) -> list:
    """Blocks of 256 books, walk chunks of ``chunk`` entries, no release margin; returns the list the
    streamed tapes made from now on are put in."""
    import replay.book_source as book_source
    import replay.tape_stream as tape_stream

    monkeypatch.setattr(book_source, "BLOCK", 256)
    monkeypatch.setattr(fast_path, "WALK_CHUNK", chunk)
    monkeypatch.setattr(tape_stream, "RELEASE_MARGIN", 0)
    tapes = []
    init = tape_stream.StreamedTape.__init__

    def keep(self, *a, **kw):
        init(self, *a, **kw)
        tapes.append(self)

    monkeypatch.setattr(tape_stream.StreamedTape, "__init__", keep)
    return tapes


def test_the_streamed_tape_hands_back_rows_behind_the_walk(tmp_path, monkeypatch):
    """Per-row columns filled a row group ahead and released with no margin behind every reader: a
    reader counted wrong would read a handed-back zero and change the run. The same run, and pages
    were really handed back."""
    import engine.store as store
    import replay.tape_stream as tape_stream

    monkeypatch.setattr(store, "ROW_GROUP_ROWS", 300)
    sim = store.open_session(simulate_session(tmp_path / "sim", minutes=6.0, seed=21))
    # several parts of uneven sizes, so blocks and row groups straddle files
    s = tmp_path / "s"
    w = store.SessionWriter(s, source="test", symbols=["BTCUSDT"])
    for stream, cuts in (("books15", (0, 1000, 1777)), ("trade", (0, 2500))):
        t = sim.read_table(stream)
        for a, b in zip(cuts, (*cuts[1:], t.num_rows), strict=True):
            w.add_table(stream, t.slice(a, b - a))
    w.close()
    assert len(list((s / "books15").glob("part-*.parquet"))) == 3
    tapes = _small_streams(monkeypatch, 700)
    for name, cfg in [
        ("quotes", ReplayConfig(seed=3)),
        ("trading", ReplayConfig(seed=3, risk=RiskLimits(daily_loss_stop_usd=1e12), fill_model="touch")),
    ]:
        _, kn = _same(s, cfg, tmp_path, name)
        assert kn.path.startswith("kernel (books and tape streamed"), kn.path
        tape = tapes[-1]
        assert tape.b_filled == tape.n_books and tape.t_filled == tape.n_trades > 0
        page_rows = tape_stream._PAGE // 8
        # every int64 column of both kinds gave back all but the last few pages' worth of rows
        for v in tape._book_maps[:6]:
            assert v._released // 8 > tape.n_books - 3 * fast_path.WALK_CHUNK - page_rows, v._released
        for v in tape._trade_maps:
            assert v._released > 0


def test_arrivals_and_labels_a_drawn_latency_moves_stream_in_order(tmp_path, monkeypatch):
    """A modelled or scaled feed latency moves arrivals, a drawn Laya latency labels: the streamed tape
    puts them in order as it fills, in small row groups, blocks and walk chunks, with no margin behind
    the readers. The same bytes as the Python engine, and rows and lists were handed back behind."""
    import engine.store as store
    import replay.driver as driver
    from engine.eventlog import EventLog

    class SmallLog(EventLog):  # labels go to the log (and stop holding their rows) every 256
        def __init__(self, events_dir=None, *, flush_rows=256):
            super().__init__(events_dir, flush_rows=flush_rows)

    monkeypatch.setattr(driver, "EventLog", SmallLog)
    monkeypatch.setattr(store, "ROW_GROUP_ROWS", 300)
    s = simulate_session(tmp_path / "s", minutes=10.0, seed=23)
    tapes = _small_streams(monkeypatch, 500)
    trading = {"risk": RiskLimits(daily_loss_stop_usd=1e12), "fill_model": "touch"}
    for name, cfg in [
        ("feed", ReplayConfig(seed=3, latency_feed="lognormal:p5=1ms,p95=900ms", **trading)),
        ("laya", ReplayConfig(seed=4, latency_laya="lognormal:p5=50us,p95=600ms", **trading)),
        ("both", ReplayConfig(seed=5, scale_feed=0.5, latency_laya="lognormal:p5=1ms,p95=90ms")),
    ]:
        _, kn = _same(s, cfg, tmp_path, name)
        assert kn.path.startswith("kernel (books and tape streamed"), kn.path
        tape = tapes[-1]
        assert tape.b_filled == tape.n_books and tape._labels.done == tape.n_books > 3000
        assert (tape._arrivals is None) == (name == "laya")
        assert (tape._labels is tape._arrivals) == (name == "feed")
        for v in tape._book_maps[:6]:  # the int64 columns, by row
            assert v._released // 8 > tape.n_books // 2, (name, v._released)
        assert tape._labels._perm._released // 8 > tape.n_books // 2


def test_virtual_rows_read_zero_once_handed_back():
    from replay.tape_stream import _PAGE, VirtualRows

    v = VirtualRows(10 * _PAGE // 8, np.int64)
    v.array[:] = 7
    v.release_below(3 * _PAGE // 8 + 5)  # whole pages only: rows of page 3 stay
    assert not v.array[: 3 * _PAGE // 8].any()
    assert (v.array[3 * _PAGE // 8 :] == 7).all()
    p = VirtualRows(100, np.float32, (4,))
    assert p.array.shape == (100, 4) and p.array.dtype == np.float32 and not p.array.any()


def test_rows_out_of_order_in_the_files_start_over_on_the_whole_tape(tmp_path):
    """A book whose recorded arrival is later than the next one's: the streamed tape finds it while
    filling, and the run starts over on the whole-table tape (which sorts), with the same events."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from engine.store import SessionWriter, open_session

    src = open_session(simulate_session(tmp_path / "a", minutes=2.0, seed=8))
    books = src.read_table("books15")
    recv = books.column("ts_recv").to_numpy().copy()
    recv[500] = recv[503] + 1_000  # arrives after the three books behind it
    books = books.set_column(books.schema.get_field_index("ts_recv"), "ts_recv", pa.array(recv))
    assert not pc.all(
        pc.greater_equal(pc.subtract(books.column("ts_recv")[1:], books.column("ts_recv")[:-1]), 0)
    ).as_py()
    w = SessionWriter(tmp_path / "b", source="test", symbols=["BTCUSDT"])
    w.add_table("books15", books)
    w.add_table("trade", src.read_table("trade"))
    w.close()
    _, kn = _same(tmp_path / "b", ReplayConfig(seed=2), tmp_path, "disorder")
    assert "tape whole: books by arrival is not in (ts, seq) order" in kn.path, kn.path


@pytest.mark.parametrize("kernel", [True, False])
def test_book_seqs_that_do_not_rise_are_refused_on_either_path(tmp_path, kernel):
    """A repeated book seq (a broken recording) is a clear error, found mid-way by the streamed tape
    as it reads rows and up front by the whole tape; no run directory is left behind."""
    import pyarrow as pa

    from engine.store import SessionWriter, open_session

    src = open_session(simulate_session(tmp_path / "a", minutes=1.0, seed=8))
    books = src.read_table("books15")
    seq = books.column("seq").to_numpy().copy()
    seq[400] = seq[399]
    books = books.set_column(books.schema.get_field_index("seq"), "seq", pa.array(seq))
    w = SessionWriter(tmp_path / "b", source="test", symbols=["BTCUSDT"])
    w.add_table("books15", books)
    w.add_table("trade", src.read_table("trade"))
    w.close()
    with pytest.raises(ValueError, match="book seqs must be strictly increasing"):
        run_replay(tmp_path / "b", ReplayConfig(seed=2), out_dir=tmp_path / "r", kernel=kernel)
    assert not (tmp_path / "r").exists() and not (tmp_path / "r.tmp").exists()


def test_a_multi_symbol_session_reads_its_symbol(tmp_path, monkeypatch):
    """Two symbols in one session: the kernel streams its symbol's rows out of the shared row groups, the
    same run as the per-event engine on the filtered tables, for either symbol."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import engine.store as store
    import replay.book_source as book_source
    from engine.store import SessionWriter, open_session

    monkeypatch.setattr(store, "ROW_GROUP_ROWS", 150)
    monkeypatch.setattr(book_source, "BLOCK", 64)
    monkeypatch.setattr(fast_path, "WALK_CHUNK", 400)
    a = open_session(simulate_session(tmp_path / "a", minutes=1.0, seed=3))
    b = open_session(simulate_session(tmp_path / "b", minutes=1.0, seed=4, symbol="ETHUSDT"))
    w = SessionWriter(tmp_path / "ab", source="test", symbols=["BTCUSDT", "ETHUSDT"])
    for stream in ("books15", "trade"):
        t = pa.concat_tables([a.read_table(stream), b.read_table(stream)])
        w.add_table(stream, t.sort_by([("ts_recv", "ascending"), ("seq", "ascending")]))
    w.close()
    part = next((tmp_path / "ab" / "books15").glob("*.parquet"))
    assert pq.ParquetFile(part).metadata.num_row_groups > 2
    assert set(pq.read_table(part).slice(0, 150).column("symbol").to_pylist()) == {"BTCUSDT", "ETHUSDT"}
    for symbol, extra in [("BTCUSDT", {}), ("ETHUSDT", {"latency_feed": "lognormal:p5=1ms,p95=50ms"})]:
        cfg = ReplayConfig(seed=2, symbol=symbol, **extra)
        py, kn = _same(tmp_path / "ab", cfg, tmp_path, f"multi-{symbol}")
        assert kn.path.startswith("kernel (books and tape streamed"), kn.path
        assert (
            kn.books
            == open_session(tmp_path / ("a" if symbol == "BTCUSDT" else "b")).read_table("books15").num_rows
        )


@pytest.mark.parametrize("feed", ["recorded", "lognormal:p5=1ms,p95=300ms"])
def test_the_merged_walk_is_the_sorted_walk(session, feed):
    """replay/walk.py's chunked merge gives tape.order()'s entries in its order, ties included."""
    import replay.driver as driver
    from engine.latency.spec import parse_latency
    from engine.store import open_session
    from replay.walk import StreamedWalk

    s = open_session(session)
    rng = np.random.default_rng(1)
    tape = driver._Tape(
        s.read_table("books15"),
        s.read_table("trade"),
        None if feed == "recorded" else parse_latency(feed, rng),
        1.0,
    )
    due = driver._label_due(tape, parse_latency("lognormal:p5=100us,p95=150ms", rng))
    due[::7] = tape.b_loc[::7] + 5  # ties between labels and other entries at one time
    want = tape.order(due)
    walk = StreamedWalk(tape.walk_streams(due), chunk=333)
    got = [[], [], [], []]
    while (chunk := walk.next_chunk()) is not None:
        for acc, part in zip(got, chunk, strict=True):
            acc.append(part.copy())
    assert walk.total == len(want[0])
    for a, b in zip(want, got, strict=True):
        c = np.concatenate(b)
        assert c.dtype == a.dtype and np.array_equal(c, a)
    unsorted = [w for w in walk._perm if len(w)]
    assert unsorted  # the modelled latencies put some stream out of its own order: the merge sorted it


def test_the_cli_says_which_engine_ran(session, tmp_path, capsys):
    from dualhub.cli import main

    assert main(["replay", str(session), "--out", str(tmp_path / "k")]) == 0
    assert "engine: kernel" in capsys.readouterr().out
    assert main(["replay", str(session), "--out", str(tmp_path / "p"), "--python-engine"]) == 0
    out = capsys.readouterr().out
    assert "engine: python (kernel=False)" in out
    k = orjson.loads((tmp_path / "k" / "manifest.json").read_bytes())
    p = orjson.loads((tmp_path / "p" / "manifest.json").read_bytes())
    assert k["digest"] == p["digest"]
    # one engine, whichever drove it: runtime.json names the core and the hash of its sources
    from engine.core import engine_identity

    for run in ("k", "p"):
        runtime = orjson.loads((tmp_path / run / "runtime.json").read_bytes())
        assert {k: runtime[k] for k in ("engine", "engine_sha256")} == engine_identity()
    assert engine_identity()["engine"] == "engine/kernel" and len(engine_identity()["engine_sha256"]) == 64


@pytest.mark.parametrize("stats", [True, False])
def test_one_symbol_reads_statistics_or_the_column(tmp_path, stats):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from replay.book_source import one_symbol

    def part(name, symbols):
        path = tmp_path / f"{name}-{stats}.parquet"
        pq.write_table(
            pa.table({"symbol": symbols, "x": list(range(len(symbols)))}), path, write_statistics=stats
        )
        return path

    one = part("one", ["BTCUSDT"] * 5)
    two = part("two", ["BTCUSDT", "ETHUSDT", "BTCUSDT"])
    empty = part("empty", pa.array([], pa.string()))
    assert one_symbol([one, empty], "BTCUSDT")
    assert not one_symbol([one], "ETHUSDT")
    assert not one_symbol([one, two], "BTCUSDT")
    assert not one_symbol([part("null", ["BTCUSDT", None])], "BTCUSDT")


def test_random_configurations_are_identical(session, tmp_path):
    """Twelve configurations drawn (seeded) from the space the kernel covers: the same bytes each time."""
    rng = np.random.default_rng(2026)
    for k in range(12):
        risk = RiskLimits(
            max_position=float(rng.choice([0.004, 0.01, 0.05])),
            max_order_qty=float(rng.choice([0.002, 0.004, 0.02])),
            max_orders_per_s=int(rng.integers(2, 12)),
            price_band_bps=float(rng.choice([1.0, 5.0, 50.0])),
            max_slippage_bps=float(rng.choice([0.01, 1.0, 5.0])),
            daily_loss_stop_usd=float(rng.choice([0.02, 0.5, 100.0, 1e9])),
            max_advice_age_ns=int(rng.choice([1, 300_000_000, 3_000_000_000])),
        )
        base = ReplayConfig(seed=int(rng.integers(1, 1000)), risk=risk)
        cfg = replace(
            base,
            fill_model=str(rng.choice(sorted(fast_path.FILL_MODEL_CODES))),
            kev_queue_policy=str(rng.choice(["drop_oldest", "fifo", "conflate"])),
            kev_queue_max=int(rng.integers(1, 4)),
            kev_max_in_flight=int(rng.integers(1, 3)),
            kev_timeout_ms=int(rng.choice([150, 400, 2000])),
            kev_stale_after_ms=int(rng.choice([100, 1000])),
            kev_lag_p5_ms=float(rng.choice([50.0, 200.0])),
            kev_lag_p95_ms=float(rng.choice([400.0, 900.0])),
            latency_order_entry=str(rng.choice(["const:0ns", "const:2ms", "const:30ms"])),
            latency_order_response=str(rng.choice(["const:1ms", "const:5ms"])),
            latency_cancel=str(rng.choice(["const:1ms", "const:10ms"])),
            latency_laya=str(rng.choice(["const:200us", "lognormal:p5=50us,p95=5ms"])),
            exchange_feed=str(rng.choice(["event", "local"])),
            quotes=replace(
                base.quotes,
                requote_min_ns=int(rng.choice([50_000_000, 250_000_000])),
                offset_ticks=int(rng.integers(0, 3)),
                rebalance_min_ns=int(rng.choice([200_000_000, 1_000_000_000])),
            ),
        )
        _same(session, cfg, tmp_path, f"r{k}")


def test_the_kernels_codes_name_the_engines_texts():
    from engine.core import LABEL_NAMES
    from engine.kev.command import ACTIONS
    from engine.kev.queue import POLICIES
    from engine.risk import REASONS

    risk_codes = [K.R_OK, K.R_BAD_ORDER, K.R_KILL, K.R_NO_BOOK, K.R_STALE_BOOK, K.R_MAX_QTY, K.R_MAX_POS]
    risk_codes += [K.R_MAX_DELTA, K.R_BAND, K.R_SLIP, K.R_RATE, K.R_LOSS, K.R_STALE_ADVICE]
    risk_codes += [K.R_BAD_BOOK, K.R_REDUCE_ONLY, K.R_PF_DELTA, K.R_PF_GROSS, K.R_PF_LOSS]
    assert [K.REASON_TEXT[c] for c in risk_codes] == list(REASONS)
    assert [LABEL_NAMES[c] for c in (K.L_HOLD, K.L_BUY, K.L_SELL, K.L_EMERGENCY)] == [
        "HOLD",
        "LEAN_BUY",
        "LEAN_SELL",
        "EMERGENCY",
    ]
    assert [ACTIONS[c] for c in (K.A_HOLD, K.A_LEAN_BUY, K.A_LEAN_SELL, K.A_FLATTEN)] == list(ACTIONS)
    policies = (K.POLICY_DROP_OLDEST, K.POLICY_FIFO, K.POLICY_CONFLATE)
    assert [POLICIES[c] for c in policies] == ["drop_oldest", "fifo", "conflate"]


@njit(inline="always")
def _core_sum(core, j, scale, CORES):
    a, b = core
    a[0] += 1
    return (a[0] + b[1]) * scale + j + len(CORES)


_core_sum_of = K.on_core(_core_sum)


@njit
def _sum_over(CORES, walk):
    s = 0.0
    for i in range(walk.shape[0]):
        s = s * 0.5 + _core_sum_of(walk[i], 3.0, CORES)
    return s


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_step_reaches_instrument_js_core_by_constant_or_variable_index(n):
    # a pair takes each core by a constant index (one inlined copy of the step each), a longer
    # portfolio by a variable one: both reach CORES[j], as the plain call does
    def cores():
        return tuple((np.zeros(2, np.int64), np.arange(2.0) + 10 * j) for j in range(n))

    walk = np.array([0, n - 1, 0, n // 2, n - 1], dtype=np.int64)
    want, got = cores(), cores()
    s = 0.0
    for j in walk:
        s = s * 0.5 + _core_sum.py_func(want[j], int(j), 3.0, want)
    assert _sum_over(got, walk) == s
    assert (
        [int(a[0]) for a, _ in got] == [int(a[0]) for a, _ in want] == np.bincount(walk, minlength=n).tolist()
    )
