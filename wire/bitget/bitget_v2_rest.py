"""Bitget v2 REST (USDT-M perpetuals): signing, request building, envelope, typed errors, contracts.

Pure: no I/O, no clock reads (the caller passes the timestamp). Shapes and codes are in
``../shared/docs/bitget-v2.md`` sections 4 and 5:

- ``sign = Base64(HMAC_SHA256(secret, timestamp + METHOD + requestPath + ("?" + query) + body))`` with
  ``timestamp`` in **milliseconds**, ``requestPath`` including ``/api/v2/...``, the query string exactly
  as sent (we send keys sorted, as ccxt does) and the body exactly as sent (compact JSON);
- headers ``ACCESS-KEY``, ``ACCESS-SIGN``, ``ACCESS-TIMESTAMP``, ``ACCESS-PASSPHRASE`` and
  ``Content-Type: application/json``;
- responses in the envelope ``{"code": "00000", "msg", "requestTime", "data"}``; any other code, or HTTP
  429, is an error mapped to a typed :class:`BitgetError` subclass by :func:`error_for`;
- contract rows: price tick = ``priceEndStep`` x 10^-``pricePlace``, size step = ``sizeMultiplier``,
  minimum size ``minTradeNum``, minimum notional ``minTradeUSDT``;
- ticker rows (``/api/v2/mix/market/ticker``: a list of one row): ``lastPr``, ``bidPr``, ``askPr``, ``ts``
  (the rest, 24 h figures, funding, is not read).

Secrets never leave :class:`Credentials` except into the HMAC and the passphrase header, and neither
:class:`Credentials` nor :class:`SignedRequest` shows them in ``repr``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final
from urllib.parse import urlencode

import orjson

from engine.contract import ContractConfig
from engine.errors import DualhubError

PRODUCT_TYPE: Final = "USDT-FUTURES"
MARGIN_COIN: Final = "USDT"
SUCCESS: Final = "00000"
MAX_CLIENT_OID_LEN: Final = 50  # error 40305 "Client_oid length is not greater than 50"
MAX_BATCH_CANCEL: Final = 50

PATH_TIME: Final = "/api/v2/public/time"
PATH_CONTRACTS: Final = "/api/v2/mix/market/contracts"
PATH_TICKER: Final = "/api/v2/mix/market/ticker"
PATH_PLACE: Final = "/api/v2/mix/order/place-order"
PATH_CANCEL: Final = "/api/v2/mix/order/cancel-order"
PATH_BATCH_CANCEL: Final = "/api/v2/mix/order/batch-cancel-orders"
PATH_CANCEL_ALL: Final = "/api/v2/mix/order/cancel-all-orders"
PATH_PENDING: Final = "/api/v2/mix/order/orders-pending"
PATH_DETAIL: Final = "/api/v2/mix/order/detail"
PATH_FILLS: Final = "/api/v2/mix/order/fills"
PATH_ALL_POSITIONS: Final = "/api/v2/mix/position/all-position"
PATH_SINGLE_POSITION: Final = "/api/v2/mix/position/single-position"


# ---------------------------------------------------------------------------------------------------
# credentials and signing


@dataclass(frozen=True, slots=True)
class Credentials:
    """An API key, its secret and passphrase. ``repr`` shows the key's last 4 characters only."""

    api_key: str
    secret: str = field(repr=False)
    passphrase: str = field(repr=False)

    def __post_init__(self) -> None:
        for name in ("api_key", "secret", "passphrase"):
            if not getattr(self, name):
                raise ValueError(f"Credentials.{name} is empty")

    def __repr__(self) -> str:
        return f"Credentials(api_key='...{self.api_key[-4:]}', secret=<hidden>, passphrase=<hidden>)"

    __str__ = __repr__

    def redact(self, text: str) -> str:
        """``text`` with the secret and the passphrase (and the key) replaced by ``<hidden>``."""
        for s in (self.secret, self.passphrase, self.api_key):
            text = text.replace(s, "<hidden>")
        return text


def _b64_hmac(secret: str, message: str) -> str:
    mac = hmac.new(secret.encode(), message.encode(), hashlib.sha256).digest()
    return base64.b64encode(mac).decode()


def prehash(ts_ms: int | str, method: str, path: str, query: str = "", body: str = "") -> str:
    """The signed string: ``timestamp + METHOD + requestPath + ("?" + query if any) + body``."""
    return f"{ts_ms}{method.upper()}{path}{'?' + query if query else ''}{body}"


def sign(secret: str, ts_ms: int | str, method: str, path: str, query: str = "", body: str = "") -> str:
    """Base64 HMAC-SHA256 of :func:`prehash` under ``secret``."""
    return _b64_hmac(secret, prehash(ts_ms, method, path, query, body))


