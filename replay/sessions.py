"""Several consecutive sessions of the same instruments replayed as one run (a *range*).

``dualhub replay`` and ``dualhub sweep`` name a session directory; here a folder of sessions, a glob or a
day range over a catalog folder (``--from``/``--to``) is resolved into its sessions, checked (the same
symbols and contracts, none overlapping another in time, each one verified against its manifest) and
written once as one finished session directory under ``<folder>/.ranges/``: a range directory. The run
then sees one ordinary session, so every reader (the driver, the streamed tape, the market cache, the
sweep, the report's books view) works on a range unchanged and the range's digest, over every file's
hash, changes when any member does (the market cache's key is that digest).

Why a directory and not a list of files handed to the driver: each session numbers its rows from 0 per
stream (``StreamCounters``), and the replay needs one stream's seqs to rise over the whole tape (labels
are found by book seq). A member whose seqs would repeat the ones before is rewritten with its seqs
shifted past them (a row group at a time: flat memory), with nothing else changed; a member whose seqs
already rise (the first, or one recorded with a continuing counter) is hard-linked, not copied. The
shift per stream and member is in the range's manifest (``range.sessions[i].seq_offsets``), so a row of
the range names its member's row.

Across a gap the engine does nothing special: positions, resting orders, Kev's state and pending timers
carry over, and the clock jumps to the next session's first row (timers due inside the gap fire first,
in time order). The gap is declared, not hidden: the range's ``gap`` stream gets one row per symbol and
boundary (channel ``session``, ``start_ns``/``end_ns`` the last and first ``ts_recv`` either side), the
manifest's ``gaps`` list the same windows as the recorder writes its own, and ``range.gaps`` the
boundaries as ``{from_ns, to_ns, before_session, after_session}`` (``dualhub report`` prints them).

The feed clock (``FeedClock.of_session``) is one per run: the members' ``clock`` estimates, where they
have them, become the range's as the median offset and the largest floor (every member's own estimate
is kept in ``range.sessions``); a range where some members have one and others none is refused.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import statistics
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.errors import DualhubError
from engine.events import SCHEMA_VERSION, STREAMS
from engine.store import (
    MANIFEST,
    ROW_GROUP_ROWS,
    SESSION_COMPRESSION,
    Session,
    SessionError,
    blake3_file,
    file_hash,
    fsync_dir,
    open_session,
    write_json,
)

RANGES_DIR: Final = ".ranges"
# Bumped when what a range directory holds changes: an older one is written again, not reused.
RANGE_FORMAT: Final = 1
# Folders a catalog scan never enters: a session's own runs and caches, and hidden ones (ranges).
_SKIP: Final = frozenset({"runs", "cache"})
# The manifest keys a range writes itself; any other key is kept where every member has it equal.
_CORE: Final = frozenset(
    {"schema_version", "source", "symbols", "streams", "ts_recv_min", "ts_recv_max", "files", "gaps", "clock"}
)


class RangeError(DualhubError):
    """Sessions that cannot be replayed as one run (different instruments, overlapping, none found)."""


@dataclass(frozen=True)
class Member:
    """One session of a range, opened, with its time span (``ts_recv``)."""

    session: Session
    first_ns: int
    last_ns: int

    @property
    def name(self) -> str:
        return self.session.root.name


def is_glob(text: str) -> bool:
    return any(c in text for c in "*?[")


def find_sessions(folder: Path) -> list[Path]:
    """Every finished session (a directory with a manifest) under ``folder``, at any depth, in path
    order; a session's own folders (runs, caches) and hidden folders (ranges) are not entered."""
    found: list[Path] = []
    for here, dirs, files in os.walk(folder):
        if MANIFEST in files and Path(here) != folder:
            found.append(Path(here))
            dirs.clear()
            continue
        dirs[:] = sorted(d for d in dirs if d not in _SKIP and not d.startswith("."))
    return sorted(found)


