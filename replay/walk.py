"""The replay's merged walk, made a chunk at a time.

``replay.driver._Tape.order`` builds the whole walk at once: every entry of every stream concatenated
and sorted by ``(ts, priority, seq)``, ~130 bytes a book at its peak. :class:`StreamedWalk` gives the
same entries in the same order without it: each stream is put in its own ``(ts, seq)`` order (usually
it already is, and costs nothing), and a compiled k-way merge hands out the next chunk on demand.
Streams have distinct priorities and seqs are unique within a stream, so ``(ts, priority, seq)`` is a
total order and the merge and the sort agree entry for entry (``tests/test_replay_kernel.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.jit import njit


@dataclass(frozen=True)
class WalkStream:
    """One kind of walk entry: its times, priority, tie-break seqs and kind; rows are 0..n-1."""

    ts: np.ndarray  # int64 per row
    priority: int
    seq: np.ndarray  # int64 per row
    kind: int


def _in_order(ts: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Rows in (ts, seq) order: an empty array when they already are (the common case)."""
    if len(ts) < 2:
        return np.zeros(0, dtype=np.int64)
    dt = np.diff(ts)
    if bool(np.all((dt > 0) | ((dt == 0) & (np.diff(seq) > 0)))):
        return np.zeros(0, dtype=np.int64)
    return np.lexsort((seq, ts)).astype(np.int64)


@njit(inline="always")
def _head(ts, seq, perm, c):  # pragma: no cover - compiled
    r = perm[c] if perm.shape[0] else c
    return r, ts[r], seq[r]


@njit
def _merge(
    ts0,
    seq0,
    perm0,
    ts1,
    seq1,
    perm1,
    ts2,
    seq2,
    perm2,
    ts3,
    seq3,
    perm3,
    prios,
    kinds,
    cursors,
    out_ts,
    out_prio,
    out_kind,
    out_row,
):  # pragma: no cover - compiled
    """Fill the out arrays with the next entries of the four streams; returns how many (0 at the end)."""
    n = 0
    cap = out_ts.shape[0]
    big = np.iinfo(np.int64).max
    while n < cap:
        best = -1
        bt = big
        bp = 0
        bs = 0
        br = 0
        for s in range(4):
            c = cursors[s]
            if s == 0:
                if c >= ts0.shape[0]:
                    continue
                r, t, q = _head(ts0, seq0, perm0, c)
            elif s == 1:
                if c >= ts1.shape[0]:
                    continue
                r, t, q = _head(ts1, seq1, perm1, c)
            elif s == 2:
                if c >= ts2.shape[0]:
                    continue
                r, t, q = _head(ts2, seq2, perm2, c)
            else:
                if c >= ts3.shape[0]:
                    continue
                r, t, q = _head(ts3, seq3, perm3, c)
            p = prios[s]
            if best < 0 or t < bt or (t == bt and (p < bp or (p == bp and q < bs))):
                best, bt, bp, bs, br = s, t, p, q, r
        if best < 0:
            break
        out_ts[n] = bt
        out_prio[n] = bp
        out_kind[n] = kinds[best]
        out_row[n] = br
        cursors[best] += 1
        n += 1
    return n


class StreamedWalk:
    """The walk over ``streams``, ``chunk`` entries at a time."""

    def __init__(self, streams: list[WalkStream], chunk: int, *, presorted: bool = False) -> None:
        """``presorted``: the caller vouches that every stream is in (ts, seq) order (a
        ``replay.tape_stream.StreamedTape`` checks it as it fills rows), so no row is looked at here."""
        if len(streams) != 4:
            raise ValueError(f"the merge takes four streams, not {len(streams)}")
        self.total = sum(len(s.ts) for s in streams)
        self._args: list[np.ndarray] = []
        for s in streams:
            self._args += [
                np.asarray(s.ts, dtype=np.int64),
                np.asarray(s.seq, dtype=np.int64),
                np.zeros(0, dtype=np.int64) if presorted else _in_order(s.ts, s.seq),
            ]
        self._perm = self._args[2::3]
        self._prio = np.array([s.priority for s in streams], dtype=np.int64)
        self._kind = np.array([s.kind for s in streams], dtype=np.int64)
        self._cursors = np.zeros(len(streams), dtype=np.int64)
        self._out = (
            np.empty(chunk, dtype=np.int64),
            np.empty(chunk, dtype=np.int8),
            np.empty(chunk, dtype=np.int8),
            np.empty(chunk, dtype=np.int64),
        )

    @property
    def cursors(self) -> np.ndarray:
        """Entries taken so far from each stream (in the streams' order)."""
        return self._cursors

    def first_ts(self) -> int:
        return min(int(ts.min()) for ts in self._args[0::3] if len(ts))

    def next_chunk(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """The next (ts, priority, kind, row) arrays, or None at the end. Views of buffers reused by the
        next call."""
        ts, prio, kind, row = self._out
        n = _merge(*self._args, self._prio, self._kind, self._cursors, ts, prio, kind, row)
        if n == 0:
            return None
        return ts[:n], prio[:n], kind[:n], row[:n]
