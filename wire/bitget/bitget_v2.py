"""Bitget v2 public WebSocket wire codec (USDT-M perpetuals). Pure: no I/O.

Shared by the simulator, the recorder, the local Bitget-protocol server and live mode. Shapes and
variants are in ``../shared/docs/bitget-v2.md``. Prices and sizes stay exchange strings on the wire
and are parsed exactly once, here, into typed events. Anything that does not parse becomes a
``Quarantined`` record with a reason; nothing raises and nothing is dropped silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from engine.events import BOOK_LEVELS, BookSnapshot, Nanos, Quarantined, Trade
from engine.validate import MAX_TS_MS, WireGuard, WireLimits

WS_PUBLIC_URL: Final = "wss://ws.bitget.com/v2/ws/public"
WS_PRIVATE_URL: Final = "wss://ws.bitget.com/v2/ws/private"
REST_BASE_URL: Final = "https://api.bitget.com"
INST_TYPE: Final = "USDT-FUTURES"
PUBLIC_CHANNELS: Final = ("books15", "trade")
# fixed-depth book channels and their depth: every push a full snapshot of that many levels a side
FIXED_DEPTH: Final = {"books1": 1, "books5": 5, "books15": BOOK_LEVELS}
INT64_MAX: Final = 2**63 - 1
MS: Final = 1_000_000  # ns per ms

# Control frames: the text keepalive and the event frames (acks, errors, login).
PING: Final = b"ping"
PONG: Final = b"pong"


@dataclass(frozen=True, slots=True)
class Control:
    """A non-data frame: ``pong``, a subscribe/unsubscribe ack, a login reply or an error."""

    kind: str
    arg: Mapping[str, Any] | None = None
    code: int | None = None
    msg: str = ""


@dataclass(slots=True)
class StreamCounters:
    """Per-stream sequence numbers handed out as frames are decoded."""

    next_seq: dict[str, int] = field(default_factory=dict)

    def take(self, stream: str) -> int:
        n = self.next_seq.get(stream, 0)
        self.next_seq[stream] = n + 1
        return n


class FrameError(ValueError):
    """A frame that cannot be normalised; the message is the quarantine reason."""


# ---------------------------------------------------------------- encoding (simulator, server)


def arg(channel: str, symbol: str, inst_type: str = INST_TYPE) -> dict[str, str]:
    return {"instType": inst_type, "channel": channel, "instId": symbol}


def subscribe_request(args: Sequence[Mapping[str, str]], op: str = "subscribe") -> bytes:
    return orjson.dumps({"op": op, "args": list(args)})


def encode_books15(
    symbol: str,
    *,
    ts_ms: int,
    seq: int,
    bids: Sequence[tuple[str, str]],
    asks: Sequence[tuple[str, str]],
    push_ts_ms: int,
) -> bytes:
    """A ``books15`` push exactly as Bitget sends it: every push a snapshot, ``checksum`` 0."""
    data = {
        "asks": [list(a) for a in asks],
        "bids": [list(b) for b in bids],
        "checksum": 0,
        "seq": seq,
        "ts": str(ts_ms),
    }
    return orjson.dumps(
        {"action": "snapshot", "arg": arg("books15", symbol), "data": [data], "ts": push_ts_ms}
    )


def encode_trades(
    symbol: str,
    trades: Sequence[Mapping[str, str]],
    *,
    push_ts_ms: int,
    action: str = "update",
) -> bytes:
    """A ``trade`` push; ``trades`` are ``{ts, price, size, side, tradeId}`` string maps, newest first."""
    return orjson.dumps(
        {"action": action, "arg": arg("trade", symbol), "data": list(trades), "ts": push_ts_ms}
    )


# ---------------------------------------------------------------- decoding


def _num(s: Any, what: str) -> float:
    if not isinstance(s, str):
        raise FrameError(f"{what} is {type(s).__name__}, expected string")
    try:
        v = float(s)
    except ValueError:
        raise FrameError(f"{what} {s!r} is not a number") from None
    if not math.isfinite(v):
        raise FrameError(f"{what} {s!r} is not finite")
    return v


_STR = {str}


def _levels(
    raw: Any, side: str, channel: str = "books15", cap: int = BOOK_LEVELS
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Fast path for well-formed levels; anything unusual goes through :func:`_levels_checked`, which
    finds the precise reason (the recorder decodes every frame, so the common case must be cheap).
    ``cap``: the channel's depth (at most 15: the event holds 15 levels)."""
    if type(raw) is list and 0 < len(raw) <= cap:
        try:
            ps = [lvl[0] for lvl in raw]
            qs = [lvl[1] for lvl in raw]
            if set(map(type, ps)) == _STR and set(map(type, qs)) == _STR:
                px = list(map(float, ps))
                sz = list(map(float, qs))
                # C-level checks: finite (fsum is nan/inf otherwise), positive, strictly ordered.
                if (
                    math.isfinite(math.fsum(px))
                    and math.isfinite(math.fsum(sz))
                    and min(px) > 0
                    and min(sz) > 0
                    and len(set(px)) == len(px)
                    and px == sorted(px, reverse=side == "bids")
                ):
                    pad = (math.nan,) * (BOOK_LEVELS - len(px))
                    return tuple(px) + pad, tuple(sz) + pad
        except (ValueError, IndexError, TypeError):
            pass
    return _levels_checked(raw, side, channel, cap)


