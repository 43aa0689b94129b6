"""The live run's write-ahead journal (``<run>.tmp/orders.wal``): what the engine decided and heard,
durable before the venue hears of it, so ``dualhub recover`` can rebuild a run killed with ``kill -9``.

What goes in: every row of the engine's event log (labels, Kev queue/requests/answers/breaker and
commands, risk decisions, order intents, sends, acks, cancels, rejects, fills, latency spans), the
delays the run observed (``latency_recorded``), every Kev answer as its cassette entry, and the run's
own events (reconcile, venue status, quarantined inputs). A header record first holds the static part
of the run's manifest (config, model, contracts, the venue's client-oid tag).

Format: the magic line ``DHWAL1\\n``, then records ``u32 length | u32 crc32 | payload`` (little
endian), payload = one type byte + body. A reader stops at the first record that is incomplete (a
torn tail: the write a crash cut short, ignored) or whose CRC does not match (reported with its byte
offset: nothing after it is trusted), never with a traceback.

When is what durable (the policy docs/ARCHITECTURE.md states, bench/bench_wal.py measures):

- appending is a list append in memory: the tick path makes no system call for the journal;
- :meth:`LiveWal.commit` serialises what is pending and writes it with one ``write(2)``. The runner
  commits at the end of every event-loop turn in which the engine's core produced a row (an order, a
  cancel, a risk decision, a fill, an ack, a Kev request or answer, a command), before the loop gets
  control back: a REST request the turn caused is sent only after its intent is in the kernel's page
  cache, and the next event is handled after it. Labels and latencies wait for the next such turn or
  the periodic flush (``flush_interval_ms``). A committed record survives the process dying (kill -9,
  a crash, an OOM kill);
- a background thread ``fsync``s the file every ``fsync_ms`` when something was written (group
  commit): a committed record survives an OS crash or power loss at most ``fsync_ms`` later.
  ``fsync_ms=0`` fsyncs inside every commit instead (on the loop: each costs a disk flush).
"""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engine.eventlog import OUTPUT_STREAMS, EventLog
from engine.events import STREAMS
from engine.latency.recorded import LatencySink
from engine.store import fsync_dir

WAL_FILE: Final = "orders.wal"
MAGIC: Final = b"DHWAL1\n"
_HEAD = struct.Struct("<II")  # payload length, crc32 of the payload
MAX_RECORD: Final = 256 << 20  # a length beyond this is damage, not a record

# record types (the payload's first byte)
HEADER, ROWS, TABLE, LATENCY, EVENT, CASSETTE, NOTE = b"H", b"R", b"T", b"L", b"E", b"K", b"N"
EVENT_STREAMS: Final = ("reconcile", "venue_status", "input_quarantine")  # the runner's own events


def _default(o: Any) -> Any:
    if isinstance(o, Decimal):
        return str(o)
    raise TypeError(type(o).__name__)


_DUMP_OPTS = orjson.OPT_SERIALIZE_NUMPY


