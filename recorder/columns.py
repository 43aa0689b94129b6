"""Column buffers for one segment's ``books15`` and ``trade`` rows, and their Arrow tables.

Rows come from two places, in journal order: the compiled block scan
(:func:`wire.bitget.bitget_v2_fast.scan_block`) writes canonical frames straight into these
arrays; events from the general path (anything the scan does not own) are appended by
:meth:`Columns.add_event`. The tables built here hold exactly the values
``engine.events.events_to_table`` builds from the same events (NaN levels -> null), in the stream's
schema, so the Parquet parts are byte-identical to the event path's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from engine.events import BOOK_LEVELS, STREAMS, BookSnapshot, Trade
from engine.validate import WireGuard
from wire.bitget.bitget_v2_fast import (
    MAX_FRAME_TRADES,
    N_STATE,
    S_NB,
    S_NSYMS,
    S_NT,
    S_NTB,
    SYM_CAP,
    SYM_SLOTS,
    SYM_WIDTH,
    intern_symbol,
    scan_block,
)

_I64 = np.int64
_LV = 4 * BOOK_LEVELS  # bid px, bid sz, ask px, ask sz; 15 levels each


def _grow(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` with its last axis enlarged to ``n`` (contents kept)."""
    out = np.empty(a.shape[:-1] + (n,), dtype=a.dtype)
    out[..., : a.shape[-1]] = a
    return out


