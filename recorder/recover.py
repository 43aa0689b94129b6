"""``dualhub recover DIR``: turn an interrupted recording (crash, ``kill -9``, power loss) into a session.

The journal is the source of truth and Parquet parts are derived from it, so recovery is:

0. refuse, changing nothing, a segment that is not a journal segment at all (another file, random bytes);
1. finish every dangling ``.dhj.part`` segment: cut a torn last block, fsync, rename;
2. delete derived files (``<stream>/part-*.parquet`` and ``*.tmp`` leftovers);
3. decode the whole journal again through the same :class:`~recorder.normalise.Normaliser`;
   gaps the journal left open run to its last record;
4. write the manifest (``recorder.recovered: true``, plus what was cut from torn segments).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from engine.errors import os_error_text
from engine.events import STREAMS
from engine.store import MANIFEST, SessionError
from recorder.normalise import Normaliser
from recorder.record import (
    JOURNAL_DIR,
    RECORD_JSON,
    finish,
    new_writer,
    normalise_segment,
    remove_tmp_files,
)
from wire.journal import MAGIC, SegmentScan, finalise_dangling, list_segments


def recover(root: Path | str) -> dict[str, Any]:
    root = Path(root)
    if (root / MANIFEST).exists():
        raise SessionError(f"{root} is already a finished session; nothing to recover")
    rj = root / RECORD_JSON
    if not rj.exists():
        raise SessionError(f"{root} has no {RECORD_JSON}: not a dualhub recording")
    try:
        asked = orjson.loads(rj.read_bytes())
    except orjson.JSONDecodeError as e:
        raise SessionError(f"{rj} is not valid JSON ({e}); it says what was recorded: restore it") from None
    if not isinstance(asked, dict) or not {"url", "symbols", "channels"} <= asked.keys():
        raise SessionError(f"{rj} is not a recorder's {RECORD_JSON} (needs url, symbols, channels)")
    jdir = root / JOURNAL_DIR
    _check_segments(root, jdir)
    try:
        return _recover(root, jdir, asked)
    except OSError as e:  # a full disk, say: the journal is untouched, so recovery can simply run again
        raise SessionError(
            f"{os_error_text(e)}; the journal is intact: fix that and run `dualhub recover {root}` again"
        ) from None
    finally:
        remove_tmp_files(root)  # what a write cut short (full disk, Ctrl-C) left; none after a success


def _check_segments(root: Path, jdir: Path) -> None:
    """Refuse, before anything is changed, a segment that is not a journal segment at all (another
    file, random bytes): recover never cuts or deletes what it cannot read. A torn header (a crash
    right after the segment was created) is shorter than the magic and is recovered as empty."""
    for _index, path, _finished in list_segments(jdir):
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
        if len(head) == len(MAGIC) and head != MAGIC:
            raise SessionError(
                f"{path} is not a dualhub journal segment (no {MAGIC.decode()} header); nothing was changed: "
                f"move it out of {jdir} and run `dualhub recover {root}` again"
            )


def _recover(root: Path, jdir: Path, asked: dict[str, Any]) -> dict[str, Any]:
    cut = finalise_dangling(jdir)
    remove_tmp_files(root)
    for stream in STREAMS:
        d = root / stream
        if d.is_dir():
            for p in d.glob("part-*.parquet"):
                p.unlink()
    writer = new_writer(root, asked)
    norm = Normaliser(asked)
    scans: list[SegmentScan] = []
    for index, path, _finished in list_segments(jdir):
        scan = SegmentScan(path=path, index=index)
        normalise_segment(path, norm, writer, scan)
        scans.append(scan)
    extra = {
        "recovered": True,
        "stopped_by": norm.stops[-1]["reason"] if norm.stops else "crash",
        "journal": {
            "segments": [s.path.name for s in scans],
            "records": sum(s.records for s in scans),
            "frames": norm.frames,
            "bytes": sum(s.total_bytes for s in scans),
            "torn_segments": [
                {
                    "segment": s.path.name,
                    "kept_bytes": s.good_bytes,
                    "cut_bytes": s.total_bytes - s.good_bytes,
                    "why": s.torn,
                }
                for s in cut
                if s.torn
            ],
        },
    }
    return finish(writer, norm, extra)
