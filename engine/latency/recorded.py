"""Recorded delays: what live mode observed, replayed exactly by ``recorded:KIND@RUN_DIR`` latency specs.

Live mode wraps every latency model it uses in :class:`RecordingLatency`, which appends
``(kind, ts_ns, dur_ns)`` to the run's ``latency_recorded.parquet`` in order of occurrence:

- ``laya``: per book, keyed by the book's receive time (Laya's measured compute latency);
- ``order_entry`` / ``order_response`` / ``cancel``: per call of the paper exchange's models, keyed by
  the send (or exchange) time; with the Bitget gateway, ``order_entry`` is send -> ack and ``cancel``
  send -> cancel ack, as observed;
- ``kev``: per request (also in ``kev_response.lag_ns``, which the cassette replays).

:class:`RecordedLatency` answers ``sample_ns(ts)`` with the recorded durations at ``ts``, in the order
they were recorded; a time that was never recorded (a replay that took another path) gets the
median of the kind and is counted in :attr:`RecordedLatency.misses`.
"""

from __future__ import annotations

import statistics
from collections import deque
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from engine.events import Nanos
from engine.latency.models import LatencyModel
from engine.store import atomic_write_parquet

RECORDED_FILE: Final = "latency_recorded.parquet"
KINDS: Final = ("laya", "order_entry", "order_response", "cancel", "kev")
SCHEMA: Final = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("dur_ns", pa.int64(), nullable=False),
    ],
    metadata={"dualhub.kind": "latency_recorded"},
)


class LatencySink:
    """Collects recorded delays in order of occurrence."""

    def __init__(self) -> None:
        self.kind: list[str] = []
        self.ts: list[int] = []
        self.dur: list[int] = []

    def add(self, kind: str, ts_ns: Nanos, dur_ns: Nanos) -> None:
        self.kind.append(kind)
        self.ts.append(int(ts_ns))
        self.dur.append(int(dur_ns))

    def __len__(self) -> int:
        return len(self.kind)

    def table(self) -> pa.Table:
        return pa.Table.from_pydict({"kind": self.kind, "ts_ns": self.ts, "dur_ns": self.dur}, schema=SCHEMA)

    def write(self, run_dir: Path) -> Path:
        path = Path(run_dir) / RECORDED_FILE
        atomic_write_parquet(self.table(), path)
        return path


class RecordingLatency:
    """Wraps a latency model and records every sample it hands out."""

    def __init__(self, inner: LatencyModel, kind: str, sink: LatencySink) -> None:
        self.inner, self.kind, self.sink = inner, kind, sink

    def sample_ns(self, ts_ns: Nanos) -> Nanos:
        d = self.inner.sample_ns(ts_ns)
        self.sink.add(self.kind, ts_ns, d)
        return d


class RecordedLatency:
    """Recorded delays replayed by key (the time passed to ``sample_ns``), in order of occurrence."""

    def __init__(self, kind: str, ts_ns: list[int], dur_ns: list[int]) -> None:
        self.kind = kind
        self._by_ts: dict[int, deque[int]] = {}
        for t, d in zip(ts_ns, dur_ns, strict=True):
            self._by_ts.setdefault(t, deque()).append(d)
        self.fallback_ns = int(statistics.median(dur_ns)) if dur_ns else 0
        self.n = len(dur_ns)
        self.misses = 0

    def sample_ns(self, ts_ns: Nanos) -> Nanos:
        q = self._by_ts.get(ts_ns)
        if q:
            return q.popleft()
        self.misses += 1
        return self.fallback_ns

    @classmethod
    def from_run(cls, run_dir: Path | str, kind: str) -> RecordedLatency:
        if kind not in KINDS:
            raise ValueError(f"recorded latency kind {kind!r} is not one of {', '.join(KINDS)}")
        path = Path(run_dir) / RECORDED_FILE
        if not path.exists():
            raise ValueError(f"{run_dir} has no {RECORDED_FILE} (not a live run?)")
        t = pq.read_table(path)
        kinds = t.column("kind").to_pylist()
        ts, dur = t.column("ts_ns").to_pylist(), t.column("dur_ns").to_pylist()
        keep = [i for i, k in enumerate(kinds) if k == kind]
        return cls(kind, [ts[i] for i in keep], [dur[i] for i in keep])


def parse_recorded(arg: str) -> RecordedLatency:
    """``KIND@RUN_DIR`` (the part of a ``recorded:KIND@RUN_DIR`` spec after the colon)."""
    kind, sep, path = arg.partition("@")
    if not sep or not path:
        raise ValueError(f"recorded latency needs KIND@RUN_DIR (kinds: {', '.join(KINDS)}), got {arg!r}")
    return RecordedLatency.from_run(path, kind)
