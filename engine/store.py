"""Session store: one directory per session, one Parquet dataset per stream, a manifest.

Layout::

    <session>/manifest.json          symbols, time span, source, schema version, file hashes
    <session>/<stream>/part-00000.parquet
    <session>/runs/<run>/...         replay outputs (see engine.eventlog)

Every file is written to ``<name>.tmp``, fsynced, then renamed, so a crash never leaves a half
file under a final name; readers only ever look at ``*.parquet``.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from blake3 import blake3

from engine.errors import DualhubError
from engine.events import SCHEMA_VERSION, STREAMS, events_to_table, stream_of, table_to_events

MANIFEST = "manifest.json"


class SessionError(DualhubError):
    """A session directory that is missing, incomplete or fails its hash check."""


class SeqOrderError(SessionError, ValueError):
    """A stream's seqs that do not rise strictly (a repeated seq: a broken recording)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def blake3_file(path: Path) -> str:
    # read a MB at a time into one buffer, not mapped: a mapped file's pages count in the process's
    # resident memory while it is hashed, and a replay checks its session's books first
    h = blake3(max_threads=1)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


# A session file's hash, by the name its manifest gives it. Sessions are written with BLAKE3, several
# times faster than sha256 here, as every replay checks every file it reads; sessions written before
# keep their sha256, still checked.
FILE_HASHES: dict[str, Callable[[Path], str]] = {"blake3": blake3_file, "sha256": sha256_file}


def file_hash(meta: Any) -> tuple[str, str] | None:
    """``(algorithm, hex)`` of a manifest's file entry, or None when it names no hash."""
    if isinstance(meta, dict):
        for algo in FILE_HASHES:
            if isinstance(meta.get(algo), str):
                return algo, meta[algo]
    return None


def _listed_hash(meta: Any) -> tuple[str, str]:
    """:func:`file_hash` of an entry of an opened session's manifest (``open_session`` refused one
    naming no hash)."""
    entry = file_hash(meta)
    assert entry is not None
    return entry


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _staged(path: Path) -> Iterator[Path]:
    """``path.tmp`` to write, renamed onto ``path`` when the block succeeds and removed when it fails
    (a full disk, Ctrl-C): never a half-written file under either name."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with _staged(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# Row groups of 65 536 rows: a replay streams the book levels a row group at a time
# (replay/book_source.py), so its memory does not grow with the session.
ROW_GROUP_ROWS = 65_536
# A session's parts are LZ4: every replay reads every book level, and LZ4 pages decompress in about
# half zstd's time, for files somewhat larger (figures: bench/HISTORY.md).
SESSION_COMPRESSION = "lz4"


def atomic_write_parquet(table: pa.Table, path: Path, *, compression: str = "zstd") -> None:
    """Write ``table`` to ``path`` via ``path.tmp`` + fsync + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _staged(path) as tmp:
        pq.write_table(
            table, tmp, compression=compression, write_statistics=True, row_group_size=ROW_GROUP_ROWS
        )
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())


def write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


class SessionWriter:
    """Buffers typed events per stream and writes rotating Parquet parts, then the manifest."""

    def __init__(
        self,
        root: Path | str,
        *,
        source: str,
        symbols: Iterable[str],
        rows_per_part: int = 1_000_000,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        if (self.root / MANIFEST).exists():
            raise SessionError(f"{self.root} already holds a finished session")
        self.source = source
        self.symbols = sorted(set(symbols))
        self.rows_per_part = rows_per_part
        self.extra = extra or {}
        reserved = {"schema_version", "source", "symbols", "streams", "ts_recv_min", "ts_recv_max", "files"}
        if clash := sorted(reserved & set(self.extra)):
            raise ValueError(f"manifest extra keys {clash} would overwrite core manifest fields")
        self._buf: dict[str, list[Any]] = {}
        self._parts: dict[str, int] = {}
        self._files: dict[str, dict[str, Any]] = {}
        self._counts: dict[str, int] = {}
        self._span: list[int] = []

    def add(self, event: Any) -> None:
        stream = stream_of(event)
        buf = self._buf.setdefault(stream, [])
        buf.append(event)
        if len(buf) >= self.rows_per_part:
            self._flush_stream(stream)

    def add_table(self, stream: str, table: pa.Table) -> None:
        """Add already-columnar rows (importers, converters): cast to the stream's schema, then written
        like any other part."""
        self._flush_stream(stream)
        table = table.select(STREAMS[stream].schema.names).cast(STREAMS[stream].schema)
        if table.num_rows:
            recv = table.column("ts_recv")
            self._span.extend((pc.min(recv).as_py(), pc.max(recv).as_py()))
        self._write_part(stream, table)

    def add_all(self, events: Iterable[Any]) -> None:
        for e in events:
            self.add(e)

    def _flush_stream(self, stream: str) -> None:
        events = self._buf.get(stream)
        if not events:
            return
        recv = [e.ts_recv for e in events]
        self._span.extend((min(recv), max(recv)))
        self._write_part(stream, events_to_table(events, stream))
        self._buf[stream] = []

    def _write_part(self, stream: str, table: pa.Table) -> None:
        """The stream's next part file, counted and listed with its hash."""
        part = self._parts.get(stream, 0)
        rel = f"{stream}/part-{part:05d}.parquet"
        path = self.root / rel
        atomic_write_parquet(table, path, compression=SESSION_COMPRESSION)
        self._parts[stream] = part + 1
        self._counts[stream] = self._counts.get(stream, 0) + table.num_rows
        self._files[rel] = {"rows": table.num_rows, "blake3": blake3_file(path)}

    def flush(self) -> None:
        for stream in sorted(self._buf):
            self._flush_stream(stream)

    def close(self) -> dict[str, Any]:
        """Flush everything and write ``manifest.json`` last: its presence marks the session complete."""
        self.flush()
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "symbols": self.symbols,
            "streams": {s: {"rows": self._counts[s]} for s in sorted(self._counts)},
            "ts_recv_min": min(self._span) if self._span else None,
            "ts_recv_max": max(self._span) if self._span else None,
            "files": dict(sorted(self._files.items())),
            **self.extra,
        }
        write_json(self.root / MANIFEST, manifest)
        return manifest


