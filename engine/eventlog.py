"""The engine's event log: per-stream sequence numbers, a digest, streamed Parquet output.

Events are kept as rows (tuples of field values in schema order, without ``seq``: a stream's seq is
its row number) and turned into Arrow columns when a stream flushes, so the tick path never builds an
event object. Each stream is written as Parquet row groups every ``flush_rows`` events, so memory
stays flat however long the run; flush points depend only on counts, so the output bytes are as
deterministic as the events. Row groups are compressed and written by one background thread, in
flush order (Parquet encoding releases the GIL, so the tick path keeps running meanwhile).

The digest is computed column-wise: per stream, every column's values in seq order are fed to their
own BLAKE3 hash (fixed-width little-endian values; strings as their lengths plus their UTF-8 bytes;
decimals as their decimal128 value at the schema's fixed scale), and the run digest is BLAKE3 over
each stream's name, row count and column digests, in :data:`OUTPUT_STREAMS` order. It changes
whenever any field of any event changes or events within a stream change order; it does not encode
how different streams interleave (each stream's own ``ts_recv`` and ``seq`` order it). Two runs agree
on it exactly when they produced the same events, in any process. BLAKE3, not sha256: a replay
hashes every value it writes, and BLAKE3 does that several times faster on one core with the same
256-bit strength.

The decision digest is the same hash without the columns in
:data:`engine.events.NON_DECISION_COLUMNS` (server measurements such as llama-server's
``prompt_ms``): two runs agree on it when they decided the same, however long the model took.
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from blake3 import blake3

from engine.events import NON_DECISION_COLUMNS, STREAM_OF_TYPE, STREAMS
from engine.store import sha256_file

# A run directory's layout version (replay and live write the same one): 2 added kev_breaker, the
# decision digest and input_quarantine.parquet; 3 hashes the digests with BLAKE3 (a version 2 run's
# digest is not comparable with a version 3 run's). A reader refuses another version with one line.
RUN_SCHEMA_VERSION: Final = 3
OUTPUT_STREAMS: Final = (
    "label",
    "kev_queue",
    "kev_request",
    "kev_response",
    "kev_breaker",
    "command",
    "risk",
    "order",
    "fill",
    "latency",
)

# Field names per stream in schema order without "seq": the layout of a row.
_ROW_FIELDS: Final = {
    s: tuple(f.name for f in dataclasses.fields(STREAMS[s].event_type) if f.name != "seq")
    for s in OUTPUT_STREAMS
}


# zstd at level 1 (on these files as small as the default level, and faster to write), and dictionary
# pages for string columns only: numbers (probabilities, prices, times) are nearly all distinct, and
# dictionary-encoding them makes the writing slower and the file larger. Ids that name one order each
# (client_oid, a latency span's ref) get no dictionary either: it overflows to plain pages after paying
# for the hashing. Integers (times, seqs, ids: rising, close together) are delta-encoded, and floats
# are byte-stream-split, so zstd sees their similar exponent bytes together. Min/max statistics are
# kept for numbers (a time range still skips row groups), not for strings, where comparing every value
# is a large share of the writing (figures: bench/HISTORY.md). DuckDB, polars and pyarrow read it all.
_ID_COLUMNS: Final = frozenset({"client_oid", "ref"})


def _parquet_options(schema: pa.Schema) -> dict[str, Any]:
    encoding = {}
    for f in schema:
        if pa.types.is_integer(f.type):
            encoding[f.name] = "DELTA_BINARY_PACKED"
        elif pa.types.is_floating(f.type):
            encoding[f.name] = "BYTE_STREAM_SPLIT"
    strings = [f.name for f in schema if pa.types.is_string(f.type)]
    return {
        "compression": "zstd",
        "compression_level": 1,
        "use_dictionary": [c for c in strings if c not in _ID_COLUMNS],
        "column_encoding": encoding,
        "write_statistics": [f.name for f in schema if f.name not in strings],
    }


_PARQUET_OPTIONS: Final = {s: _parquet_options(STREAMS[s].schema) for s in OUTPUT_STREAMS}


def rows_to_table(stream: str, rows: list[tuple[Any, ...]], first_seq: int) -> pa.Table:
    """Arrow table of a stream from rows (field values in schema order, ``seq`` left out)."""
    schema = STREAMS[stream].schema
    n = len(rows)
    cols = list(zip(*rows, strict=True)) if n else [()] * len(_ROW_FIELDS[stream])
    arrays = []
    it = iter(cols)
    for f in schema:
        if f.name == "seq":
            arrays.append(pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64)))
        else:
            arrays.append(pa.array(next(it), type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _u8(a: np.ndarray) -> np.ndarray:
    """A contiguous array's bytes as the uint8 view BLAKE3 takes (it refuses other item formats)."""
    return a.view(np.uint8)


