"""A session's books15 levels read a block at a time, so a replay never holds the whole book table.

The walk needs a book's 60 level values (bid/ask prices and sizes) when the exchange or the engine
receives it, and Laya's label shortly after. :class:`StreamedBooks` reads the Parquet row groups that
cover one block of :data:`BLOCK` rows when the walk first needs it, computes the block's features and
labels a slice of :data:`LABEL_ROWS` at a time (Laya's inference runs in chunks of
``BATCH_CHUNK_ROWS`` whatever the batch, so the labels are bit-identical to ``replay.driver._batch_v0``'s
whole-session batches; in tick mode each row goes through Laya's tick path instead, as live mode labels
it), keeps the levels of the last two blocks and drops the rest.
The levels' memory is then two blocks whatever the session's length, provided its files were written
in row groups of a block or less (``engine.store`` writes 65 536). The per-row labels and
probabilities (and the other per-row columns) are streamed by ``replay.tape_stream`` where the
session allows it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.jit import njit
from engine.laya.features import N_FEATURES, features_v0_rows
from engine.laya.model import BATCH_CHUNK_ROWS, Laya
from engine.store import SessionError, first_line, open_parquet
from engine.validate import LEVEL_COLUMNS, REASONS, book_codes
from replay.market_cache import Builder, Cached
from replay.walk import readonly

BLOCK = 65_536  # rows per block of levels: engine.store's row group
# Rows labelled at once: the features buffer is this many rows (4 MB), not a block's (32 MB of peak
# RSS). A multiple of Laya's chunk, so its chunks start where a whole block's would.
LABEL_ROWS = 8 * BATCH_CHUNK_ROWS
SMALL_COLUMNS = ["ts_event", "ts_recv", "seq", "symbol", "exch_seq"]


class InvalidRows(RuntimeError):
    """A streamed block holds rows that fail validation (``engine.validate``): the replay starts over on
    whole tables, where they are removed and reported (``replay.driver.run_replay``)."""


def read_group(path: Path, pf: pq.ParquetFile, group: int, columns: list[str]) -> pa.Table:
    """One row group of the session file ``path``; a damaged one is a SessionError naming it."""
    try:
        return pf.read_row_group(group, columns=columns, use_threads=False)
    except (pa.ArrowException, OSError) as e:
        raise SessionError(f"{path}: cannot read row group {group} ({first_line(e)})") from None


class GroupCache:
    """Row groups shared by the :class:`StreamedBooks` of the symbols of one session: a portfolio's
    instruments walk the same files side by side, so each group is read once, not once per symbol.

    A group is read a quarter of the level columns at a time, as a symbol alone reads it, and each
    symbol's rows are pushed into an array of its own as the quarters go by; a symbol drops its array
    once its blocks have taken every row of it. Why: a whole group's table kept for the symbols still
    to come (31 MB, one per symbol) stayed resident beside the blocks made from it; what waits here is
    only rows no block has taken yet. They share one features buffer too."""

    def __init__(self) -> None:
        self._members: list[StreamedBooks] = []
        self._rows: dict[tuple[Path, int], dict[int, np.ndarray]] = {}  # group -> member -> its rows
        self._pushed: set[tuple[Path, int]] = set()  # groups read at least once
        self._symbols: dict[tuple[Path, int], pa.Table] = {}  # symbol columns, while symbols are set up
        self._x = np.zeros((0, N_FEATURES), dtype=np.float32)  # the symbols' features buffer

    def join(self, member: StreamedBooks) -> int:
        """``member``'s number, by which it asks for its rows."""
        self._members.append(member)
        return len(self._members) - 1

    def symbols(self, path: Path, pf: pq.ParquetFile, group: int) -> pa.Table:
        """The group's symbol column, read once for all the symbols that pick their rows from it."""
        key = (path, group)
        t = self._symbols.get(key)
        if t is None:
            t = self._symbols[key] = read_group(path, pf, group, ["symbol"])
        return t

    def symbols_done(self) -> None:
        """Every symbol has its rows' places: the symbol columns go."""
        self._symbols.clear()

    def rows(self, me: int, path: Path, pf: pq.ParquetFile, group: int) -> np.ndarray:
        """Member ``me``'s rows of the group as one (rows x 60) array, read with every other member's
        the first time any of them asks. Asked again after :meth:`taken` (a walk that reaches back past
        the blocks it keeps), the group is read again for ``me`` alone."""
        key = (path, group)
        got = self._rows.setdefault(key, {})
        if me not in got:
            takers = [me]
            if key not in self._pushed:
                takers += [m for m, b in enumerate(self._members) if m != me and key in b.group_at]
                self._pushed.add(key)
            targets = []
            for m in takers:
                b = self._members[m]
                k = b.group_at[key]
                n = b.groups[k][3]
                targets.append((np.empty((n, len(LEVEL_COLUMNS))), b.picks[k], 0, n))
            gather(path, pf, group, targets)
            got.update((m, t[0]) for m, t in zip(takers, targets, strict=True))  # once read whole
        return got[me]

    def taken(self, me: int, path: Path, group: int) -> None:
        """Member ``me``'s blocks have every row of the group it was given: its array goes."""
        key = (path, group)
        got = self._rows.get(key)
        if got is not None:
            got.pop(me, None)
            if not got:
                del self._rows[key]


