"""The raw journal: every received frame, first, before anything parses it.

A journal is a directory of segments ``seg-000000.dhj``, ``seg-000001.dhj``, ... A segment is written
as ``seg-NNNNNN.dhj.part`` and renamed to ``seg-NNNNNN.dhj`` once it is complete (closed and fsynced),
so a finished name never holds a half-written file. Rotation (by age and by size) closes the current
segment and opens the next.

Segment layout (all integers little-endian)::

    header   b"DHJ1" u8 version=1 u8 codec (1 = zstd, 2 = zlib) u16 reserved u32 segment index
    block*   b"BLK1" u32 raw_len u32 comp_len u32 crc32(comp) comp[comp_len]

A block is one flush: the records appended since the previous flush, compressed independently.
``raw`` is a run of records::

    i64 ts_recv_ns  u16 conn_id  u8 kind  u32 len  payload[len]

``kind`` is ``RECV`` (a frame received, untouched bytes), ``SENT`` (a frame we sent) or ``META``
(a JSON object the recorder writes about itself: connects, disconnects, gap windows, stop).

Crash behaviour: blocks are written with one ``write`` each and flushed to the OS every
``flush_interval_ms``; a ``kill -9`` loses at most the records of the current interval. A torn last
block (short or failing its CRC) is detected by the reader and everything before it is kept.
"""

from __future__ import annotations

import os
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa

from engine.store import fsync_dir

RECV: Final = 0
SENT: Final = 1
META: Final = 2
KIND_NAMES: Final = {RECV: "recv", SENT: "sent", META: "meta"}

MAGIC: Final = b"DHJ1"
BLOCK_MAGIC: Final = b"BLK1"
VERSION: Final = 1
CODEC_ZSTD: Final = 1
CODEC_ZLIB: Final = 2
_HEADER = struct.Struct("<4sBBHI")
_BLOCK = struct.Struct("<4sIII")
_REC = struct.Struct("<qHBI")
SEGMENT_SUFFIX: Final = ".dhj"
PART_SUFFIX: Final = ".dhj.part"
_SEG_RE = re.compile(r"^seg-(\d{6})\.dhj(\.part)?$")


class JournalError(ValueError):
    """A journal file that is not a journal (bad magic, unknown codec)."""


@dataclass(frozen=True, slots=True)
class Record:
    ts_recv_ns: int
    conn_id: int
    kind: int
    payload: bytes

    def meta(self) -> dict[str, Any]:
        return orjson.loads(self.payload)


def _compress(codec: int, raw: bytes | bytearray) -> bytes:
    if codec == CODEC_ZSTD:
        return pa.Codec("zstd", compression_level=1).compress(raw, asbytes=True)
    return zlib.compress(raw, 1)


def _decompress(codec: int, comp: bytes, raw_len: int) -> bytes:
    if codec == CODEC_ZSTD:
        return pa.Codec("zstd").decompress(comp, decompressed_size=raw_len, asbytes=True)
    return zlib.decompress(comp)


def _default_codec() -> int:
    return CODEC_ZSTD if pa.Codec.is_available("zstd") else CODEC_ZLIB


def segment_name(index: int, *, part: bool = False) -> str:
    return f"seg-{index:06d}" + (PART_SUFFIX if part else SEGMENT_SUFFIX)


def list_segments(directory: Path | str) -> list[tuple[int, Path, bool]]:
    """``(index, path, finished)`` for every segment in ``directory``, by index."""
    d = Path(directory)
    if not d.exists():
        return []
    out = []
    for p in d.iterdir():
        m = _SEG_RE.match(p.name)
        if m:
            out.append((int(m.group(1)), p, m.group(2) is None))
    out.sort(key=lambda t: (t[0], not t[2]))
    return out