def encode_query(params: Mapping[str, Any] | None) -> str:
    """The query string we send: keys sorted (as ccxt sends them), values as strings."""
    if not params:
        return ""
    return urlencode(sorted((k, _param(v)) for k, v in params.items() if v is not None))


def encode_body(body: Mapping[str, Any] | None) -> str:
    """The exact body text sent and signed: compact JSON in the mapping's key order ("" for none)."""
    return "" if body is None else orjson.dumps(dict(body)).decode()


def _param(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """One request ready to send: ``target`` is path plus ``?query``; ``body`` the exact bytes signed.

    ``repr`` omits the headers (they hold the passphrase).
    """

    method: str
    path: str
    query: str
    body: bytes
    headers: Mapping[str, str] = field(repr=False)

    @property
    def target(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path


def build_request(
    method: str,
    path: str,
    *,
    params: Mapping[str, Any] | None = None,
    body: Mapping[str, Any] | None = None,
    credentials: Credentials | None = None,
    ts_ms: int | None = None,
    locale: str | None = None,
    demo: bool = False,
) -> SignedRequest:
    """Build (and with ``credentials``, sign) one request. GET carries ``params`` in the query string,
    POST carries ``body`` as compact JSON; ``ts_ms`` is required when signing."""
    method = method.upper()
    query = encode_query(params)
    text = encode_body(body) if method != "GET" else ""
    headers: dict[str, str] = {}
    if method != "GET":
        headers["Content-Type"] = "application/json"
    if locale:
        headers["locale"] = locale
    if demo:
        headers["paptrading"] = "1"
    if credentials is not None:
        if ts_ms is None:
            raise ValueError("a signed request needs ts_ms")
        headers["ACCESS-KEY"] = credentials.api_key
        headers["ACCESS-SIGN"] = sign(credentials.secret, ts_ms, method, path, query, text)
        headers["ACCESS-TIMESTAMP"] = str(ts_ms)
        headers["ACCESS-PASSPHRASE"] = credentials.passphrase
    return SignedRequest(method=method, path=path, query=query, body=text.encode(), headers=headers)


# ---------------------------------------------------------------------------------------------------
# envelope and errors


class BitgetError(DualhubError):
    """An error answer from Bitget: ``code`` (string, as sent), ``msg`` and the HTTP status."""

    def __init__(self, code: str, msg: str, http_status: int = 0) -> None:
        super().__init__(f"bitget {code}: {msg}" + (f" (HTTP {http_status})" if http_status else ""))
        self.code = code
        self.msg = msg
        self.http_status = http_status


class BitgetAuthError(BitgetError):
    """Key, signature, passphrase, timestamp or permission refused (400xx auth codes)."""


class BitgetParamError(BitgetError):
    """A parameter the venue refused: missing, malformed, scale, minimums, client oid too long."""


class BitgetBalanceError(BitgetError):
    """Not enough balance or margin for the order."""


class BitgetNotFoundError(BitgetError):
    """The order does not exist (already filled, cancelled, or never placed)."""


class BitgetRateLimitError(BitgetError):
    """HTTP 429 or body code 429: too many requests."""


class BitgetAccountModeError(BitgetError):
    """40085: a Unified (UTA) account cannot use the classic v2 endpoints."""


class BitgetProtocolError(BitgetError):
    """A response that is not Bitget's envelope at all."""


AUTH_CODES: Final = frozenset(
    {"40001", "40002", "40003", "40004", "40005", "40006", "40008", "40009", "40010", "40011", "40012"}
    | {"40014", "40018", "40037"}
)
PARAM_CODES: Final = frozenset(
    {"40017", "40019", "40020", "40305", "40808", "41103", "43006", "45110", "45113", "40774"}
)
BALANCE_CODES: Final = frozenset({"40762", "43012", "40754"})
# The doc's "order does not exist" codes plus hummingbot's list for cancels.
NOT_FOUND_CODES: Final = frozenset(
    {"40109", "40768", "43001", "43025", "22001", "80011", "40819", "43020", "45057", "31007", "43033"}
)
RATE_LIMIT_CODES: Final = frozenset({"429", "30006", "30007"})
ACCOUNT_MODE_CODES: Final = frozenset({"40085"})


def error_for(code: str | int, msg: str, http_status: int = 0) -> BitgetError:
    """The typed error for a Bitget code (a number or a string) and HTTP status."""
    c = str(code)
    if http_status == 429 or c in RATE_LIMIT_CODES:
        return BitgetRateLimitError(c, msg, http_status)
    for codes, cls in (
        (AUTH_CODES, BitgetAuthError),
        (PARAM_CODES, BitgetParamError),
        (BALANCE_CODES, BitgetBalanceError),
        (NOT_FOUND_CODES, BitgetNotFoundError),
        (ACCOUNT_MODE_CODES, BitgetAccountModeError),
    ):
        if c in codes:
            return cls(c, msg, http_status)
    return BitgetError(c, msg, http_status)


@dataclass(frozen=True, slots=True)
class Envelope:
    code: str
    msg: str
    request_time_ms: int | None
    data: Any


def parse_envelope(http_status: int, body: bytes | str | Mapping[str, Any]) -> Envelope:
    """Parse a response; raise the typed :class:`BitgetError` unless it is a success envelope.

    ``code`` is compared as a string (a numeric 0 is read as success); ``requestTime`` may be a number
    or a string.
    """
    if isinstance(body, bytes | str):
        try:
            obj = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            obj = None
    else:
        obj = body
    if not isinstance(obj, Mapping) or "code" not in obj:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        if http_status == 429:
            raise BitgetRateLimitError("429", "Too Many Requests", http_status)
        raise BitgetProtocolError("?", f"not a Bitget envelope: {str(text)[:200]!r}", http_status)
    raw_code = obj.get("code")
    code = SUCCESS if raw_code in (0, "0") else str(raw_code)
    msg = str(obj.get("msg", ""))
    rt = obj.get("requestTime")
    try:
        request_time = int(rt) if rt is not None and not isinstance(rt, bool) else None
    except (TypeError, ValueError):
        request_time = None
    if code != SUCCESS or http_status == 429:
        raise error_for(code if code != SUCCESS else "429", msg, http_status)
    return Envelope(code=code, msg=msg, request_time_ms=request_time, data=obj.get("data"))


# ---------------------------------------------------------------------------------------------------
# numbers on the wire


def _dec(v: Any, what: str) -> Decimal:
    if isinstance(v, bool) or v is None:
        raise ValueError(f"{what} is {v!r}")
    try:
        d = Decimal(str(v))
    except ArithmeticError:
        raise ValueError(f"{what} {v!r} is not a number") from None
    if not d.is_finite():
        raise ValueError(f"{what} {v!r} is not finite")
    return d


def _float(v: Any, what: str, default: float = math.nan) -> float:
    if v is None or v == "":
        return default
    return float(_dec(v, what))


def format_decimal(x: float | Decimal, step: Decimal | float | str) -> str:
    """``x`` rounded to a multiple of ``step`` (half-even), as a plain decimal string without exponent:
    what Bitget's ``price``/``size`` fields want (40808/41103 on a wrong scale)."""
    st = Decimal(str(step))
    if st <= 0:
        raise ValueError(f"step must be > 0, got {step}")
    d = Decimal(repr(x)) if isinstance(x, float) else Decimal(x)
    q = (d / st).to_integral_value() * st
    places = max(0, -st.normalize().as_tuple().exponent)  # type: ignore[operator]
    return format(q.quantize(Decimal(1).scaleb(-places)), "f")


# ---------------------------------------------------------------------------------------------------
# contracts


@dataclass(frozen=True, slots=True, kw_only=True)
class ContractSpec:
    """One ``/api/v2/mix/market/contracts`` row, parsed."""

    symbol: str
    tick: Decimal
    size_step: Decimal
    min_qty: Decimal
    min_notional_usdt: Decimal
    maker_fee_rate: Decimal
    taker_fee_rate: Decimal
    price_place: int
    volume_place: int
    status: str
    max_leverage: int

    def config(self) -> ContractConfig:
        return ContractConfig(
            symbol=self.symbol,
            tick=float(self.tick),
            size_step=float(self.size_step),
            min_qty=float(self.min_qty),
            maker_fee_rate=self.maker_fee_rate,
            taker_fee_rate=self.taker_fee_rate,
        )

    @property
    def tradable(self) -> bool:
        return self.status == "normal"


def parse_contract(row: Mapping[str, Any]) -> ContractSpec:
    """Parse a contract row; ``ValueError`` names the field that is missing or malformed."""
    try:
        price_place = int(row["pricePlace"])
        volume_place = int(row.get("volumePlace", 0))
        tick = _dec(row["priceEndStep"], "priceEndStep").scaleb(-price_place)
        step = _dec(row["sizeMultiplier"], "sizeMultiplier")
        if tick <= 0 or step <= 0:
            raise ValueError(f"tick {tick} / size step {step} must be > 0")
        return ContractSpec(
            symbol=str(row["symbol"]),
            tick=tick.normalize(),
            size_step=step.normalize(),
            min_qty=_dec(row.get("minTradeNum", step), "minTradeNum"),
            min_notional_usdt=_dec(row.get("minTradeUSDT", 0), "minTradeUSDT"),
            maker_fee_rate=_dec(row.get("makerFeeRate", "0.0002"), "makerFeeRate"),
            taker_fee_rate=_dec(row.get("takerFeeRate", "0.0006"), "takerFeeRate"),
            price_place=price_place,
            volume_place=volume_place,
            status=str(row.get("symbolStatus", "normal")),
            max_leverage=int(row.get("maxLever", 0) or 0),
        )
    except KeyError as e:
        raise ValueError(f"contract row lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"contract row {row.get('symbol')!r}: {e}") from None


# ---------------------------------------------------------------------------------------------------
# ticker


@dataclass(frozen=True, slots=True, kw_only=True)
class Ticker:
    """One ``/api/v2/mix/market/ticker`` row, parsed (NaN: a price the row leaves empty)."""

    symbol: str
    last: float
    bid: float
    ask: float
    ts_ms: int

    @property
    def mid(self) -> float:
        """The best bid and ask's mid (a book's, as replay reads a session's first book), else the last
        trade's price; NaN when the row has neither."""
        if self.bid > 0 and self.ask > self.bid:
            return (self.bid + self.ask) / 2
        return self.last if self.last > 0 else math.nan


def parse_ticker(row: Mapping[str, Any]) -> Ticker:
    """Parse a ticker row (``lastPr``, ``bidPr``, ``askPr``, ``ts``); ``ValueError`` names the field that
    is missing or malformed."""
    try:
        return Ticker(
            symbol=str(row["symbol"]),
            last=_float(row.get("lastPr"), "lastPr"),
            bid=_float(row.get("bidPr"), "bidPr"),
            ask=_float(row.get("askPr"), "askPr"),
            ts_ms=int(row.get("ts") or 0),
        )
    except KeyError as e:
        raise ValueError(f"ticker row lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"ticker row {row.get('symbol')!r}: {e}") from None


# ---------------------------------------------------------------------------------------------------
# order bodies


def check_client_oid(client_oid: str) -> str:
    if not client_oid or len(client_oid) > MAX_CLIENT_OID_LEN:
        raise ValueError(f"clientOid must be 1..{MAX_CLIENT_OID_LEN} characters, got {len(client_oid)}")
    return client_oid


def place_order_body(
    *,
    symbol: str,
    side: str,
    order_type: str,
    size: str,
    client_oid: str,
    price: str | None = None,
    force: str = "gtc",
    reduce_only: bool = False,
    margin_mode: str = "crossed",
    margin_coin: str = MARGIN_COIN,
    product_type: str = PRODUCT_TYPE,
) -> dict[str, str]:
    """A one-way-mode ``place-order`` body (no ``tradeSide``; ``reduceOnly`` YES/NO)."""
    if side not in ("buy", "sell"):
        raise ValueError(f"side must be buy or sell, got {side!r}")
    if order_type not in ("limit", "market"):
        raise ValueError(f"orderType must be limit or market, got {order_type!r}")
    if order_type == "limit" and not price:
        raise ValueError("a limit order needs a price")
    body = {
        "symbol": symbol,
        "productType": product_type,
        "marginMode": margin_mode,
        "marginCoin": margin_coin,
        "size": size,
        "side": side,
        "orderType": order_type,
    }
    if order_type == "limit":
        body["price"] = str(price)
        body["force"] = force
    if reduce_only:
        body["reduceOnly"] = "YES"
    body["clientOid"] = check_client_oid(client_oid)
    return body


def cancel_order_body(
    *, symbol: str, order_id: str = "", client_oid: str = "", product_type: str = PRODUCT_TYPE
) -> dict[str, str]:
    if not order_id and not client_oid:
        raise ValueError("cancel needs an orderId or a clientOid")
    body = {"symbol": symbol, "productType": product_type, "marginCoin": MARGIN_COIN}
    if order_id:
        body["orderId"] = order_id
    else:
        body["clientOid"] = client_oid
    return body


def batch_cancel_body(
    *,
    symbol: str,
    order_ids: Sequence[str] = (),
    client_oids: Sequence[str] = (),
    product_type: str = PRODUCT_TYPE,
) -> dict[str, Any]:
    """``batch-cancel-orders``: at most 50 ids; with none it cancels every order on the symbol."""
    items = [{"orderId": o} for o in order_ids] + [{"clientOid": c} for c in client_oids]
    if len(items) > MAX_BATCH_CANCEL:
        raise ValueError(f"batch cancel takes at most {MAX_BATCH_CANCEL} orders, got {len(items)}")
    body: dict[str, Any] = {"symbol": symbol, "productType": product_type, "marginCoin": MARGIN_COIN}
    if items:
        body["orderIdList"] = items
    return body


def cancel_all_body(*, product_type: str = PRODUCT_TYPE, margin_coin: str = MARGIN_COIN) -> dict[str, str]:
    return {"productType": product_type, "marginCoin": margin_coin}


# ---------------------------------------------------------------------------------------------------
# response rows


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderRef:
    order_id: str
    client_oid: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchResult:
    success: list[OrderRef]
    failure: list[tuple[OrderRef, str, str]]  # (ref, errorCode, errorMsg)


def client_oid_of(row: Mapping[str, Any]) -> str:
    """``clientOid``, or the older spelling ``clientOId``."""
    v = row.get("clientOid", row.get("clientOId"))
    return "" if v is None else str(v)


def parse_order_ref(data: Any) -> OrderRef:
    if not isinstance(data, Mapping):
        raise BitgetProtocolError("?", f"order reply data is not an object: {data!r}"[:200])
    oid = data.get("orderId")
    return OrderRef(order_id="" if oid is None else str(oid), client_oid=client_oid_of(data))


def parse_batch(data: Any) -> BatchResult:
    if not isinstance(data, Mapping):
        raise BitgetProtocolError("?", f"batch reply data is not an object: {data!r}"[:200])
    ok = [parse_order_ref(r) for r in data.get("successList") or []]
    bad = [
        (parse_order_ref(r), str(r.get("errorCode", "")), str(r.get("errorMsg", "")))
        for r in data.get("failureList") or []
    ]
    return BatchResult(success=ok, failure=bad)


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderRow:
    """An order from ``orders-pending`` or ``detail`` (``status``/``state`` both accepted)."""

    order_id: str
    client_oid: str
    symbol: str
    side: str
    order_type: str
    price: float
    size: float
    filled: float
    price_avg: float
    status: str
    c_time_ms: int
    u_time_ms: int


def parse_order_row(row: Mapping[str, Any]) -> OrderRow:
    status = str(row.get("status", row.get("state", "")))
    if status == "cancelled":
        status = "canceled"
    return OrderRow(
        order_id=str(row.get("orderId", "")),
        client_oid=client_oid_of(row),
        symbol=str(row.get("symbol", "")),
        side=str(row.get("side", "")),
        order_type=str(row.get("orderType", "")),
        price=_float(row.get("price"), "price"),
        size=_float(row.get("size"), "size", 0.0),
        filled=_float(row.get("baseVolume", row.get("accBaseVolume")), "baseVolume", 0.0),
        price_avg=_float(row.get("priceAvg"), "priceAvg"),
        status=status,
        c_time_ms=int(row.get("cTime") or 0),
        u_time_ms=int(row.get("uTime") or row.get("cTime") or 0),
    )


def parse_pending(data: Any) -> list[OrderRow]:
    """``orders-pending`` data: ``{"entrustedList": [...]}`` (``null`` when empty) or a bare list."""
    if data is None:
        return []
    rows = data.get("entrustedList") if isinstance(data, Mapping) else data
    return [parse_order_row(r) for r in rows or []]


@dataclass(frozen=True, slots=True, kw_only=True)
class PositionRow:
    symbol: str
    hold_side: str  # long | short
    total: float
    available: float
    open_price_avg: float
    leverage: str
    margin_mode: str
    pos_mode: str

    @property
    def signed_size(self) -> float:
        return self.total if self.hold_side == "long" else -self.total


def parse_position(row: Mapping[str, Any]) -> PositionRow:
    """A position row from REST or the ``positions`` channel; ``leverage`` may be a number or a string."""
    lev = row.get("leverage", "")
    if isinstance(lev, float) and lev.is_integer():
        lev = int(lev)
    return PositionRow(
        symbol=str(row.get("symbol", row.get("instId", ""))),
        hold_side=str(row.get("holdSide", "")),
        total=_float(row.get("total"), "total", 0.0),
        available=_float(row.get("available"), "available", 0.0),
        open_price_avg=_float(row.get("openPriceAvg"), "openPriceAvg"),
        leverage=str(lev),
        margin_mode=str(row.get("marginMode", "")),
        pos_mode=str(row.get("posMode", "")),
    )


def net_position(rows: Sequence[PositionRow], symbol: str) -> float:
    return sum(r.signed_size for r in rows if r.symbol == symbol)
