"""``dualhub import binance-futures FILE --out DIR``: a Binance USD-M raw feed file -> a dualhub session.

Input (``../shared/data/real/SOURCES.md``): gzip or plain text, one ``<local_ts_ns> <raw JSON>`` per
line; combined-stream frames ``{"stream": ..., "data": {...}}`` (``depth@0ms`` diffs, ``trade``,
``bookTicker``) and one REST depth snapshot line (``{"lastUpdateId": ..., "bids", "asks"}``, no
``stream`` key).

Book sync (Binance futures rule): diffs that arrive before the snapshot are buffered; diffs with
``u <= lastUpdateId`` are dropped; the first applied diff straddles it (``U <= lastUpdateId <= u``);
after that each diff's ``pu`` must equal the previous diff's ``u``. A break is a ``Gap`` event and
the book is not emitted again until a new snapshot line re-syncs it.

Output: a 15-level ``BookSnapshot`` at every 100 ms of *exchange* time (the book as of that instant:
all diffs with ``E <= t`` applied), and every trade. Both clocks are kept: ``ts_event`` is the
exchange time, ``ts_recv`` the file's local receive time of the line that made the record known.
The recording machine's clock in the reference file runs ~1.27 s *behind* the exchange, so
``ts_recv < ts_event`` is normal here; nothing assumes local >= exchange. A crossed book (best bid
>= best ask) is flagged and not emitted.
"""

from __future__ import annotations

import gzip
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson

from engine.events import BOOK_LEVELS, BookSnapshot, Gap, Trade
from engine.store import SessionWriter
from engine.venues.bitget_v2 import StreamCounters
from engine.venues.bitget_v2_books import BookError, LocalBook

MS: Final = 1_000_000


def iter_lines(path: Path | str) -> Iterator[tuple[int, bytes]]:
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rb") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            ts, sep, js = line.partition(b" ")
            if not sep or not ts.isdigit():
                raise ValueError(f"{p}:{lineno}: expected '<local_ts_ns> <json>'")
            yield int(ts), js


