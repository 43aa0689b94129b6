"""Label events as columns: the replay's per-book output stream without a row per event.

A replay emits one ``LabelEvent`` per book. Its fields are the book's (ts_event, seq, ts_recv,
symbol, already columns on the tape), the time the label became visible, and Laya's class and
probabilities. :class:`LabelColumns` keeps just the book row, the time and Laya's output per label and
hands the event log whole Arrow tables at its flush points (``EventLog.attach_columns``): the same
events, files and digest as ``Engine.on_label`` appending rows (``tests/replay/test_replay_fast.py``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.core import LABEL_NAMES
from engine.eventlog import EventLog
from engine.events import STREAMS

_SCHEMA = STREAMS["label"].schema
_NAMES = pa.array(LABEL_NAMES, pa.string())


class _Ints:
    """A growable int64 column: labels arrive a chunk at a time (``add_many``) and leave as one array,
    with no Python int per label on the way."""

    __slots__ = ("a", "n")

    def __init__(self) -> None:
        self.a = np.empty(1 << 12, dtype=np.int64)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def _room(self, m: int) -> None:
        if self.n + m > len(self.a):
            a = np.empty(max(2 * len(self.a), self.n + m), dtype=np.int64)
            a[: self.n] = self.a[: self.n]
            self.a = a

    def append(self, v: int) -> None:
        self._room(1)
        self.a[self.n] = v
        self.n += 1

    def extend(self, v: np.ndarray) -> None:
        m = len(v)
        self._room(m)
        self.a[self.n : self.n + m] = v
        self.n += m

    def values(self) -> np.ndarray:
        """The column so far (a view: copy it before the next :meth:`clear` if it must outlive it)."""
        return self.a[: self.n]

    def clear(self) -> None:
        self.n = 0


class LabelColumns:
    """Records label events for ``log`` (stream ``label``) from book rows of one symbol's tape.

    With ``labels``/``probs`` (Laya's output per book row, batch mode) only the row and the time are
    kept per event; otherwise each event's class and probabilities too (labels computed per tick).
    """

    def __init__(
        self,
        log: EventLog,
        symbol: str,
        ts_event: np.ndarray,
        seq: np.ndarray,
        ts_recv: np.ndarray,
        labels: np.ndarray | None = None,
        probs: np.ndarray | None = None,
    ) -> None:
        self._symbol = symbol
        self._evt, self._seq, self._recv = ts_event, seq, ts_recv
        self._by_row = (labels, probs) if labels is not None and probs is not None else None
        # a portfolio's: per column (ts_event, seq, ts_recv, labels, probs) each instrument's array
        self._per_inst: list[list[np.ndarray]] | None = None
        self._row = _Ints()
        self._at = _Ints()
        self._label: list[int] = []
        self._probs: list[list[float]] = []
        self._flush_rows, self._flush = log.flush_rows, log.flush
        self._symbols: pa.Array | None = None  # several instruments: their symbols
        self._offset = np.zeros(1, dtype=np.int64)  # instrument j's rows start at offset[j]
        log.attach_columns("label", self._table, self._row.__len__)

    @classmethod
    def of_instruments(
        cls,
        log: EventLog,
        symbols: list[str],
        ts_event: list[np.ndarray],
        seq: list[np.ndarray],
        ts_recv: list[np.ndarray],
        labels: list[np.ndarray],
        probs: list[np.ndarray],
    ) -> LabelColumns:
        """One label stream for a portfolio's tapes (batch labels), rows named by (row, instrument) in
        :meth:`add_many`: the instruments' rows numbered end to end."""
        out = cls(log, symbols[0], ts_event[0], seq[0], ts_recv[0])
        # each instrument's own arrays, read when the log takes the rows: a streamed symbol's labels
        # fill in as the walk reads its books (replay.book_source), so nothing is copied here
        out._per_inst = [list(ts_event), list(seq), list(ts_recv), list(labels), list(probs)]
        sizes = np.array([len(a) for a in ts_event], dtype=np.int64)
        out._offset = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        out._symbols = pa.array(symbols, pa.string())
        return out

    def add(self, row: int, ts_recv: int, label_id: int, probs: np.ndarray) -> None:
        """The label of book ``row`` became visible at ``ts_recv`` (call before the engine acts on it,
        so its seq is counted: the engine's Kev requests name it)."""
        self._row.append(row)
        self._at.append(ts_recv)
        if self._by_row is not None:
            if len(self._row) >= self._flush_rows:  # the log's flush point, as for appended rows
                self._flush("label")
            return
        self._label.append(label_id)
        self._probs.append(probs.tolist())  # copied now: the labeler may reuse its buffer
        if len(self._row) >= self._flush_rows:
            self._flush("label")

    def oldest_row(self) -> int | None:
        """The lowest book row a label not yet handed to the log refers to (None when none is)."""
        return int(self._row.values().min()) if len(self._row) else None

    def add_many(self, rows: np.ndarray, ts_recv: np.ndarray, inst: np.ndarray | None = None) -> None:
        """:meth:`add` for many labels at once (batch labels only), flushing at the same points;
        ``inst``: each row's instrument (:meth:`of_instruments`)."""
        if self._by_row is None and self._per_inst is None:
            raise ValueError("add_many needs the labels and probabilities by row")
        if inst is not None:
            rows = rows + self._offset[inst]
        i, n = 0, len(rows)
        while i < n:
            take = min(n - i, self._flush_rows - len(self._row))
            self._row.extend(rows[i : i + take])
            self._at.extend(ts_recv[i : i + take])
            i += take
            if len(self._row) >= self._flush_rows:
                self._flush("label")
                if len(self._row) >= self._flush_rows:  # an in-memory log keeps all until write()
                    self._row.extend(rows[i:])
                    self._at.extend(ts_recv[i:])
                    return

    def _table(self, first_seq: int, n: int, consume: bool) -> pa.Table:
        if n != len(self._row):
            raise AssertionError(f"label log asks for {n} pending events, {len(self._row)} recorded")
        rows = self._row.values()
        if self._per_inst is not None:
            inst = np.searchsorted(self._offset, rows, side="right") - 1
            local = rows - self._offset[inst]
            evt, seq, recv, label = (np.empty(n, dtype=np.int64) for _ in range(4))
            p = np.empty((n, 4), dtype=np.float32)
            for j in range(len(self._offset)):
                m = inst == j
                lj = local[m]
                for out, by_inst in zip((evt, seq, recv, label, p), self._per_inst, strict=True):
                    out[m] = by_inst[j][lj]
            symbol = self._symbols.take(pa.array(inst))
        else:
            evt, seq, recv = self._evt[rows], self._seq[rows], self._recv[rows]
            symbol = pa.array([self._symbol], pa.string()).take(pa.array(np.zeros(n, dtype=np.int64)))
            if self._by_row is not None:
                label, p = self._by_row[0][rows], self._by_row[1][rows]
            else:
                label, p = np.asarray(self._label), np.asarray(self._probs)
        # float32 -> float64 (or Python float) is exact: the values Engine.on_label would log.
        # one column per class, each contiguous (Arrow copies a strided column element by element)
        probs = np.ascontiguousarray(np.asarray(p, dtype=np.float64).reshape(n, 4).T)
        cols = [
            pa.array(evt),
            pa.array(self._at.values().copy()),
            pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64)),
            symbol,
            pa.array(seq),
            pa.array(recv),
            _NAMES.take(pa.array(np.asarray(label, dtype=np.int64))),
            *(pa.array(probs[k]) for k in range(4)),
        ]
        if consume:  # cleared in place: the log counts pending events through self._row.__len__
            self._row.clear()
            self._at.clear()
            self._label.clear()
            self._probs.clear()
        return pa.Table.from_arrays(cols, schema=_SCHEMA)