def _day(text: str, option: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise RangeError(f"{option} {text!r} is not a day (YYYY-MM-DD)") from None


def _utc_day(ns: int) -> date:
    return datetime.fromtimestamp(ns // 1_000_000_000, UTC).date()


def resolve(arg: Path | str, date_from: str | None = None, date_to: str | None = None) -> Path:
    """The session directory to replay for ``arg``: a session itself, unchanged; else the range
    directory of the sessions it names (a folder of sessions, a glob of session directories, or a
    catalog folder with ``--from``/``--to``: the sessions whose first row falls on those UTC days,
    inclusive), written now or reused. One session named: that session."""
    text = str(arg)
    ranged = date_from is not None or date_to is not None
    if not is_glob(text) and (Path(text) / MANIFEST).exists():
        if ranged:
            raise RangeError(f"--from/--to pick sessions out of a catalog folder; {text} is one session")
        return Path(text)
    if is_glob(text):
        paths = sorted(Path(p) for p in glob.glob(os.path.expanduser(text)) if (Path(p) / MANIFEST).is_file())
        what = f"no session directory (with {MANIFEST}) matches {text}"
    elif Path(text).is_dir():
        paths = find_sessions(Path(text))
        what = f"{text} holds no session (a directory with {MANIFEST})"
        if not paths and not ranged:  # an interrupted recording, say: the replay says what it is
            return Path(text)
    else:
        # not a folder: the replay refuses it in its own words (no manifest.json)
        return Path(text)
    if not paths:
        raise RangeError(what)
    members = [_member(p) for p in paths]
    if ranged:
        lo = _day(date_from, "--from") if date_from else date.min
        hi = _day(date_to, "--to") if date_to else date.max
        if lo > hi:
            raise RangeError(f"--from {date_from} is after --to {date_to}")
        members = [m for m in members if lo <= _utc_day(m.first_ns) <= hi]
        if not members:
            raise RangeError(f"no session under {text} starts between {lo} and {hi} (UTC days)")
    if len(members) == 1:
        return members[0].session.root
    return build_range(members)


def _member(path: Path) -> Member:
    try:
        s = open_session(path)
    except SessionError as e:
        raise RangeError(str(e)) from None
    lo, hi = s.manifest.get("ts_recv_min"), s.manifest.get("ts_recv_max")
    if type(lo) is not int or type(hi) is not int:
        raise RangeError(f"{path} has no time span (ts_recv_min/max): an empty session cannot join a range")
    return Member(s, lo, hi)


def _instrument(m: Member) -> tuple[Any, ...]:
    """What must be equal for sessions to be one market: the symbols and each one's contract."""
    from replay.config import session_contract

    syms = tuple(m.session.manifest.get("symbols") or [])
    return syms, tuple(session_contract(m.session.manifest, s) for s in syms)


def check(members: list[Member]) -> list[Member]:
    """``members`` in time order, refused unless they are one market's consecutive sessions: the same
    symbols and contracts, each with a books15 stream, none overlapping the next."""
    ordered = sorted(members, key=lambda m: (m.first_ns, str(m.session.root)))
    first = ordered[0]
    for m in ordered:
        if "books15" not in m.session.streams:
            raise RangeError(f"{m.session.root} has no books15 stream to replay")
        if _instrument(m) != _instrument(first):
            a, b = _instrument(first), _instrument(m)
            why = f"symbols {list(a[0])} and {list(b[0])}" if a[0] != b[0] else "contract specs"
            raise RangeError(
                f"{first.session.root} and {m.session.root} are not the same instruments ({why} differ): "
                "a range replays one market"
            )
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b.first_ns <= a.last_ns:
            raise RangeError(
                f"{a.session.root} and {b.session.root} overlap in time (ts_recv {b.first_ns} <= "
                f"{a.last_ns}): a range's sessions must follow one another"
            )
    return ordered


def _clock(members: list[Member]) -> dict[str, Any] | None:
    clocks = [m.session.manifest.get("clock") for m in members]
    if all(c is None for c in clocks):
        return None
    if any(c is None for c in clocks):
        raise RangeError(
            "some of the sessions have a clock estimate (manifest 'clock') and some none: replay them "
            "one by one, or as two ranges"
        )
    try:
        offsets = [int(c["local_minus_exchange_ns"]) for c in clocks]  # type: ignore[index]
        floors = [int(c["min_feed_latency_ns"]) for c in clocks]  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        raise RangeError(
            "a session's manifest 'clock' lacks local_minus_exchange_ns/min_feed_latency_ns"
        ) from None
    return {
        "local_minus_exchange_ns": int(statistics.median_low(offsets)),
        "min_feed_latency_ns": max(floors),
        "source": "range: the median of the sessions' offsets, the largest of their floors",
    }


def range_key(members: list[Member]) -> str:
    """The range's identity: its members' digests in order, and the format of what is written."""
    h = hashlib.sha256(f"range-format {RANGE_FORMAT}\n".encode())
    for m in members:
        h.update(f"{m.session.digest()}\n".encode())
    return h.hexdigest()


def range_dir(members: list[Member]) -> Path:
    """Where a range is written: ``.ranges/`` in the folder that holds its members."""
    parent = Path(os.path.commonpath([str(m.session.root.resolve().parent) for m in members]))
    return parent / RANGES_DIR / f"{members[0].name}..{members[-1].name}-{range_key(members)[:12]}"


def build_range(members: list[Member]) -> Path:
    """The range directory of ``members`` (checked first), reused when it is already there with the
    same key, else written to a temporary folder and renamed into place."""
    members = check(members)
    clock = _clock(members)
    out = range_dir(members)
    key = range_key(members)
    if _has_key(out, key):
        return out
    for m in members:  # what is copied must be what each manifest names (a damaged file: one line)
        m.session.verify()
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        manifest = _write(tmp, members, clock, key)
        write_json(tmp / MANIFEST, manifest)
        if out.exists() and not _has_key(out, key):  # not a range of these sessions (edited by hand)
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)
        except OSError:
            if not _has_key(out, key):
                raise
            # another process wrote the same range meanwhile (and may be replaying it): theirs stays
            shutil.rmtree(tmp)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _has_key(out: Path, key: str) -> bool:
    """Whether ``out`` is a finished range directory of the range ``key`` names."""
    try:
        have = orjson.loads((out / MANIFEST).read_bytes())
        return isinstance(have, dict) and (range_of(have) or {}).get("key") == key
    except (OSError, orjson.JSONDecodeError):
        return False


@dataclass
class _Parts:
    """A stream's part files as they are written into the range: numbered in order, listed with hashes."""

    root: Path
    files: dict[str, dict[str, Any]]
    counts: dict[str, int]

    def next_path(self, stream: str) -> tuple[str, Path]:
        n = sum(1 for rel in self.files if rel.split("/", 1)[0] == stream)
        rel = f"{stream}/part-{n:05d}.parquet"
        (self.root / stream).mkdir(exist_ok=True)
        return rel, self.root / rel

    def add(self, stream: str, rel: str, meta: dict[str, Any]) -> None:
        self.files[rel] = meta
        self.counts[stream] = self.counts.get(stream, 0) + int(meta["rows"])


def _seq_span(files: list[Path]) -> tuple[int, int] | None:
    lo: int | None = None
    hi: int | None = None
    for f in files:
        col = pq.read_table(f, columns=["seq"]).column("seq")
        if len(col) == 0:
            continue
        mm = pc.min_max(col).as_py()
        lo = mm["min"] if lo is None else min(lo, mm["min"])
        hi = mm["max"] if hi is None else max(hi, mm["max"])
    return None if lo is None else (lo, hi)  # type: ignore[return-value]


def _write(root: Path, members: list[Member], clock: dict[str, Any] | None, key: str) -> dict[str, Any]:
    """Every stream of every member into ``root``, in time order, seqs shifted where they would repeat;
    then the boundary gaps. Returns the manifest."""
    parts = _Parts(root, {}, {})
    streams = sorted({s for m in members for s in m.session.streams} - {"gap"})
    top: dict[str, int] = {}  # per stream: the highest seq written so far
    offsets: list[dict[str, int]] = [{} for _ in members]
    for i, m in enumerate(members):
        for stream in streams:
            files = m.session.files(stream) if stream in m.session.streams else []
            span = _seq_span(files)
            if span is None:
                continue
            shift = top[stream] + 1 - span[0] if stream in top and span[0] <= top[stream] else 0
            offsets[i][stream] = shift
            top[stream] = span[1] + shift
            for f in files:
                _copy_part(parts, stream, f, shift, m.session.manifest["files"][f"{stream}/{f.name}"])
    gaps, windows = _gaps(root, parts, members, offsets)
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "source": "range",
        "symbols": list(members[0].session.manifest.get("symbols") or []),
        "streams": {s: {"rows": parts.counts[s]} for s in sorted(parts.counts)},
        "ts_recv_min": members[0].first_ns,
        "ts_recv_max": members[-1].last_ns,
        "files": dict(sorted(parts.files.items())),
        "gaps": [g for m in members for g in (m.session.manifest.get("gaps") or [])] + windows,
        **_common_extras(members),
        "range": {
            "format": RANGE_FORMAT,
            "key": key,
            "sessions": [_describe(m, offsets[i]) for i, m in enumerate(members)],
            "gaps": gaps,
        },
    }
    if clock is not None:
        manifest["clock"] = clock
    return manifest


