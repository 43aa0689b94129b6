"""Bitget v2 full-depth ``books`` channel: local order book, ``seq``/``pseq`` gap rule, CRC32 checksum.

Pure: no I/O. The wire shapes and every variant are in ``../shared/docs/bitget-v2.md`` (section 1):

* the first push after subscribing is ``action:"snapshot"`` (all levels), then ``"update"`` deltas;
  each delta level carries the new absolute size, size ``"0"`` deletes the level, a new price is
  inserted in sorted order;
* gap rule: an update's ``pseq`` must equal the previous frame's ``seq`` (the first update's ``pseq``
  is the snapshot's ``seq``); otherwise the book is unusable until a new snapshot (resubscribe);
  frames without ``seq``/``pseq`` (v1 captures, older docs) are not gap-checked;
* checksum: CRC32 (zlib) over the first 25 bids and asks interleaved ``bid1p:bid1q:ask1p:ask1q:...``
  using the ORIGINAL wire strings, compared as a signed 32-bit integer; it is optional on v2 futures
  and is validated only when the key is present and the frame is an ``update`` (as ccxt does).

The encoder half (:class:`BooksEncoder`) turns a sequence of full books into ``books`` frames
(snapshot, then deltas with ``seq``/``pseq``/``checksum``) for the local server and tests.
"""

from __future__ import annotations

import math
import zlib
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from engine.events import BOOK_LEVELS, BookSnapshot, Nanos, Quarantined, Trade
from engine.validate import MAX_TS_MS, WireGuard
from wire.bitget.bitget_v2 import INST_TYPE, MS, Control, StreamCounters, arg, decode

CHECKSUM_DEPTH: Final = 25
BOOKS_CHANNEL: Final = "books"

Level = tuple[str, str]  # (price, size) exactly as on the wire


# ---------------------------------------------------------------- checksum


def checksum_string(bids: Sequence[Level], asks: Sequence[Level], depth: int = CHECKSUM_DEPTH) -> str:
    """``bid1p:bid1q:ask1p:ask1q:bid2p:...`` over the first ``depth`` levels; a short side is skipped."""
    parts: list[str] = []
    for i in range(depth):
        if i < len(bids):
            parts.append(bids[i][0])
            parts.append(bids[i][1])
        if i < len(asks):
            parts.append(asks[i][0])
            parts.append(asks[i][1])
    return ":".join(parts)


def crc32_signed(text: str) -> int:
    """zlib CRC32 of the UTF-8 bytes as a signed 32-bit int (``u - 2**32`` if ``u >= 2**31``)."""
    u = zlib.crc32(text.encode("utf-8"))
    return u - (1 << 32) if u >= (1 << 31) else u


def book_checksum(bids: Sequence[Level], asks: Sequence[Level], depth: int = CHECKSUM_DEPTH) -> int:
    return crc32_signed(checksum_string(bids, asks, depth))


# ---------------------------------------------------------------- local book


