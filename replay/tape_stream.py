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

The streams by exchange time must be in ``(ts, seq)`` order in the files; a recorded session's are, and
so are its arrivals with the recorded ``ts_recv`` and its labels at arrival plus a constant Laya latency:
then the merge needs no sort. A modelled (or scaled) feed latency moves arrivals, and a drawn Laya
latency moves labels: those two streams are put in order as they fill (:class:`Reorder`). A row's
arrival is never earlier than its exchange time plus the feed floor (``exchange_times``), and a label
never earlier than its arrival, so once the rows up to a given exchange time are in, every arrival or
label at or below it is final. The reorder window is the spread of the drawn latencies.

A row found out of order while filling raises :class:`TapeDisorder`, and the run starts over on the
whole-table tape (:func:`streamable` says up front what this tape cannot take). The events are the same
either way (``tests/replay/test_replay_kernel.py``).
"""

from __future__ import annotations

import copy
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.events import STREAMS
from engine.latency.batch import sample_each, sample_many
from engine.latency.models import ConstantLatency, LatencyModel, ScaledLatency
from engine.store import SeqOrderError, SessionError, open_parquet
from engine.validate import REASONS, side_codes, time_codes, trade_codes
from replay.book_source import BLOCK, InvalidRows, StreamedBooks, one_symbol, read_group

__all__ = ["ONE_CLOCK", "FeedClock", "InvalidRows", "StreamedTape", "TapeDisorder", "side_codes"]
from replay.walk import StreamedWalk, WalkStream

_PAGE = mmap.PAGESIZE
# Rows kept behind the first row a reader may still need (tests set 0: then a miscounted reader would
# read a handed-back zero and change the run).
RELEASE_MARGIN = BLOCK


@dataclass(frozen=True, slots=True)
class FeedClock:
    """Where a session's exchange times sit on its local clock.

    ``offset_ns``: local clock minus exchange clock, estimated at import (the session manifest's
    ``clock``, e.g. ``recorder.importers.binance``). ``floor_ns``: the least feed latency a row may
    have (exchange -> local). A session without an estimate has both 0: its clocks are taken as one."""

    offset_ns: int = 0
    floor_ns: int = 0

    @classmethod
    def of_session(cls, manifest: dict[str, Any]) -> FeedClock:
        c = manifest.get("clock")
        if c is None:
            return cls()
        try:
            offset, floor = c["local_minus_exchange_ns"], c["min_feed_latency_ns"]
            if type(offset) is not int or type(floor) is not int or floor < 0:
                raise TypeError
        except (KeyError, TypeError):
            raise SessionError(
                f"session manifest 'clock' must hold integer local_minus_exchange_ns and "
                f"min_feed_latency_ns >= 0, not {c!r:.200}"
            ) from None
        return cls(offset, floor)


ONE_CLOCK: Final = FeedClock()  # a session without a clock estimate


def exchange_times(
    evt: np.ndarray, loc: np.ndarray, exchange_feed: str, clock: FeedClock = ONE_CLOCK
) -> tuple[np.ndarray, int]:
    """When the simulated exchange sees each row, on the local clock, and how many rows were moved.

    ``exchange_feed='event'``: at its event time put on the local clock (``ts_event + offset_ns``),
    but at least ``floor_ns`` before the engine receives it: a feed latency below the floor (negative,
    where the clocks disagree) is raised to it, and those rows are counted. ``'local'``: at the arrival
    itself (a paper exchange sees the market when the engine does)."""
    if exchange_feed == "local":
        return loc, 0
    seen, latest = evt + clock.offset_ns, loc - clock.floor_ns
    return np.minimum(seen, latest), int(np.count_nonzero(seen > latest))


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


def arrival_times(
    recv: np.ndarray, evt: np.ndarray, feed: LatencyModel | None, scale: float, offset: int
) -> np.ndarray:
    """Local receipt times: recorded, or exchange time + a modelled feed latency; a what-if scale
    multiplies the feed latency, measured with both times on the local clock (``offset``). Draws come
    from ``feed`` in row order, so rows taken a block at a time draw what the whole column would."""
    if feed is not None:  # drawn in one go where the model allows (the same draws, in order)
        recv = evt + offset + sample_each(feed, evt)
    if scale != 1.0:
        recv = evt + offset + np.rint((recv - evt - offset) * scale).astype(np.int64)
    return recv


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


def _rows(
    files: list[Path], symbol: str
) -> tuple[list[tuple[pq.ParquetFile, int, int, Path]], list[np.ndarray | None]]:
    """The trade parts' row groups with ``symbol``'s rows in them, and those rows' places in each group
    (None: every row is the symbol's), as ``StreamedBooks`` finds its books'."""
    out: list[tuple[pq.ParquetFile, int, int, Path]] = []
    picks: list[np.ndarray | None] = []
    mixed = bool(files) and not one_symbol(files, symbol)
    for f in files:
        pf = open_parquet(f, STREAMS["trade"].schema)
        for g in range(pf.metadata.num_row_groups):
            n, pick = pf.metadata.row_group(g).num_rows, None
            if mixed:
                col = read_group(f, pf, g, ["symbol"]).column(0)
                hit = pc.equal(col, symbol).to_numpy(zero_copy_only=False)
                if not hit.all():
                    pick = np.flatnonzero(hit)
                    n = len(pick)
            if n:
                out.append((pf, g, n, f))
                picks.append(pick)
    return out, picks


def _refuse(what: str, codes: np.ndarray, first_row: int) -> None:
    """Rows that fail validation: the run starts over on whole tables, which drop and report them."""
    if codes.any():
        i = int(np.flatnonzero(codes)[0])
        raise InvalidRows(f"{what} row {first_row + i} is invalid ({REASONS[codes[i]]})")


class Reorder:
    """Rows that come in one order handed out in ``(ts, seq)`` order, once no later row can precede
    them: :meth:`push` takes the next rows and a bound every later row's ts is at least; the rows at or
    below it are final. ``perm`` lists the rows in order (its first ``done`` entries are final)."""

    def __init__(self, n: int) -> None:
        self._perm = VirtualRows(n, np.int64)
        self.perm = self._perm.array
        self.done = 0
        self._ts = self._seq = self._row = np.zeros(0, dtype=np.int64)
        self._last: tuple[int, int] | None = None

    def push(self, ts: np.ndarray, seq: np.ndarray, rows: np.ndarray, bound: int) -> np.ndarray:
        """Add rows; return the rows made final, in order (and write them to ``perm``)."""
        if len(self._row):
            ts, seq, rows = (np.concatenate(p) for p in ((self._ts, ts), (self._seq, seq), (self._row, rows)))
        final = ts <= bound
        pick = np.flatnonzero(final)
        pick = pick[np.lexsort((seq[pick], ts[pick]))]
        out = rows[pick]
        if len(out):
            first = (int(ts[pick[0]]), int(seq[pick[0]]))
            if self._last is not None and first <= self._last:  # a bound that did not hold
                raise TapeDisorder("a reordered stream went back in (ts, seq)")
            self._last = (int(ts[pick[-1]]), int(seq[pick[-1]]))
        self.perm[self.done : self.done + len(out)] = out
        self.done += len(out)
        keep = ~final
        self._ts, self._seq, self._row = ts[keep], seq[keep], rows[keep]
        return out

    def lowest_row(self, cursor: int, unfilled: int) -> int:
        """The lowest row this stream still hands out from position ``cursor`` on; rows from
        ``unfilled`` on have not come in yet."""
        low = unfilled
        if cursor < self.done:
            low = min(low, int(self.perm[cursor : self.done].min()))
        if len(self._row):
            low = min(low, int(self._row.min()))
        return low

    def release_below(self, position: int) -> None:
        self._perm.release_below(position)


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
        laya: LatencyModel,
        priorities: tuple[int, int, int, int],
        clock: FeedClock = ONE_CLOCK,
        feed: LatencyModel | None = None,
        scale_feed: float = 1.0,
    ) -> None:
        """``feed``: a modelled feed latency (None: the recorded ``ts_recv``), ``scale_feed`` its what-if
        scale; ``laya``: the latency of Laya's labels (drawn per book in arrival order unless constant)."""
        self.symbol = symbol
        self._books = books
        self._exchange_feed = exchange_feed
        self._clock = clock
        self.clamped = {"books15": 0, "trade": 0}  # rows whose feed latency was raised to the floor
        self._laya = laya
        self._laya_ns = constant_ns(laya)
        self._prio = priorities
        # the books' row groups as StreamedBooks found them (no second read of the footers)
        self._bgroups = [(pf, g, n, path) for pf, g, _, n, path in books.groups]
        self._bpicks = books.picks  # a session of several symbols: this one's rows of each group
        self._tgroups, self._tpicks = _rows(trade_files, symbol)
        nb, nt = books.num_rows, sum(n for _, _, n, _ in self._tgroups)
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
        self._recv_last: list[int | None] = [None, None]  # latest ts_recv of the books, the trades
        self._feed, self._scale = feed, scale_feed
        # The whole-table tape draws every book's feed latency, then every trade's, from one model: the
        # trades draw from a copy of it moved past the books' draws (the same values, a block at a time).
        self._trade_feed = None
        if feed is not None:
            self._trade_feed = copy.deepcopy(feed)
            for k in range(0, nb, BLOCK):
                sample_each(self._trade_feed, np.zeros(min(BLOCK, nb - k), dtype=np.int64))
        moved = feed is not None or scale_feed != 1.0
        # Arrivals and labels out of order: put in order as they fill. Labels a constant latency behind
        # their arrivals keep the arrivals' order.
        self._arrivals = Reorder(nb) if moved else None
        self._labels = Reorder(nb) if self._laya_ns is None else self._arrivals
        self._ranked = 0  # books given their place in arrival order (their rank)

    # -- what the kernel run reads ------------------------------------------------------------

    def levels(self, r0: int, r1: int) -> np.ndarray:
        return self._books.levels(r0, r1)

    def walk(self, chunk: int) -> StreamedWalk:
        """The merged walk over this tape's four streams (in order as they fill: no sort of the whole)."""
        p = self._prio
        arrivals = None if self._arrivals is None else self._arrivals.perm
        labels = None if self._labels is None else self._labels.perm
        streams = [
            WalkStream(self.b_exch, p[0], self.b_seq, 0),
            WalkStream(self.t_exch, p[1], self.t_seq, 1),
            WalkStream(self.b_loc, p[2], self.b_seq, 2, perm=arrivals),
            WalkStream(self.label_due, p[3], self.rank, 4, perm=labels),
        ]
        self.fill((0, 0, 0, 0), chunk)
        return StreamedWalk(streams, chunk, presorted=True)

    def first_ts(self) -> int:
        firsts = []
        if self.n_books:
            firsts.append(int(self.b_exch[0]))
            for ts, order in ((self.b_loc, self._arrivals), (self.label_due, self._labels)):
                firsts.append(int(ts[0 if order is None else order.perm[0]]))
        if self.n_trades:
            firsts.append(int(self.t_exch[0]))
        return min(firsts)

    # -- filling ahead, releasing behind ------------------------------------------------------

    def fill(self, cursors: tuple[int, int, int, int], chunk: int) -> None:
        """Read row groups until the next ``chunk`` entries of every walk stream past ``cursors`` (the
        merge's: books by exchange time, trades, arrivals, labels) are in place: a chunk of the walk
        takes at most that many from any one stream."""
        b0, t0, b2, b4 = cursors
        nb = self.n_books
        want = min(nb, b0 + chunk)
        want_arrivals, want_labels = min(nb, b2 + chunk), min(nb, b4 + chunk)
        while self.b_filled < nb and (
            self.b_filled < want
            or (self._arrivals is None and self.b_filled < want_arrivals)
            or (self._arrivals is not None and self._arrivals.done < want_arrivals)
            or (self._labels is None and self.b_filled < want_labels)
            or (self._labels is not None and self._labels.done < want_labels)
        ):
            self._fill_books()
        while self.t_filled < min(t0 + chunk, self.n_trades):
            self._fill_trades()

    def _fill_books(self) -> None:
        pf, g, n, path = self._bgroups[self._bg]
        pick = self._bpicks[self._bg]
        self._bg += 1
        t = read_group(path, pf, g, ["ts_event", "ts_recv", "seq"])
        if pick is not None:
            t = t.take(pick)
        lo, hi = self.b_filled, self.b_filled + n
        evt = t.column("ts_event").to_numpy().astype(np.int64, copy=False)
        recv = t.column("ts_recv").to_numpy().astype(np.int64, copy=False)
        seq = t.column("seq").to_numpy().astype(np.int64, copy=False)
        # as _BatchLabeler checks a whole stream
        if n and (
            not bool(np.all(np.diff(seq) > 0))
            or (self._seq_last is not None and int(seq[0]) <= self._seq_last)
        ):
            raise SeqOrderError(f"{path}: book seqs must be strictly increasing (a seq repeats or goes back)")
        # a row that arrives before an earlier one: kept from the engine on whole tables, not sorted
        _refuse(
            "books by arrival is not in (ts, seq) order: books15", time_codes(recv, self._recv_last[0]), lo
        )
        if n:
            self._seq_last, self._recv_last[0] = int(seq[-1]), int(recv.max())
        loc = arrival_times(recv, evt, self._feed, self._scale, self._clock.offset_ns)
        exch, clamped = exchange_times(evt, loc, self._exchange_feed, self._clock)
        self.clamped["books15"] += clamped
        self._order[0].check(exch, seq)
        self.b_evt[lo:hi], self.b_seq[lo:hi], self.b_loc[lo:hi], self.b_exch[lo:hi] = evt, seq, loc, exch
        self.b_filled = hi
        rows = np.arange(lo, hi, dtype=np.int64)
        # Every later row arrives no earlier than this group's last exchange time plus the floor
        # (exchange_times keeps a row's exchange time that far before its arrival), and its label later
        # still: arrivals and labels up to that time are final.
        last = self._bg == len(self._bgroups)
        bound = np.iinfo(np.int64).max if last else (int(exch[-1]) + self._clock.floor_ns if n else None)
        if self._arrivals is None:
            self._order[1].check(loc, seq)
            arrived = rows
        elif bound is None:
            return
        else:
            arrived = self._arrivals.push(loc, seq, rows, bound)
        if not len(arrived):
            return
        rank = np.arange(self._ranked, self._ranked + len(arrived), dtype=np.int64)
        self._ranked += len(arrived)
        self.rank[arrived] = rank
        # Laya's latencies drawn in the order the engine receives the books, as the whole tape does
        at = self.b_loc[arrived]
        if self._laya_ns is not None:
            due = at + self._laya_ns
        else:
            drawn = sample_each(self._laya, at)
            if int(drawn.min()) < 0:  # the whole tape hands such a run to the per-event engine
                raise TapeDisorder("a Laya latency was drawn negative")
            due = at + drawn
        self.label_due[arrived] = due
        if self._labels is None:
            self._order[2].check(due, rank)
        elif self._labels is not self._arrivals:
            label_bound = bound if self._arrivals is not None else int(at[-1])
            self._labels.push(due, rank, arrived, np.iinfo(np.int64).max if last else label_bound)

    def _fill_trades(self) -> None:
        pf, g, n, path = self._tgroups[self._tg]
        pick = self._tpicks[self._tg]
        self._tg += 1
        t = read_group(path, pf, g, ["ts_event", "ts_recv", "seq", "px", "sz", "side"])
        if pick is not None:
            t = t.take(pick)
        lo, hi = self.t_filled, self.t_filled + n
        evt = t.column("ts_event").to_numpy().astype(np.int64, copy=False)
        recv = t.column("ts_recv").to_numpy().astype(np.int64, copy=False)
        seq = t.column("seq").to_numpy().astype(np.int64, copy=False)
        side = side_codes(t.column("side"))
        px = t.column("px").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        sz = t.column("sz").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        _refuse("trade", trade_codes(px, sz, side), lo)
        _refuse("trade", time_codes(recv, self._recv_last[1]), lo)
        if n:
            self._recv_last[1] = int(recv.max())
        loc = arrival_times(recv, evt, self._trade_feed, self._scale, self._clock.offset_ns)
        exch, clamped = exchange_times(evt, loc, self._exchange_feed, self._clock)
        self.clamped["trade"] += clamped
        self._t_order.check(exch, seq)
        self.t_seq[lo:hi], self.t_exch[lo:hi] = seq, exch
        self.t_side[lo:hi], self.t_px[lo:hi], self.t_sz[lo:hi] = side, px, sz
        self.t_filled = hi

    def lowest_book_row(self, b0: int, b2: int, b4: int) -> int:
        """The lowest book row the merge still reads, given its cursors on the three book streams."""
        low = b0
        for order, cursor in ((self._arrivals, b2), (self._labels, b4)):
            low = min(low, cursor if order is None else order.lowest_row(cursor, self.b_filled))
        return low

    def release(self, book_row: int, cursors: tuple[int, int, int, int]) -> None:
        """Nothing will read books before ``book_row`` again, nor what the merge's ``cursors`` have
        passed: hand back their pages, :data:`RELEASE_MARGIN` rows short of them (trades by their
        cursor; the reordered streams' lists of rows behind both their cursors, as one list may serve
        both)."""
        for v in self._book_maps:
            v.release_below(max(0, book_row - RELEASE_MARGIN))
        for v in self._trade_maps:
            v.release_below(max(0, cursors[1] - RELEASE_MARGIN))
        behind = max(0, min(cursors[2], cursors[3]) - RELEASE_MARGIN)
        for order in (self._arrivals, self._labels):
            if order is not None:
                order.release_below(behind)


def streamable(feed: LatencyModel | None, scale_feed: float, exchange_feed: str) -> str:
    """Why the streamed tape cannot take this run ('' when it can, given rows in order)."""
    moved = feed is not None or scale_feed != 1.0
    if moved and exchange_feed == "local":
        return "the exchange sees the arrivals a feed latency model moves"
    if feed is not None and sample_many(feed, np.zeros(0, dtype=np.int64)) is None:
        return "the feed latency model answers by time"
    return ""