def _copy_part(parts: _Parts, stream: str, src: Path, shift: int, meta: dict[str, Any]) -> None:
    """One member file into the range: the same bytes (a hard link, else a copy) when its seqs stand as
    they are, else rewritten a row group at a time with ``seq + shift``."""
    rel, dst = parts.next_path(stream)
    if shift == 0:
        try:
            os.link(src, dst)
        except OSError:  # another filesystem, or links refused: the bytes copied
            shutil.copyfile(src, dst)
        algo, hexdigest = file_hash(meta) or ("blake3", blake3_file(dst))
        parts.add(stream, rel, {"rows": meta["rows"], algo: hexdigest})
        return
    pf = pq.ParquetFile(src)
    schema = pf.schema_arrow
    i = schema.get_field_index("seq")
    rows = 0
    tmp = dst.with_name(dst.name + ".tmp")
    with pq.ParquetWriter(tmp, schema, compression=SESSION_COMPRESSION, write_statistics=True) as w:
        for g in range(pf.metadata.num_row_groups):
            t = pf.read_row_group(g)
            t = t.set_column(i, schema.field(i), pc.add(t.column(i), pa.scalar(shift, pa.int64())))
            w.write_table(t, row_group_size=ROW_GROUP_ROWS)
            rows += t.num_rows
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dst)
    parts.add(stream, rel, {"rows": rows, "blake3": blake3_file(dst)})