class _StreamDigest:
    """One BLAKE3 hash per column (two for strings: lengths and bytes), fed chunk by chunk in seq order."""

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema
        self._h = {f.name: (blake3(), blake3()) for f in schema}

    def update(self, table: pa.Table) -> None:
        for f in self._schema:
            arr = table.column(f.name).combine_chunks()
            if arr.null_count:
                raise ValueError(f"null in non-nullable output column {f.name}")
            values, lengths = self._h[f.name]
            off, n = arr.offset, len(arr)
            if pa.types.is_string(f.type):
                offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[off : off + n + 1]
                data = arr.buffers()[2]
                if n and data is not None:
                    values.update(np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]])
                lengths.update(_u8(np.diff(offsets).astype("<i8")))
            elif pa.types.is_decimal(f.type):
                values.update(np.frombuffer(arr.buffers()[1], dtype=np.uint8)[off * 16 : (off + n) * 16])
            elif pa.types.is_boolean(f.type):
                values.update(arr.to_numpy(zero_copy_only=False).astype(np.uint8))
            elif pa.types.is_floating(f.type):
                # hashed in place (no copy) unless a NaN needs its one bit pattern, whatever produced it
                a = np.ascontiguousarray(arr.to_numpy(), dtype="<f8")
                nan = np.isnan(a)
                if nan.any():
                    a = a.copy()
                    a[nan] = np.nan
                values.update(_u8(a))
            else:
                values.update(_u8(np.ascontiguousarray(arr.to_numpy(), dtype="<i8")))

    def copy(self) -> _StreamDigest:
        d = _StreamDigest.__new__(_StreamDigest)
        d._schema = self._schema
        d._h = {k: (a.copy(), b.copy()) for k, (a, b) in self._h.items()}
        return d

    def hexdigests(self, skip: frozenset[str] = frozenset()) -> list[str]:
        return [f"{k}:{a.hexdigest()}:{b.hexdigest()}" for k, (a, b) in self._h.items() if k not in skip]


def _run_digest(
    digests: dict[str, _StreamDigest], counts: dict[str, int], skip: dict[str, frozenset[str]]
) -> str:
    h = blake3()
    for stream in OUTPUT_STREAMS:
        h.update(f"{stream}\t{counts[stream]}\n".encode())
        h.update("\n".join(digests[stream].hexdigests(skip.get(stream, frozenset()))).encode())
    return h.hexdigest()


def digest_tables(tables: dict[str, pa.Table]) -> tuple[str, str]:
    """``(digest, decision digest)`` of a whole event log given as one table per output stream (a
    missing stream counts as empty): what :class:`EventLog` reports for the same events."""
    digests = {s: _StreamDigest(STREAMS[s].schema) for s in OUTPUT_STREAMS}
    counts = dict.fromkeys(OUTPUT_STREAMS, 0)
    for s, table in tables.items():
        digests[s].update(table)
        counts[s] = table.num_rows
    return _run_digest(digests, counts, {}), _run_digest(digests, counts, NON_DECISION_COLUMNS)


# rows(first_seq, n, consume) -> the table of events first_seq .. first_seq + n - 1 of a stream whose
# events a caller keeps as columns; consume=False is a look (the digest of a log not yet flushed).
ColumnRows = Callable[[int, int, bool], pa.Table]
# pending() -> how many of those events the caller holds that the log has not flushed yet.
ColumnCount = Callable[[], int]