class JournalWriter:
    """Appends records to the current segment; ``flush`` writes one block; ``rotate`` finishes a segment.

    Not thread-safe: one event loop owns it. ``flush_interval_ms`` is the caller's timer; this class
    only says when rotation is due (``rotate_due``) and never blocks on the network.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        rotate_s: float = 3600.0,
        rotate_bytes: int = 256 << 20,
        fsync_on_flush: bool = False,
        codec: int | None = None,
        first_index: int | None = None,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rotate_ns = int(rotate_s * 1e9)
        self.rotate_bytes = rotate_bytes
        self.fsync_on_flush = fsync_on_flush
        self.codec = codec or _default_codec()
        self._mono = monotonic_ns
        existing = list_segments(self.dir)
        if first_index is None:
            first_index = existing[-1][0] + 1 if existing else 0
        self._index = first_index
        self._buf = bytearray()
        self._buf_records = 0
        self._fd: int | None = None
        self._path: Path | None = None
        self._seg_bytes = 0
        self._seg_opened_ns = 0
        self.records = 0
        self.frames = 0
        self.bytes_written = 0
        self.finished: list[Path] = []
        self._open()

    # ------------------------------------------------------------ writing

    def _open(self) -> None:
        path = self.dir / segment_name(self._index, part=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        header = _HEADER.pack(MAGIC, VERSION, self.codec, 0, self._index)
        os.write(fd, header)
        self._fd, self._path = fd, path
        self._seg_bytes = len(header)
        self._seg_opened_ns = self._mono()
        self.bytes_written += len(header)

    @property
    def current_path(self) -> Path | None:
        return self._path

    def append(self, ts_recv_ns: int, conn_id: int, payload: bytes, kind: int = RECV) -> None:
        """Buffer one record (``payload`` as received, untouched). Visible on disk after ``flush``."""
        self._buf += _REC.pack(ts_recv_ns, conn_id, kind, len(payload))
        self._buf += payload
        self._buf_records += 1
        self.records += 1
        if kind == RECV:
            self.frames += 1

    def sent(self, ts_ns: int, conn_id: int, payload: bytes) -> None:
        self.append(ts_ns, conn_id, payload, SENT)

    def meta(self, ts_ns: int, conn_id: int, obj: dict[str, Any]) -> None:
        self.append(ts_ns, conn_id, orjson.dumps(obj), META)

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)

    def flush(self) -> int:
        """Compress the buffered records into one block and write it; returns bytes written."""
        if not self._buf or self._fd is None:
            return 0
        raw = self._buf  # compressed in place: no copy of the whole block first
        comp = _compress(self.codec, raw)
        block = _BLOCK.pack(BLOCK_MAGIC, len(raw), len(comp), zlib.crc32(comp)) + comp
        n = 0
        view = memoryview(block)
        while n < len(block):
            n += os.write(self._fd, view[n:])
        if self.fsync_on_flush:
            os.fsync(self._fd)
        self._buf.clear()
        self._buf_records = 0
        self._seg_bytes += len(block)
        self.bytes_written += len(block)
        return len(block)

    def rotate_due(self) -> bool:
        return self._seg_bytes >= self.rotate_bytes or (self._mono() - self._seg_opened_ns) >= self.rotate_ns

    def _finish(self) -> Path:
        assert self._fd is not None and self._path is not None
        self.flush()
        os.fsync(self._fd)
        os.close(self._fd)
        final = self._path.with_name(segment_name(self._index))
        os.replace(self._path, final)
        fsync_dir(self.dir)
        self._fd = None
        self._path = None
        self.finished.append(final)
        return final

    def rotate(self) -> Path:
        """Finish the current segment (flush, fsync, rename) and open the next; returns the finished path."""
        final = self._finish()
        self._index += 1
        self._open()
        return final

    def close(self) -> Path | None:
        """Finish the current segment; errors propagate (a close that fails is not a success)."""
        if self._fd is None:
            return None
        return self._finish()


# ---------------------------------------------------------------- reading


@dataclass(slots=True)
class SegmentScan:
    """What reading a segment found: records and where (if anywhere) it stopped early."""

    path: Path
    index: int
    records: int = 0
    good_bytes: int = 0  # offset just past the last complete block
    total_bytes: int = 0
    torn: str = ""  # why reading stopped before the end ("" = clean)


def iter_blocks(path: Path | str, scan: SegmentScan | None = None) -> Iterator[bytes]:
    """The decompressed record runs of one segment's blocks. A torn tail (crash mid-write) ends the
    iteration; ``scan`` says where (its ``records`` is left to the caller)."""
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _HEADER.size:
        if scan is not None:
            scan.total_bytes = len(data)
            scan.torn = "short header"
        return
    magic, version, codec, _r, index = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION or codec not in (CODEC_ZSTD, CODEC_ZLIB):
        raise JournalError(f"{path}: not a dualhub journal segment (magic {magic!r}, version {version})")
    if scan is not None:
        scan.index = index
        scan.total_bytes = len(data)
        scan.good_bytes = _HEADER.size
    off = _HEADER.size
    while off < len(data):
        if len(data) - off < _BLOCK.size:
            if scan is not None:
                scan.torn = f"short block header at {off}"
            return
        bmagic, raw_len, comp_len, crc = _BLOCK.unpack_from(data, off)
        start = off + _BLOCK.size
        comp = data[start : start + comp_len]
        if bmagic != BLOCK_MAGIC or len(comp) != comp_len or zlib.crc32(comp) != crc:
            if scan is not None:
                scan.torn = f"torn block at {off}"
            return
        raw = _decompress(codec, comp, raw_len)
        off = start + comp_len
        if scan is not None:
            scan.good_bytes = off
        yield raw


def iter_records(raw: bytes, pos: int = 0) -> Iterator[Record]:
    """The records of one block's raw bytes, from offset ``pos``."""
    unpack = _REC.unpack_from
    hs = _REC.size
    n = len(raw)
    while pos < n:
        ts, conn, kind, ln = unpack(raw, pos)
        pos += hs
        yield Record(ts, conn, kind, raw[pos : pos + ln])
        pos += ln


