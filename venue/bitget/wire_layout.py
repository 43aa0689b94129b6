"""How the local Bitget server lays out its book pushes, per year of real captures, and its full book.

Bitget's v2 book frames changed over the years (facts from real captures, ``../shared/docs/bitget-v2.md``
and issue 53), and clients must take every layout, so the local server can speak each one:

* 2024: fixed-depth (``books1``/``books5``/``books15``, every push whole) ``checksum: 0`` and no
  ``seq``; ``books`` a ``checksum`` (0 on a snapshot) and no ``seq``, as the v1 capture in
  ``../shared/data/real`` has it (no 2024 v2 ``books`` capture is at hand);
* 2025: ``books`` a ``checksum`` and ``seq``, no ``pseq`` (spot captures); fixed-depth
  ``checksum: 0`` and ``seq``, the doc's example, between the two captured forms;
* 2026: fixed-depth ``seq`` and ``pseq``, no checksum; ``books`` ``seq`` and ``pseq``, no checksum
  (futures captures).

The ``books`` channel is the full depth: :class:`DeepBook` keeps a book deeper than the CRC's 25
levels. Its top comes from the source's fixed-depth pushes (authoritative over the price range they
cover); below that, levels that moved out of the top keep their last size, and the far end is filled
to ``depth`` levels on the source's price grid with sizes fixed by the price (so a level keeps its
size until the feed changes it). A level the feed sent is never invented or promoted: the CRC32 of
an update covers the top 25 levels of this full book, exactly what a client that applies every delta
holds. :class:`BooksStream` turns successive full books into one connection's ``books`` frames,
updates sorted by price (bids descending, asks ascending).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import orjson

from wire.bitget.bitget_v2_books import book_checksum

YEARS: Final = ("2024", "2025", "2026")
LATEST: Final = "2026"
FIXED_DEPTH: Final = {"books1": 1, "books5": 5, "books15": 15}
DEFAULT_BOOKS_DEPTH: Final = 200  # levels a side; a real v2 snapshot carries 200 (500 on BTCUSDT)


@dataclass(frozen=True, slots=True)
class WireLayout:
    """Which optional keys a year's book pushes carry."""

    year: str
    fixed_checksum: bool  # fixed-depth: "checksum": 0
    fixed_seq: bool
    fixed_pseq: bool
    books_checksum: bool  # books: 0 on a snapshot, CRC32 of the top 25 levels on an update
    books_seq: bool
    books_pseq: bool


LAYOUTS: Final[Mapping[str, WireLayout]] = {
    "2024": WireLayout("2024", True, False, False, True, False, False),
    "2025": WireLayout("2025", True, True, False, True, True, False),
    "2026": WireLayout("2026", False, True, True, False, True, True),
}


def layout_of(year: str | int) -> WireLayout:
    y = str(year)
    if y not in LAYOUTS:
        raise ValueError(f"wire year is one of {', '.join(YEARS)}, got {year!r}")
    return LAYOUTS[y]


# ---------------------------------------------------------------- fixed-depth pushes


def encode_fixed(parsed: Mapping[str, Any], channel: str, layout: WireLayout, pseq: int) -> bytes:
    """A fixed-depth push of ``channel`` in ``layout`` from a parsed source push (any fixed-depth
    layout): its top ``FIXED_DEPTH[channel]`` levels, ``arg.instType`` and push ``ts`` kept; ``pseq``
    is the previous push's ``seq`` on that connection (2026)."""
    n = FIXED_DEPTH[channel]
    out = []
    for d in parsed["data"]:
        e: dict[str, Any] = {"asks": d["asks"][:n], "bids": d["bids"][:n]}
        seq = d.get("seq", 0)
        if layout.fixed_checksum:  # the doc's key order: asks, bids, checksum, seq, ts
            e["checksum"] = 0
            if layout.fixed_seq:
                e["seq"] = seq
            e["ts"] = d["ts"]
        else:  # 2026 capture order: asks, bids, ts, seq, pseq
            e["ts"] = d["ts"]
            if layout.fixed_seq:
                e["seq"] = seq
            if layout.fixed_pseq:
                e["pseq"] = pseq
        out.append(e)
    a = dict(parsed["arg"])
    a["channel"] = channel
    return orjson.dumps({"action": "snapshot", "arg": a, "data": out, "ts": parsed["ts"]})


