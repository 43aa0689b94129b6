"""Bitget v1 websocket captures (cryptofeed ``sample_data`` format) -> v2-shaped frames and sessions.

Capture format (``../shared/data/real/SOURCES.md``), one event a line::

    wss://ws.bitget.com/spot/v1/stream <-> 1649290076.511507          connect
    wss://ws.bitget.com/spot/v1/stream <- 1649290077.318636: {...}    a request we sent
    1649290078.12577: {...}                                           a frame received

v1 differs from v2 only in the envelope: ``instType`` is ``sp``/``mc`` (v2 ``SPOT``/``USDT-FUTURES``)
and trades are arrays ``[ts, price, size, side]`` (v2 objects with a ``tradeId``; v1 has none, so
the id is derived from the trade's fields: ``v1-<ts>-<price>-<size>-<side>``). ``books`` (snapshot +
updates with a CRC32 ``checksum``, no ``seq``) is the same rule in both, so the v2 books code is
verified on v1 data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import orjson

from engine.events import BookSnapshot, Quarantined, Trade
from engine.venues.bitget_v2 import Control, StreamCounters
from engine.venues.bitget_v2_books import BookFault, BooksOptions, BooksState, decode_with_books

V1_INST_TYPES: Final = {"sp": "SPOT", "mc": "USDT-FUTURES", "umcbl": "USDT-FUTURES"}
SUPPORTED: Final = ("books", "trade")


@dataclass(frozen=True, slots=True)
class CaptureLine:
    """One line of a capture: ``kind`` is ``connect``, ``sent`` or ``recv``."""

    ts_recv_ns: int
    kind: str
    text: str


def seconds_to_ns(s: str) -> int:
    """``"1649290078.12577"`` -> ns, exactly (no float rounding)."""
    return int(Decimal(s) * 1_000_000_000)


def iter_capture(path: Path | str) -> Iterator[CaptureLine]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            if line.startswith("wss://") or line.startswith("ws://"):
                _url, rest = line.split(" ", 1)
                if rest.startswith("<-> "):
                    yield CaptureLine(seconds_to_ns(rest[4:].strip()), "connect", "")
                elif rest.startswith("<- "):
                    ts, _, text = rest[3:].partition(": ")
                    yield CaptureLine(seconds_to_ns(ts), "sent", text)
                else:
                    raise ValueError(f"{path}:{lineno}: unknown capture line {line[:80]!r}")
                continue
            ts, sep, text = line.partition(": ")
            if not sep:
                raise ValueError(f"{path}:{lineno}: no '<ts>: ' prefix")
            yield CaptureLine(seconds_to_ns(ts), "recv", text)


def to_v2(frame: dict[str, Any]) -> dict[str, Any]:
    """Rewrite a v1 frame's envelope (and trade arrays) into the v2 shape; other fields untouched."""
    a = frame.get("arg")
    if isinstance(a, dict) and isinstance(a.get("instType"), str):
        a = dict(a)
        a["instType"] = V1_INST_TYPES.get(a["instType"].lower(), a["instType"])
        frame = {**frame, "arg": a}
        if a.get("channel") == "trade" and isinstance(frame.get("data"), list):
            data = []
            for d in frame["data"]:
                if isinstance(d, list) and len(d) >= 4:
                    # v1 trades carry no id; the codec needs one: derive it from the trade's own fields
                    tid = f"v1-{d[0]}-{d[1]}-{d[2]}-{d[3]}"
                    data.append({"ts": str(d[0]), "price": d[1], "size": d[2], "side": d[3], "tradeId": tid})
                else:
                    data.append(d)
            frame["data"] = data
    return frame


def import_bitget_v1(
    path: Path | str, out: Path | str, *, verify_snapshot_checksum: bool = True
) -> dict[str, Any]:
    """Import ``books`` (rebuilt, checksum-verified, top 15 as ``BookSnapshot``) and ``trade``."""
    from engine.store import SessionWriter

    counters = StreamCounters()
    state = BooksState(BooksOptions(verify_snapshot_checksum=verify_snapshot_checksum))
    symbols: set[str] = set()
    skipped: dict[str, int] = {}
    faults: list[dict[str, Any]] = []
    events: list[Any] = []
    for line in iter_capture(path):
        if line.kind != "recv":
            continue
        try:
            frame = orjson.loads(line.text)
        except orjson.JSONDecodeError:
            frame = None
        if isinstance(frame, dict) and "event" not in frame:
            ch = (frame.get("arg") or {}).get("channel")
            if ch not in SUPPORTED:
                skipped[str(ch)] = skipped.get(str(ch), 0) + 1
                continue
            raw = orjson.dumps(to_v2(frame))
        else:
            raw = line.text.encode()
        for item in decode_with_books(raw, line.ts_recv_ns, counters, state, source="bitget_v1"):
            if isinstance(item, BookSnapshot | Trade | Quarantined):
                events.append(item)
                if not isinstance(item, Quarantined):
                    symbols.add(item.symbol)
            elif isinstance(item, BookFault):
                faults.append({"symbol": item.symbol, "reason": item.reason, "detail": item.detail})
            elif isinstance(item, Control):
                pass
    w = SessionWriter(
        out,
        source=f"bitget_v1:{Path(path).name}",
        symbols=symbols,
        extra={
            "import": {
                "format": "bitget-v1-capture",
                "file": str(path),
                "skipped_channels": skipped,
                "book_faults": faults,
                "checksums_verified": state.checksums_verified,
            }
        },
    )
    w.add_all(events)
    return w.close()
