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

WS_PUBLIC_URL: Final = "wss://ws.bitget.com/v2/ws/public"
WS_PRIVATE_URL: Final = "wss://ws.bitget.com/v2/ws/private"
REST_BASE_URL: Final = "https://api.bitget.com"
INST_TYPE: Final = "USDT-FUTURES"
PUBLIC_CHANNELS: Final = ("books15", "trade")
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


def _levels(raw: Any, side: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Fast path for well-formed levels; anything unusual goes through :func:`_levels_checked`, which
    finds the precise reason (the recorder decodes every frame, so the common case must be cheap)."""
    if type(raw) is list and 0 < len(raw) <= BOOK_LEVELS:
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
    return _levels_checked(raw, side)


def _levels_checked(raw: Any, side: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if not isinstance(raw, list):
        raise FrameError(f"{side} is not a list")
    if len(raw) > BOOK_LEVELS:
        raise FrameError(f"{side} has {len(raw)} levels, books15 allows {BOOK_LEVELS}")
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
    if isinstance(v, bool):
        raise FrameError(f"{what} is a boolean")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.isdigit():
        return int(v)
    raise FrameError(f"{what} {v!r} is not an integer millisecond timestamp")


def parse_books15(frame: Mapping[str, Any], ts_recv: Nanos, counters: StreamCounters) -> list[BookSnapshot]:
    symbol = frame["arg"]["instId"]
    out = []
    for d in _data(frame):
        bid_px, bid_sz = _levels(d.get("bids"), "bids")
        ask_px, ask_sz = _levels(d.get("asks"), "asks")
        if bid_px[0] != bid_px[0] or ask_px[0] != ask_px[0]:
            raise FrameError("book has an empty side")
        if bid_px[0] >= ask_px[0]:
            raise FrameError(f"crossed book: best bid {bid_px[0]} >= best ask {ask_px[0]}")
        seq = d.get("seq", 0)
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise FrameError(f"seq {seq!r} is not an integer")
        out.append(
            BookSnapshot(
                ts_event=_ts_ms(d.get("ts"), "data.ts") * MS,
                ts_recv=ts_recv,
                seq=counters.take("books15"),
                symbol=symbol,
                exch_seq=seq,
                bid_px=bid_px,
                bid_sz=bid_sz,
                ask_px=ask_px,
                ask_sz=ask_sz,
            )
        )
    return out


def parse_trade(frame: Mapping[str, Any], ts_recv: Nanos, counters: StreamCounters) -> list[Trade]:
    symbol = frame["arg"]["instId"]
    rows = []
    for d in _data(frame):
        side = d.get("side")
        if side not in ("buy", "sell"):
            raise FrameError(f"trade side {side!r} is not buy/sell")
        px = _num(d.get("price"), "trade price")
        sz = _num(d.get("size"), "trade size")
        if px <= 0 or sz <= 0:
            raise FrameError(f"trade price/size not positive: {d.get('price')!r}/{d.get('size')!r}")
        tid = d.get("tradeId")
        if not isinstance(tid, str) or not tid:
            raise FrameError(f"tradeId {tid!r} is not a non-empty string")
        rows.append((_ts_ms(d.get("ts"), "trade ts"), tid, px, sz, side))
    # Bitget sends newest first; events go out oldest first. Stable sort keeps equal-ts order.
    rows.reverse()
    rows.sort(key=lambda r: r[0])
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


Parser = Callable[[Mapping[str, Any], Nanos, StreamCounters], list[Any]]
PARSERS: Final[Mapping[str, Parser]] = {"books15": parse_books15, "trade": parse_trade}


def _code(v: Any) -> int | None:
    # Bitget sends ``code`` as a number or a string; accept both.
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def decode(
    raw: bytes | str, ts_recv: Nanos, counters: StreamCounters
) -> list[BookSnapshot | Trade | Quarantined | Control]:
    """Turn one received WebSocket frame into typed events, control frames or a quarantine record."""
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
        return quarantine(f"unknown channel {a['channel']!r}")
    try:
        return list(parser(frame, ts_recv, counters))
    except FrameError as e:
        return quarantine(f"{a['channel']}: {e}")
