"""A session's per-row columns read a row group at a time ahead of the walk and released behind it.

The kernel's replay needs a few numbers per book and per trade: times, seqs, the walk's keys, and
Laya's label and probabilities. These are far less than the levels (``replay.book_source`` streams those),
but on a whole-table tape they still add up to ~0.25 KB a book: ~2.5 GB for a 10M-book session.
:class:`StreamedTape` keeps them in *virtual* arrays instead. Each array is an anonymous memory map
with the session's full length, so the kernel, the merge and the label log index rows as before.
- It is filled a row group at a time, a walk chunk ahead of the merge's cursors.
- Pages behind every reader are handed back to the OS (``madvise(MADV_DONTNEED)``). Those readers are
  the merge's cursors, the engine's last book and the label events not yet written.
Resident memory then stays a few row groups whatever the session's length.

This needs every walk stream in its ``(ts, seq)`` order in the files. A recorded session is, so the
merge needs no sort:
- books and trades by exchange time, and by arrival with the recorded ``ts_recv``;
- labels at arrival plus a constant Laya latency.

The driver uses this tape only then (:func:`streamable`). A row found out of order while filling
raises :class:`TapeDisorder`, and the run starts over on the whole-table tape. The events are the same
either way (``tests/test_replay_kernel.py``).
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.latency import ConstantLatency, LatencyModel, ScaledLatency
from replay.batch_latency import sample_many
from replay.book_source import BLOCK, StreamedBooks, one_symbol
from replay.walk import StreamedWalk, WalkStream

_PAGE = mmap.PAGESIZE
# Rows kept behind the first row a reader may still need (tests set 0: then a miscounted reader would
# read a handed-back zero and change the run).
RELEASE_MARGIN = BLOCK


def side_codes(side: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Aggressor side per trade: 0 buy, 1 sell, -1 anything else (the kernel's codes)."""
    buy = pc.fill_null(pc.equal(side, "buy"), False).to_numpy(zero_copy_only=False)
    sell = pc.fill_null(pc.equal(side, "sell"), False).to_numpy(zero_copy_only=False)
    return np.where(buy, 0, np.where(sell, 1, -1)).astype(np.int64)


def exchange_times(evt: np.ndarray, loc: np.ndarray, exchange_feed: str) -> np.ndarray:
    """When the simulated exchange sees each row: its event time, never after the engine receives it
    (local clocks can run behind the exchange's), or the arrival itself with ``exchange_feed='local'``
    (a paper exchange sees the market when the engine does)."""
    return loc if exchange_feed == "local" else np.minimum(evt, loc)


class TapeDisorder(RuntimeError):
    """A walk stream is not in (ts, seq) order in the files: the replay needs the whole-table tape."""