class WalWriter:
    """Framing, buffering, writing and the fsync policy of one journal file."""

    def __init__(self, path: Path | str, *, fsync_ms: int = 50) -> None:
        self.path = Path(path)
        self.fsync_ms = fsync_ms
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._buf = bytearray(MAGIC)
        self.records = 0
        self.bytes = 0
        self.commits = 0
        self.fsyncs = 0
        self.fsync_ns: list[int] = []  # each fsync's duration (the bench and the manifest read them)
        self._written = 0  # commits written / fsynced: the thread syncs when they differ
        self._synced = 0
        self._lock = threading.Lock()  # close vs the fsync thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.commit()
        os.fsync(self._fd)
        fsync_dir(self.path.parent)  # the file itself survives a power cut from here on
        if fsync_ms > 0:
            self._thread = threading.Thread(target=self._sync_loop, name="wal-fsync", daemon=True)
            self._thread.start()

    def add(self, kind: bytes, body: bytes) -> None:
        payload = kind + body
        self._buf += _HEAD.pack(len(payload), zlib.crc32(payload))
        self._buf += payload
        self.records += 1

    @property
    def pending(self) -> int:
        return len(self._buf)

    def commit(self) -> int:
        """Write what is buffered (one ``write(2)``, more only if the kernel takes less); bytes written."""
        buf = self._buf
        if not buf:
            return 0
        view = memoryview(buf)
        done = 0
        while done < len(buf):
            done += os.write(self._fd, view[done:])
        view.release()
        self._buf = bytearray()
        self.bytes += done
        self.commits += 1
        self._written += 1
        if self.fsync_ms == 0:
            self._fsync()
        return done

    def _fsync(self) -> None:
        with self._lock:
            if self._fd < 0:
                return
            seen = self._written
            t0 = time.perf_counter_ns()
            os.fsync(self._fd)
            self.fsync_ns.append(time.perf_counter_ns() - t0)
            self.fsyncs += 1
            self._synced = seen

    def _sync_loop(self) -> None:
        while not self._stop.wait(self.fsync_ms / 1000):
            if self._written != self._synced:
                try:
                    self._fsync()
                except OSError:  # the disk failed: close() raises it where it can be reported
                    return

    def close(self) -> None:
        self.commit()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._fsync()
        with self._lock:
            os.close(self._fd)
            self._fd = -1

    def stats(self) -> dict[str, Any]:
        lat = sorted(self.fsync_ns)
        return {
            "file": self.path.name,
            "records": self.records,
            "bytes": self.bytes,
            "commits": self.commits,
            "fsync_ms": self.fsync_ms,
            "fsyncs": self.fsyncs,
            "fsync_p50_us": lat[len(lat) // 2] // 1000 if lat else 0,
            "fsync_max_us": lat[-1] // 1000 if lat else 0,
        }


class LiveWal:
    """What the run appends, kept in memory until :meth:`commit` serialises and writes it."""

    def __init__(self, path: Path | str, header: dict[str, Any], *, fsync_ms: int = 50) -> None:
        self.writer = WalWriter(path, fsync_ms=fsync_ms)
        self.rows: list[tuple[str, tuple[Any, ...]]] = []  # Python-appended event rows (label, ...)
        self.tables: list[tuple[str, pa.Table]] = []  # the core's rows, as the log gets them
        self.latency: list[tuple[str, int, int]] = []
        self.writer.add(HEADER, orjson.dumps(header, default=_default))
        self.writer.commit()
        self.closed = False

    def event(self, stream: str, ev: Any) -> None:
        """One of the runner's own events (:data:`EVENT_STREAMS`), a dataclass of engine.events."""
        body = {"s": stream, "e": dataclasses.asdict(ev)}
        self.writer.add(EVENT, orjson.dumps(body, default=_default, option=_DUMP_OPTS))

    def cassette(self, slot: int, entry: Any) -> None:
        """A Kev answer as its cassette entry; ``slot``: its request's place in request order."""
        body = {"slot": slot, "entry": dataclasses.asdict(entry)}
        self.writer.add(CASSETTE, orjson.dumps(body, option=_DUMP_OPTS))

    def note(self, obj: dict[str, Any]) -> None:
        self.writer.add(NOTE, orjson.dumps(obj, default=_default, option=_DUMP_OPTS))

    def commit(self) -> int:
        if self.closed:
            return 0
        w = self.writer
        if self.rows:
            by: dict[str, list[tuple[Any, ...]]] = {}
            for stream, row in self.rows:
                by.setdefault(stream, []).append(row)
            self.rows.clear()  # the same list: JournaledLog holds its append
            for stream, rows in by.items():
                w.add(ROWS, orjson.dumps({"s": stream, "r": rows}, default=_default, option=_DUMP_OPTS))
        if self.tables:
            for stream, table in self.tables:
                name = stream.encode()
                # an IPC record batch message alone (its schema is the stream's): a quarter of the
                # cost of a whole IPC stream per table, and this runs after every order turn
                for batch in table.to_batches():
                    w.add(TABLE, bytes([len(name)]) + name + batch.serialize().to_pybytes())
            self.tables = []
        if self.latency:
            w.add(LATENCY, orjson.dumps(self.latency))
            self.latency = []
        return w.commit()

    def close(self) -> dict[str, Any]:
        if not self.closed:
            self.commit()
            self.writer.close()
            self.closed = True
        return self.writer.stats()


class JournaledLog(EventLog):
    """The run's event log, every row also on its way into the journal: rows appended by Python
    (labels, Kev breaker changes) as they come, the core's rows as it hands them over
    (:meth:`watch`)."""

    def __init__(self, events_dir: Path | None, wal: LiveWal) -> None:
        super().__init__(events_dir)
        self.wal = wal
        self._journal = wal.rows.append  # a label per frame: no attribute lookups on the way

    def append(self, stream: str, row: tuple[Any, ...]) -> int:
        self._journal((stream, row))
        return EventLog.append(self, stream, row)

    def watch(self, streams: dict[str, Any]) -> None:
        """The core's output streams (``engine.state._KernelStream``, by name): each table a stream is
        handed is journaled first. A portfolio's engines share one set: it is wrapped once."""
        for name, ks in streams.items():
            if getattr(ks, "wal_watched", False):
                continue

            def journaled(
                table: pa.Table, _add: Any = ks.add, _name: str = name, _wal: LiveWal = self.wal
            ) -> None:
                if table.num_rows:
                    _wal.tables.append((_name, table))
                _add(table)

            ks.add = journaled
            ks.wal_watched = True


class JournaledSink(LatencySink):
    """The recorded delays, each also on its way into the journal."""

    def __init__(self, wal: LiveWal) -> None:
        super().__init__()
        self.wal = wal

    def add(self, kind: str, ts_ns: int, dur_ns: int) -> None:
        super().add(kind, ts_ns, dur_ns)
        self.wal.latency.append((kind, int(ts_ns), int(dur_ns)))


# ---------------------------------------------------------------------------------------------- reading


@dataclass
class WalScan:
    """A journal read back: its records in order, how much of the file they cover, and why the read
    stopped early (``problem``: one line, "" when the whole file was read)."""

    path: Path
    records: list[tuple[bytes, bytes]] = field(default_factory=list)
    good_bytes: int = 0
    total_bytes: int = 0
    problem: str = ""


def scan_wal(path: Path | str) -> WalScan:
    """Every intact record up to the first torn or damaged one (never raises on the file's content)."""
    path = Path(path)
    scan = WalScan(path)
    data = path.read_bytes()
    scan.total_bytes = len(data)
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):  # a crash right after the file was made
            scan.problem = f"{path.name}: torn header ({len(data)} bytes): an empty journal"
        else:
            scan.problem = f"{path.name}: not a dualhub live journal (no {MAGIC!r} header)"
        return scan
    pos = len(MAGIC)
    n = 0
    while pos < len(data):
        rest = len(data) - pos
        if rest < _HEAD.size:
            scan.problem = f"{path.name}: torn tail: the last {rest} bytes are an incomplete record (ignored)"
            break
        length, crc = _HEAD.unpack_from(data, pos)
        if length == 0 or length > MAX_RECORD:
            scan.problem = (
                f"{path.name}: record {n} at byte {pos}: impossible length {length}; "
                f"the {rest} bytes from there are ignored"
            )
            break
        end = pos + _HEAD.size + length
        if end > len(data):
            scan.problem = f"{path.name}: torn tail: the last {rest} bytes are an incomplete record (ignored)"
            break
        payload = data[pos + _HEAD.size : end]
        if zlib.crc32(payload) != crc:
            scan.problem = (
                f"{path.name}: record {n} at byte {pos}: CRC mismatch; "
                f"the {rest} bytes from there are ignored"
            )
            break
        scan.records.append((payload[:1], payload[1:]))
        pos = end
        n += 1
    scan.good_bytes = pos if data.startswith(MAGIC) else 0
    return scan