def _levels_checked(
    raw: Any, side: str, channel: str, cap: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if not isinstance(raw, list):
        raise FrameError(f"{side} is not a list")
    if len(raw) > cap:
        raise FrameError(f"{side} has {len(raw)} levels, {channel} allows {cap}")
    px: list[float] = []
    sz: list[float] = []
    for i, lvl in enumerate(raw):
        if not isinstance(lvl, list) or len(lvl) < 2:
            raise FrameError(f"{side}[{i}] is not a [price, size] pair")
        p = _num(lvl[0], f"{side}[{i}] price")
        q = _num(lvl[1], f"{side}[{i}] size")
        if p <= 0:
            raise FrameError(f"{side}[{i}] price {lvl[0]!r} is not positive")
        if q <= 0:
            raise FrameError(f"{side}[{i}] size {lvl[1]!r} is not positive")
        px.append(p)
        sz.append(q)
    for i in range(1, len(px)):
        ordered = px[i] < px[i - 1] if side == "bids" else px[i] > px[i - 1]
        if not ordered:
            order = "descending" if side == "bids" else "ascending"
            raise FrameError(f"{side} not strictly {order} at level {i}")
    pad = BOOK_LEVELS - len(px)
    nan = math.nan
    return tuple(px) + (nan,) * pad, tuple(sz) + (nan,) * pad


def _ts_ms(v: Any, what: str) -> int:
    """A millisecond timestamp: a JSON integer or a string of ASCII digits whose nanoseconds fit int64
    (anything else cannot be stored; the wire checks then judge its value)."""
    if isinstance(v, bool):
        raise FrameError(f"{what} is a boolean")
    if isinstance(v, int):
        t = v
    elif isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 25:
        t = int(v)
    else:
        raise FrameError(f"{what} {str(v)[:40]!r} is not an integer millisecond timestamp")
    if not 0 <= t <= MAX_TS_MS:
        raise FrameError(f"bad_ts: {what} {str(v)[:40]} ms does not fit int64 nanoseconds")
    return t


def _seq(v: Any, what: str) -> int:
    """An exchange sequence number: an int64 (Bitget's can pass 2**53), as a JSON integer or digits."""
    if isinstance(v, str) and v.isascii() and v.lstrip("-").isdigit() and len(v) <= 20:
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or not -INT64_MAX - 1 <= v <= INT64_MAX:
        raise FrameError(f"{what} {str(v)[:40]!r} is not an int64")
    return v


def parse_book(
    frame: Mapping[str, Any],
    ts_recv: Nanos,
    counters: StreamCounters,
    guard: WireGuard | None = None,
    channel: str = "books15",
) -> list[BookSnapshot]:
    """A fixed-depth push (``books1``, ``books5``, ``books15``). Every variant of the fields is taken:
    ``seq`` present or not (2024 captures: ``checksum: 0`` and no ``seq``; 2026: ``seq`` and ``pseq``,
    no checksum); ``checksum`` and ``pseq`` are not needed for a snapshot and are only type-checked."""
    symbol = frame["arg"]["instId"]
    cap = FIXED_DEPTH[channel]
    books = []
    for d in _data(frame):
        bid_px, bid_sz = _levels(d.get("bids"), "bids", channel, cap)
        ask_px, ask_sz = _levels(d.get("asks"), "asks", channel, cap)
        if bid_px[0] != bid_px[0] or ask_px[0] != ask_px[0]:
            raise FrameError("book has an empty side")
        if bid_px[0] >= ask_px[0]:
            raise FrameError(f"crossed book: best bid {bid_px[0]} >= best ask {ask_px[0]}")
        seq = 0 if d.get("seq") is None else _seq(d["seq"], "seq")  # absent or null: none sent
        for k in ("pseq", "checksum"):
            if d.get(k) is not None:
                _seq(d[k], k)
        ts_ms = _ts_ms(d.get("ts"), "data.ts")
        if guard is not None:
            why = guard.book_reason(ts_ms, ts_recv, symbol, bid_px, bid_sz, ask_px, ask_sz)
            if why:
                raise FrameError(why)
        books.append((ts_ms, seq, bid_px, bid_sz, ask_px, ask_sz))
    # seqs are taken once the whole push is accepted: a refused push leaves no hole in the stream
    return [
        BookSnapshot(
            ts_event=ts_ms * MS,
            ts_recv=ts_recv,
            seq=counters.take("books15"),
            symbol=symbol,
            exch_seq=seq,
            bid_px=bid_px,
            bid_sz=bid_sz,
            ask_px=ask_px,
            ask_sz=ask_sz,
        )
        for ts_ms, seq, bid_px, bid_sz, ask_px, ask_sz in books
    ]


def parse_books15(
    frame: Mapping[str, Any], ts_recv: Nanos, counters: StreamCounters, guard: WireGuard | None = None
) -> list[BookSnapshot]:
    return parse_book(frame, ts_recv, counters, guard, "books15")


def parse_books5(
    frame: Mapping[str, Any], ts_recv: Nanos, counters: StreamCounters, guard: WireGuard | None = None
) -> list[BookSnapshot]:
    return parse_book(frame, ts_recv, counters, guard, "books5")


def parse_books1(
    frame: Mapping[str, Any], ts_recv: Nanos, counters: StreamCounters, guard: WireGuard | None = None
) -> list[BookSnapshot]:
    return parse_book(frame, ts_recv, counters, guard, "books1")


def parse_trade(
    frame: Mapping[str, Any], ts_recv: Nanos, counters: StreamCounters, guard: WireGuard | None = None
) -> list[Trade]:
    """A ``trade`` push (``snapshot`` after each subscribe, then ``update``). With a guard, trade ids
    it has seen on the symbol are dropped (the snapshot repeats recent trades)."""
    symbol = frame["arg"]["instId"]
    rows = []
    for d in _data(frame):
        side = d.get("side")
        if side not in ("buy", "sell"):
            raise FrameError(f"trade side {str(side)[:40]!r} is not buy/sell")
        px = _num(d.get("price"), "trade price")
        sz = _num(d.get("size"), "trade size")
        if px <= 0 or sz <= 0:
            raise FrameError(f"trade price/size not positive: {d.get('price')!r}/{d.get('size')!r}")
        tid = d.get("tradeId")
        if not isinstance(tid, str) or not tid:
            raise FrameError(f"tradeId {str(tid)[:40]!r} is not a non-empty string")
        rows.append((_ts_ms(d.get("ts"), "trade ts"), tid, px, sz, side))
    # Bitget sends newest first; events go out oldest first. Stable sort keeps equal-ts order.
    rows.reverse()
    rows.sort(key=lambda r: r[0])
    if guard is not None:
        why = guard.trades_reason(rows, ts_recv, symbol)
        if why:
            raise FrameError(why)
        rows = [r for r in rows if guard.fresh(symbol, r[1])]
    return [
        Trade(
            ts_event=ts * MS,
            ts_recv=ts_recv,
            seq=counters.take("trade"),
            symbol=symbol,
            trade_id=tid,
            px=px,
            sz=sz,
            side=side,
        )
        for ts, tid, px, sz, side in rows
    ]


def _data(frame: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    data = frame.get("data")
    if not isinstance(data, list) or not data:
        raise FrameError("data is missing or empty")
    if not all(isinstance(d, dict) for d in data):
        raise FrameError("data element is not an object")
    return data


Parser = Callable[[Mapping[str, Any], Nanos, StreamCounters, WireGuard | None], list[Any]]
PARSERS: Final[Mapping[str, Parser]] = {
    "books15": parse_books15,
    "books5": parse_books5,
    "books1": parse_books1,
    "trade": parse_trade,
}


def wire_guard(
    limits: WireLimits | None = None,
    *,
    inst_type: str | None = INST_TYPE,
    intern: Any = None,
    dedupe: bool = True,
) -> WireGuard:
    """The wire checks for one feed of this venue (:class:`engine.validate.WireGuard`). The compiled
    scans read only the canonical USDT-FUTURES frame, so they may take frames only where that is the
    subscription's instType (or any is taken)."""
    fast = inst_type in (None, INST_TYPE)
    return WireGuard(limits, inst_type=inst_type, intern=intern, fast=fast, dedupe=dedupe)


def _code(v: Any) -> int | None:
    # Bitget sends ``code`` as a number or a string; accept both.
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def decode(
    raw: bytes | str, ts_recv: Nanos, counters: StreamCounters, guard: WireGuard | None = None
) -> list[BookSnapshot | Trade | Quarantined | Control]:
    """Turn one received WebSocket frame into typed events, control frames or a quarantine record.

    With a ``guard`` (every recorder, live feed and importer has one) the wire checks apply too
    (:mod:`engine.validate`): the subscription's instType, timestamps, price and size ranges, the price
    band and duplicate trade ids. A push whose trades were all seen before gives
    ``Control("duplicate", arg)`` instead of events (the frame was received; nothing in it is new)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if text == "pong":
        return [Control("pong")]

    def quarantine(reason: str) -> list[BookSnapshot | Trade | Quarantined | Control]:
        return [
            Quarantined(
                ts_event=ts_recv,
                ts_recv=ts_recv,
                seq=counters.take("quarantine"),
                source="bitget_v2",
                reason=reason,
                raw=text[:4096],
            )
        ]

    try:
        frame = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return quarantine(f"not JSON: {e}")
    if not isinstance(frame, dict):
        return quarantine("frame is not a JSON object")
    event = frame.get("event")
    if event is not None:
        return [Control(str(event), frame.get("arg"), _code(frame.get("code")), str(frame.get("msg", "")))]
    if frame.get("op") in ("subscribe", "unsubscribe") and "args" in frame:
        # Some doc versions acknowledge an unsubscribe as {"op":"unsubscribe","args":[...]}.
        return [Control(str(frame["op"]), {"args": frame["args"]})]
    a = frame.get("arg")
    if (
        not isinstance(a, dict)
        or not isinstance(a.get("channel"), str)
        or not isinstance(a.get("instId"), str)
    ):
        return quarantine("frame has no arg.channel/arg.instId")
    parser = PARSERS.get(a["channel"])
    if parser is None:
        return quarantine(f"unknown channel {a['channel'][:40]!r}")
    if guard is not None and (why := guard.inst_type_reason(a.get("instType"))):
        return quarantine(f"{a['channel']}: {why}")
    try:
        out: list[Any] = list(parser(frame, ts_recv, counters, guard))
    except FrameError as e:
        return quarantine(f"{a['channel']}: {e}")
    if not out:  # only a trade push whose every trade was a duplicate comes out empty
        return [Control("duplicate", a)]
    return out
