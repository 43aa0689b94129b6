"""The replay's merged walk, made a chunk at a time.

``replay.driver._Tape.order`` builds the whole walk at once: every entry of every stream concatenated
and sorted by ``(ts, priority, seq)``, ~130 bytes a book at its peak. :class:`StreamedWalk` gives the
same entries in the same order without it: each stream is put in its own ``(ts, seq)`` order (usually
it already is, and costs nothing), and a compiled k-way merge hands out the next chunk on demand.
Streams have distinct priorities and seqs are unique within a stream, so ``(ts, priority, seq)`` is a
total order and the merge and the sort agree entry for entry (``tests/replay/test_replay_kernel.py``). A
portfolio merges every instrument's streams the same way, the instrument in the keys' high bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.jit import njit


@dataclass(frozen=True)
class WalkStream:
    """One kind of walk entry: its times, priority, tie-break keys and kind, and the instrument whose
    tape it is (a portfolio walks several); rows are 0..n-1."""

    ts: np.ndarray  # int64 per row
    priority: int
    seq: np.ndarray  # int64 per row: the tie-break among entries of one (ts, priority)
    kind: int
    inst: int = 0
    perm: np.ndarray | None = None  # rows in (ts, seq) order, filled as the walk goes (else computed)


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``. Compiled code indexes a tuple of arrays at run time only when they
    have one type, and Arrow hands some columns out read-only, others not (a copy): read-only views of
    all of them are of one type."""
    v = a.view()
    v.flags.writeable = False
    return v


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only int64 view: the merge takes each kind of array as one tuple."""
    return readonly(np.asarray(a, dtype=np.int64))


def _in_order(ts: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Rows in (ts, seq) order: an empty array when they already are (the common case)."""
    if len(ts) < 2:
        return np.zeros(0, dtype=np.int64)
    dt = np.diff(ts)
    if bool(np.all((dt > 0) | ((dt == 0) & (np.diff(seq) > 0)))):
        return np.zeros(0, dtype=np.int64)
    return np.lexsort((seq, ts)).astype(np.int64)


@njit(nrt=True)
def _merge(
    tss, seqs, perms, prios, kinds, insts, cursors, out_ts, out_prio, out_kind, out_row, out_inst
):  # pragma: no cover - compiled
    """Fill the out arrays with the next entries of the streams (tuples of one array per stream), least
    (ts, priority, key) first; returns how many (0 at the end)."""
    k = len(tss)
    ht = np.empty(k, dtype=np.int64)  # each stream's next entry: time, key, row (live: one is left)
    hq = np.empty(k, dtype=np.int64)
    hr = np.empty(k, dtype=np.int64)
    live = np.zeros(k, dtype=np.bool_)
    n = 0
    cap = out_ts.shape[0]
    s = 0
    filling = True  # the heads of every stream first, then only the one just taken
    while True:
        # Stream s's next entry into the heads. Written here, not in a helper: a call that takes the
        # tuples reference-counts every array in them, which cost ten times the merge itself.
        c = cursors[s]
        ts = tss[s]
        live[s] = c < ts.shape[0]
        if live[s]:
            perm = perms[s]
            r = perm[c] if perm.shape[0] else c
            ht[s] = ts[r]
            hq[s] = seqs[s][r]
            hr[s] = r
        if filling:
            s += 1
            if s < k:
                continue
            filling = False
        if n >= cap:
            break
        best = -1
        bt = 0
        bp = 0
        bs = 0
        for j in range(k):
            if not live[j]:
                continue
            t = ht[j]
            p = prios[j]
            q = hq[j]
            if best < 0 or t < bt or (t == bt and (p < bp or (p == bp and q < bs))):
                best, bt, bp, bs = j, t, p, q
        if best < 0:
            break
        out_ts[n] = bt
        out_prio[n] = bp
        out_kind[n] = kinds[best]
        out_row[n] = hr[best]
        out_inst[n] = insts[best]
        cursors[best] += 1
        n += 1
        s = best
    return n


class StreamedWalk:
    """The walk over ``streams``, ``chunk`` entries at a time."""

    def __init__(self, streams: list[WalkStream], chunk: int, *, presorted: bool = False) -> None:
        """``presorted``: the caller vouches that every stream is in (ts, seq) order, or gives its order
        as ``perm`` (a ``replay.tape_stream.StreamedTape`` checks or sorts rows as it fills them), so no
        row is looked at here.
        Streams of one priority must have keys (``seq``) that never tie across them (a portfolio puts
        the instrument in the key's high bits): then (ts, priority, key) is a total order."""
        if not streams:
            raise ValueError("the merge needs a stream")
        self.total = sum(len(s.ts) for s in streams)
        self._ts = tuple(_readonly(s.ts) for s in streams)
        self._seq = tuple(_readonly(s.seq) for s in streams)
        none = np.zeros(0, dtype=np.int64)  # in order as it is
        self._perm = tuple(
            _readonly(s.perm if s.perm is not None else none if presorted else _in_order(s.ts, s.seq))
            for s in streams
        )
        self._prio = np.array([s.priority for s in streams], dtype=np.int64)
        self._kind = np.array([s.kind for s in streams], dtype=np.int64)
        self._inst = np.array([s.inst for s in streams], dtype=np.int64)
        self._cursors = np.zeros(len(streams), dtype=np.int64)
        self._out = (
            np.empty(chunk, dtype=np.int64),
            np.empty(chunk, dtype=np.int8),
            np.empty(chunk, dtype=np.int8),
            np.empty(chunk, dtype=np.int64),
            np.empty(chunk, dtype=np.int64),
        )

    @property
    def cursors(self) -> np.ndarray:
        """Entries taken so far from each stream (in the streams' order)."""
        return self._cursors

    def first_ts(self) -> int:
        return min(int(ts.min()) for ts in self._ts if len(ts))

    def next_entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """The next (ts, priority, kind, row, instrument) arrays, or None at the end. Views of buffers
        reused by the next call."""
        ts, prio, kind, row, inst = self._out
        n = _merge(
            self._ts, self._seq, self._perm, self._prio, self._kind, self._inst, self._cursors,
            ts, prio, kind, row, inst,
        )  # fmt: skip
        if n == 0:
            return None
        return ts[:n], prio[:n], kind[:n], row[:n], inst[:n]

    def next_chunk(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`next_entries` without the instrument (a single instrument's walk)."""
        e = self.next_entries()
        return None if e is None else e[:4]

    def all_entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every entry left, as whole arrays (the per-event drivers walk them so)."""
        parts: list[list[np.ndarray]] = [[], [], [], [], []]
        while (e := self.next_entries()) is not None:
            for acc, a in zip(parts, e, strict=True):
                acc.append(a.copy())
        out = tuple(
            np.concatenate(p) if p else np.zeros(0, dtype=b.dtype)
            for p, b in zip(parts, self._out, strict=True)
        )
        return out  # type: ignore[return-value]