@dataclass
class WalContent:
    """A journal decoded: what a run directory is rebuilt from."""

    scan: WalScan
    header: dict[str, Any] = field(default_factory=dict)
    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    tables: dict[str, list[pa.Table]] = field(default_factory=dict)
    latency: list[tuple[str, int, int]] = field(default_factory=list)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    cassette: dict[int, dict[str, Any]] = field(default_factory=dict)
    notes: list[dict[str, Any]] = field(default_factory=list)
    last_ts_ns: int = 0  # the latest ts_recv of any event journaled

    def stream_rows(self, stream: str) -> int:
        return len(self.rows.get(stream, ())) + sum(t.num_rows for t in self.tables.get(stream, ()))


_NO_SEQ: dict[str, pa.Schema] = {}


def _no_seq(stream: str) -> pa.Schema:
    """A stream's schema without ``seq``: the core's tables' (a table record is one of its batches)."""
    s = _NO_SEQ.get(stream)
    if s is None:
        s = _NO_SEQ[stream] = pa.schema([f for f in STREAMS[stream].schema if f.name != "seq"])
    return s


def _decimal_fields(stream: str) -> list[int]:
    """Positions (in a row without seq) of a stream's decimal columns: JSON carries them as text."""
    names = [f for f in STREAMS[stream].schema if f.name != "seq"]
    return [i for i, f in enumerate(names) if pa.types.is_decimal(f.type)]