class StreamedBooks:
    """Level rows and labels of one symbol's books15 parts, block by block. With ``symbol``, the parts
    may hold other symbols too: the symbol's rows are picked out of each row group (their places found
    from the symbol column, once), and ``cache`` shares the groups read with the other symbols'."""

    def __init__(
        self,
        files: list[Path],
        laya: Laya,
        schema: pa.Schema,
        symbol: str | None = None,
        cache: GroupCache | None = None,
        block: int | None = None,
        tick: bool = False,
    ) -> None:
        self._laya = laya
        # labels per tick (``--laya-mode tick``): each row through Laya's tick path, as live labels it
        self._predict = laya.predict_each if tick else laya.predict_batch
        # rows a block (a label batch, two levels buffers kept): a portfolio's symbols share the walk's
        # chunk, so each needs fewer rows at once
        self.block = block or BLOCK
        self._schema = schema
        self._files = list(files)
        self._symbol = symbol
        self._cache = cache
        # (file, group, first row, rows, path): rows of the symbol, numbered across the groups
        self.groups: list[tuple[pq.ParquetFile, int, int, int, Path]] = []
        self.picks: list[np.ndarray | None] = []  # per group: the symbol's rows in it (None: all)
        row = 0
        for f in files:
            pf = open_parquet(f, schema)
            for g in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                pick = None
                if symbol is not None:
                    col = (
                        read_group(f, pf, g, ["symbol"]) if cache is None else cache.symbols(f, pf, g)
                    ).column(0)
                    hit = pc.equal(col, symbol).to_numpy(zero_copy_only=False)
                    if not hit.all():
                        pick = np.flatnonzero(hit)
                        n = len(pick)
                if n or symbol is None:
                    self.groups.append((pf, g, row, n, f))
                    self.picks.append(pick)
                row += n
        self.num_rows = row
        self.group_at = {(path, g): k for k, (_, g, _, _, path) in enumerate(self.groups)}
        self._member = -1 if cache is None else cache.join(self)
        self.labels: np.ndarray = np.zeros(row, dtype=np.int8)
        self.probs: np.ndarray = np.zeros((row, 4), dtype=np.float32)
        self._blocks: dict[int, np.ndarray] = {}  # block number -> (rows x 60) levels
        # Buffers of dropped blocks are refilled rather than freed: a fresh 31 MB array per block
        # costs its page faults again, and three are enough for a walk.
        self._spare: list[np.ndarray] = []
        self._x = np.zeros((0, N_FEATURES), dtype=np.float32)  # features, reused block to block
        self._labelled = np.zeros((row + self.block - 1) // self.block, dtype=bool)
        self.blocks_read = 0
        # replay.market_cache: blocks read from a cache entry instead (levels, labels, probabilities),
        # or handed to a builder of one as they are labelled
        self.cached: Cached | None = None
        self.building: Builder | None = None

    def small_columns(self) -> pa.Table:
        """Every row's times, seqs and symbol (no levels)."""
        if not self._files:
            return self._schema.empty_table().select(SMALL_COLUMNS)
        # symbol as a dictionary: one string, not a million
        t = pa.concat_tables(
            [pq.read_table(f, columns=SMALL_COLUMNS, read_dictionary=["symbol"]) for f in self._files]
        )
        if self._symbol is not None:  # this symbol's rows, in the order the blocks number them
            t = t.filter(pc.equal(t.column("symbol"), self._symbol))
        return t

    def _read_block(self, b: int) -> np.ndarray:
        block = self.block
        lo, hi = b * block, min(self.num_rows, (b + 1) * block)
        buf = self._spare.pop() if self._spare else np.empty((block, len(LEVEL_COLUMNS)), dtype=np.float64)
        levels = buf[: hi - lo]
        if self.cached is not None:  # the bits a first run read, checked and labelled
            self.cached.read(b, levels, self.labels[lo:hi], self.probs[lo:hi])
            self._labelled[b] = True
            self.blocks_read += 1
            return levels
        at = 0
        for (pf, g, first, n, path), pick in zip(self.groups, self.picks, strict=True):
            if first + n <= lo or first >= hi:
                continue
            a, z = max(lo, first) - first, min(hi, first + n) - first
            if self._cache is None:
                gather(path, pf, g, [(levels[at : at + z - a], pick, a, z)])
            else:  # the symbol's rows of the group, pushed when it was read
                levels[at : at + z - a] = self._cache.rows(self._member, path, pf, g)[a:z]
                if z == n:
                    self._cache.taken(self._member, path, g)
            at += z - a
        assert at == hi - lo, (at, lo, hi)
        self.blocks_read += 1
        if not self._labelled[b]:
            codes = book_codes(levels)  # checked once, when first read (compiled)
            if codes.any():
                i = int(np.flatnonzero(codes)[0])
                raise InvalidRows(f"books15 row {lo + i} is invalid ({REASONS[codes[i]]})")
            # the per-tick feature kernel on each row, as features_v0_table runs it: the same bits
            for s in range(0, hi - lo, LABEL_ROWS):
                e = min(hi - lo, s + LABEL_ROWS)
                x = self._features(e - s)
                features_v0_rows(levels[s:e], x)
                lab, pr = self._predict(x)
                self.labels[lo + s : lo + e] = lab
                self.probs[lo + s : lo + e] = pr
            self._labelled[b] = True
            if self.building is not None:
                self.building.add(b, levels, self.labels[lo:hi], self.probs[lo:hi])
        return levels

    def _features(self, n: int) -> np.ndarray:
        """Room for ``n`` rows of features: this symbol's buffer, or the one its cache shares among the
        symbols (a block is labelled before the next is read, so one buffer serves them all)."""
        holder = self if self._cache is None else self._cache
        if len(holder._x) < n:
            holder._x = np.empty((max(n, LABEL_ROWS), N_FEATURES), dtype=np.float32)  # all overwritten
        return holder._x[:n]

    def levels(self, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1-1 as one (rows x 60) float64 array: bid_px, bid_sz, ask_px, ask_sz. It is valid
        until the next call, which may refill its buffer."""
        block = self.block
        first, last = r0 // block, (r1 - 1) // block
        for b in sorted(k for k in self._blocks if k < first - 1):  # the walk moves forward: keep two
            self._spare.append(self._blocks.pop(b).base)
        for b in range(first, last + 1):
            if b not in self._blocks:
                self._blocks[b] = self._read_block(b)
        parts = []
        for b in range(first, last + 1):
            lo = max(r0, b * block) - b * block
            hi = min(r1, (b + 1) * block) - b * block
            parts.append(self._blocks[b][lo:hi])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def gather(
    path: Path, pf: pq.ParquetFile, group: int, targets: list[tuple[np.ndarray, np.ndarray | None, int, int]]
) -> None:
    """Rows a..z-1 of a symbol's rows of the group (``pick``: their places in it; None: all the group's
    rows) into ``out``, for each ``(out, pick, a, z)`` of ``targets``. The group is read a quarter of
    the level columns at a time: Arrow's pool reuses one quarter's pages for the next, where a whole
    group's table (31 MB) stayed resident beside the rows made from it."""
    for c0, names in _PARTS:
        t = read_group(path, pf, group, names)
        # a row group's columns are single chunks: these are views of Arrow's buffers, gathered into
        # the rows once (an Arrow take of the symbol's rows copied all 60 columns)
        cols = tuple(_column(t, c) for c in names)
        for out, pick, a, z in targets:
            part = out[:, c0 : c0 + len(names)]
            if pick is None:
                rows_of(tuple(c[a:z] for c in cols), part, _ALL)
            else:
                rows_of(cols, part, pick[a:z])
        del t, cols


def _column(table: pa.Table, name: str) -> np.ndarray:
    """A level column as a read-only float64 array (:func:`rows_of` takes them as one tuple)."""
    return readonly(table.column(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False))


@njit
def rows_of(cols, out, pick):
    """``out[i, c] = cols[c][pick[i]]`` (the rows ``pick`` of the columns; all of them in order when
    ``pick`` is empty): columns into rows, a tile of rows at a time. np.stack writes each column down
    the whole block, a cache line per value; a tile's rows stay in the cache while every column is
    written into them."""
    n = out.shape[0]
    picked = pick.shape[0] > 0
    for i0 in range(0, n, 64):
        i1 = min(n, i0 + 64)
        for c in range(len(cols)):
            col = cols[c]
            if picked:
                for i in range(i0, i1):
                    out[i, c] = col[pick[i]]
            else:
                for i in range(i0, i1):
                    out[i, c] = col[i]


_ALL = np.zeros(0, dtype=np.int64)  # rows_of: every row, in order
_SIDE = len(LEVEL_COLUMNS) // 4  # one of bid_px, bid_sz, ask_px, ask_sz
_PARTS = tuple((c0, LEVEL_COLUMNS[c0 : c0 + _SIDE]) for c0 in range(0, len(LEVEL_COLUMNS), _SIDE))


_SYMBOL = pa.schema([pa.field("symbol", pa.string())])  # nulls: not one symbol (below), no error


def one_symbol(files: list[Path], symbol: str) -> bool:
    """Whether every row of these parts is ``symbol`` (then rows need no filtering): from the row groups'
    statistics where written (min == max == symbol, no nulls), else from the column itself."""
    for f in files:
        pf = open_parquet(f, _SYMBOL)
        idx = pf.schema_arrow.get_field_index("symbol")
        known = True
        for g in range(pf.metadata.num_row_groups):
            st = pf.metadata.row_group(g).column(idx).statistics
            if st is None or not st.has_min_max or st.null_count != 0:
                known = False
                break
            if st.min != symbol or st.max != symbol:
                return False
        if not known:
            col = pq.read_table(f, columns=["symbol"], read_dictionary=["symbol"]).column(0)
            if col.null_count or (len(col) and set(pc.unique(col).to_pylist()) != {symbol}):
                return False
    return True
