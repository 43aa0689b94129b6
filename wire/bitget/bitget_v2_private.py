"""Bitget v2 private WebSocket (USDT-M): login and the ``orders``, ``fill``, ``positions`` channels.

Pure: no I/O, no clock reads. Shapes are in ``../shared/docs/bitget-v2.md`` section 3:

- login: ``{"op":"login","args":[{"apiKey","passphrase","timestamp","sign"}]}`` with ``timestamp`` in
  **seconds** (a string) and ``sign = Base64(HMAC_SHA256(secret, timestamp + "GET" + "/user/verify"))``;
  success ``{"event":"login","code":"0"}`` (``code`` a string or a number), failure an error event;
- ``orders``: ``clientOid`` or the older ``clientOId``; on a fill the push adds ``tradeId``,
  ``fillPrice``, ``baseVolume`` (this fill), ``fillFee``, ``tradeScope`` (``T``/``M``), ``fillTime``;
  ``accBaseVolume`` is cumulative; ``status`` live/partially_filled/filled/canceled (or cancelled);
- ``fill``: ``orderId`` but no client oid; ``tradeScope`` ``taker``/``maker``; fee in ``feeDetail``;
- ``positions``: the full list of open positions; ``leverage`` a JSON number or a string.

A frame that does not parse becomes :class:`PrivateQuarantined` with the reason, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from wire.bitget.bitget_v2 import Control
from wire.bitget.bitget_v2_rest import (
    PRODUCT_TYPE,
    Credentials,
    PositionRow,
    _b64_hmac,
    client_oid_of,
    parse_position,
)

PRIVATE_CHANNELS: Final = ("orders", "fill", "positions")
LOGIN_PATH: Final = "/user/verify"


def login_sign(secret: str, ts_s: int | str) -> str:
    return _b64_hmac(secret, f"{ts_s}GET{LOGIN_PATH}")


def login_message(credentials: Credentials, ts_s: int) -> bytes:
    """The login request; ``ts_s`` is Unix time in **seconds** (Bitget expires it after 30 s)."""
    return orjson.dumps(
        {
            "op": "login",
            "args": [
                {
                    "apiKey": credentials.api_key,
                    "passphrase": credentials.passphrase,
                    "timestamp": str(ts_s),
                    "sign": login_sign(credentials.secret, ts_s),
                }
            ],
        }
    )


def private_args(
    channels: Sequence[str] = PRIVATE_CHANNELS, inst_type: str = PRODUCT_TYPE
) -> list[dict[str, str]]:
    return [{"instType": inst_type, "channel": ch, "instId": "default"} for ch in channels]


@dataclass(frozen=True, slots=True, kw_only=True)
class FillInfo:
    trade_id: str
    price: float
    qty: float
    fee: float  # as sent: negative when paid
    liquidity: str  # maker | taker
    time_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderUpdate:
    order_id: str
    client_oid: str
    symbol: str
    side: str
    order_type: str
    price: float
    size: float
    acc_filled: float
    price_avg: float
    status: str  # live | partially_filled | filled | canceled
    cancel_reason: str
    reduce_only: bool
    leverage: str
    u_time_ms: int
    fill: FillInfo | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FillUpdate:
    order_id: str
    trade_id: str
    symbol: str
    side: str
    order_type: str
    price: float
    qty: float
    fee: float
    liquidity: str
    trade_side: str
    time_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PositionsUpdate:
    """A ``positions`` push: every open position of the instType (an empty list = flat everywhere)."""

    positions: list[PositionRow]
    ts_ms: int


@dataclass(frozen=True, slots=True)
class PrivateQuarantined:
    reason: str
    raw: str


PrivateItem = OrderUpdate | FillUpdate | PositionsUpdate | Control | PrivateQuarantined

_LIQUIDITY: Final = {"T": "taker", "M": "maker", "taker": "taker", "maker": "maker"}


def _f(v: Any, default: float = math.nan) -> float:
    if v is None or v == "" or isinstance(v, bool):
        return default
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{v!r} is not a number") from None


def _ms(v: Any) -> int:
    if v is None or v == "" or isinstance(v, bool):
        return 0
    return int(v)


def _fee_detail(d: Mapping[str, Any]) -> float:
    fd = d.get("feeDetail")
    if isinstance(fd, list) and fd and isinstance(fd[0], Mapping):
        f = fd[0]
        return _f(f.get("totalFee", f.get("fee")), 0.0)
    return 0.0


def parse_order(d: Mapping[str, Any]) -> OrderUpdate:
    status = str(d.get("status", ""))
    if status == "cancelled":
        status = "canceled"
    fill = None
    if d.get("tradeId"):
        fill = FillInfo(
            trade_id=str(d["tradeId"]),
            price=_f(d.get("fillPrice")),
            qty=_f(d.get("baseVolume"), 0.0),
            fee=_f(d.get("fillFee"), _fee_detail(d)),
            liquidity=_LIQUIDITY.get(str(d.get("tradeScope", "")), "taker"),
            time_ms=_ms(d.get("fillTime") or d.get("uTime")),
        )
    return OrderUpdate(
        order_id=str(d.get("orderId", "")),
        client_oid=client_oid_of(d),
        symbol=str(d.get("instId", d.get("symbol", ""))),
        side=str(d.get("side", "")),
        order_type=str(d.get("orderType", "")),
        price=_f(d.get("price")),
        size=_f(d.get("size"), 0.0),
        acc_filled=_f(d.get("accBaseVolume"), 0.0),
        price_avg=_f(d.get("priceAvg")),
        status=status,
        cancel_reason=str(d.get("cancelReason", "") or ""),
        reduce_only=str(d.get("reduceOnly", "no")).lower() in ("yes", "true"),
        leverage=str(d.get("leverage", "")),
        u_time_ms=_ms(d.get("uTime") or d.get("cTime")),
        fill=fill,
    )


def parse_fill(d: Mapping[str, Any]) -> FillUpdate:
    return FillUpdate(
        order_id=str(d.get("orderId", "")),
        trade_id=str(d.get("tradeId", "")),
        symbol=str(d.get("symbol", d.get("instId", ""))),
        side=str(d.get("side", "")),
        order_type=str(d.get("orderType", "")),
        price=_f(d.get("price")),
        qty=_f(d.get("baseVolume"), 0.0),
        fee=_fee_detail(d),
        liquidity=_LIQUIDITY.get(str(d.get("tradeScope", "")), "taker"),
        trade_side=str(d.get("tradeSide", "")),
        time_ms=_ms(d.get("uTime") or d.get("cTime")),
    )


def parse_fill_page(data: Any) -> tuple[list[FillUpdate], str]:
    """A page of the REST ``fills`` endpoint, ``{"fillList": [...] | null, "endId": ...}``: its rows
    are the ``fill`` channel's. Returns the fills and ``endId`` (the next page's ``idLessThan``)."""
    if not isinstance(data, Mapping):
        return [], ""
    return [parse_fill(r) for r in data.get("fillList") or []], str(data.get("endId") or "")


def _code(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def parse_private(raw: bytes | str) -> list[PrivateItem]:
    """One private frame -> typed updates, control frames (``pong``, login, acks, errors) or quarantine."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if text == "pong":
        return [Control("pong")]
    try:
        frame = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        return [PrivateQuarantined(f"not JSON: {e}", text[:4096])]
    if not isinstance(frame, dict):
        return [PrivateQuarantined("frame is not a JSON object", text[:4096])]
    event = frame.get("event")
    if event is not None:
        return [Control(str(event), frame.get("arg"), _code(frame.get("code")), str(frame.get("msg", "")))]
    a = frame.get("arg")
    channel = a.get("channel") if isinstance(a, dict) else None
    data = frame.get("data")
    if channel not in PRIVATE_CHANNELS or not isinstance(data, list):
        return [PrivateQuarantined(f"unknown private frame (channel {channel!r})", text[:4096])]
    try:
        if channel == "positions":
            rows = [parse_position(d) for d in data if isinstance(d, Mapping)]
            return [PositionsUpdate(positions=rows, ts_ms=_ms(frame.get("ts")))]
        parse = parse_order if channel == "orders" else parse_fill
        return [parse(d) for d in data if isinstance(d, Mapping)]
    except (TypeError, ValueError) as e:
        return [PrivateQuarantined(f"{channel}: {e}", text[:4096])]


# ---------------------------------------------------------------------------------------------------
# encoding (the local exchange)


def encode_push(
    channel: str, data: Sequence[Mapping[str, Any]], ts_ms: int, inst_type: str = PRODUCT_TYPE
) -> bytes:
    return orjson.dumps(
        {
            "action": "snapshot",
            "arg": {"instType": inst_type, "channel": channel, "instId": "default"},
            "data": list(data),
            "ts": ts_ms,
        }
    )
