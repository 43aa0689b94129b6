"""The engine's event log: per-stream sequence numbers, a running digest, Parquet output.

The digest is sha256 over every emitted event in emit order (stream name plus the event's values
as canonical JSON), so two runs agree on it exactly when they produced the same events in the same
order.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import orjson

from engine.events import STREAM_OF_TYPE, STREAMS, event_values, events_to_table
from engine.store import atomic_write_parquet, sha256_file

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
    def __init__(self) -> None:
        self._events: dict[str, list[Any]] = {s: [] for s in OUTPUT_STREAMS}
        self._hash = hashlib.sha256()
        self.count = 0

    def next_seq(self, stream: str) -> int:
        return len(self._events[stream])

    def emit(self, event_type: type, **fields: Any) -> Any:
        """Build an event with its stream's next ``seq``, record it and return it."""
        stream = STREAM_OF_TYPE[event_type]
        buf = self._events[stream]
        event = event_type(seq=len(buf), **fields)
        buf.append(event)
        self._hash.update(stream.encode())
        self._hash.update(orjson.dumps(event_values(event), default=_default))
        self.count += 1
        return event

    def events(self, stream: str) -> list[Any]:
        return self._events[stream]

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()

    def counts(self) -> dict[str, int]:
        return {s: len(v) for s, v in self._events.items()}

    def write(self, events_dir: Path) -> dict[str, dict[str, Any]]:
        """Write one Parquet file per output stream (empty streams too, so queries never miss a table)."""
        files = {}
        for stream in OUTPUT_STREAMS:
            evs = self._events[stream]
            table = events_to_table(evs, stream) if evs else STREAMS[stream].schema.empty_table()
            path = events_dir / f"{stream}.parquet"
            atomic_write_parquet(table, path)
            files[f"events/{stream}.parquet"] = {"rows": len(evs), "sha256": sha256_file(path)}
        return files