def load_wal(path: Path | str) -> WalContent:
    """Decode every intact record; a record that passes its CRC and still cannot be decoded ends the
    read there as a damaged one does (``scan.problem``)."""
    scan = scan_wal(path)
    out = WalContent(scan)
    for i, (kind, body) in enumerate(scan.records):
        try:
            _decode(out, kind, body)
        except Exception as e:  # a record that passed its CRC and still cannot be read: stop, one line
            why = f"{type(e).__name__}: {str(e)[:200]}"
            scan.problem = (
                f"{scan.path.name}: record {i} ({kind.decode(errors='replace')}) cannot be decoded ({why})"
            )
            scan.records = scan.records[:i]
            break
    return out


def _decode(out: WalContent, kind: bytes, body: bytes) -> None:
    if kind == HEADER:
        out.header = orjson.loads(body)
    elif kind == ROWS:
        obj = orjson.loads(body)
        stream = obj["s"]
        if stream not in OUTPUT_STREAMS:
            raise ValueError(f"unknown stream {stream!r}")
        dec = _decimal_fields(stream)
        rows = [tuple(r) for r in obj["r"]]
        if dec:
            rows = [tuple(Decimal(v) if j in dec else v for j, v in enumerate(r)) for r in rows]
        out.rows.setdefault(stream, []).extend(rows)
        if rows:
            out.last_ts_ns = max(out.last_ts_ns, max(int(r[1]) for r in rows))
    elif kind == TABLE:
        n = body[0]
        stream = body[1 : 1 + n].decode()
        if stream not in OUTPUT_STREAMS:
            raise ValueError(f"unknown stream {stream!r}")
        batch = pa.ipc.read_record_batch(pa.py_buffer(body[1 + n :]), _no_seq(stream))
        table = pa.Table.from_batches([batch])
        out.tables.setdefault(stream, []).append(table)
        if table.num_rows:
            out.last_ts_ns = max(out.last_ts_ns, int(pc.max(table.column("ts_recv")).as_py()))
    elif kind == LATENCY:
        out.latency.extend((k, int(t), int(d)) for k, t, d in orjson.loads(body))
    elif kind == EVENT:
        obj = orjson.loads(body)
        if obj["s"] not in EVENT_STREAMS:
            raise ValueError(f"unknown event stream {obj['s']!r}")
        out.events.setdefault(obj["s"], []).append(obj["e"])
    elif kind == CASSETTE:
        obj = orjson.loads(body)
        out.cassette[int(obj["slot"])] = obj["entry"]
    elif kind == NOTE:
        out.notes.append(orjson.loads(body))
    else:
        raise ValueError(f"unknown record type {kind!r}")
