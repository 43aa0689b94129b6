"""Live tick path: compiled features and pre-labelled books equal the general path bit for bit."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

import engine.book as book_mod
import engine.kernel as K
from engine.book import as_levels
from engine.events import BookSnapshot
from engine.laya.features import features_v0, features_v0_levels
from engine.laya.model import DEFAULT_MODEL, Laya, LayaConfig
from live.tick import TickLaya
from venue.simulator import generate_frames
from wire.bitget.bitget_v2 import StreamCounters, decode, encode_books15
from wire.bitget.bitget_v2_fast import Books15Scanner


@pytest.fixture(scope="module")
def laya() -> Laya:
    return Laya(LayaConfig(model_path=DEFAULT_MODEL, provider="cpu"))


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32)


def _bits64(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint64)


def test_compiled_features_are_bit_identical_to_features_v0():
    sc = Books15Scanner()
    out = np.zeros(128, dtype=np.float32)
    counters = StreamCounters()
    n = 0
    short = [
        encode_books15("X", ts_ms=1, seq=1, bids=[("999.9", "0.001")], asks=[("1000.1", "7")], push_ts_ms=1),
        encode_books15(
            "X", ts_ms=1, seq=2, bids=[("1.5", "3"), ("1.4", "2")], asks=[("1.6", "1")], push_ts_ms=1
        ),
    ]
    for ts, raw in itertools.chain(generate_frames(minutes=2, seed=5), ((0, r) for r in short)):
        if not sc.scan(raw):
            continue
        (book,) = decode(raw, ts, counters)
        features_v0_levels(sc.levels, out)
        assert np.array_equal(_bits(out), _bits(features_v0(book))), raw
        n += 1
    assert n > 500


def test_tick_laya_labels_and_events_equal_the_general_path(laya):
    clock = iter(range(10**6, 10**12, 1000))
    tick = TickLaya(laya, lambda: next(clock))
    c_tick, c_ref = StreamCounters(), StreamCounters()
    books = 0
    for ts, raw in generate_frames(minutes=2, seed=8):
        evs = tick.decode(raw, ts, c_tick)
        assert evs == decode(raw, ts, c_ref)
        for ev in evs:
            if isinstance(ev, BookSnapshot):
                # the scan's levels, handed to as_levels: what the tuples would make, bit for bit
                assert book_mod._last[0] is ev  # remembered by the decode, not built by as_levels
                made = np.array(ev.bid_px + ev.bid_sz + ev.ask_px + ev.ask_sz, dtype=np.float64)
                assert np.array_equal(as_levels(ev), made, equal_nan=True)
                assert np.array_equal(_bits64(as_levels(ev)), _bits64(made))
                label, probs = tick(ev)  # what Engine.on_book asks: the pre-computed label
                ref_label, ref_probs = laya.predict(features_v0(ev))
                assert label == ref_label and np.array_equal(_bits(probs), _bits(ref_probs))
                assert 0 <= tick.sample_ns(ev.ts_recv) < 10**12
                books += 1
    assert books > 500 and tick.fast == books


def test_a_book_off_the_fast_path_is_labelled_the_general_way(laya):
    walls = iter([5_000, 9_000])
    tick = TickLaya(laya, lambda: next(walls))
    spaced = (
        b'{"action":"snapshot", "arg":{"instType":"USDT-FUTURES","channel":"books15","instId":"BTCUSDT"},'
        b'"data":[{"asks":[["27000.5","8.760"]],"bids":[["27000.0","2.710"]],"checksum":0,"seq":1,'
        b'"ts":"1695716059516"}],"ts":1695716059516}'
    )
    (book,) = tick.decode(spaced, 1_000, StreamCounters())  # a space after a comma: not canonical
    assert tick.fast == 0 and isinstance(book, BookSnapshot)
    label, probs = tick(book)
    ref_label, ref_probs = laya.predict(features_v0(book))
    assert label == ref_label and np.array_equal(_bits(probs), _bits(ref_probs))
    assert tick.sample_ns(book.ts_recv) == 5_000 - 1_000  # timed at the engine's call, as before


def test_pre_labelled_result_is_used_once_and_only_for_its_book(laya):
    walls = iter(range(100, 10**9, 100))
    tick = TickLaya(laya, lambda: next(walls))
    raw = encode_books15("BTCUSDT", ts_ms=1, seq=1, bids=[("10.0", "1")], asks=[("10.5", "9")], push_ts_ms=1)
    (a,) = tick.decode(raw, 0, StreamCounters())
    other = dataclasses.replace(a)
    assert other == a and other is not a
    tick(other)  # not the pre-labelled object: computed afresh, the pending result is kept
    assert tick._pre is not None
    tick(a)
    assert tick._pre is None


def test_keep_warm_changes_nothing_the_engine_reads(laya):
    walls = iter(range(100, 10**9, 100))
    tick = TickLaya(laya, lambda: next(walls))
    tick.keep_warm()  # before any frame: nothing to do
    frames = [raw for _, raw in generate_frames(minutes=1, seed=2) if b'"books15"' in raw[:90]][:50]
    counters = StreamCounters()
    for raw in frames:
        (book,) = tick.decode(raw, 0, counters)
        pre = tick._pre
        row = laya.input_row.copy()
        tick.keep_warm()
        assert tick._pre is pre and np.array_equal(laya.input_row, row)
        label, probs = tick(book)
        ref_label, ref_probs = laya.predict(features_v0(book))
        assert label == ref_label and np.array_equal(_bits(probs), _bits(ref_probs))


def test_engine_keep_warm_changes_no_decision(tmp_path, monkeypatch):
    """Live mode runs Engine.keep_warm between frames: a replay that calls it after every label, Kev
    answer and trade writes the same files as one that never does, and each call leaves the core's
    arrays as they were."""
    from engine.core import SHADOW_LEAD_NS, Engine
    from replay.config import ReplayConfig
    from replay.driver import run_replay
    from venue.simulator import simulate_session

    session = simulate_session(tmp_path / "s", minutes=2.0, seed=5)
    cfg = ReplayConfig(fill_model="queue_power2")
    plain = run_replay(session, cfg, out_dir=tmp_path / "plain")
    warmed = {"n": 0, "checks": 0, "shadow": 0, "sent": 0}
    windows: set[int] = set()
    looked = [0]  # when each keep-warm ran
    for name in ("on_label", "_on_kev_done", "on_trade"):
        orig = getattr(Engine, name)

        def hooked(self, *a, _orig=orig, **k):
            r = _orig(self, *a, **k)
            warmed["n"] += 1
            before = {name: a.copy() for name, a in vars(self.core).items() if isinstance(a, np.ndarray)}
            steps = self.shadow_steps
            looked.append(self.clock.now_ns())
            warmed["checks"] += self.keep_warm()
            if self.shadow_steps > steps:  # the shadow requote ran: it sent or cancelled on its own arrays
                warmed["shadow"] += 1
                warmed["sent"] += int(self._shadow.NOUT[K.O_ORDER] > 0)
                # once per requote window, before it opens: within SHADOW_LEAD_NS of it, or after the
                # keep-warm before the window's first label when they are farther apart than that
                now = self.clock.now_ns()
                last, due = int(self.core.S[K.S_LAST_REQUOTE]), int(self.core.C[K.C_REQUOTE_MIN])
                assert last not in windows
                windows.add(last)
                assert now + max(SHADOW_LEAD_NS, now - looked[-2]) >= last + due
            for name, a in before.items():
                b = getattr(self.core, name)
                if name in ("SCR", "SCRI"):  # a step's scratch, never read before written
                    continue
                if name == "S":  # the step's time, and the rate window's head (step_warm's docstring)
                    changed = set(np.flatnonzero(a != b).tolist())
                    assert changed <= {K.S_NOW, K.S_RECENT_HEAD}, changed
                else:
                    assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
            return r

        monkeypatch.setattr(Engine, name, hooked)
    # the hooks are the per-event engine's: that run takes it (plain takes the compiled loop, the same events)
    warm = run_replay(session, cfg, out_dir=tmp_path / "warm", kernel=False)
    assert warmed["n"] > 500 and warmed["checks"] > warmed["n"]  # it did run the rules
    # and the order path: a requote on the core's shadow before each window, orders out of it, the
    # core's arrays untouched; far fewer shadows than keep-warms (its cost, not paid on every frame)
    assert warmed["shadow"] > 100 and warmed["sent"] > 0.9 * warmed["shadow"]
    assert warmed["shadow"] < warmed["n"] / 2, warmed
    assert warm.digest == plain.digest
    for f in sorted((tmp_path / "plain" / "events").iterdir()):
        assert f.read_bytes() == (tmp_path / "warm" / "events" / f.name).read_bytes(), f.name
