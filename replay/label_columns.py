"""Label events as columns: the replay's per-book output stream without a row per event.

A replay emits one ``LabelEvent`` per book. Its fields are the book's (ts_event, seq, ts_recv,
symbol, already columns on the tape), the time the label became visible, and Laya's class and
probabilities. :class:`LabelColumns` keeps just the book row, the time and Laya's output per label and
hands the event log whole Arrow tables at its flush points (``EventLog.attach_columns``): the same
events, files and digest as ``Engine.on_label`` appending rows (``tests/test_replay_fast.py``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.core import LABEL_NAMES
from engine.eventlog import EventLog
from engine.events import STREAMS

_SCHEMA = STREAMS["label"].schema
_NAMES = pa.array(LABEL_NAMES, pa.string())


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
        self._row: list[int] = []
        self._at: list[int] = []
        self._label: list[int] = []
        self._probs: list[list[float]] = []
        self._flush_rows, self._flush = log.flush_rows, log.flush
        log.attach_columns("label", self._table, self._row.__len__)

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
        return min(self._row) if self._row else None

    def add_many(self, rows: np.ndarray, ts_recv: np.ndarray) -> None:
        """:meth:`add` for many labels at once (batch labels only), flushing at the same points."""
        if self._by_row is None:
            raise ValueError("add_many needs the labels and probabilities by row")
        rows_l, ts_l = rows.tolist(), ts_recv.tolist()
        i, n = 0, len(rows_l)
        while i < n:
            take = min(n - i, self._flush_rows - len(self._row))
            self._row.extend(rows_l[i : i + take])
            self._at.extend(ts_l[i : i + take])
            i += take
            if len(self._row) >= self._flush_rows:
                self._flush("label")
                if len(self._row) >= self._flush_rows:  # an in-memory log keeps all until write()
                    self._row.extend(rows_l[i:])
                    self._at.extend(ts_l[i:])
                    return

    def _table(self, first_seq: int, n: int, consume: bool) -> pa.Table:
        if n != len(self._row):
            raise AssertionError(f"label log asks for {n} pending events, {len(self._row)} recorded")
        rows = np.asarray(self._row, dtype=np.int64)
        if self._by_row is not None:
            label, p = self._by_row[0][rows], self._by_row[1][rows]
        else:
            label, p = np.asarray(self._label), np.asarray(self._probs)
        # float32 -> float64 (or Python float) is exact: the values Engine.on_label would log.
        probs = np.asarray(p, dtype=np.float64).reshape(n, 4)
        cols = [
            pa.array(self._evt[rows]),
            pa.array(np.asarray(self._at, dtype=np.int64)),
            pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64)),
            pa.array([self._symbol], pa.string()).take(pa.array(np.zeros(n, dtype=np.int64))),
            pa.array(self._seq[rows]),
            pa.array(self._recv[rows]),
            _NAMES.take(pa.array(np.asarray(label, dtype=np.int64))),
            *(pa.array(probs[:, k]) for k in range(4)),
        ]
        if consume:  # cleared in place: the log counts pending events through self._row.__len__
            self._row.clear()
            self._at.clear()
            self._label.clear()
            self._probs.clear()
        return pa.Table.from_arrays(cols, schema=_SCHEMA)
