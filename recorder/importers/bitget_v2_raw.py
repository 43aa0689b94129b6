"""``dualhub import bitget-v2 FILE --out DIR``: Bitget v2 public frames captured by another tool -> a session.

Two line formats, told apart by the first line (plain text or gzip):

* ``<ts_recv_ns> <json>``: one received frame per line with its local receive time in nanoseconds,
  as this project's own journal holds them (``wire.journal``) and as hftbacktest-style collectors write;
* tardis-machine's raw replay lines, ``{"localTimestamp": "<ISO 8601>", "message": {...}}``
  (https://docs.tardis.dev/api/tardis-machine: ``/replay`` with ``exchange: bitget-futures``; the
  message is the frame as Bitget sent it, the local time is microseconds, UTC).

Every frame goes through the recorder's own normaliser (:class:`recorder.normalise.Normaliser`): the
same codec, wire checks, fixed-depth and ``books`` channels, trade de-duplication and quarantine
reasons as ``dualhub record``. The subscription's ``instType`` is the one most data frames carry
(frames of another market are quarantined, as live). A ``books`` push that breaks the local book opens
a ``Gap`` at that symbol's previous push, closed by its next good snapshot (the recorder's connection
would have resubscribed; a capture cannot). Bad lines are counted (``import.discarded``), never fatal.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import orjson

from engine.events import BookSnapshot, Quarantined, Trade
from engine.store import SessionWriter
from recorder.importers.common import ImportInputError, contracts, count, read_lines, staged_dir
from recorder.normalise import Normaliser, frame_arg
from wire.bitget.bitget_v2 import INST_TYPE
from wire.bitget.bitget_v2_books import parse_books_frame
from wire.journal import RECV, Record

_JOURNAL_LINE: Final = re.compile(rb"^(\d{1,19}) (.*)$", re.S)
_INST_TYPE: Final = re.compile(rb'"instType"\s*:\s*"([^"\\]{1,40})"')
CHANNELS: Final = ("books", "books1", "books5", "books15", "trade")


def _iso_ns(text: Any) -> int | None:
    """``2024-08-08T23:54:15.123456Z`` -> ns since the epoch (None: not such a time)."""
    if not isinstance(text, str):
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        return None
    delta = t - datetime(1970, 1, 1, tzinfo=t.tzinfo)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _frames(path: Path, discarded: dict[str, int]) -> tuple[str, list[tuple[int, bytes]]]:
    """The file's format and its ``(ts_recv_ns, frame)`` pairs, in file order."""
    fmt = ""
    out: list[tuple[int, bytes]] = []
    for lineno, line in read_lines(path):
        if not fmt:
            if _JOURNAL_LINE.match(line):
                fmt = "ts-ns-json"
            elif line.startswith(b"{") and b'"localTimestamp"' in line[:200]:
                fmt = "tardis-machine-raw"
            else:
                raise ImportInputError(
                    f"{path}: not a Bitget v2 capture (line {lineno} is neither '<ts_recv_ns> <json>' nor"
                    ' a tardis-machine line {"localTimestamp": ..., "message": ...})'
                )
        if fmt == "ts-ns-json":
            m = _JOURNAL_LINE.match(line)
            if m is None or int(m.group(1)) > 2**63 - 1:
                count(discarded, "bad_line")
                continue
            out.append((int(m.group(1)), m.group(2)))
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            count(discarded, "bad_line")
            continue
        ts = _iso_ns(obj.get("localTimestamp")) if isinstance(obj, dict) else None
        msg = obj.get("message") if isinstance(obj, dict) else None
        if ts is None or not 0 <= ts <= 2**63 - 1 or msg is None:
            count(discarded, "bad_line")
            continue
        out.append((ts, msg.encode() if isinstance(msg, str) else orjson.dumps(msg)))
    return fmt, out


def import_bitget_v2_raw(path: Path | str, out: Path | str) -> dict[str, Any]:
    """Import every public channel of a Bitget v2 capture (see the module docstring)."""
    with staged_dir(out) as tmp:
        return _import(Path(path), tmp)


def _import(path: Path, out: Path) -> dict[str, Any]:
    discarded: dict[str, int] = {}
    fmt, frames = _frames(path, discarded)
    args: dict[tuple[str, str], int] = {}
    inst: Counter[str] = Counter()
    for _, raw in frames:
        a = frame_arg(raw)
        if a is not None and a[0] in CHANNELS and b'"event"' not in raw[:200]:
            args[a] = args.get(a, 0) + 1
            if (m := _INST_TYPE.search(raw[:400])) is not None:
                inst[m.group(1).decode()] += 1
    if not args:
        raise ImportInputError(f"{path}: no Bitget v2 public data frame ({', '.join(CHANNELS)})")
    symbols = sorted({s for _, s in args})
    channels = sorted({c for c, _ in args}, key=CHANNELS.index)
    inst_type = inst.most_common(1)[0][0] if inst else INST_TYPE
    asked = {"url": f"file:{path.name}", "inst_type": inst_type, "symbols": symbols, "channels": channels}
    norm = Normaliser(asked, fast=False)
    events: list[Any] = []
    last_books: dict[str, int] = {}
    for ts, raw in frames:
        faults = sum(norm.book_faults.values())
        got = norm.feed(Record(ts, 0, RECV, raw))
        events.extend(got)
        frame = parse_books_frame(raw) if b'"books"' in raw[:200] else None
        if frame is None:
            continue
        sym = frame["arg"]["instId"]
        if sum(norm.book_faults.values()) > faults:
            reason = next(q.reason for q in got if isinstance(q, Quarantined))
            norm.gap_log.start("books", sym, last_books.get(sym, ts), "books_" + reason.split(": ")[1])
        elif frame.get("action") == "snapshot" and not any(isinstance(e, Quarantined) for e in got):
            if (g := norm.gap_log.end("books", sym, ts, ts)) is not None:
                events.append(g)
        last_books[sym] = ts
    end = frames[-1][0] if frames else 0
    events.extend(norm.gap_log.finish(end, end, "unresolved_at_end_of_file"))
    lost = dict(sorted({**discarded, **norm.discarded}.items()))
    if not any(isinstance(e, BookSnapshot) for e in events):
        why = ", ".join(f"{k} {v}" for k, v in lost.items()) or "nothing"
        raise ImportInputError(
            f"{path}: no order book could be rebuilt ({len(frames)} frames; discarded {why})"
        )
    s = norm.summary()
    w = SessionWriter(
        out,
        source=f"bitget_v2_raw:{path.name}",
        symbols=sorted({e.symbol for e in events if isinstance(e, BookSnapshot | Trade)}),
        extra={
            "contracts": contracts(
                events,
                venue="bitget",
                contract_type="spot" if inst_type == "SPOT" else "perpetual",
                origin="bitget v2 contracts",
            ),
            "import": {
                "format": f"bitget-v2-{fmt}",
                "file": str(path),
                "inst_type": inst_type,
                "channels": channels,
                "frames": len(frames),
                "received": s["received"],
                "discarded": lost,
                "duplicate_trades": s["duplicate_trades"],
                "book_faults": s["book_faults"],
                "gaps": len(s["gaps"]),
                "gap_windows": s["gaps"][:1000],
                "wire_limits": s["wire_limits"],
            },
        },
    )
    w.add_all(events)
    return w.close()