def is_layout(frame: bytes, layout: WireLayout) -> bool:
    """Cheap test: is this encoded fixed-depth push already in ``layout`` (then it goes out verbatim)?"""
    has_cs = b'"checksum":' in frame
    has_seq = b'"seq":' in frame
    has_pseq = b'"pseq":' in frame
    return (has_cs, has_seq, has_pseq) == (layout.fixed_checksum, layout.fixed_seq, layout.fixed_pseq)


# ---------------------------------------------------------------- the full book


Level = tuple[Decimal, str, str]  # (price, price string, size string) as on the wire


def _dec(s: str) -> Decimal | None:
    try:
        d = Decimal(s)
    except (InvalidOperation, TypeError):
        return None
    return d if d.is_finite() and d > 0 else None


def _places(s: str) -> int:
    return len(s.partition(".")[2])


@dataclass(frozen=True, slots=True)
class BookView:
    """One full book as the server holds it after a source push (best first on each side)."""

    bids: tuple[Level, ...]
    asks: tuple[Level, ...]
    ts: str  # data.ts of the source push
    push_ts: int
    inst_type: str


class DeepBook:
    """One symbol's full-depth book, fed by the source's fixed-depth pushes (see the module text)."""

    def __init__(self, symbol: str, *, depth: int = DEFAULT_BOOKS_DEPTH, seed: int = 0) -> None:
        if depth <= 25:
            raise ValueError(f"books depth must exceed the checksum's 25 levels, got {depth}")
        self.symbol = symbol
        self.depth = depth
        self.seed = seed
        self._bids: dict[Decimal, tuple[str, str]] = {}
        self._asks: dict[Decimal, tuple[str, str]] = {}
        self._tick: Decimal | None = None
        self._px_places = 0
        self._sz_places = 3

    def _size(self, price: str) -> str:
        """A deep level's size: fixed by the price (and seed), on the source's size decimals."""
        h = zlib.crc32(f"{self.seed}:{self.symbol}:{price}".encode())
        units = 1 + h % 5000
        q = Decimal(units).scaleb(-self._sz_places) if self._sz_places else Decimal(units)
        return format(q, "f")

    def _learn_grid(self, bids: Sequence[Sequence[str]], asks: Sequence[Sequence[str]]) -> None:
        px = sorted({d for lv in (*bids, *asks) if (d := _dec(lv[0])) is not None})
        gaps = [b - a for a, b in zip(px, px[1:], strict=False) if b > a]
        places = max((_places(lv[0]) for lv in (*bids, *asks)), default=0)
        self._px_places = max(self._px_places, places)
        self._sz_places = max((_places(lv[1]) for lv in (*bids, *asks)), default=self._sz_places)
        tick = min(gaps) if gaps else Decimal(1).scaleb(-self._px_places)
        if self._tick is None or tick < self._tick:
            self._tick = tick

    @staticmethod
    def _replace_top(side: dict[Decimal, tuple[str, str]], top: Sequence[Sequence[str]], bids: bool) -> None:
        levels = [(d, str(lv[0]), str(lv[1])) for lv in top if (d := _dec(str(lv[0]))) is not None]
        if not levels:
            return
        edge = min(d for d, _, _ in levels) if bids else max(d for d, _, _ in levels)
        for k in [k for k in side if (k >= edge if bids else k <= edge)]:
            del side[k]  # the source's range is authoritative: what it does not list is not there
        for d, p, s in levels:
            side[d] = (p, s)

    def _fill(self, side: dict[Decimal, tuple[str, str]], bids: bool) -> None:
        keys = sorted(side, reverse=bids)
        for k in keys[self.depth :]:
            del side[k]  # past the published depth
        tick = self._tick
        if tick is None or not keys:
            return
        far = keys[min(len(keys), self.depth) - 1]
        q = Decimal(1).scaleb(-self._px_places)
        while len(side) < self.depth:
            far = (far - tick if bids else far + tick).quantize(q)
            if far <= 0:
                break
            p = format(far, "f")
            side[far] = (p, self._size(p))

    def update(self, parsed: Mapping[str, Any]) -> BookView:
        """Take one source fixed-depth push (parsed); returns the full book after it."""
        d = parsed["data"][0]
        bids, asks = d.get("bids") or [], d.get("asks") or []
        self._learn_grid(bids, asks)
        self._replace_top(self._bids, bids, True)
        self._replace_top(self._asks, asks, False)
        # nothing may cross the source's top (a deep level left over from before a jump)
        if self._asks and self._bids:
            best_bid = max(self._bids)
            for k in [k for k in self._asks if k <= best_bid]:
                del self._asks[k]
            best_ask = min(self._asks) if self._asks else None
            if best_ask is not None:
                for k in [k for k in self._bids if k >= best_ask]:
                    del self._bids[k]
        self._fill(self._bids, True)
        self._fill(self._asks, False)
        return BookView(
            bids=tuple((k, *self._bids[k]) for k in sorted(self._bids, reverse=True)),
            asks=tuple((k, *self._asks[k]) for k in sorted(self._asks)),
            ts=str(d.get("ts", "")),
            push_ts=int(parsed.get("ts", 0) or 0),
            inst_type=str(parsed["arg"]["instType"]),
        )