class Columns:
    """Growable buffers (one set per normaliser) plus the compiled scan's symbol table and scratch."""

    def __init__(self, books_rows: int = 1 << 14, trade_rows: int = 1 << 14) -> None:
        self.st = np.zeros(N_STATE, dtype=_I64)
        self.symtab = np.zeros((SYM_CAP, SYM_WIDTH), dtype=np.uint8)
        self.symlen = np.zeros(SYM_CAP, dtype=_I64)
        self.slots = np.zeros(SYM_SLOTS, dtype=_I64)
        self.agg = np.zeros((3, 2 * SYM_CAP), dtype=_I64)
        self.touched = np.zeros(2 * SYM_CAP, dtype=_I64)
        self._names: list[str] = []
        self._extra: dict[str, int] = {}  # symbols the compiled table cannot hold: ids SYM_CAP + k
        # books15
        self.b_ts = np.zeros(books_rows, dtype=_I64)
        self.b_recv = np.zeros(books_rows, dtype=_I64)
        self.b_seq = np.zeros(books_rows, dtype=_I64)
        self.b_sym = np.zeros(books_rows, dtype=np.int32)
        self.b_xseq = np.zeros(books_rows, dtype=_I64)
        self.b_lv = np.zeros((_LV, books_rows), dtype=np.float64)
        # trade
        self.t_ts = np.zeros(trade_rows, dtype=_I64)
        self.t_recv = np.zeros(trade_rows, dtype=_I64)
        self.t_seq = np.zeros(trade_rows, dtype=_I64)
        self.t_sym = np.zeros(trade_rows, dtype=np.int32)
        self.t_px = np.zeros(trade_rows, dtype=np.float64)
        self.t_sz = np.zeros(trade_rows, dtype=np.float64)
        self.t_side = np.zeros(trade_rows, dtype=np.int8)
        self.t_off = np.zeros(trade_rows + 1, dtype=_I64)
        self.t_bytes = np.zeros(trade_rows * 16, dtype=np.uint8)
        # scanner scratch
        self.lv = np.empty((4, BOOK_LEVELS), dtype=np.float64)
        self.meta = np.zeros(6, dtype=_I64)
        self.tr_ts = np.zeros(MAX_FRAME_TRADES, dtype=_I64)
        self.tr_px = np.zeros(MAX_FRAME_TRADES, dtype=np.float64)
        self.tr_sz = np.zeros(MAX_FRAME_TRADES, dtype=np.float64)
        self.tr_side = np.zeros(MAX_FRAME_TRADES, dtype=np.int8)
        self.tr_tid = np.zeros((MAX_FRAME_TRADES, 2), dtype=_I64)
        self.tr_order = np.zeros(MAX_FRAME_TRADES, dtype=_I64)
        self.tr_meta = np.zeros(2, dtype=_I64)

    # ------------------------------------------------------------ compiled scan

    def scan(self, buf: np.ndarray, pos: int, guard: WireGuard) -> int:
        """One :func:`~wire.bitget.bitget_v2_fast.scan_block` call from ``pos``; returns its status.
        ``guard``: the feed's wire checks (its symbol ids must be this table's: see ``Normaliser``)."""
        return int(
            scan_block(
                buf,
                pos,
                self.st,
                self.symtab,
                self.symlen,
                self.slots,
                self.agg,
                self.touched,
                self.b_ts,
                self.b_recv,
                self.b_sym,
                self.b_xseq,
                self.b_lv,
                self.t_ts,
                self.t_recv,
                self.t_sym,
                self.t_px,
                self.t_sz,
                self.t_side,
                self.t_off,
                self.t_bytes,
                self.lv,
                self.meta,
                self.tr_ts,
                self.tr_px,
                self.tr_sz,
                self.tr_side,
                self.tr_tid,
                self.tr_order,
                self.tr_meta,
                guard.lim,
                guard.mid,
                guard.mid_ts,
            )
        )

    def names(self) -> list[str]:
        """Symbols of the compiled table, by id (new ones decoded once)."""
        names = self._names
        for k in range(len(names), int(self.st[S_NSYMS])):
            names.append(bytes(self.symtab[k, : self.symlen[k]]).decode("utf-8"))
        return names

    def grow(self) -> None:
        """Double every buffer (the scan said ``FULL``)."""
        nb, nt = self.b_ts.shape[0] * 2, self.t_ts.shape[0] * 2
        for a in ("b_ts", "b_recv", "b_seq", "b_sym", "b_xseq", "b_lv"):
            setattr(self, a, _grow(getattr(self, a), nb))
        for a in ("t_ts", "t_recv", "t_seq", "t_sym", "t_px", "t_sz", "t_side"):
            setattr(self, a, _grow(getattr(self, a), nt))
        self.t_off = _grow(self.t_off, nt + 1)
        self.t_bytes = _grow(self.t_bytes, max(self.t_bytes.shape[0] * 2, 64))

    def drop_seen_trades(self, a: int, b: int, guard: WireGuard) -> int:
        """Remove from trade rows ``a..b`` (the last rows, just scanned) those whose trade id ``guard``
        has seen on their symbol, in row order (as the general parser does); returns the new row
        count. The compiled scan cannot know the ids the general path took, so the check is here."""
        if b <= a:
            return b
        off = self.t_off[a : b + 1].tolist()
        base = off[0]
        blob = self.t_bytes[base : off[-1]].tobytes().decode("utf-8")  # ids are ASCII on this path
        tids = [blob[x - base : y - base] for x, y in zip(off, off[1:], strict=False)]
        syms = self.t_sym[a:b]
        names = self.names()
        keep: list[bool] | None = None
        for sym in np.unique(syms).tolist():
            rows = np.flatnonzero(syms == sym).tolist()
            name = names[sym] if sym < SYM_CAP else list(self._extra)[sym - SYM_CAP]
            fresh = guard.fresh_all(name, [tids[i] for i in rows])
            if fresh is not None:
                if keep is None:
                    keep = [True] * (b - a)
                for i, f in zip(rows, fresh, strict=True):
                    keep[i] = f
        if keep is None or all(keep):
            return b
        mask = np.array(keep, dtype=bool)
        n = a + int(mask.sum())
        for name in ("t_ts", "t_recv", "t_sym", "t_px", "t_sz", "t_side"):
            arr = getattr(self, name)
            arr[a:n] = arr[a:b][mask]
        kept = "".join(t for t, k in zip(tids, keep, strict=True) if k).encode()
        lens = np.diff(np.array(off, dtype=_I64))[mask]
        self.t_bytes[base : base + len(kept)] = np.frombuffer(kept, dtype=np.uint8)
        self.t_off[a + 1 : n + 1] = base + np.cumsum(lens)
        self.st[S_NT] = n
        self.st[S_NTB] = base + len(kept)
        return n

    # ------------------------------------------------------------ rows from the general path

    def sym_id(self, symbol: str) -> int:
        """The symbol's id: the compiled table's when it fits there, else one past ``SYM_CAP``."""
        b = symbol.encode("utf-8")
        k = int(
            intern_symbol(
                np.frombuffer(b, dtype=np.uint8), 0, len(b), self.symtab, self.symlen, self.slots, self.st
            )
        )
        if k >= 0:
            return k
        return SYM_CAP + self._extra.setdefault(symbol, len(self._extra))

    def add_event(self, e: BookSnapshot | Trade) -> None:
        """Append the row of an event the general path decoded (its ``seq`` already taken)."""
        st = self.st
        if type(e) is BookSnapshot:
            r = int(st[S_NB])
            if r >= self.b_ts.shape[0]:
                self.grow()
            self.b_ts[r] = e.ts_event
            self.b_recv[r] = e.ts_recv
            self.b_seq[r] = e.seq
            self.b_sym[r] = self.sym_id(e.symbol)
            self.b_xseq[r] = e.exch_seq
            self.b_lv[:, r] = e.bid_px + e.bid_sz + e.ask_px + e.ask_sz
            st[S_NB] = r + 1
        else:
            r = int(st[S_NT])
            tid = e.trade_id.encode("utf-8")
            off = int(st[S_NTB])
            while r >= self.t_ts.shape[0] or off + len(tid) > self.t_bytes.shape[0]:
                self.grow()
            self.t_ts[r] = e.ts_event
            self.t_recv[r] = e.ts_recv
            self.t_seq[r] = e.seq
            self.t_sym[r] = self.sym_id(e.symbol)
            self.t_px[r] = e.px
            self.t_sz[r] = e.sz
            self.t_side[r] = 0 if e.side == "buy" else 1
            self.t_bytes[off : off + len(tid)] = np.frombuffer(tid, dtype=np.uint8)
            self.t_off[r + 1] = off + len(tid)
            st[S_NT] = r + 1
            st[S_NTB] = off + len(tid)

    # ------------------------------------------------------------ tables

    def _symbols(self, ids: np.ndarray) -> pa.Array:
        table = self.names()
        names = table + [""] * (SYM_CAP - len(table)) + list(self._extra)
        return pa.DictionaryArray.from_arrays(pa.array(ids), pa.array(names, pa.string())).cast(pa.string())

    def _books(self, a: int, b: int) -> pa.Table:
        cols: list[Any] = [
            pa.array(self.b_ts[a:b]),
            pa.array(self.b_recv[a:b]),
            pa.array(self.b_seq[a:b]),
            self._symbols(self.b_sym[a:b]),
            pa.array(self.b_xseq[a:b]),
        ]
        # NaN padding past the last level is null on disk, as in events_to_table
        cols += [pa.array(self.b_lv[c, a:b], from_pandas=True) for c in range(_LV)]
        return pa.Table.from_arrays(cols, schema=STREAMS["books15"].schema)

    def _trades(self, a: int, b: int) -> pa.Table:
        o0, o1 = int(self.t_off[a]), int(self.t_off[b])
        offsets = (self.t_off[a : b + 1] - o0).astype(np.int32)
        tid = pa.StringArray.from_buffers(
            b - a, pa.py_buffer(offsets), pa.py_buffer(self.t_bytes[o0:o1].copy())
        )
        side = pa.DictionaryArray.from_arrays(pa.array(self.t_side[a:b]), pa.array(["buy", "sell"]))
        cols = [
            pa.array(self.t_ts[a:b]),
            pa.array(self.t_recv[a:b]),
            pa.array(self.t_seq[a:b]),
            self._symbols(self.t_sym[a:b]),
            tid,
            pa.array(self.t_px[a:b]),
            pa.array(self.t_sz[a:b]),
            side.cast(pa.string()),
        ]
        return pa.Table.from_arrays(cols, schema=STREAMS["trade"].schema)

    def take_tables(self, rows_per_part: int) -> list[tuple[str, pa.Table]]:
        """The buffered rows as tables of at most ``rows_per_part`` rows (the writer's part split), per
        stream; the buffers are then empty."""
        out: list[tuple[str, pa.Table]] = []
        for stream, n, build in (
            ("books15", int(self.st[S_NB]), self._books),
            ("trade", int(self.st[S_NT]), self._trades),
        ):
            out += [(stream, build(a, min(a + rows_per_part, n))) for a in range(0, n, rows_per_part)]
        self.st[S_NB] = self.st[S_NT] = self.st[S_NTB] = 0
        self.t_off[0] = 0
        return out