@dataclass(frozen=True)
class Session:
    """A finished session on disk."""

    root: Path
    manifest: dict[str, Any]

    @property
    def streams(self) -> list[str]:
        return sorted(self.manifest["streams"])

    def files(self, stream: str) -> list[Path]:
        return sorted(self.root / rel for rel in self.manifest["files"] if rel.split("/", 1)[0] == stream)

    def read_table(self, stream: str) -> pa.Table:
        files = self.files(stream)
        schema = STREAMS[stream].schema
        if not files:
            return schema.empty_table()
        tables = []
        for f in files:
            open_parquet(f, schema)
            try:
                tables.append(pq.read_table(f, schema=schema))
            except (pa.ArrowException, OSError) as e:
                raise SessionError(f"{f}: cannot read it ({first_line(e)})") from None
        return pa.concat_tables(tables)

    def read_symbols(
        self, stream: str, symbols: list[str], columns: list[str] | None = None
    ) -> list[pa.Table]:
        """Each symbol's rows of ``stream`` (its ``columns``, ``symbol`` among them; all by default), in
        the files' order: read a row group at a time and split, so the session's whole table never sits
        in memory beside the symbols' (a portfolio of all of a session's symbols would hold its data
        twice)."""
        files = self.files(stream)
        full = STREAMS[stream].schema
        schema = full if columns is None else pa.schema([full.field(c) for c in columns])
        parts: list[list[pa.Table]] = [[] for _ in symbols]
        for f in files:
            pf = open_parquet(f, full)
            try:
                for g in range(pf.metadata.num_row_groups):
                    t = pf.read_row_group(g, columns=schema.names).cast(schema)
                    col = t.column("symbol")
                    for j, sym in enumerate(symbols):
                        mask = pc.equal(col, sym)
                        if pc.all(mask).as_py():
                            parts[j].append(t)
                        elif pc.any(mask).as_py():
                            parts[j].append(t.filter(mask))
            except (pa.ArrowException, OSError) as e:
                raise SessionError(f"{f}: cannot read it ({first_line(e)})") from None
        return [pa.concat_tables(p) if p else schema.empty_table() for p in parts]

    def read_events(self, stream: str) -> list[Any]:
        return table_to_events(self.read_table(stream), stream)

    def verify(self) -> None:
        """Check every file against the manifest: a regular file inside the session (a symlink could
        point anywhere, and the session would no longer be the bytes it names), its hash, and its row
        count, per file and per stream (a hand-edited count would mislead every reader that trusts
        it)."""
        root = self.root.resolve()
        rows_by_stream: dict[str, int] = {}
        for rel, meta in self.manifest["files"].items():
            p = self.root / rel
            if p.is_symlink() or not p.resolve().is_relative_to(root):
                raise SessionError(f"{p} is a link, not a file of the session (copy the file in its place)")
            if not p.exists():
                raise SessionError(f"{p} is listed in the manifest but missing")
            if not p.is_file():
                raise SessionError(f"{p} is not a regular file")
            algo, want = _listed_hash(meta)
            if FILE_HASHES[algo](p) != want:
                raise SessionError(f"{p} does not match its manifest {algo}")
            rows = _parquet_rows(p)
            listed = meta.get("rows")
            if listed is not None and listed != rows:
                raise SessionError(f"{p} holds {rows} rows, its manifest says {listed!r}")
            stream = rel.split("/", 1)[0]
            rows_by_stream[stream] = rows_by_stream.get(stream, 0) + rows
        for stream, meta in self.manifest["streams"].items():
            listed = meta.get("rows")
            if listed is not None and listed != rows_by_stream.get(stream, 0):
                raise SessionError(
                    f"{self.root / MANIFEST}: stream {stream!r} lists {listed!r} rows, its files hold "
                    f"{rows_by_stream.get(stream, 0)}"
                )

    def digest(self) -> str:
        """One hash over the manifest's file hashes: identifies the session's content. A sha256 entry
        counts as its hex alone, as before BLAKE3, so an older session keeps its digest."""
        h = hashlib.sha256()
        for rel, meta in sorted(self.manifest["files"].items()):
            algo, hexdigest = _listed_hash(meta)
            tag = hexdigest if algo == "sha256" else f"{algo}:{hexdigest}"
            h.update(f"{rel}\t{tag}\n".encode())
        return h.hexdigest()