def record_at(raw: bytes, pos: int) -> tuple[Record, int]:
    """The record at offset ``pos`` of a block's raw bytes, and the offset after it."""
    ts, conn, kind, ln = _REC.unpack_from(raw, pos)
    pos += _REC.size
    return Record(ts, conn, kind, raw[pos : pos + ln]), pos + ln


def iter_segment(path: Path | str, scan: SegmentScan | None = None) -> Iterator[Record]:
    """Records of one segment. A torn tail (crash mid-write) ends the iteration; ``scan`` says where."""
    for raw in iter_blocks(path, scan):
        for rec in iter_records(raw):
            yield rec
            if scan is not None:
                scan.records += 1


def replay(directory: Path | str, scans: list[SegmentScan] | None = None) -> Iterator[Record]:
    """Every record of a journal directory, segments in index order (finished and ``.part`` alike)."""
    for index, path, _finished in list_segments(directory):
        scan = SegmentScan(path=path, index=index)
        if scans is not None:
            scans.append(scan)
        yield from iter_segment(path, scan)


def finalise_dangling(directory: Path | str) -> list[SegmentScan]:
    """Turn ``.part`` segments left by a crash into finished ones: cut the torn tail, fsync, rename."""
    out = []
    for index, path, finished in list_segments(directory):
        if finished:
            continue
        scan = SegmentScan(path=path, index=index)
        for _ in iter_segment(path, scan):
            pass
        if scan.good_bytes < scan.total_bytes:
            with open(path, "rb+") as f:
                f.truncate(scan.good_bytes)
                os.fsync(f.fileno())
        final = path.with_name(segment_name(index))
        if final.exists():
            raise JournalError(f"{final} exists next to {path.name}; refusing to overwrite")
        os.replace(path, final)
        fsync_dir(path.parent)
        scan.path = final
        out.append(scan)
    return out