class BinanceBookBuilder:
    """Binance USD-M depth sync + local book + 100 ms snapshots (exchange time)."""

    def __init__(self, symbol: str, counters: StreamCounters, *, interval_ms: int = 100) -> None:
        self.symbol = symbol
        self.c = counters
        self.interval_ms = interval_ms
        self.book = LocalBook()
        self.last_update_id: int | None = None  # snapshot's lastUpdateId
        self.prev_u: int | None = None  # last applied diff's u
        self.synced = False
        self.buffer: list[tuple[int, dict[str, Any]]] = []
        self.next_emit_ms: int | None = None
        self.last_e_ms: int | None = None
        self.gaps = 0
        self.crossed = 0
        self.applied = 0
        self.dropped = 0
        self.crossed_at: list[int] = []

    def on_snapshot(self, ts_recv: int, snap: dict[str, Any]) -> list[Any]:
        self.book.load_snapshot(snap.get("bids"), snap.get("asks"))
        self.last_update_id = int(snap["lastUpdateId"])
        self.prev_u = None
        self.synced = True
        out: list[Any] = []
        buffered, self.buffer = self.buffer, []
        for ts, d in buffered:
            out.extend(self.on_diff(ts, d))
        return out

    def on_diff(self, ts_recv: int, d: dict[str, Any]) -> list[Any]:
        if self.last_update_id is None:
            self.buffer.append((ts_recv, d))
            return []
        if not self.synced:
            return []  # after a gap: wait for a new snapshot line
        big_u, u, pu = int(d["U"]), int(d["u"]), int(d.get("pu", -1))
        e_ms = int(d["E"])
        out: list[Any] = []
        if self.prev_u is None:
            if u <= self.last_update_id:
                self.dropped += 1
                return []
            if big_u > self.last_update_id:
                return self._gap(ts_recv, e_ms, f"first diff U={big_u} > lastUpdateId={self.last_update_id}")
        elif pu != self.prev_u:
            return self._gap(ts_recv, e_ms, f"pu={pu} != previous u={self.prev_u}")
        # the book as of every grid instant strictly before this diff's exchange time
        out.extend(self._emit_until(ts_recv, e_ms))
        try:
            self.book.apply_update(d.get("b"), d.get("a"))
        except BookError as e:
            return out + self._gap(ts_recv, e_ms, f"bad diff: {e}")
        self.prev_u = u
        self.applied += 1
        self.last_e_ms = e_ms
        if self.next_emit_ms is None:
            self.next_emit_ms = (e_ms // self.interval_ms + 1) * self.interval_ms
        return out

    def _emit_until(self, ts_recv: int, e_ms: int) -> list[Any]:
        out: list[Any] = []
        if self.next_emit_ms is None:
            return out
        while self.next_emit_ms < e_ms:
            t = self.next_emit_ms
            self.next_emit_ms += self.interval_ms
            if self.book.crossed():
                self.crossed += 1
                self.crossed_at.append(t)
                continue
            bid_px, bid_sz, ask_px, ask_sz = self.book.top_levels(BOOK_LEVELS)
            out.append(
                BookSnapshot(
                    ts_event=t * MS,
                    ts_recv=ts_recv,
                    seq=self.c.take("books15"),
                    symbol=self.symbol,
                    exch_seq=self.prev_u or 0,
                    bid_px=bid_px,
                    bid_sz=bid_sz,
                    ask_px=ask_px,
                    ask_sz=ask_sz,
                )
            )
        return out

    def _gap(self, ts_recv: int, e_ms: int, reason: str) -> list[Any]:
        self.gaps += 1
        self.synced = False
        self.last_update_id = None  # buffer again until the next snapshot line
        start = (self.last_e_ms or e_ms) * MS
        return [
            Gap(
                ts_event=start,
                ts_recv=ts_recv,
                seq=self.c.take("gap"),
                symbol=self.symbol,
                channel="depth",
                start_ns=start,
                end_ns=e_ms * MS,
                reason=reason,
            )
        ]


def import_binance_usdm(path: Path | str, out: Path | str, *, interval_ms: int = 100) -> dict[str, Any]:
    counters = StreamCounters()
    builders: dict[str, BinanceBookBuilder] = {}
    skipped: dict[str, int] = {}
    offsets_ms: list[float] = []
    events: list[Any] = []
    trades = 0
    symbol_of_snapshot: str | None = None

    def builder(sym: str) -> BinanceBookBuilder:
        b = builders.get(sym)
        if b is None:
            b = builders[sym] = BinanceBookBuilder(sym, counters, interval_ms=interval_ms)
        return b

    for ts_recv, js in iter_lines(path):
        if b'"bookTicker"' in js[:40]:
            skipped["bookTicker"] = skipped.get("bookTicker", 0) + 1
            continue
        msg = orjson.loads(js)
        data = msg.get("data")
        if "stream" not in msg:
            if "lastUpdateId" in msg:
                # the REST snapshot names no symbol: it belongs to the file's (single) depth stream
                sym = symbol_of_snapshot or next(iter(builders), None) or _symbol_from_path(path)
                events.extend(builder(sym).on_snapshot(ts_recv, msg))
            else:
                skipped["unknown"] = skipped.get("unknown", 0) + 1
            continue
        e = data.get("e")
        if e == "depthUpdate":
            sym = data["s"]
            symbol_of_snapshot = symbol_of_snapshot or sym
            offsets_ms.append((ts_recv / MS) - int(data["E"]))
            events.extend(builder(sym).on_diff(ts_recv, data))
        elif e == "trade":
            if data.get("X", "MARKET") != "MARKET":
                skipped["trade_" + str(data.get("X"))] = skipped.get("trade_" + str(data.get("X")), 0) + 1
                continue
            trades += 1
            events.append(
                Trade(
                    ts_event=int(data["T"]) * MS,
                    ts_recv=ts_recv,
                    seq=counters.take("trade"),
                    symbol=data["s"],
                    trade_id=str(data["t"]),
                    px=float(data["p"]),
                    sz=float(data["q"]),
                    side="sell" if data["m"] else "buy",  # m: buyer is maker -> the seller hit the bid
                )
            )
        else:
            skipped[str(e)] = skipped.get(str(e), 0) + 1
    w = SessionWriter(
        out,
        source=f"binance_usdm:{Path(path).name}",
        symbols=builders.keys() or [],
        extra={
            "import": {
                "format": "binance-usdm-raw",
                "file": str(path),
                "interval_ms": interval_ms,
                "gaps": sum(b.gaps for b in builders.values()),
                "crossed": sum(b.crossed for b in builders.values()),
                "depth_applied": sum(b.applied for b in builders.values()),
                "depth_dropped_before_snapshot": sum(b.dropped for b in builders.values()),
                "trades": trades,
                "skipped": skipped,
                "local_minus_exchange_ms": {
                    "min": min(offsets_ms) if offsets_ms else None,
                    "median": statistics.median(offsets_ms) if offsets_ms else None,
                    "max": max(offsets_ms) if offsets_ms else None,
                },
            }
        },
    )
    events.sort(key=lambda ev: (ev.ts_recv, 0 if isinstance(ev, BookSnapshot) else 1))
    w.add_all(events)
    return w.close()


def _symbol_from_path(path: Path | str) -> str:
    name = Path(path).name.lower()
    for part in name.replace(".", "_").split("_"):
        if part.endswith("usdt"):
            return part.upper()
    return "UNKNOWN"
