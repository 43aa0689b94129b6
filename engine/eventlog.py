"""The engine's event log: per-stream sequence numbers, a running digest, streamed Parquet output.

The digest is sha256 over every emitted event in emit order (stream name, seq, and the event's
fields as canonical JSON with sorted keys), so two runs agree on it exactly when they produced the
same events in the same order. Events are buffered per stream and written as Parquet row groups
every ``flush_rows`` events, so memory stays flat however long the run; flush points depend only on
counts, so the bytes of the output files are as deterministic as the events.
"""

from __future__ import annotations

import hashlib
import os
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow.parquet as pq

from engine.events import STREAM_OF_TYPE, STREAMS, events_to_table
from engine.store import sha256_file

OUTPUT_STREAMS: Final = (
    "label",
    "kev_queue",
    "kev_request",
    "kev_response",
    "command",
    "risk",
    "order",
    "fill",
    "latency",
)


def _default(o: Any) -> Any:
    if isinstance(o, Decimal):
        return str(o)
    raise TypeError(f"cannot digest {type(o).__name__}")


class EventLog:
    """Collects output events. With ``events_dir`` they stream to ``<events_dir>/<stream>.parquet``;
    without, they stay in memory until :meth:`write`."""

    def __init__(self, events_dir: Path | None = None, *, flush_rows: int = 65_536) -> None:
        self._buf: dict[str, list[Any]] = {s: [] for s in OUTPUT_STREAMS}
        self._n: dict[str, int] = dict.fromkeys(OUTPUT_STREAMS, 0)
        self._hash = hashlib.sha256()
        self._dir = events_dir
        self._flush_rows = flush_rows
        self._writers: dict[str, pq.ParquetWriter] = {}
        self.count = 0

    def next_seq(self, stream: str) -> int:
        return self._n[stream]

    def emit(self, event_type: type, **fields: Any) -> Any:
        """Build an event with its stream's next ``seq``, record it and return it."""
        stream = STREAM_OF_TYPE[event_type]
        seq = self._n[stream]
        event = event_type(seq=seq, **fields)
        self._n[stream] = seq + 1
        buf = self._buf[stream]
        buf.append(event)
        self._hash.update(b"%s\t%d\t" % (stream.encode(), seq))
        self._hash.update(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS, default=_default))
        self.count += 1
        if self._dir is not None and len(buf) >= self._flush_rows:
            self._flush(stream)
        return event

    def _flush(self, stream: str) -> None:
        assert self._dir is not None
        buf = self._buf[stream]
        if not buf:
            return
        w = self._writers.get(stream)
        if w is None:
            w = self._writers[stream] = pq.ParquetWriter(
                self._dir / f"{stream}.parquet", STREAMS[stream].schema, compression="zstd"
            )
        w.write_table(events_to_table(buf, stream))
        self._buf[stream] = []

    def events(self, stream: str) -> list[Any]:
        """Events still in memory (all of them when not streaming)."""
        return self._buf[stream]

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()

    def counts(self) -> dict[str, int]:
        return dict(self._n)

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
            w = self._writers.pop(stream, None)
            path = target / f"{stream}.parquet"
            if w is not None:
                w.close()
            else:
                pq.write_table(STREAMS[stream].schema.empty_table(), path, compression="zstd")
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
            files[f"events/{stream}.parquet"] = {"rows": self._n[stream], "sha256": sha256_file(path)}
        return files