class BooksStream:
    """One connection's ``books`` channel for one symbol: a snapshot, then sorted price deltas."""

    def __init__(self, arg: Mapping[str, str], layout: WireLayout, *, first_seq: int = 1) -> None:
        self.arg = dict(arg)
        self.layout = layout
        self.seq = first_seq - 1
        self._bids: dict[Decimal, tuple[str, str]] = {}
        self._asks: dict[Decimal, tuple[str, str]] = {}
        self._started = False

    @property
    def started(self) -> bool:
        """Whether the snapshot has gone out (the next frame is an update)."""
        return self._started

    def reset(self) -> None:
        """The next frame is a snapshot again (as after a resubscribe)."""
        self._started = False

    @staticmethod
    def _delta(
        old: Mapping[Decimal, tuple[str, str]], new: Sequence[Level], bids: bool
    ) -> list[tuple[Decimal, list[str]]]:
        seen = set()
        out = []
        for k, p, s in new:
            seen.add(k)
            if old.get(k) != (p, s):
                out.append((k, [p, s]))
        out.extend((k, [old[k][0], "0"]) for k in old if k not in seen)
        out.sort(key=lambda x: x[0], reverse=bids)
        return out

    def encode(self, view: BookView, *, checksum_offset: int = 0, burn: bool = False) -> bytes | None:
        """The frame moving the client to ``view``; ``None`` when nothing changed after the snapshot.
        ``checksum_offset`` (a fault) puts a wrong checksum on an update, in any layout; ``burn``
        (a fault) takes the update's ``seq`` and returns ``b""`` instead of its frame."""
        snapshot = not self._started
        pseq = self.seq
        if snapshot:
            bids = [[p, s] for _, p, s in view.bids]
            asks = [[p, s] for _, p, s in view.asks]
        else:
            db = self._delta(self._bids, view.bids, True)
            da = self._delta(self._asks, view.asks, False)
            if not db and not da:
                return None
            bids = [x for _, x in db]
            asks = [x for _, x in da]
        self._started = True
        self._bids = {k: (p, s) for k, p, s in view.bids}
        self._asks = {k: (p, s) for k, p, s in view.asks}
        self.seq += 1
        if burn and not snapshot:
            return b""
        lay = self.layout
        d: dict[str, Any] = {"asks": asks, "bids": bids}
        checksum: int | None = None
        if snapshot:
            checksum = 0 if lay.books_checksum else None  # "Snapshots carry 0 or nothing"
        elif lay.books_checksum or checksum_offset:
            top_b = [(p, s) for _, p, s in view.bids[:25]]
            top_a = [(p, s) for _, p, s in view.asks[:25]]
            cs = book_checksum(top_b, top_a) + checksum_offset
            checksum = ((cs + (1 << 31)) % (1 << 32)) - (1 << 31)  # stays a signed 32-bit int
        if lay.books_pseq:  # 2026 futures capture order: asks, bids, ts, seq, pseq
            d["ts"] = view.ts
            d["seq"] = self.seq
            d["pseq"] = 0 if snapshot else pseq
            if checksum is not None:
                d["checksum"] = checksum
        else:  # the doc's order: asks, bids, checksum, seq, ts
            if checksum is not None:
                d["checksum"] = checksum
            if lay.books_seq:
                d["seq"] = self.seq
            d["ts"] = view.ts
        return orjson.dumps(
            {
                "action": "snapshot" if snapshot else "update",
                "arg": self.arg,
                "data": [d],
                "ts": view.push_ts,
            }
        )
