"""The market of a (session, model) paid once: decoded book levels with Laya's labels and probabilities,
kept beside the session as content-addressed Arrow IPC files and reused by every replay of it.

What a replay of one symbol does before any decision is the same whatever is swept (latencies, Kev,
risk limits, fill model, strategy): read the books15 row groups, gather the 60 level columns into rows,
check them and label them with Laya. ``replay.book_source.StreamedBooks`` does that a block of
:data:`replay.book_source.BLOCK` rows at a time; a :class:`Builder` keeps each block as it goes
(``blocks/NNNNNN.arrow``: the levels, the label and the four probabilities per row) and, once every
block is in, commits the entry. A later run with the same :class:`CacheKey` reads the blocks instead
(:class:`Cached`), and its labels and levels are the same bits, so its events and digest are too
(``tests/replay/test_market_cache.py``).

Identity: the key names the session's digest (its files' hashes), the symbol, the model's sha256, its
feature version and the source of the feature code (an edit of ``engine/laya/features.py`` is another
cache), Laya's mode and active provider (a GPU's float sums are not the CPU's) and :data:`VERSION`.
Nothing cached depends on a seed: the latency draws (feed, Laya, orders, Kev) are made by each run.

Trust: the entry's ``manifest.json`` lists every file with its BLAKE3; a block is hashed as it is read
(once per process while the file is unchanged: same inode, size and modification time) and one that
does not match raises :class:`CacheCorrupt`: the entry is deleted and the replay starts over without it
(``replay.driver.run_replay``), building it again. A half-built entry is a ``.tmp`` directory, never
read.

Size: the entries of one cache directory (default ``SESSION/cache/market``) are kept under a cap
(``DUALHUB_MARKET_CACHE_MB``, default :data:`DEFAULT_CAP_MB`): after a commit the least recently used
entries go; an entry that alone would pass the cap is not built.

Notebooks: :func:`open_market` gives an entry as one memory-mapped Arrow table.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
from blake3 import blake3

from engine.validate import LEVEL_COLUMNS

VERSION: Final = 1
DEFAULT_CAP_MB: Final = 4096
CAP_ENV: Final = "DUALHUB_MARKET_CACHE_MB"
DIR_NAME: Final = "cache/market"  # under the session
N_LEVELS: Final = len(LEVEL_COLUMNS)
SCHEMA: Final = pa.schema(
    [
        pa.field(
            "levels", pa.list_(pa.float64(), N_LEVELS), nullable=False
        ),  # bid_px, bid_sz, ask_px, ask_sz
        pa.field("label", pa.int8(), nullable=False),
        pa.field("probs", pa.list_(pa.float32(), 4), nullable=False),
    ]
)
ROW_BYTES: Final = N_LEVELS * 8 + 1 + 4 * 4
_FEATURES_SRC: Final = Path(__file__).resolve().parent.parent / "engine" / "laya" / "features.py"


# Block files this process has hashed, as they were then (device, inode, size, modification time, listed
# hash): a sweep's later runs read them without hashing them again (hashing was a third of a cached
# run's reading). A write to a file (size or mtime) or another file in its place is hashed again.
_verified: set[tuple[int, int, int, int, str]] = set()


class CacheCorrupt(RuntimeError):
    """A cached file does not match its manifest: the entry is gone and the run starts over without it."""


@dataclass(frozen=True)
class CacheKey:
    session_digest: str
    symbol: str
    model_sha256: str
    feature_version: str
    feature_code: str  # sha256 of the feature kernels' source
    laya_mode: str
    provider: str
    version: int = VERSION

    def hex(self) -> str:
        return hashlib.sha256(orjson.dumps(asdict(self), option=orjson.OPT_SORT_KEYS)).hexdigest()


def feature_code() -> str:
    return hashlib.sha256(_FEATURES_SRC.read_bytes()).hexdigest()


def cap_bytes() -> int:
    """The size cap of a cache directory: ``$DUALHUB_MARKET_CACHE_MB`` MiB, else :data:`DEFAULT_CAP_MB`."""
    raw = os.environ.get(CAP_ENV, "")
    try:
        mb = float(raw) if raw else DEFAULT_CAP_MB
    except ValueError:
        mb = DEFAULT_CAP_MB
    return max(0, int(mb * 2**20))


def _hash_bytes(data: bytes | memoryview) -> str:
    return blake3(data, max_threads=1).hexdigest()


@dataclass
class Stats:
    """What a replay did with the cache: ``"built"``, ``"reused"``, or ``"off"`` and why."""

    state: str = "off"
    entry: str = ""


class MarketCache:
    """The market cache entries of one directory, capped at ``cap`` bytes."""

    def __init__(self, root: Path | str, cap: int | None = None) -> None:
        self.root = Path(root)
        self.cap = cap_bytes() if cap is None else cap

    @classmethod
    def beside(cls, session_root: Path | str, cap: int | None = None) -> MarketCache:
        return cls(Path(session_root) / DIR_NAME, cap)

    def entry(self, key: CacheKey) -> Path:
        return self.root / key.hex()[:32]

    def open(self, key: CacheKey, rows: int, block: int) -> Cached | None:
        """The committed entry of ``key`` (None when there is none, or it does not fit this walk)."""
        path = self.entry(key)
        try:
            manifest = orjson.loads((path / "manifest.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if (
            manifest.get("key") != asdict(key)
            or manifest.get("rows") != rows
            or manifest.get("block") != block
        ):
            self.drop(path)  # a hash prefix shared by another key, or a stale layout: built again
            return None
        try:
            os.utime(path / "manifest.json")  # least recently used goes first
        except OSError:
            pass
        return Cached(path, manifest)

    def builder(self, key: CacheKey, rows: int, block: int) -> Builder | None:
        """A builder of ``key``'s entry, or None when it would pass the cap or cannot be written."""
        if rows * ROW_BYTES > self.cap:
            return None
        path = self.entry(key)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            self.root.mkdir(parents=True, exist_ok=True)
            lock = os.open(path.with_name(f"{path.name}.lock"), os.O_CREAT | os.O_RDWR, 0o644)
        except OSError:  # a read-only session: the run goes on without a cache
            return None
        try:  # one builder per entry: the sweep's other processes on this machine run without it meanwhile
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            return None
        return Builder(self, key, tmp, path, rows, block, lock)

    def drop(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, path) of every committed entry."""
        out = []
        if not self.root.is_dir():
            return out
        for p in self.root.iterdir():
            m = p / "manifest.json"
            if p.is_dir() and ".tmp" not in p.name and m.is_file():
                size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
                out.append((m.stat().st_mtime, size, p))
        return out

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Remove the least recently used entries until the directory is under the cap."""
        entries = sorted(self.entries())
        total = sum(size for _, size, _ in entries)
        gone = []
        for _, size, p in entries:
            if total <= self.cap:
                break
            if p == keep:
                continue
            self.drop(p)
            gone.append(p)
            total -= size
        return gone


