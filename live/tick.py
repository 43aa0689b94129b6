"""Laya on the live tick path: a books15 frame is labelled from its bytes before its event exists.

Why: the general path (``decode`` -> ``BookSnapshot`` -> ``features_v0`` -> ONNX) spends most of its
time from frame to label in CPython, parsing 60 decimal strings. Here a canonical books15 frame
is scanned by the compiled codec fast path (:mod:`wire.bitget.bitget_v2_fast`), its features are
computed by the features v0 kernel (``features_v0_levels``) straight into Laya's input row, and ONNX
Runtime runs at once; only then is the ``BookSnapshot`` built and handed to the engine.

The engine is unchanged: :class:`TickLaya` is both its ``labeler`` and its Laya latency model. When
``Engine.on_book`` asks for the label of the book that was just pre-labelled it gets that result and,
as latency, the wall time from the frame's receipt to the label (what live records and replay
re-applies); any other book (a frame off the fast path) is labelled the general way, timed the same
way as before. Both ways give bit-identical features and labels (tests/live/test_live_tick.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.book import remember_levels
from engine.events import BookSnapshot, Nanos, Quarantined, Trade
from engine.laya.features import features_v0, features_v0_levels
from engine.laya.features import warm_up as warm_features
from engine.laya.model import Laya
from engine.validate import WireGuard
from wire.bitget.bitget_v2 import Control, StreamCounters
from wire.bitget.bitget_v2_fast import Books15Scanner, TradeScanner, decode_fast, decode_not_books15
from wire.bitget.bitget_v2_fast import warm_up as warm_codec


class TickLaya:
    """Decoder + labeler + Laya latency model of live mode (see the module docstring)."""

    def __init__(self, laya: Laya, wall_ns: Callable[[], int], guard: WireGuard | None = None) -> None:
        # the scanned-levels path exists for v0 only; other versions keep the general path throughout
        self.compiled = laya.feature_version == "v0"
        self.laya = laya
        self.wall_ns = wall_ns
        self.scanner = Books15Scanner()
        self.trade_scanner = TradeScanner()  # trades don't wait for a label, but they share the loop
        self._row = laya.input_row
        self._buf = np.zeros(laya.n_features, dtype=np.float32)
        self._pre: tuple[BookSnapshot, int, np.ndarray, int] | None = None
        self._hit_latency = -1
        self._last_raw = b""
        self._warm_scanner = Books15Scanner()
        self._warm_row = np.zeros(laya.n_features, dtype=np.float32)
        self.fast = 0  # frames labelled on the compiled path
        # the wire checks (engine.validate), the recorder's: a frame that fails them is quarantined
        # (live mode passes its feed's; None: none, as the general decoder without one)
        self.guard = guard
        warm_codec()
        warm_features()

    def decode(
        self, raw: bytes, ts: Nanos, counters: StreamCounters
    ) -> list[BookSnapshot | Trade | Quarantined | Control]:
        """:func:`wire.bitget.bitget_v2.decode`, labelling a canonical books15 frame on the way."""
        sc = self.scanner
        guard = self.guard
        # a canonical frame that fails the wire checks goes to the general parser, which says why
        if (
            self.compiled
            and type(raw) is bytes
            and sc.scan(raw)
            and (guard is None or sc.wire_ok(raw, ts, guard))
        ):
            features_v0_levels(sc.levels, self._row)
            label, probs = self.laya.predict_row()
            latency = self.wall_ns() - ts
            book = sc.book(raw, ts, counters)
            remember_levels(book, sc.levels.reshape(-1).copy())  # the scan's rows: as_levels' layout
            self._pre = (book, label, probs, latency)
            self._last_raw = raw
            self.fast += 1
            return [book]
        if self.compiled:  # the books15 scan above declined it (or the checks did): don't scan it again
            return decode_not_books15(raw, ts, counters, self.trade_scanner, guard)
        return decode_fast(raw, ts, counters, sc, self.trade_scanner, guard)

    def keep_warm(self) -> None:
        """Run the label path once more on the last frame, results discarded, so the next frame finds
        its code and data in the CPU caches. Why: after a frame the engine's Python work evicts ONNX
        Runtime's working set, and a cold inference takes several times a warm one. Called
        after a frame's work is done (off its critical path); it changes no state anyone reads."""
        raw = self._last_raw
        if not raw:
            return
        sc = self._warm_scanner
        if sc.scan(raw):
            features_v0_levels(sc.levels, self._warm_row)
        self.laya.predict_row()  # the input row still holds the last frame's features

    def __call__(self, book: BookSnapshot) -> tuple[int, np.ndarray]:
        pre = self._pre
        if pre is not None and pre[0] is book:
            self._pre = None
            self._hit_latency = pre[3]
            return pre[1], pre[2]
        self._hit_latency = -1
        return self.laya.predict(features_v0(book, out=self._buf))

    def sample_ns(self, ts_ns: Nanos) -> Nanos:
        """Laya's latency for the book just labelled: receipt -> label."""
        lat = self._hit_latency
        if lat >= 0:
            self._hit_latency = -1
            return max(0, lat)
        return max(0, self.wall_ns() - ts_ns)
