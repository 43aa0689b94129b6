"""A replay's tape: the session's books and trades as the exchange and the engine see them (times after
the feed latency, the merged walk order, each label's due time), and the rows that fail validation
(quarantined and reported)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine import validate
from engine.core import PRIO_LABEL
from engine.events import STREAMS, BookSnapshot, Trade
from engine.fastinit import frozen_maker
from engine.latency.batch import sample_each
from engine.latency.models import LatencyModel
from engine.store import (
    SeqOrderError,
    SessionError,
    atomic_write_parquet,
    sha256_file,
)
from replay.book_source import InvalidRows, StreamedBooks
from replay.tape_stream import (
    ONE_CLOCK,
    FeedClock,
    arrival_times,
    exchange_times,
    side_codes,
)
from replay.walk import WalkStream

# Merge priorities at one timestamp: the exchange sees market data before the engine does.
PRIO_EXCH_BOOK, PRIO_EXCH_TRADE = 5, 6


PRIO_LOCAL_BOOK, PRIO_LOCAL_TRADE = STREAMS["books15"].priority, STREAMS["trade"].priority


def _col(table: pa.Table, name: str, dtype: str = "float64") -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(dtype, copy=False)


class _Tape:
    """A session's market data as columns, with both timelines: exchange time and local time.

    Events are built lazily while the replay walks the merged order, so memory holds columns, not
    millions of objects.
    """

    def __init__(
        self,
        books: pa.Table,
        trades: pa.Table,
        feed: LatencyModel | None,
        scale_feed: float,
        exchange_feed: str = "event",
        streamed: StreamedBooks | None = None,
        clock: FeedClock = ONE_CLOCK,
    ) -> None:
        self.symbol = books.column("symbol")[0].as_py()
        self.streamed = streamed
        self.b_seq = _col(books, "seq", "int64")
        self.b_evt = _col(books, "ts_event", "int64")
        self.b_exch_seq = _col(books, "exch_seq", "int64")
        # Book levels stay in the Arrow table; (chunk x 15) arrays per side are built on demand.
        self._books = (
            books.select([f"{s}_{i}" for s in ("bid_px", "bid_sz", "ask_px", "ask_sz") for i in range(15)])
            if streamed is None
            else None
        )
        self._chunks: dict[int, tuple[np.ndarray, list[int], list[int], list[int], list[int]]] = {}
        self._trade_chunk_no = -1
        self._trade_chunk: tuple[list[Any], ...] = ()
        self.t_seq = _col(trades, "seq", "int64")
        self.t_evt = _col(trades, "ts_event", "int64")
        self.t_px = _col(trades, "px")
        self.t_sz = _col(trades, "sz")
        # Python strings per trade only for the per-event driver's Trade objects (built on first use)
        self._trades_side, self._trades_id = trades.column("side"), trades.column("trade_id")
        self._t_side: list[str] | None = None
        self._t_id: list[str] | None = None
        off = clock.offset_ns
        self.b_loc = arrival_times(_col(books, "ts_recv", "int64"), self.b_evt, feed, scale_feed, off)
        self.t_loc = arrival_times(_col(trades, "ts_recv", "int64"), self.t_evt, feed, scale_feed, off)
        self.b_exch, nb = exchange_times(self.b_evt, self.b_loc, exchange_feed, clock)
        self.t_exch, nt = exchange_times(self.t_evt, self.t_loc, exchange_feed, clock)
        self.clamped = {"books15": nb, "trade": nt}  # rows whose feed latency was raised to the floor

    @property
    def t_side(self) -> list[str]:
        if self._t_side is None:
            self._t_side = self._trades_side.to_pylist()
        return self._t_side

    @property
    def t_id(self) -> list[str]:
        if self._t_id is None:
            self._t_id = self._trades_id.to_pylist()
        return self._t_id

    def t_side_codes(self) -> np.ndarray:
        """Aggressor side per trade: 0 buy, 1 sell, -1 anything else (the kernel's codes)."""
        return side_codes(self._trades_side)

    def walk_streams(self, label_due: np.ndarray) -> list[WalkStream]:
        """The walk's streams for :class:`replay.walk.StreamedWalk`: :meth:`order`'s entries (kinds 0, 1, 2
        and 4; no kind 3) without building them all."""
        nb = len(self.b_seq)
        rank = np.empty(nb, dtype=np.int64)
        rank[self.engine_book_order()] = np.arange(nb)
        return [
            WalkStream(self.b_exch, PRIO_EXCH_BOOK, self.b_seq, 0),
            WalkStream(self.t_exch, PRIO_EXCH_TRADE, self.t_seq, 1),
            WalkStream(self.b_loc, PRIO_LOCAL_BOOK, self.b_seq, 2),
            WalkStream(label_due, PRIO_LABEL, rank, 4),
        ]

    def engine_book_order(self) -> np.ndarray:
        """Book rows in the order the engine receives them (the walk's kind-2 entries)."""
        return np.lexsort((self.b_seq, self.b_loc))

    def order(
        self, label_due: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The merged walk: (ts, priority, kind, row), sorted by (ts, priority, stream seq).

        kind 0/1 = book/trade at the exchange, 2/3 = book/trade at the engine. With ``label_due``
        (per book row, when its Laya label becomes visible), kind 4 = that label at priority
        ``PRIO_LABEL``; labels due at the same time keep the order the engine received their books
        in, as timers scheduled by ``Engine.on_book`` would. There are no kind-3 entries: the engine
        takes no public trades (``Engine.on_trade``), and timers run in the same order without them.
        """
        nb, nt = len(self.b_seq), len(self.t_seq)
        parts = [
            (self.b_exch, PRIO_EXCH_BOOK, self.b_seq, 0, nb),
            (self.t_exch, PRIO_EXCH_TRADE, self.t_seq, 1, nt),
            (self.b_loc, PRIO_LOCAL_BOOK, self.b_seq, 2, nb),
        ]
        if label_due is not None:
            rank = np.empty(nb, dtype=np.int64)
            rank[self.engine_book_order()] = np.arange(nb)
            parts.append((label_due, PRIO_LABEL, rank, 4, nb))
        ts = np.concatenate([p[0] for p in parts])
        prio = np.concatenate([np.full(p[4], p[1], dtype=np.int8) for p in parts])
        seq = np.concatenate([p[2] for p in parts])
        kind = np.concatenate([np.full(p[4], p[3], dtype=np.int8) for p in parts])
        row = np.concatenate([np.arange(p[4]) for p in parts])
        o = np.lexsort((seq, prio, ts))
        return ts[o], prio[o], kind[o], row[o]

    _CHUNK_BITS = 14  # 16 384 books per chunk

    def _chunk(self, i: int) -> tuple[np.ndarray, list[int], list[int], list[int], list[int]]:
        """Chunk of book ``i``: its levels as one (rows x 60) array (bid_px, bid_sz, ask_px, ask_sz)
        and its times and seqs as Python ints (one conversion per chunk instead of four per row)."""
        c = i >> self._CHUNK_BITS
        chunk = self._chunks.get(c)
        if chunk is None:
            if len(self._chunks) >= 4:  # the walk moves forward: drop the oldest chunk
                del self._chunks[min(self._chunks)]
            size = 1 << self._CHUNK_BITS
            part = self._books.slice(c * size, size)
            rows = slice(c * size, (c + 1) * size)
            chunk = self._chunks[c] = (
                np.column_stack([_col(part, name) for name in part.column_names]),
                self.b_evt[rows].tolist(),
                self.b_loc[rows].tolist(),
                self.b_seq[rows].tolist(),
                self.b_exch_seq[rows].tolist(),
            )
        return chunk

    def levels(self, r0: int, r1: int) -> np.ndarray:
        """Book rows r0..r1-1 as one (rows x 60) float64 array: bid_px, bid_sz, ask_px, ask_sz."""
        if self.streamed is not None:
            return self.streamed.levels(r0, r1)
        assert self._books is not None
        part = self._books.slice(r0, r1 - r0)
        return np.column_stack([_col(part, name) for name in part.column_names])

    def book(self, i: int) -> BookSnapshot:
        levels, evt, loc, seq, exch_seq = self._chunk(i)
        j = i & ((1 << self._CHUNK_BITS) - 1)
        r = levels[j].tolist()  # one row of 60 levels as Python floats, cut into the four sides
        return _make_book(
            evt[j],
            loc[j],
            seq[j],
            self.symbol,
            exch_seq[j],
            tuple(r[0:15]),
            tuple(r[15:30]),
            tuple(r[30:45]),
            tuple(r[45:60]),
        )

    def trade(self, i: int) -> Trade:
        c = i >> self._CHUNK_BITS
        if c != self._trade_chunk_no:  # one list conversion per chunk instead of five per trade
            rows = slice(c << self._CHUNK_BITS, (c + 1) << self._CHUNK_BITS)
            self._trade_chunk_no = c
            self._trade_chunk = tuple(
                a[rows].tolist() for a in (self.t_evt, self.t_loc, self.t_seq, self.t_px, self.t_sz)
            )
        evt, loc, seq, px, sz = self._trade_chunk
        j = i & ((1 << self._CHUNK_BITS) - 1)
        return _make_trade(evt[j], loc[j], seq[j], self.symbol, self.t_id[i], px[j], sz[j], self.t_side[i])


# BookSnapshot / Trade from positional fields without the frozen dataclass __init__ (one per row).
_make_book = frozen_maker(BookSnapshot)


_make_trade = frozen_maker(Trade)


def _label_due(tape: _Tape, model: LatencyModel) -> np.ndarray | None:
    """When each book's Laya label becomes visible: ts_recv + a latency drawn in the order the engine
    receives the books, as ``Engine.on_book`` would draw it. Nothing else draws from the Laya model,
    so a model that cannot be drawn in a batch (recorded latencies, keyed by ts_recv) is drawn here one
    book at a time, in that order: the same draws. None when a draw is negative (then the engine
    schedules each label as it goes and the clock refuses the one in the past)."""
    order = tape.engine_book_order()
    drawn = sample_each(model, tape.b_loc[order])
    if len(drawn) and int(drawn.min()) < 0:
        return None
    due = np.empty_like(tape.b_loc)
    due[order] = tape.b_loc[order] + drawn
    return due


def _walk(*cols: np.ndarray, bar: Any = None, chunk: int = 65_536) -> Iterator[Iterator[tuple[int, ...]]]:
    """The merge order a chunk at a time (flat memory), each chunk's rows as tuples of Python ints."""
    for start in range(0, len(cols[0]), chunk):
        if bar is not None:
            bar.update(start)
        yield zip(*(c[start : start + chunk].tolist() for c in cols), strict=True)


def _for_symbol(table: pa.Table, symbol: str) -> pa.Table:
    mask = pc.equal(table.column("symbol"), symbol)
    if pc.all(mask).as_py() is not False:  # one-symbol session: no copy (a 1M-book filter is ~500 MB)
        return table
    return table.filter(mask)


class _Quarantine:
    """Session rows kept from the engine (``engine.validate``): their ``input_quarantine`` events and
    their counts by stream and reason, for the run's log and manifest."""

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []
        self.counts: dict[str, dict[str, int]] = {}

    def check(self, root: Path, symbol: str, books: pa.Table, trades: pa.Table) -> tuple[pa.Table, pa.Table]:
        """One symbol's whole tables without their invalid rows; a session mostly invalid is refused."""
        seq = _col(books, "seq", "int64")
        if len(seq) > 1 and not bool(np.all(np.diff(seq) > 0)):
            raise SeqOrderError(f"{root}: book seqs must be strictly increasing within a session stream")
        out = []
        for stream, table, codes in (
            ("books15", books, validate.book_table_codes(books)),
            ("trade", trades, validate.trade_table_codes(trades)),
        ):
            bad = int(np.count_nonzero(codes))
            if bad:
                found = validate.counts(codes)
                if 2 * bad > table.num_rows:
                    why = ", ".join(f"{k} {v}" for k, v in found.items())
                    raise SessionError(
                        f"{root}: {bad} of {table.num_rows} {stream} rows for {symbol} are invalid ({why}); "
                        "refusing a session that is mostly bad data"
                    )
                mine = self.counts.setdefault(stream, {})  # a portfolio checks several symbols
                for k, v in found.items():
                    mine[k] = mine.get(k, 0) + v
                first = sum(t.num_rows for t in self.tables)
                self.tables.append(validate.quarantine_table(stream, table, codes, first))
                table = table.filter(pa.array(codes == 0))
            out.append(table)
        return out[0], out[1]

    def write(self, events_dir: Path) -> dict[str, dict[str, Any]]:
        """``input_quarantine.parquet`` (empty when nothing was kept out, as every stream's file is)."""
        schema = STREAMS["input_quarantine"].schema
        table = pa.concat_tables(self.tables) if self.tables else schema.empty_table()
        path = events_dir / "input_quarantine.parquet"
        atomic_write_parquet(table, path)
        return {"events/input_quarantine.parquet": {"rows": table.num_rows, "sha256": sha256_file(path)}}


def _check_streamable(books: pa.Table, trades: pa.Table) -> None:
    """Arrival times and trades of a run whose levels stream: any invalid row means whole tables."""
    if validate.time_codes(_col(books, "ts_recv", "int64")).any():
        raise InvalidRows("books by arrival is not in (ts, seq) order: a books15 row is time_backwards")
    codes = validate.trade_table_codes(trades)
    if codes.any():
        raise InvalidRows(f"a trade row is invalid ({validate.REASONS[int(codes[codes != 0][0])]})")


# Every label is scheduled ahead as a walk entry; the clock takes no timer in its past.
_NEGATIVE_LAYA = "a Laya latency drawn below zero (a label would be due before its book arrived)"