class Builder:
    """Takes a replay's blocks in order as it labels them; :meth:`commit` once every block is in."""

    def __init__(
        self, cache: MarketCache, key: CacheKey, tmp: Path, path: Path, rows: int, block: int, lock: int
    ) -> None:
        self.cache, self.key, self.tmp, self.path = cache, key, tmp, path
        self._lock = lock  # held (flock) until commit or abandon
        self.rows, self.block = rows, block
        self.n_blocks = (rows + block - 1) // block
        self.files: dict[str, dict[str, object]] = {}
        self._next = 0
        self.failed = False

    def add(self, b: int, levels: np.ndarray, labels: np.ndarray, probs: np.ndarray) -> None:
        """Block ``b`` as the replay labelled it (blocks come in order; a block met again is skipped)."""
        if self.failed or b != self._next:
            return
        n = len(levels)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.FixedSizeListArray.from_arrays(
                    pa.array(np.ascontiguousarray(levels).reshape(-1)), N_LEVELS
                ),
                pa.array(np.asarray(labels, dtype=np.int8)),
                pa.FixedSizeListArray.from_arrays(
                    pa.array(np.ascontiguousarray(probs, dtype=np.float32).reshape(-1)), 4
                ),
            ],
            schema=SCHEMA,
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, SCHEMA) as w:
            w.write_batch(batch)
        data = sink.getvalue()
        rel = _block_name(b)
        try:
            if b == 0:  # made with the first block: a run that fails before reading any leaves nothing
                shutil.rmtree(self.tmp, ignore_errors=True)
                (self.tmp / "blocks").mkdir(parents=True)
            (self.tmp / rel).write_bytes(memoryview(data))
        except OSError:  # a full disk: this run goes on, the cache is not kept
            self.failed = True
            return
        self.files[rel] = {"rows": n, "bytes": data.size, "blake3": _hash_bytes(memoryview(data))}
        self._next += 1

    def commit(self) -> bool:
        """Move the entry into place (every block in), then keep the directory under its cap."""
        if self.failed or self._next != self.n_blocks:
            self.abandon()
            return False
        manifest = {"key": asdict(self.key), "rows": self.rows, "block": self.block, "files": self.files}
        try:
            (self.tmp / "manifest.json").write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
            if self.path.exists():  # another process built it meanwhile: the same bytes
                self.abandon()
                return True
            self.tmp.rename(self.path)
        except OSError:
            self.abandon()
            return False
        self._unlock()
        self.cache.evict(keep=self.path)
        return True

    def abandon(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._unlock()

    def _unlock(self) -> None:
        if self._lock >= 0:
            os.close(self._lock)  # closing the descriptor releases the flock
            self._lock = -1


class Cached:
    """A committed entry: block ``b``'s levels, labels and probabilities, checked as they are read."""

    def __init__(self, path: Path, manifest: dict) -> None:
        self.path = path
        self.manifest = manifest
        self.rows: int = manifest["rows"]
        self.block: int = manifest["block"]

    def read(self, b: int, levels: np.ndarray, labels: np.ndarray, probs: np.ndarray) -> None:
        """Block ``b`` into ``levels`` (rows x 60), ``labels`` and ``probs`` (rows x 4); a file that does not
        match its listed hash raises :class:`CacheCorrupt` (the entry is removed first)."""
        rel = _block_name(b)
        meta = self.manifest["files"].get(rel)
        try:
            with open(self.path / rel, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                data = _read_into_scratch(f, st.st_size)
            seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, meta["blake3"] if meta else "")
        except OSError:
            data, seen = memoryview(b""), None
        if (
            meta is None
            or len(data) != meta["bytes"]
            or (seen not in _verified and _hash_bytes(data) != meta["blake3"])
        ):
            shutil.rmtree(self.path, ignore_errors=True)
            raise CacheCorrupt(f"market cache {self.path / rel} does not match its manifest; rebuilt")
        if seen is not None:
            _verified.add(seen)
        batch = pa.ipc.open_file(pa.py_buffer(data)).get_batch(0)
        n = batch.num_rows
        if n != len(levels):
            shutil.rmtree(self.path, ignore_errors=True)
            raise CacheCorrupt(f"market cache {self.path / rel} holds {n} rows, the walk wants {len(levels)}")
        levels[:] = batch.column(0).values.to_numpy().reshape(n, N_LEVELS)
        labels[:] = batch.column(1).to_numpy()
        probs[:] = batch.column(2).values.to_numpy().reshape(n, 4)
        if (b + 1) * self.block >= self.rows:  # the walk's last block: the buffer is not held past the run
            _drop_scratch()  # (freed as this returns, with the views of it here)


# One buffer the block files are read into, reused block after block: a fresh bytes object per block
# paid its page faults on every read (a block's levels are copied out of it, so nothing keeps a view
# of it). Dropped after a walk's last block, so a run's later peak (the summary) does not hold it.
_scratch = bytearray()


def _drop_scratch() -> None:
    global _scratch
    _scratch = bytearray()


def _read_into_scratch(f: Any, size: int) -> memoryview:
    global _scratch
    if len(_scratch) < size + 1:
        _scratch = bytearray(size + 1)
    view = memoryview(_scratch)
    n = 0
    while got := f.readinto(view[n:]):  # to the end: a file that grew since fstat reads longer
        n += got
    return view[:n]


def attach(cache: MarketCache, books: Any, key: CacheKey) -> str:
    """Give ``books`` (a ``replay.book_source.StreamedBooks``) the entry of ``key`` to read, or a builder
    of it; what happened, for the run's engine path: ``reused``, ``building`` or ``off (why)``."""
    cached = cache.open(key, books.num_rows, books.block)
    if cached is not None:
        books.cached = cached
        return "reused"
    books.building = cache.builder(key, books.num_rows, books.block)
    if books.building is None:
        return "off (over its size cap, not writable, or another process is building it)"
    return "building"


def _block_name(b: int) -> str:
    return f"blocks/{b:06d}.arrow"


def open_market(
    session: Path | str, model: Path | str | None = None, symbol: str = "BTCUSDT", provider: str = "auto"
) -> pa.Table | None:
    """A session's cached market for ``model`` (default: the bundled one) as one Arrow table, its blocks
    memory-mapped (columns ``levels``, ``label``, ``probs``; rows in the books' order): None when no
    replay has built it yet. Every file is checked against its hash first."""
    from engine.laya.model import DEFAULT_MODEL, Laya, LayaConfig
    from engine.store import open_session

    s = open_session(session)
    laya = Laya(LayaConfig(model_path=Path(model or DEFAULT_MODEL), provider=provider))
    key = key_for(s.digest(), symbol, laya, "batch")
    cache = MarketCache.beside(s.root)
    path = cache.entry(key)
    try:
        manifest = orjson.loads((path / "manifest.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    tables = []
    for rel, meta in sorted(manifest["files"].items()):
        src = pa.memory_map(str(path / rel))
        buf = src.read_buffer()
        if _hash_bytes(memoryview(buf)) != meta["blake3"]:
            cache.drop(path)
            raise CacheCorrupt(f"market cache {path / rel} does not match its manifest")
        tables.append(pa.ipc.open_file(buf).read_all())
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


def key_for(session_digest: str, symbol: str, laya: object, laya_mode: str) -> CacheKey:
    return CacheKey(
        session_digest=session_digest,
        symbol=symbol,
        model_sha256=laya.model_sha256,  # type: ignore[attr-defined]
        feature_version=laya.feature_version,  # type: ignore[attr-defined]
        feature_code=feature_code(),
        laya_mode=laya_mode,
        provider=str(laya.active_provider),  # type: ignore[attr-defined]
    )