class VirtualRows:
    """An array of ``n`` rows (of ``shape`` each) in an anonymous private memory map. Its pages cost
    memory once written and can be handed back, so only a window of a long array stays resident.
    Where the platform has no anonymous maps it is a plain array and nothing is handed back."""

    def __init__(self, n: int, dtype: type | np.dtype, shape: tuple[int, ...] = ()) -> None:
        dt = np.dtype(dtype)
        per_row = int(np.prod(shape, dtype=np.int64))
        self.row_bytes = dt.itemsize * per_row
        self._map: mmap.mmap | None = None
        if hasattr(mmap, "MAP_ANONYMOUS") and hasattr(mmap, "MAP_PRIVATE"):
            # private: MADV_DONTNEED frees private anonymous pages (a shared map would keep them)
            self._map = mmap.mmap(-1, max(1, n * self.row_bytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            flat = np.frombuffer(self._map, dtype=dt, count=n * per_row)
        else:
            flat = np.zeros(n * per_row, dtype=dt)
        self.array = flat.reshape((n, *shape)) if shape else flat
        self._released = 0  # bytes [0, released) are handed back

    def release_below(self, row: int) -> None:
        """Hand back the whole pages of rows ``< row`` (they read as zeros afterwards)."""
        end = (row * self.row_bytes) // _PAGE * _PAGE
        if end > self._released and self._map is not None and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED, self._released, end - self._released)
            self._released = end


def constant_ns(model: LatencyModel) -> int | None:
    """The latency of a model that always draws the same value, else None."""
    if type(model) is ConstantLatency:
        return int(model.latency_ns)
    if type(model) is ScaledLatency:
        inner = constant_ns(model.inner)
        if inner is not None:
            drawn = sample_many(model, np.zeros(1, dtype=np.int64))
            return None if drawn is None else int(drawn[0])
    return None


def _rows(files: list[Path]) -> list[tuple[pq.ParquetFile, int, int]]:
    out = []
    for f in files:
        pf = pq.ParquetFile(f)
        for g in range(pf.metadata.num_row_groups):
            out.append((pf, g, pf.metadata.row_group(g).num_rows))
    return out


class _Order:
    """Checks that one stream's (ts, seq) keys rise strictly, block after block."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.last: tuple[int, int] | None = None

    def check(self, ts: np.ndarray, seq: np.ndarray) -> None:
        if not len(ts):
            return
        dt, ds = np.diff(ts), np.diff(seq)
        ok = bool(np.all((dt > 0) | ((dt == 0) & (ds > 0))))
        if not ok or (self.last is not None and (int(ts[0]), int(seq[0])) <= self.last):
            raise TapeDisorder(f"{self.name} is not in (ts, seq) order in the session's files")
        self.last = (int(ts[-1]), int(seq[-1]))


class StreamedTape:
    """One symbol's books and trades as virtual per-row columns, filled ahead of a :class:`StreamedWalk`
    and released behind it. Attribute names follow ``replay.driver._Tape``."""

    def __init__(
        self,
        books: StreamedBooks,
        trade_files: list[Path],
        symbol: str,
        exchange_feed: str,
        laya_latency_ns: int,
        priorities: tuple[int, int, int, int],
    ) -> None:
        self.symbol = symbol
        self._books = books
        self._exchange_feed = exchange_feed
        self._laya_ns = laya_latency_ns
        self._prio = priorities
        # the books' row groups as StreamedBooks found them (no second read of the footers)
        self._bgroups = [(pf, g, n) for pf, g, _, n in books.groups]
        self._tgroups = _rows(trade_files)
        nb, nt = books.num_rows, sum(n for _, _, n in self._tgroups)
        self.n_books, self.n_trades = nb, nt
        vb = [VirtualRows(nb, np.int64) for _ in range(6)]
        self.b_evt, self.b_seq, self.b_loc, self.b_exch, self.label_due, self.rank = (v.array for v in vb)
        vb += [VirtualRows(nb, np.int8), VirtualRows(nb, np.float32, (4,))]
        books.labels, books.probs = vb[6].array, vb[7].array  # Laya's output, block by block
        vt = [VirtualRows(nt, np.int64) for _ in range(3)] + [VirtualRows(nt, np.float64) for _ in range(2)]
        self.t_seq, self.t_exch, self.t_side, self.t_px, self.t_sz = (v.array for v in vt)
        self._book_maps, self._trade_maps = vb, vt
        self.b_filled = self.t_filled = 0
        self._bg = self._tg = 0
        self._order = [_Order("books by exchange time"), _Order("books by arrival"), _Order("labels")]
        self._t_order = _Order("trades by exchange time")
        self._seq_last: int | None = None

    # -- what the kernel run reads ------------------------------------------------------------

    def levels(self, r0: int, r1: int) -> np.ndarray:
        return self._books.levels(r0, r1)

    def walk(self, chunk: int) -> StreamedWalk:
        """The merged walk over this tape's four streams (already in order: no sort, no look at rows)."""
        p = self._prio
        streams = [
            WalkStream(self.b_exch, p[0], self.b_seq, 0),
            WalkStream(self.t_exch, p[1], self.t_seq, 1),
            WalkStream(self.b_loc, p[2], self.b_seq, 2),
            WalkStream(self.label_due, p[3], self.rank, 4),
        ]
        self.fill(min(self.n_books, chunk), min(self.n_trades, chunk))
        return StreamedWalk(streams, chunk, presorted=True)

    def first_ts(self) -> int:
        firsts = [int(a[0]) for a in (self.b_exch, self.b_loc, self.label_due) if self.n_books]
        if self.n_trades:
            firsts.append(int(self.t_exch[0]))
        return min(firsts)

    # -- filling ahead, releasing behind ------------------------------------------------------

    def fill(self, book_rows: int, trade_rows: int) -> None:
        """Read row groups until rows ``< book_rows`` / ``< trade_rows`` are in place."""
        while self.b_filled < min(book_rows, self.n_books):
            self._fill_books()
        while self.t_filled < min(trade_rows, self.n_trades):
            self._fill_trades()

    def _fill_books(self) -> None:
        pf, g, n = self._bgroups[self._bg]
        self._bg += 1
        t = pf.read_row_group(g, columns=["ts_event", "ts_recv", "seq"], use_threads=False)
        lo, hi = self.b_filled, self.b_filled + n
        evt = t.column("ts_event").to_numpy().astype(np.int64, copy=False)
        loc = t.column("ts_recv").to_numpy().astype(np.int64, copy=False)
        seq = t.column("seq").to_numpy().astype(np.int64, copy=False)
        # as _BatchLabeler checks a whole stream
        if not bool(np.all(np.diff(seq) > 0)) or (
            self._seq_last is not None and int(seq[0]) <= self._seq_last
        ):
            raise ValueError("book seqs must be strictly increasing within a session stream")
        self._seq_last = int(seq[-1])
        exch = exchange_times(evt, loc, self._exchange_feed)
        due = loc + self._laya_ns
        rank = np.arange(lo, hi, dtype=np.int64)
        self._order[0].check(exch, seq)
        self._order[1].check(loc, seq)
        self._order[2].check(due, rank)
        self.b_evt[lo:hi], self.b_seq[lo:hi], self.b_loc[lo:hi] = evt, seq, loc
        self.b_exch[lo:hi], self.label_due[lo:hi], self.rank[lo:hi] = exch, due, rank
        self.b_filled = hi

    def _fill_trades(self) -> None:
        pf, g, n = self._tgroups[self._tg]
        self._tg += 1
        t = pf.read_row_group(
            g, columns=["ts_event", "ts_recv", "seq", "px", "sz", "side"], use_threads=False
        )
        lo, hi = self.t_filled, self.t_filled + n
        evt = t.column("ts_event").to_numpy().astype(np.int64, copy=False)
        loc = t.column("ts_recv").to_numpy().astype(np.int64, copy=False)
        seq = t.column("seq").to_numpy().astype(np.int64, copy=False)
        exch = exchange_times(evt, loc, self._exchange_feed)
        self._t_order.check(exch, seq)
        self.t_seq[lo:hi], self.t_exch[lo:hi] = seq, exch
        self.t_side[lo:hi] = side_codes(t.column("side"))
        self.t_px[lo:hi] = t.column("px").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        self.t_sz[lo:hi] = t.column("sz").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        self.t_filled = hi

    def release(self, book_row: int, trade_row: int) -> None:
        """Nothing will read books before ``book_row`` or trades before ``trade_row`` again: hand back
        their pages, :data:`RELEASE_MARGIN` rows short of them."""
        for v in self._book_maps:
            v.release_below(max(0, book_row - RELEASE_MARGIN))
        for v in self._trade_maps:
            v.release_below(max(0, trade_row - RELEASE_MARGIN))


def streamable(
    symbol: str, trade_files: list[Path], latency_feed: str, scale_feed: float, laya: LatencyModel
) -> str:
    """Why the streamed tape cannot take this run ('' when it can, given rows in order)."""
    if latency_feed != "recorded" or scale_feed != 1.0:
        return "a feed latency model moves arrivals"
    if constant_ns(laya) is None:
        return "Laya's latency is not constant"
    if trade_files and not one_symbol(trade_files, symbol):
        return "the trades hold other symbols"
    return ""
