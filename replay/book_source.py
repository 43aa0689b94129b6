"""A session's books15 levels read a block at a time, so a replay never holds the whole book table.

The walk needs a book's 60 level values (bid/ask prices and sizes) when the exchange or the engine
receives it, and Laya's label shortly after. :class:`StreamedBooks` reads the Parquet row groups that
cover one block of :data:`BLOCK` rows when the walk first needs it, computes the block's features and
labels in one batch (the same 65 536-row batches as ``replay.driver._batch_v0``, so the labels are
bit-identical to a whole-session batch), keeps the levels of the last two blocks and drops the rest.
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

from engine.laya.features import N_FEATURES, features_v0_rows
from engine.laya.model import Laya
from engine.store import SessionError, first_line, open_parquet
from engine.validate import LEVEL_COLUMNS, REASONS, book_codes

BLOCK = 65_536  # rows per label batch: replay.driver._batch_v0's chunk
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


class StreamedBooks:
    """Level rows and labels of one symbol's books15 parts, block by block."""

    def __init__(self, files: list[Path], laya: Laya, schema: pa.Schema) -> None:
        self._laya = laya
        self._schema = schema
        self._files = list(files)
        # (file, group, first row, rows, path)
        self.groups: list[tuple[pq.ParquetFile, int, int, int, Path]] = []
        row = 0
        for f in files:
            pf = open_parquet(f, schema)
            for g in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                self.groups.append((pf, g, row, n, f))
                row += n
        self.num_rows = row
        self.labels: np.ndarray = np.zeros(row, dtype=np.int8)
        self.probs: np.ndarray = np.zeros((row, 4), dtype=np.float32)
        self._blocks: dict[int, np.ndarray] = {}  # block number -> (rows x 60) levels
        # Buffers of dropped blocks are refilled rather than freed: a fresh 31 MB array per block
        # costs its page faults again (~15 ms a block, measured), and three are enough for a walk.
        self._spare: list[np.ndarray] = []
        self._x = np.zeros((0, N_FEATURES), dtype=np.float32)  # features, reused block to block
        self._labelled = np.zeros((row + BLOCK - 1) // BLOCK, dtype=bool)
        self.blocks_read = 0

    def small_columns(self) -> pa.Table:
        """Every row's times, seqs and symbol (no levels)."""
        if not self._files:
            return self._schema.empty_table().select(SMALL_COLUMNS)
        # symbol as a dictionary: one string, not a million
        return pa.concat_tables(
            [pq.read_table(f, columns=SMALL_COLUMNS, read_dictionary=["symbol"]) for f in self._files]
        )

    def _read_block(self, b: int) -> np.ndarray:
        lo, hi = b * BLOCK, min(self.num_rows, (b + 1) * BLOCK)
        pieces = []
        for pf, g, first, n, path in self.groups:
            if first + n <= lo or first >= hi:
                continue
            t = read_group(path, pf, g, LEVEL_COLUMNS)
            a, z = max(lo, first) - first, min(hi, first + n) - first
            pieces.append(t.slice(a, z - a))
        table = pa.concat_tables(pieces)
        self.blocks_read += 1
        buf = self._spare.pop() if self._spare else np.empty((BLOCK, len(LEVEL_COLUMNS)), dtype=np.float64)
        levels = buf[: hi - lo]
        np.stack(
            [
                table.column(c).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
                for c in LEVEL_COLUMNS
            ],
            axis=1,
            out=levels,
        )
        if not self._labelled[b]:
            codes = book_codes(levels)  # checked once, when first read (compiled, ~0.1 us a row)
            if codes.any():
                i = int(np.flatnonzero(codes)[0])
                raise InvalidRows(f"books15 row {lo + i} is invalid ({REASONS[codes[i]]})")
            # the per-tick feature kernel on each row, as features_v0_table runs it: the same bits
            if len(self._x) < hi - lo:
                self._x = np.empty((BLOCK, N_FEATURES), dtype=np.float32)  # every row is overwritten
            x = self._x[: hi - lo]
            features_v0_rows(levels, x)
            lab, pr = self._laya.predict_batch(x)
            self.labels[lo:hi] = lab.astype(np.int8)
            self.probs[lo:hi] = pr.astype(np.float32)
            self._labelled[b] = True
        return levels

    def levels(self, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1-1 as one (rows x 60) float64 array: bid_px, bid_sz, ask_px, ask_sz. It is valid
        until the next call, which may refill its buffer."""
        first, last = r0 // BLOCK, (r1 - 1) // BLOCK
        for b in sorted(k for k in self._blocks if k < first - 1):  # the walk moves forward: keep two
            self._spare.append(self._blocks.pop(b).base)
        for b in range(first, last + 1):
            if b not in self._blocks:
                self._blocks[b] = self._read_block(b)
        parts = []
        for b in range(first, last + 1):
            lo = max(r0, b * BLOCK) - b * BLOCK
            hi = min(r1, (b + 1) * BLOCK) - b * BLOCK
            parts.append(self._blocks[b][lo:hi])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


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