class BookError(ValueError):
    """A ``books`` frame that cannot be applied; ``reason`` is a short machine tag."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _parse_level(lvl: Any, side: str, i: int) -> tuple[float, float, str, str]:
    if not isinstance(lvl, list | tuple) or len(lvl) < 2:
        raise BookError("malformed", f"{side}[{i}] is not a [price, size] pair")
    ps, ss = lvl[0], lvl[1]
    if not isinstance(ps, str) or not isinstance(ss, str):
        raise BookError("malformed", f"{side}[{i}] price/size are not strings")
    try:
        p = float(ps)
        s = float(ss)
    except ValueError:
        raise BookError("malformed", f"{side}[{i}] {ps!r}/{ss!r} is not a number") from None
    if not (math.isfinite(p) and math.isfinite(s)) or p <= 0 or s < 0:
        raise BookError("malformed", f"{side}[{i}] {ps!r}/{ss!r} is out of range")
    return p, s, ps, ss


class LocalBook:
    """One symbol's full-depth book. Levels keep their original wire strings (for the checksum).

    Keys are the float price; bids are kept as sorted negated keys so both sides iterate best-first.
    """

    __slots__ = ("_bids", "_asks", "_bid_keys", "_ask_keys", "seq", "ready")

    def __init__(self) -> None:
        self._bids: dict[float, Level] = {}
        self._asks: dict[float, Level] = {}
        self._bid_keys: list[float] = []  # -price, ascending = best bid first
        self._ask_keys: list[float] = []  # price, ascending = best ask first
        self.seq: int | None = None
        self.ready = False

    def reset(self) -> None:
        self._bids.clear()
        self._asks.clear()
        self._bid_keys.clear()
        self._ask_keys.clear()
        self.seq = None
        self.ready = False

    def _apply_side(self, raw: Any, side: str) -> None:
        if raw is None:
            return
        if not isinstance(raw, list):
            raise BookError("malformed", f"{side} is not a list")
        levels = self._bids if side == "bids" else self._asks
        keys = self._bid_keys if side == "bids" else self._ask_keys
        sign = -1.0 if side == "bids" else 1.0
        for i, lvl in enumerate(raw):
            p, s, ps, ss = _parse_level(lvl, side, i)
            k = sign * p
            if s == 0.0:
                if p in levels:
                    del levels[p]
                    del keys[bisect_left(keys, k)]
                continue
            if p not in levels:
                insort(keys, k)
            levels[p] = (ps, ss)

    def load_snapshot(self, bids: Any, asks: Any) -> None:
        self.reset()
        self._apply_side(bids, "bids")
        self._apply_side(asks, "asks")
        self.ready = True

    def apply_update(self, bids: Any, asks: Any) -> None:
        self._apply_side(bids, "bids")
        self._apply_side(asks, "asks")

    def bids(self, n: int | None = None) -> list[Level]:
        keys = self._bid_keys if n is None else self._bid_keys[:n]
        return [self._bids[-k] for k in keys]

    def asks(self, n: int | None = None) -> list[Level]:
        keys = self._ask_keys if n is None else self._ask_keys[:n]
        return [self._asks[k] for k in keys]

    def depth(self) -> tuple[int, int]:
        return len(self._bid_keys), len(self._ask_keys)

    def best(self) -> tuple[float | None, float | None]:
        b = -self._bid_keys[0] if self._bid_keys else None
        a = self._ask_keys[0] if self._ask_keys else None
        return b, a

    def crossed(self) -> bool:
        b, a = self.best()
        return b is not None and a is not None and b >= a

    def checksum(self, depth: int = CHECKSUM_DEPTH) -> int:
        return book_checksum(self.bids(depth), self.asks(depth), depth)

    def top_levels(self, n: int = BOOK_LEVELS) -> tuple[tuple[float, ...], ...]:
        """``(bid_px, bid_sz, ask_px, ask_sz)`` of the first ``n`` levels, NaN-padded (BookSnapshot shape)."""
        nan = math.nan
        bk = self._bid_keys[:n]
        ak = self._ask_keys[:n]
        bid_px = tuple(-k for k in bk) + (nan,) * (n - len(bk))
        bid_sz = tuple(float(self._bids[-k][1]) for k in bk) + (nan,) * (n - len(bk))
        ask_px = tuple(ak) + (nan,) * (n - len(ak))
        ask_sz = tuple(float(self._asks[k][1]) for k in ak) + (nan,) * (n - len(ak))
        return bid_px, bid_sz, ask_px, ask_sz


# ---------------------------------------------------------------- frame application


def _int_or_none(v: Any, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool):
        raise BookError("malformed", f"{what} is a boolean")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    raise BookError("malformed", f"{what} {v!r} is not an integer")


@dataclass(frozen=True, slots=True)
class BookFault:
    """A ``books`` frame broke the local book: the symbol needs a resubscribe (new snapshot).

    ``reason`` is one of ``seq_gap``, ``checksum``, ``no_snapshot``, ``crossed``, ``malformed``.
    """

    symbol: str
    reason: str
    detail: str


@dataclass(slots=True)
class BooksOptions:
    verify_snapshot_checksum: bool = False  # ccxt checks updates only; v1 captures carry it on snapshots too
    check_crossed: bool = True


class BooksState:
    """Local books for every symbol of one feed; applies ``books`` frames in arrival order."""

    def __init__(self, options: BooksOptions | None = None) -> None:
        self.options = options or BooksOptions()
        self.books: dict[str, LocalBook] = {}
        self.checksums_verified = 0
        self.faults = 0

    def book(self, symbol: str) -> LocalBook:
        b = self.books.get(symbol)
        if b is None:
            b = self.books[symbol] = LocalBook()
        return b

    def apply(self, symbol: str, action: Any, d: Mapping[str, Any]) -> LocalBook:
        """Apply one ``data[]`` element. Raises :class:`BookError`; after an error the book is reset."""
        book = self.book(symbol)
        try:
            self._apply(book, action, d)
        except BookError:
            self.faults += 1
            book.reset()
            raise
        return book

    def _apply(self, book: LocalBook, action: Any, d: Mapping[str, Any]) -> None:
        seq = _int_or_none(d.get("seq"), "seq")
        pseq = _int_or_none(d.get("pseq"), "pseq")
        checksum = _int_or_none(d.get("checksum"), "checksum")
        if action == "snapshot":
            book.load_snapshot(d.get("bids"), d.get("asks"))
            if checksum is not None and self.options.verify_snapshot_checksum:
                self._verify(book, checksum)
        elif action == "update":
            if not book.ready:
                raise BookError("no_snapshot", "update before any snapshot")
            if pseq is not None and book.seq is not None and pseq != book.seq:
                raise BookError("seq_gap", f"pseq {pseq} != previous seq {book.seq}")
            book.apply_update(d.get("bids"), d.get("asks"))
            if checksum is not None:
                self._verify(book, checksum)
        else:
            raise BookError("malformed", f"action {action!r} is not snapshot/update")
        if self.options.check_crossed and book.crossed():
            b, a = book.best()
            raise BookError("crossed", f"best bid {b} >= best ask {a}")
        book.seq = seq

    def _verify(self, book: LocalBook, expected: int) -> None:
        got = book.checksum()
        if got != expected:
            raise BookError("checksum", f"computed {got} != frame checksum {expected}")
        self.checksums_verified += 1


def is_books_frame(raw: bytes | str) -> bool:
    """Cheap pre-filter: could this frame be a ``books`` push? (Confirmed after parsing.)"""
    needle = b'"books"' if isinstance(raw, bytes) else '"books"'
    return needle in raw  # type: ignore[operator]


DecodedItem = BookSnapshot | Trade | Quarantined | Control | BookFault


def parse_books_frame(raw: bytes | str) -> dict[str, Any] | None:
    """The parsed frame if ``raw`` is a ``books`` data push (not an ack/error), else ``None``."""
    if not is_books_frame(raw):
        return None
    try:
        frame = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(frame, dict) or "event" in frame:
        return None
    a = frame.get("arg")
    if not isinstance(a, dict) or a.get("channel") != BOOKS_CHANNEL or not isinstance(a.get("instId"), str):
        return None
    return frame


def books_frame_events(
    frame: Mapping[str, Any],
    raw: bytes | str,
    ts_recv: Nanos,
    counters: StreamCounters,
    state: BooksState,
    *,
    emit: bool = True,
    source: str = "bitget_v2",
    guard: WireGuard | None = None,
) -> list[DecodedItem]:
    """Apply one parsed ``books`` push (see :func:`parse_books_frame`) to ``state``.

    With ``emit`` the book's top 15 levels become a ``BookSnapshot`` (``exch_seq`` = the frame's
    ``seq``, or 0 when absent). A frame that breaks the book yields a ``Quarantined`` record (its
    reason names the fault) and a :class:`BookFault`; the caller resubscribes and records a gap.
    A book that fails the wire checks (``guard``; a timestamp out of int64 always does) is quarantined
    without a fault: the local book stays right (``seq``/``pseq`` and the checksum say so), only that
    snapshot of it is not an event, so nothing needs a resubscribe.
    """
    symbol = frame["arg"]["instId"]

    def quarantine(reason: str) -> Quarantined:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        return Quarantined(
            ts_event=ts_recv,
            ts_recv=ts_recv,
            seq=counters.take("quarantine"),
            source=source,
            reason=reason,
            raw=text[:4096],
        )

    data = frame.get("data")
    if not isinstance(data, list) or not data or not all(isinstance(d, dict) for d in data):
        state.book(symbol).reset()
        return [
            quarantine("books: malformed: data is missing or empty"),
            BookFault(symbol, "malformed", "no data"),
        ]
    out: list[DecodedItem] = []
    for d in data:
        try:
            book = state.apply(symbol, frame.get("action"), d)
            ts_ms = _int_or_none(d.get("ts"), "data.ts")
        except BookError as e:
            state.book(symbol).reset()
            out.append(quarantine(f"books: {e.reason}: {e.detail}"))
            out.append(BookFault(symbol, e.reason, e.detail))
            return out
        if not emit:
            continue
        nb, na = book.depth()
        if nb == 0 or na == 0:
            continue  # a book with an empty side is not a usable snapshot
        bid_px, bid_sz, ask_px, ask_sz = book.top_levels(BOOK_LEVELS)
        ts_ms = ts_ms if ts_ms is not None else ts_recv // MS
        why = "" if 0 <= ts_ms <= MAX_TS_MS else f"bad_ts: data.ts {ts_ms} ms does not fit int64 nanoseconds"
        if guard is not None and not why:
            why = guard.book_reason(ts_ms, ts_recv, symbol, bid_px, bid_sz, ask_px, ask_sz)
        if why:
            out.append(quarantine(f"books: {why}"))
            continue
        out.append(
            BookSnapshot(
                ts_event=ts_ms * MS,
                ts_recv=ts_recv,
                seq=counters.take("books15"),
                symbol=symbol,
                exch_seq=book.seq or 0,
                bid_px=bid_px,
                bid_sz=bid_sz,
                ask_px=ask_px,
                ask_sz=ask_sz,
            )
        )
    return out


def decode_with_books(
    raw: bytes | str,
    ts_recv: Nanos,
    counters: StreamCounters,
    state: BooksState,
    *,
    emit_snapshots: bool | Callable[[str], bool] = True,
    source: str = "bitget_v2",
    guard: WireGuard | None = None,
) -> list[DecodedItem]:
    """:func:`wire.bitget.bitget_v2.decode` plus the ``books`` channel (see :func:`books_frame_events`).

    ``emit_snapshots`` is a bool or ``f(symbol) -> bool``; ``guard``: the feed's wire checks.
    """
    frame = parse_books_frame(raw)
    if frame is None:
        return list(decode(raw, ts_recv, counters, guard))
    symbol = frame["arg"]["instId"]
    if guard is not None and (why := guard.inst_type_reason(frame["arg"].get("instType"))):
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        reason = f"books: {why}"
        seq = counters.take("quarantine")
        return [
            Quarantined(
                ts_event=ts_recv, ts_recv=ts_recv, seq=seq, source=source, reason=reason, raw=text[:4096]
            )
        ]
    emit = emit_snapshots(symbol) if callable(emit_snapshots) else emit_snapshots
    return books_frame_events(frame, raw, ts_recv, counters, state, emit=emit, source=source, guard=guard)


# ---------------------------------------------------------------- encoding (local server, tests)


def encode_books(
    symbol: str,
    *,
    action: str,
    bids: Iterable[Sequence[str]],
    asks: Iterable[Sequence[str]],
    ts_ms: int,
    seq: int,
    pseq: int,
    push_ts_ms: int,
    checksum: int | None = None,
    inst_type: str = INST_TYPE,
) -> bytes:
    """A ``books`` push as Bitget v2 sends it; ``checksum`` is omitted when ``None`` (as on v2 futures)."""
    data: dict[str, Any] = {
        "asks": [list(x) for x in asks],
        "bids": [list(x) for x in bids],
        "ts": str(ts_ms),
        "seq": seq,
        "pseq": pseq,
    }
    if checksum is not None:
        data["checksum"] = checksum
    return orjson.dumps(
        {"action": action, "arg": arg(BOOKS_CHANNEL, symbol, inst_type), "data": [data], "ts": push_ts_ms}
    )


def diff_levels(old: Mapping[str, str], new: Mapping[str, str]) -> list[list[str]]:
    """Delta from ``old`` to ``new`` (price string -> size string): changed/new levels, removed as ``"0"``."""
    out = [[p, s] for p, s in new.items() if old.get(p) != s]
    out.extend([p, "0"] for p in old if p not in new)
    return out


class BooksEncoder:
    """Turns successive full books of one symbol into ``books`` frames: a snapshot, then updates.

    ``seq`` rises by one per frame; each update's ``pseq`` is the previous frame's ``seq``. With
    ``with_checksum`` the updates carry the CRC32 of the book after the update.
    """

    def __init__(self, symbol: str, *, first_seq: int = 1, with_checksum: bool = True) -> None:
        self.symbol = symbol
        self.with_checksum = with_checksum
        self._seq = first_seq - 1
        self._bids: dict[str, str] = {}
        self._asks: dict[str, str] = {}
        self._started = False

    @property
    def seq(self) -> int:
        return self._seq

    def reset(self) -> None:
        """Next frame is a snapshot again (as after a resubscribe)."""
        self._started = False

    def skip(self) -> None:
        """Burn one ``seq`` without a frame: the client sees ``pseq`` != its last ``seq``."""
        self._seq += 1

    def encode(
        self,
        bids: Sequence[Level],
        asks: Sequence[Level],
        *,
        ts_ms: int,
        push_ts_ms: int,
        checksum_offset: int = 0,
    ) -> bytes | None:
        """The frame moving the client to this book; ``None`` when nothing changed after the snapshot."""
        nb = dict(bids)
        na = dict(asks)
        pseq = self._seq
        if not self._started:
            self._started = True
            self._bids, self._asks = nb, na
            self._seq += 1
            return encode_books(
                self.symbol,
                action="snapshot",
                bids=bids,
                asks=asks,
                ts_ms=ts_ms,
                seq=self._seq,
                pseq=0,
                push_ts_ms=push_ts_ms,
                checksum=0 if self.with_checksum else None,  # "Snapshots carry 0 or nothing"
            )
        db = diff_levels(self._bids, nb)
        da = diff_levels(self._asks, na)
        if not db and not da:
            return None
        self._bids, self._asks = nb, na
        self._seq += 1
        cs = None
        if self.with_checksum:
            cs = book_checksum(bids, asks) + checksum_offset
            cs = ((cs + (1 << 31)) % (1 << 32)) - (1 << 31)  # stay a signed 32-bit int
        return encode_books(
            self.symbol,
            action="update",
            bids=db,
            asks=da,
            ts_ms=ts_ms,
            seq=self._seq,
            pseq=pseq,
            push_ts_ms=push_ts_ms,
            checksum=cs,
        )