def _parquet_rows(path: Path) -> int:
    """The row count a Parquet file's footer declares (the footer alone is read)."""
    try:
        return pq.read_metadata(path).num_rows
    except (pa.ArrowException, OSError) as e:
        raise SessionError(f"{path}: not a readable Parquet file ({first_line(e)})") from None


def read_regular(path: Path, what: str = "file") -> bytes:
    """The bytes of ``path``, which must be a regular file: opened without blocking and checked before
    it is read, so a FIFO or a device in a manifest's place is one error instead of a read that waits
    forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SessionError(f"{path} is not a regular file: not a {what}")
        return f.read()


def open_session(root: Path | str) -> Session:
    root = Path(root)
    mpath = root / MANIFEST
    if not mpath.exists():
        raise SessionError(
            f"{root} is not a finished session (no {MANIFEST}); "
            "an interrupted recording can be finished with `dualhub recover`"
        )
    try:
        manifest = orjson.loads(read_regular(mpath, "session manifest"))
    except orjson.JSONDecodeError as e:
        raise SessionError(f"{mpath} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict):
        raise SessionError(
            f"{mpath} is not a session manifest (a JSON object), it is {type(manifest).__name__}"
        )
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise SessionError(
            f"{root}: schema version {manifest.get('schema_version')} != supported {SCHEMA_VERSION}"
        )
    _check_manifest(mpath, manifest)
    return Session(root, manifest)


def _check_manifest(mpath: Path, manifest: dict[str, Any]) -> None:
    """The keys and shapes readers rely on, so a hand-edited or foreign manifest is one clear error."""
    if missing := [k for k in ("streams", "files") if k not in manifest]:
        raise SessionError(f"{mpath} lacks {', '.join(missing)}: not a finished dualhub session")
    streams, files = manifest["streams"], manifest["files"]
    if not isinstance(streams, dict) or not all(isinstance(v, dict) for v in streams.values()):
        raise SessionError(f"{mpath}: 'streams' must map stream names to objects")
    if not isinstance(files, dict):
        raise SessionError(f"{mpath}: 'files' must map file paths to objects")
    for rel, meta in files.items():
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or len(parts) != 2:
            raise SessionError(f"{mpath}: file {rel!r} is not a <stream>/<part> path inside the session")
        if file_hash(meta) is None:
            raise SessionError(f"{mpath}: file {rel!r} has no hash ({' or '.join(FILE_HASHES)})")


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def open_parquet(path: Path, schema: pa.Schema) -> pq.ParquetFile:
    """A session data file, opened and checked against its stream's schema: a damaged file (truncated,
    empty) or a missing or mistyped column (text timestamps) is a SessionError naming the file and
    column, not a pyarrow exception from deep inside a replay."""
    try:
        pf = pq.ParquetFile(path)
        found = pf.schema_arrow
    except (pa.ArrowException, OSError) as e:
        raise SessionError(f"{path}: not a readable Parquet file ({first_line(e)})") from None
    for field in schema:
        i = found.get_field_index(field.name)
        if i < 0:
            raise SessionError(f"{path}: column {field.name!r} is missing")
        if found.field(i).type != field.type:
            raise SessionError(
                f"{path}: column {field.name!r} is {found.field(i).type}, expected {field.type}"
            )
        if not field.nullable:
            for g in range(pf.metadata.num_row_groups):
                st = pf.metadata.row_group(g).column(i).statistics
                if st is not None and st.null_count:
                    raise SessionError(f"{path}: column {field.name!r} has {st.null_count} nulls")
    return pf


def iter_parts(root: Path, stream: str) -> Iterator[Path]:
    """Finished part files of a stream, ignoring ``*.tmp`` leftovers of a crash."""
    yield from sorted((root / stream).glob("part-*.parquet"))