class EventLog:
    """Collects output events. With ``events_dir`` they stream to ``<events_dir>/<stream>.parquet``;
    without, they stay in memory until :meth:`write`."""

    # Rows wait as Python tuples until their stream flushes, up to flush_rows per stream: 16 384 keeps
    # the 1M-snapshot replay with the strategy trading at 1.37 GB peak RSS instead of 1.47 GB (same
    # digest, same speed: bench/bench_replay_1m.py --loss-stop-usd 1e12).
    def __init__(self, events_dir: Path | None = None, *, flush_rows: int = 16_384) -> None:
        self._buf: dict[str, list[tuple[Any, ...]]] = {s: [] for s in OUTPUT_STREAMS}
        self._n: dict[str, int] = dict.fromkeys(OUTPUT_STREAMS, 0)
        self._flushed: dict[str, int] = dict.fromkeys(OUTPUT_STREAMS, 0)  # rows already hashed/written
        self._digests = {s: _StreamDigest(STREAMS[s].schema) for s in OUTPUT_STREAMS}
        self._dir = events_dir
        self._flush_rows = flush_rows
        self._writers: dict[str, pq.ParquetWriter] = {}
        self._columns: dict[str, tuple[ColumnRows, ColumnCount]] = {}  # streams kept as columns by a caller
        self._io: ThreadPoolExecutor | None = None  # one thread: writes happen in submission order
        self._io_pending: deque[Future[None]] = deque()

    @property
    def count(self) -> int:
        return sum(self.counts().values())

    @property
    def flush_rows(self) -> int:
        return self._flush_rows

    def _count(self, stream: str) -> int:
        cols = self._columns.get(stream)
        return self._n[stream] if cols is None else self._flushed[stream] + cols[1]()

    def next_seq(self, stream: str) -> int:
        return self._count(stream)

    def append(self, stream: str, row: tuple[Any, ...]) -> int:
        """Record one event given as a row (schema order, no ``seq``); returns its seq. The tick path's
        way in: no event object is built."""
        buf = self._buf[stream]
        buf.append(row)
        seq = self._n[stream]
        self._n[stream] = seq + 1
        if len(buf) >= self._flush_rows and self._dir is not None:
            self._flush(stream)
        return seq

    def attach_columns(self, stream: str, rows: ColumnRows, pending: ColumnCount) -> None:
        """From now on the caller keeps ``stream``'s events as columns: ``pending()`` says how many it
        holds unflushed, ``rows`` gives them as a table, and the caller calls :meth:`flush` once it
        holds :attr:`flush_rows` of them. The files, flush points and digest are the same as if every
        event had been appended as a row."""
        if self._n[stream] or self._buf[stream]:
            raise ValueError(f"stream {stream} already has events")
        self._columns[stream] = (rows, pending)

    def flush(self, stream: str) -> None:
        """Write ``stream``'s pending events now (streaming logs; a no-op in memory)."""
        if self._dir is not None:
            self._flush(stream)

    def _pending(self, stream: str, consume: bool) -> pa.Table | None:
        cols = self._columns.get(stream)
        if cols is not None:
            n = cols[1]()  # may hand rows over first: the first seq is read after it
            return cols[0](self._flushed[stream], n, consume) if n else None
        first = self._flushed[stream]
        buf = self._buf[stream]
        if not buf:
            return None
        if consume:
            self._buf[stream] = []
        return rows_to_table(stream, buf, first)

    def emit(self, event_type: type, **fields: Any) -> Any:
        """Build an event with its stream's next ``seq``, record it and return it."""
        stream = STREAM_OF_TYPE[event_type]
        event = event_type(seq=self._n[stream], **fields)
        self.append(stream, tuple(fields[n] for n in _ROW_FIELDS[stream]))
        return event

    def _flush(self, stream: str) -> None:
        assert self._dir is not None
        table = self._pending(stream, consume=True)
        if table is None:
            return
        self._digests[stream].update(table)
        self._flushed[stream] += table.num_rows
        w = self._writers.get(stream)
        if w is None:
            w = self._writers[stream] = pq.ParquetWriter(
                self._dir / f"{stream}.parquet", STREAMS[stream].schema, **_PARQUET_OPTIONS[stream]
            )
        if self._io is None:
            self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eventlog")
        pending = self._io_pending
        pending.append(self._io.submit(w.write_table, table))
        while len(pending) > 4 or (pending and pending[0].done()):  # bounded: memory stays flat
            pending.popleft().result()  # re-raises a failed write here

    def _drain(self) -> None:
        """Wait for every queued row group (raising the first failure)."""
        while self._io_pending:
            self._io_pending.popleft().result()
        if self._io is not None:
            self._io.shutdown()
            self._io = None

    def abandon(self) -> None:
        """Stop writing without finishing: queued row groups are waited for, files closed as they are
        (the caller throws the run directory away)."""
        try:
            self._drain()
        finally:
            for w in self._writers.values():
                w.close()
            self._writers.clear()

    def events(self, stream: str) -> list[Any]:
        """Events still in memory (all of them when not streaming), as event objects."""
        table = self._pending(stream, consume=False)
        cls = STREAMS[stream].event_type
        return [] if table is None else [cls(**r) for r in table.to_pylist()]

    def _current_digests(self) -> dict[str, _StreamDigest]:
        out = {}
        for stream in OUTPUT_STREAMS:
            d = self._digests[stream]
            pending = self._pending(stream, consume=False)
            if pending is not None:
                d = d.copy()
                d.update(pending)
            out[stream] = d
        return out

    @property
    def digest(self) -> str:
        return _run_digest(self._current_digests(), self.counts(), {})

    @property
    def decision_digest(self) -> str:
        """The digest without the :data:`~engine.events.NON_DECISION_COLUMNS` (server measurements)."""
        return _run_digest(self._current_digests(), self.counts(), NON_DECISION_COLUMNS)

    def counts(self) -> dict[str, int]:
        return {s: self._count(s) for s in OUTPUT_STREAMS}

    def write(self, events_dir: Path | None = None) -> dict[str, dict[str, Any]]:
        """Finish: one Parquet file per output stream (empty ones too, so queries never miss a table)."""
        target = events_dir or self._dir
        if target is None:
            raise ValueError("EventLog.write needs a directory when the log was not streaming")
        if self._dir is not None and target != self._dir:
            raise ValueError(f"this log streams to {self._dir}, not {target}")
        self._dir = target
        files = {}
        for stream in OUTPUT_STREAMS:
            self._flush(stream)
        self._drain()
        for stream in OUTPUT_STREAMS:
            w = self._writers.pop(stream, None)
            path = target / f"{stream}.parquet"
            if w is not None:
                w.close()
            else:
                pq.write_table(STREAMS[stream].schema.empty_table(), path, **_PARQUET_OPTIONS[stream])
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
            files[f"events/{stream}.parquet"] = {"rows": self._count(stream), "sha256": sha256_file(path)}
        return files