def _gaps(
    root: Path, parts: _Parts, members: list[Member], offsets: list[dict[str, int]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``gap`` stream: the members' own gap rows (seqs shifted past the ones before) and one row per
    symbol at each boundary, in ``ts_recv`` order, as one part. Returns the boundaries
    (``range.gaps``) and their windows in the recorder's ``gaps`` shape."""
    schema = STREAMS["gap"].schema
    tables: list[pa.Table] = []
    top = -1
    for i, m in enumerate(members):
        if "gap" in m.session.streams:
            t = m.session.read_table("gap")
            if t.num_rows:
                lo = pc.min(t.column("seq")).as_py()
                shift = top + 1 - lo if lo <= top else 0
                offsets[i]["gap"] = shift
                t = t.set_column(
                    t.schema.get_field_index("seq"),
                    "seq",
                    pc.add(t.column("seq"), pa.scalar(shift, pa.int64())),
                )
                top = pc.max(t.column("seq")).as_py()
                tables.append(t)
    boundaries, windows, rows = [], [], []
    symbols = list(members[0].session.manifest.get("symbols") or [])
    for a, b in zip(members, members[1:], strict=False):
        reason = f"between sessions {a.name} and {b.name}"
        boundaries.append(
            {"from_ns": a.last_ns, "to_ns": b.first_ns, "before_session": a.name, "after_session": b.name}
        )
        for sym in symbols:
            top += 1
            rows.append(
                {
                    "ts_event": a.last_ns,
                    "ts_recv": b.first_ns,
                    "seq": top,
                    "symbol": sym,
                    "channel": "session",
                    "start_ns": a.last_ns,
                    "end_ns": b.first_ns,
                    "reason": reason,
                }
            )
            windows.append(
                {
                    "symbol": sym,
                    "channel": "session",
                    "start_ns": a.last_ns,
                    "end_ns": b.first_ns,
                    "reason": reason,
                }
            )
    if rows:
        tables.append(pa.Table.from_pylist(rows, schema=schema))
    table = pa.concat_tables([t.select(schema.names).cast(schema) for t in tables])
    table = table.sort_by([("ts_recv", "ascending"), ("seq", "ascending")])
    rel, dst = parts.next_path("gap")
    tmp = dst.with_name(dst.name + ".tmp")
    pq.write_table(table, tmp, compression=SESSION_COMPRESSION, write_statistics=True)
    os.replace(tmp, dst)
    parts.add("gap", rel, {"rows": table.num_rows, "blake3": blake3_file(dst)})
    return boundaries, windows


def _common_extras(members: list[Member]) -> dict[str, Any]:
    """The members' other manifest keys, each kept where all members have it equal; a dict kept as its
    entries that are (a simulator's ``symbols`` and instruments' grids stay; its ``seed`` and
    ``start_ms``, one per member, are in ``range.sessions``)."""
    manifests = [m.session.manifest for m in members]
    return _common([{k: v for k, v in mf.items() if k not in _CORE} for mf in manifests])


def _common(values: list[dict[str, Any]]) -> dict[str, Any]:
    """The entries of ``values`` equal in all of them, nested dicts kept as their common entries: a
    multi-symbol simulator's ``instruments`` keep each symbol's tick and size step, not its price."""
    out: dict[str, Any] = {}
    for k in sorted(values[0]):
        vs = [v.get(k) for v in values]
        if all(x == vs[0] for x in vs):
            out[k] = vs[0]
        elif all(isinstance(x, dict) for x in vs):
            if same := _common(vs):  # type: ignore[arg-type]
                out[k] = same
    return out


def _describe(m: Member, offsets: dict[str, int]) -> dict[str, Any]:
    """A member as the range's manifest lists it: where it is, its digest and span, how its seqs were
    shifted, and its own keys the range does not keep whole (its simulator's seed, its clock)."""
    mf = m.session.manifest
    return {
        "name": m.name,
        "path": str(m.session.root.resolve()),
        "digest": m.session.digest(),
        "ts_recv_min": m.first_ns,
        "ts_recv_max": m.last_ns,
        "streams": {s: mf["streams"][s].get("rows") for s in sorted(mf["streams"])},
        "seq_offsets": dict(sorted(offsets.items())),
        **{k: mf[k] for k in ("source", "simulator", "import", "clock") if k in mf},
    }


def range_of(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """A session manifest's ``range`` entry (sessions, gaps), or None for a single session."""
    r = manifest.get("range")
    return r if isinstance(r, dict) else None


def range_lines(session_manifest: dict[str, Any]) -> list[str]:
    """What a report says of a run over a range: its sessions and each gap between them."""
    r = range_of(session_manifest)
    if r is None:
        return []
    sessions, gaps = r.get("sessions") or [], r.get("gaps") or []
    lines = [f"sessions: {len(sessions)} replayed as one run ({', '.join(s['name'] for s in sessions)})"]
    for g in gaps:
        secs = (g["to_ns"] - g["from_ns"]) / 1e9
        lines.append(
            f"gap: {g['before_session']} -> {g['after_session']}, {secs:,.3f} s without data "
            f"(ts_recv {g['from_ns']} .. {g['to_ns']}); state carried across"
        )
    return lines


def run_range_lines(run_dir: Path | str) -> list[str]:
    """:func:`range_lines` of the session a run replayed (its manifest's ``session.path``); none for a
    run of one session, or one whose session is no longer there."""
    try:
        run = orjson.loads((Path(run_dir) / MANIFEST).read_bytes())
        session = orjson.loads((Path(run["session"]["path"]) / MANIFEST).read_bytes())
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return []
    return range_lines(session) if isinstance(session, dict) else []
