"""``dualhub recover DIR``: turn an interrupted recording (crash, ``kill -9``, power loss) into a session.

The journal is the source of truth and Parquet parts are derived from it, so recovery is:

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

from engine.events import STREAMS
from engine.store import MANIFEST, SessionError
from recorder.journal import SegmentScan, finalise_dangling, list_segments
from recorder.normalise import Normaliser
from recorder.record import JOURNAL_DIR, RECORD_JSON, finish, new_writer, normalise_segment


def recover(root: Path | str) -> dict[str, Any]:
    root = Path(root)
    if (root / MANIFEST).exists():
        raise SessionError(f"{root} is already a finished session; nothing to recover")
    rj = root / RECORD_JSON
    if not rj.exists():
        raise SessionError(f"{root} has no {RECORD_JSON}: not a dualhub recording")
    asked = orjson.loads(rj.read_bytes())
    jdir = root / JOURNAL_DIR
    cut = finalise_dangling(jdir)
    for stream in STREAMS:
        d = root / stream
        if d.is_dir():
            for p in list(d.glob("part-*.parquet")) + list(d.glob("*.tmp")):
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
