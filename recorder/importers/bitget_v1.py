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

import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import orjson

from engine.events import BookSnapshot, Quarantined, Trade
from engine.store import SessionWriter
from recorder.importers.common import ImportInputError, contracts, count, read_lines, staged_dir
from recorder.normalise import WIRE_CHECKS, GapLog, discard_reason, frame_arg
from wire.bitget.bitget_v2 import StreamCounters, wire_guard
from wire.bitget.bitget_v2_books import BookFault, BooksOptions, BooksState, decode_with_books

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


_RECV_TS: Final = re.compile(rb"^(\d+(?:\.\d+)?): ")


def iter_capture(path: Path | str) -> Iterator[CaptureLine]:
    """Every line of a capture (plain or gzip); a line that is not one of the three forms is kind
    ``bad`` (its text the raw line), except the first: a file that does not start like a capture is
    refused (:class:`ImportInputError`)."""
    first = True
    for lineno, raw in read_lines(path):
        line = _parse_line(raw)
        if line is None:
            if first:
                raise ImportInputError(
                    f"{path}: not a Bitget capture"
                    f" (line {lineno} is not 'wss://... <-> <ts>' or '<ts>: <json>')"
                )
            line = CaptureLine(0, "bad", raw.decode("utf-8", "replace"))
        first = False
        yield line


def _parse_line(raw: bytes) -> CaptureLine | None:
    try:
        if raw.startswith((b"wss://", b"ws://")):
            rest = raw.split(b" ", 1)[1].decode()
            if rest.startswith("<-> "):
                return CaptureLine(seconds_to_ns(rest[4:].strip()), "connect", "")
            if rest.startswith("<- "):
                ts, _, text = rest[3:].partition(": ")
                return CaptureLine(seconds_to_ns(ts), "sent", text)
            return None
        m = _RECV_TS.match(raw)
        if m is None:
            return None
        return CaptureLine(seconds_to_ns(m.group(1).decode()), "recv", raw[m.end() :].decode())
    except (IndexError, UnicodeDecodeError, ArithmeticError, ValueError):
        return None


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
    """Import ``books`` (rebuilt, checksum-verified, top 15 as ``BookSnapshot``) and ``trade``.

    Gaps, as the recorder declares them: a ``books`` push that breaks the book (checksum, malformed,
    update without snapshot) opens a gap for that symbol at its previous push, which ends at the next
    good snapshot (or the last line); a quarantined ``trade`` push is a gap from the previous one.
    Quarantined pushes are kept (``quarantine`` stream) and counted by reason (``import.discarded``)."""
    with staged_dir(out) as tmp:
        return _import(Path(path), tmp, verify_snapshot_checksum)


def _import(path: Path, out: Path, verify_snapshot_checksum: bool) -> dict[str, Any]:
    counters = StreamCounters()
    gaps = GapLog(counters)
    state = BooksState(BooksOptions(verify_snapshot_checksum=verify_snapshot_checksum))
    # the wire checks of the recorder and live mode; a capture mixes markets (no instType to hold it to),
    # and v1 trades carry no id (the derived one can repeat for distinct trades: no de-duplication)
    guard = wire_guard(inst_type=None, dedupe=False)
    symbols: set[str] = set()
    markets: dict[str, str] = {}
    skipped: dict[str, int] = {}
    discarded: dict[str, int] = {}
    faults: list[dict[str, Any]] = []
    events: list[Any] = []
    last_push: dict[tuple[str, str], int] = {}  # (channel, instId) -> receive time of its previous push
    ts = 0
    for line in iter_capture(path):
        if line.kind == "bad":
            count(discarded, "bad_line")
            continue
        if line.kind != "recv":
            continue
        ts = line.ts_recv_ns
        try:
            frame = orjson.loads(line.text)
        except orjson.JSONDecodeError:
            frame = None
        action = None
        if isinstance(frame, dict) and "event" not in frame:
            ch = (frame.get("arg") or {}).get("channel")
            if ch not in SUPPORTED:
                count(skipped, str(ch))
                continue
            action = frame.get("action")
            v2 = to_v2(frame)
            a2 = v2.get("arg") if isinstance(v2, dict) else None
            if isinstance(a2, dict) and isinstance(a2.get("instId"), str):
                # v1 captures mix markets: each symbol's contract type is its frames' instType
                markets.setdefault(a2["instId"], str(a2.get("instType")))
            raw = orjson.dumps(v2)
        else:
            raw = line.text.encode()
        arg = None if isinstance(frame, dict) and "event" in frame else frame_arg(raw)  # acks are no push
        prev = last_push.get(arg, ts) if arg else ts
        if arg:
            last_push[arg] = ts
        items = decode_with_books(raw, ts, counters, state, source="bitget_v1", guard=guard)
        lost = ""
        fault = False
        for item in items:
            if isinstance(item, BookSnapshot | Trade):
                events.append(item)
                symbols.add(item.symbol)
            elif isinstance(item, Quarantined):
                events.append(item)
                lost = discard_reason(item.reason)
                count(discarded, lost)
            elif isinstance(item, BookFault):
                fault = True
                faults.append({"symbol": item.symbol, "reason": item.reason, "detail": item.detail})
        if arg is None or arg[0] not in SUPPORTED:
            continue
        if lost and arg[0] == "books" and not fault and lost.partition("_")[2] in WIRE_CHECKS:
            # a snapshot the wire checks refused: the local book is still right, that instant is lost
            events.append(gaps.gap(*arg, prev, ts, ts, f"quarantined:{lost}"))
        elif lost and arg[0] == "books":
            # the book is unusable until the next snapshot (a frame too broken to parse included)
            state.book(arg[1]).reset()
            gaps.start(*arg, prev, lost if lost.startswith("books_") else "books_malformed")
        elif lost:
            events.append(gaps.gap(*arg, prev, ts, ts, f"quarantined:{lost}"))
        elif arg[0] == "books" and action == "snapshot" and (g := gaps.end(*arg, ts, ts)):
            events.append(g)
    events.extend(gaps.finish(ts, ts, "unresolved_at_end_of_file"))
    books = sum(isinstance(e, BookSnapshot) for e in events)
    if not books:
        n = sum(ch == "books" for ch, _ in last_push)
        raise ImportInputError(
            f"{path}: no order book could be rebuilt ({n} symbols with books pushes; discarded"
            f" {', '.join(f'{k} {v}' for k, v in sorted(discarded.items())) or 'nothing'})"
        )
    w = SessionWriter(
        out,
        source=f"bitget_v1:{path.name}",
        symbols=symbols,
        extra={
            "contracts": contracts(
                events,
                venue="bitget",
                contract_type=lambda sym: "perpetual" if markets.get(sym) == "USDT-FUTURES" else "spot",
                origin="bitget v1 products",
            ),
            "import": {
                "format": "bitget-v1-capture",
                "file": str(path),
                "skipped_channels": skipped,
                "discarded": dict(sorted(discarded.items())),
                "book_faults": faults[:1000],
                "gaps": len(gaps.closed),
                "gap_windows": gaps.closed[:1000],
                "checksums_verified": state.checksums_verified,
            },
        },
    )
    w.add_all(events)
    return w.close()
