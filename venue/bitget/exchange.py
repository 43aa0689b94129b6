"""A local Bitget v2 exchange (USDT-M, one-way mode) for dress rehearsals of live mode on one machine.

It composes the two local protocol servers and adds a matching engine:

- :class:`venue.bitget.public_server.BitgetServer` serves the public WebSocket (``/v2/ws/public``:
  ``books15``, ``trade``, ... from a stored session or any frame source) and, on the same port, this module's
  private WebSocket (``/v2/ws/private``: login, ``orders``, ``fill``, ``positions``);
- :class:`venue.bitget.rest_server.BitgetRestServer` serves REST with the signed order endpoints added here:
  ``place-order``, ``cancel-order``, ``batch-cancel-orders``, ``cancel-all-orders``, ``orders-pending``,
  ``detail``, ``all-position`` and ``single-position``, and the public ``ticker`` (venue/bitget/ticker.py).
  Signatures, timestamps (30 s window) and passphrases are checked and refused with Bitget's codes;
  parameters are validated against the contract (size step 40808, price tick 41103, minimum size 43006,
  minimum notional 45110, client oid length 40305, missing 40019, wrong 40017); unknown orders are
  40768; more than ``orders_per_s`` requests per second per key on an order endpoint is HTTP 429 with
  code ``"429"``.
- Matching is against the exchange's own book, the frames it broadcasts, through the **same fill model
  as replay** (:class:`venue.exchange.SimExchange` with zero latency on the exchange's clock):
  marketable orders walk the book as taker, resting orders fill as maker on trades through the fill
  model and when the book trades through them.

Times in the broadcast frames are rebased to the exchange's clock (``rebase_times``): a session
recorded months ago is served as if it were happening now, at ``speed``.

Divergences from the venue (not verified against it): a duplicate ``clientOid`` answers 40017
"Duplicate clientOid"; an order before the first book answers 40017 "no market"; ``post_only`` is
treated as ``gtc`` and ``fok`` as ``ioc``; ``reduceOnly`` is recorded but not enforced; business errors
use HTTP 400.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import orjson
import websockets
from websockets.asyncio.server import ServerConnection

from engine.clock import ReplayClock
from engine.contract import ContractConfig
from engine.events import BookSnapshot, Trade
from engine.risk import OrderIntent, reduce_only_ok
from engine.venues.bitget_v2 import StreamCounters, decode
from engine.venues.bitget_v2_private import PRIVATE_CHANNELS, encode_push, login_sign
from engine.venues.bitget_v2_rest import PATH_TICKER, ContractSpec, parse_contract, sign
from venue.bitget.public_server import BitgetServer, Fault, FrameSource
from venue.bitget.rest_server import BitgetRestServer, Request, Response, contract_row, error, ok
from venue.bitget.ticker import FrameLookahead, ticker_row
from venue.exchange import SimExchange
from venue.fills import FILL_MODELS
from venue.latency import ConstantLatency
from venue.simulator import INSTRUMENTS

log = logging.getLogger(__name__)

PRIVATE_PATH: Final = "/v2/ws/private"
PUBLIC_PATH: Final = "/v2/ws/public"
TS_WINDOW_MS: Final = 30_000
LOGIN_WINDOW_S: Final = 30
DEFAULT_ACCOUNTS: Final = {"local-key": ("local-secret", "local-passphrase")}
ORDER_ENDPOINTS: Final = ("place-order", "cancel-order", "batch-cancel-orders", "cancel-all-orders")


def _same(given: str, want: str) -> bool:
    """Constant-time equality of a credential as sent and as expected. As bytes: compare_digest refuses
    str with non-ASCII characters (TypeError), which a client controls."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), want.encode("utf-8", "surrogatepass"))


@dataclass
class _Order:
    order_id: str
    client_oid: str
    uid: str
    symbol: str
    side: str
    order_type: str
    force: str
    price: str
    size: str
    px: float
    qty: float
    reduce_only: bool
    c_time: int
    u_time: int
    status: str = "new"  # new -> live | partially_filled | filled | canceled | rejected
    filled: float = 0.0
    notional: float = 0.0
    fee: float = 0.0  # negative: paid
    pnl: float = 0.0  # realized by this order's fills
    cancel_reason: str = ""
    reject_reason: str = ""
    fills: list[dict[str, Any]] = field(default_factory=list)  # its rows of the fills endpoint, in order

    @property
    def open(self) -> bool:
        return self.status in ("new", "live", "partially_filled")

    @property
    def price_avg(self) -> float:
        return self.notional / self.filled if self.filled > 0 else 0.0


@dataclass
class _Position:
    qty: float = 0.0  # signed, one-way mode
    avg: float = 0.0
    realized: float = 0.0
    c_time: int = 0
    u_time: int = 0

    def apply(self, side: str, px: float, q: float, ts: int) -> None:
        signed = q if side == "buy" else -q
        if self.qty == 0 or (self.qty > 0) == (signed > 0):
            total = abs(self.qty) + q
            self.avg = (self.avg * abs(self.qty) + px * q) / total
            if self.qty == 0:
                self.c_time = ts
        else:
            closing = min(abs(self.qty), q)
            self.realized += closing * (px - self.avg) * (1 if self.qty > 0 else -1)
            if q > abs(self.qty) + 1e-12:
                self.avg = px
                self.c_time = ts
        self.qty = round(self.qty + signed, 12)
        if abs(self.qty) < 1e-12:
            self.qty, self.avg = 0.0, 0.0
        self.u_time = ts


KEEP_MARGIN_RATE: Final = 0.004
LEVERAGE: Final = 20


def _liquidation_price(p: _Position) -> float:
    """A crossed position's liquidation price at the fixed leverage, ignoring the rest of the account
    (the local exchange keeps no wallet): where the loss eats the initial margin down to the
    maintenance rate."""
    move = 1.0 / LEVERAGE - KEEP_MARGIN_RATE
    return p.avg * (1 - move) if p.qty > 0 else p.avg * (1 + move)


def _rest_fill(row: Mapping[str, Any]) -> dict[str, Any]:
    """A fill row as the REST fills endpoint has it: ``totalDeductionFee`` null where the channel
    sends ``"0"``."""
    out = dict(row)
    out["feeDetail"] = [{**fd, "totalDeductionFee": None} for fd in row["feeDetail"]]
    return out


def _num(x: float) -> str:
    """A float as Bitget's plain decimal string (shortest round trip, no exponent)."""
    if x != x:
        return ""
    s = repr(float(x))
    return format(Decimal(s), "f") if "e" in s or "E" in s else s


class _Reports:
    """What :class:`SimExchange` reports for one symbol, turned into order state and private pushes."""

    def __init__(self, ex: LocalExchange, symbol: str) -> None:
        self.ex, self.symbol = ex, symbol

    def on_ack(self, order_id: str, ts_ns: int) -> None:
        o = self.ex.orders[order_id]
        if o.status == "new":
            o.status = "live"
            o.u_time = ts_ns // 1_000_000
            self.ex._push_order(o)

    def on_reject(self, order_id: str, reason: str, ts_ns: int) -> None:
        o = self.ex.orders[order_id]
        if o.status == "new":
            o.status, o.reject_reason = "rejected", reason
        else:
            o.reject_reason = reason  # a cancel that found nothing

    def on_cancel_ack(self, order_id: str, ts_ns: int) -> None:
        o = self.ex.orders[order_id]
        o.status, o.cancel_reason, o.u_time = "canceled", "normal_cancel", ts_ns // 1_000_000
        self.ex._push_order(o)

    def on_done(self, order_id: str, reason: str, ts_ns: int) -> None:
        o = self.ex.orders[order_id]
        o.u_time = ts_ns // 1_000_000
        if reason == "filled":
            o.status = "filled"
        else:  # an IOC/market remainder: the venue cancels it
            o.status, o.cancel_reason = "canceled", "normal_cancel"
        self.ex._push_order(o)

    def on_fill(self, order_id: str, px: float, qty: float, liquidity: str, ts_ns: int) -> None:
        self.ex._on_fill(self.ex.orders[order_id], px, qty, liquidity, ts_ns // 1_000_000)


@dataclass
class _Venue:
    symbol: str
    spec: ContractSpec
    clock: ReplayClock
    sim: SimExchange
    book: BookSnapshot | None = None
    last_px: float = math.nan  # the last trade applied (the ticker's lastPr)


@dataclass
class _PrivConn:
    ws: ServerConnection
    index: int
    queue: asyncio.Queue[bytes | str] = field(default_factory=asyncio.Queue)
    uid: str = ""
    subs: set[tuple[str, str]] = field(default_factory=set)  # (channel, instId)
    closed: bool = False


def default_contract(symbol: str) -> ContractConfig:
    """The contract a symbol gets when none is given: the simulator's (venue.simulator.INSTRUMENTS:
    tick and size step, the step also the minimum size) for a symbol it knows, else the engine's
    defaults."""
    inst = INSTRUMENTS.get(symbol)
    if inst is None:
        return ContractConfig(symbol=symbol)
    step = float(inst.size_step)
    return ContractConfig(symbol=symbol, tick=float(inst.tick), size_step=step, min_qty=step)


class LocalExchange:
    """``async with LocalExchange(session_frames(dir), speed=1) as ex:`` -> ``ex.rest_url``, ``ex.ws_url``.

    ``accounts``: API key -> (secret, passphrase). ``contracts``: contract rows (default:
    :func:`default_contract` of each of ``symbols``, and BTCUSDT). ``fill_model``: a name from
    :data:`venue.fills.FILL_MODELS`, as in replay. ``wire_year``: the public book pushes' layout
    (:mod:`venue.bitget.wire_layout`, the latest by default); ``request_time``: REST's ``requestTime``
    as a ``"number"`` or a ``"string"``.
    """

    def __init__(
        self,
        source: FrameSource = (),
        *,
        speed: float = 1.0,
        fill_model: str = "touch",
        accounts: Mapping[str, tuple[str, str]] | None = None,
        contracts: Iterable[Mapping[str, Any]] | None = None,
        symbols: Iterable[str] = ("BTCUSDT",),
        host: str = "127.0.0.1",
        rest_port: int = 0,
        ws_port: int = 0,
        rebase_times: bool = True,
        orders_per_s: int = 10,
        max_notional_usdt: float = 1_000_000.0,
        clock_offset_ms: int = 0,
        client_oid_key: str = "clientOid",
        faults: Iterable[Fault] = (),
        wire_year: str | None = None,
        request_time: str = "number",
    ) -> None:
        if fill_model not in FILL_MODELS:
            raise ValueError(f"unknown fill model {fill_model!r}; known: {', '.join(FILL_MODELS)}")
        if client_oid_key not in ("clientOid", "clientOId"):
            raise ValueError("client_oid_key is 'clientOid' or the older 'clientOId'")
        self.fill_model = fill_model
        self.speed = speed
        self.rebase_times = rebase_times
        self.orders_per_s = orders_per_s
        self.max_notional_usdt = max_notional_usdt
        self.client_oid_key = client_oid_key
        self.accounts = {
            k: (s, p, f"uid-{i}") for i, (k, (s, p)) in enumerate((accounts or DEFAULT_ACCOUNTS).items())
        }
        rows = [dict(r) for r in contracts] if contracts is not None else None
        if rows is None:
            rows = [contract_row(default_contract(s)) for s in sorted(set(symbols) | {"BTCUSDT"})]
        self.rest = BitgetRestServer(
            host=host,
            port=rest_port,
            contracts=rows,
            clock_offset_ms=clock_offset_ms,
            request_time=request_time,
        )
        self._frames = FrameLookahead(source)  # the ticker reads the first books before the broadcast
        self.public = BitgetServer(
            self._rebased(self._frames),
            speed=speed,
            faults=list(faults),
            host=host,
            port=ws_port,
            path_handlers={PRIVATE_PATH: self._private},
            wire_year=wire_year,
        )
        self._lock = threading.RLock()
        self.venues: dict[str, _Venue] = {}
        for r in rows:
            spec = parse_contract(r)
            self.venues[spec.symbol] = self._venue(spec)
        self.orders: dict[str, _Order] = {}
        self._by_client: dict[tuple[str, str], str] = {}
        self.positions: dict[tuple[str, str], _Position] = {}
        self._order_ids = itertools.count(1_100_000_000_000_000_001)
        self._trade_ids = itertools.count(2_200_000_000_000_000_001)
        self._rate: dict[tuple[str, str], deque[float]] = {}
        self._conns: list[_PrivConn] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_ns = 0
        self.refuse_private = False  # tests: refuse private connections (a network partition)
        self.mute_private = False  # tests: private connections stay up but their pushes are lost
        self.pushes_lost = 0
        self.private_connections = 0
        self.logins = 0
        self.pushes = 0
        self.cancel_all_calls = 0
        for method, path, handler in (
            ("POST", "/api/v2/mix/order/place-order", self._place),
            ("POST", "/api/v2/mix/order/cancel-order", self._cancel),
            ("POST", "/api/v2/mix/order/batch-cancel-orders", self._batch_cancel),
            ("POST", "/api/v2/mix/order/cancel-all-orders", self._cancel_all),
            ("GET", "/api/v2/mix/order/orders-pending", self._pending),
            ("GET", "/api/v2/mix/order/detail", self._detail),
            ("GET", "/api/v2/mix/order/fills", self._fills),
            ("GET", "/api/v2/mix/position/all-position", self._all_positions),
            ("GET", "/api/v2/mix/position/single-position", self._single_position),
        ):
            self.rest.add_route(method, path, self._signed(handler, path.rsplit("/", 1)[1]))
        self.rest.add_route("GET", PATH_TICKER, self._ticker)

    def _venue(self, spec: ContractSpec) -> _Venue:
        clock = ReplayClock(0)
        sim = SimExchange(
            clock,
            fill_model=FILL_MODELS[self.fill_model](),
            entry_latency=ConstantLatency(0),
            response_latency=ConstantLatency(0),
            cancel_latency=ConstantLatency(0),
            size_step=float(spec.size_step),
            tick=float(spec.tick),
        )
        sim.engine = _Reports(self, spec.symbol)
        return _Venue(spec.symbol, spec, clock, sim)

    # ------------------------------------------------------------------ lifecycle and urls

    async def start(self) -> LocalExchange:
        self._loop = asyncio.get_running_loop()
        self.rest.start()
        await self.public.start()
        return self

    async def stop(self) -> None:
        for c in list(self._conns):
            c.closed = True
            c.ws.transport.abort()
        for pc in list(self.public._conns):  # a client that stopped reading would hold a close handshake
            pc.ws.transport.abort()
        await self.public.stop()
        await asyncio.to_thread(self.rest.stop)

    async def __aenter__(self) -> LocalExchange:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def rest_url(self) -> str:
        return self.rest.url

    @property
    def ws_url(self) -> str:
        return f"ws://{self.public.host}:{self.public.port}"

    @property
    def public_url(self) -> str:
        return self.ws_url + PUBLIC_PATH

    @property
    def private_url(self) -> str:
        return self.ws_url + PRIVATE_PATH

    def now_ns(self) -> int:
        """The exchange's clock (wall + offset), never going back."""
        t = time.time_ns() + self.rest.clock_offset_ms * 1_000_000
        self._last_ns = max(self._last_ns + 1, t)
        return self._last_ns

    # ------------------------------------------------------------------ market data

    def _rebased(self, source: FrameSource) -> Iterator[tuple[int, bytes]]:
        counters = StreamCounters()
        t0: tuple[int, int] | None = None
        for ts_ns, frame in source:
            if self.rebase_times:
                now_ms = self.now_ns() // 1_000_000
                if t0 is None:
                    t0 = (ts_ns, now_ms)
                new_ms = now_ms if self.speed <= 0 else t0[1] + round((ts_ns - t0[0]) / 1e6 / self.speed)
                obj = orjson.loads(frame)
                obj["ts"] = new_ms
                for d in obj.get("data") or []:
                    if isinstance(d, dict) and "ts" in d:
                        d["ts"] = str(new_ms)
                frame = orjson.dumps(obj)
            yield ts_ns, frame
            # The broadcaster asks for the next frame once this one is fanned out: the book changes now.
            for ev in decode(frame, self.now_ns(), counters):
                if isinstance(ev, BookSnapshot):
                    self.apply_book(ev)
                elif isinstance(ev, Trade):
                    self.apply_trade(ev)

    def apply_book(self, book: BookSnapshot) -> None:
        """The exchange's book for ``book.symbol`` becomes ``book`` (resting orders may fill)."""
        self._apply(book)

    def apply_trade(self, trade: Trade) -> None:
        self._apply(trade)

    def _apply(self, ev: BookSnapshot | Trade) -> None:
        with self._lock:
            v = self.venues.get(ev.symbol)
            if v is None:
                return
            if isinstance(ev, BookSnapshot):
                v.book = ev
            else:
                v.last_px = ev.px
            self._advance(v)
            (v.sim.on_book if isinstance(ev, BookSnapshot) else v.sim.on_trade)(ev)
            self._drain(v)

    def _advance(self, v: _Venue) -> int:
        t = max(self.now_ns(), v.clock.now_ns())
        v.clock.advance_to(t)
        return t

    @staticmethod
    def _drain(v: _Venue) -> None:
        while due := v.clock.pop_due():
            for _, cb in due:
                cb()

    def _ticker(self, req: Request) -> Response:
        """The exchange's book, or before the broadcast the first its frames hold (venue/bitget/ticker.py)."""
        if miss := self._require(req, req.query, "productType", "symbol"):
            return miss
        symbol = req.query["symbol"]
        with self._lock:
            v = self.venues.get(symbol)
            book, last = (v.book, v.last_px) if v is not None else (None, math.nan)
        if v is not None and book is None:
            book = self._frames.first_book(symbol)
        return ok([] if book is None else [ticker_row(symbol, book, last, req.ts_ms)], req.ts_ms)

    # ------------------------------------------------------------------ fills and positions

    def _on_fill(self, o: _Order, px: float, qty: float, liquidity: str, ts_ms: int) -> None:
        v = self.venues[o.symbol]
        rate = v.spec.maker_fee_rate if liquidity == "maker" else v.spec.taker_fee_rate
        fee = -float(Decimal(repr(px)) * Decimal(repr(qty)) * rate)
        o.filled = round(o.filled + qty, 12)
        o.notional += px * qty
        o.fee += fee
        o.u_time = ts_ms
        if o.status in ("new", "live"):
            o.status = "partially_filled"
        pos = self.positions.setdefault((o.uid, o.symbol), _Position())
        realized = pos.realized
        pos.apply(o.side, px, qty, ts_ms)
        o.pnl += pos.realized - realized
        trade_id = str(next(self._trade_ids))
        fill = {
            "tradeId": trade_id,
            "fillPrice": _num(px),
            "baseVolume": _num(qty),
            "fillFee": _num(fee),
            "fillFeeCoin": "USDT",
            "tradeScope": "M" if liquidity == "maker" else "T",
            "fillTime": str(ts_ms),
            "fillNotionalUsd": _num(px * qty),
        }
        self._push_order(o, fill)
        row = {
            "orderId": o.order_id,
            "tradeId": trade_id,
            "symbol": o.symbol,
            "side": o.side,
            "orderType": o.order_type,
            "posMode": "one_way_mode",
            "price": _num(px),
            "baseVolume": _num(qty),
            "quoteVolume": _num(px * qty),
            "profit": "0",
            "tradeSide": "open",
            "tradeScope": liquidity,
            "feeDetail": [
                {
                    "feeCoin": "USDT",
                    "deduction": "no",
                    "totalDeductionFee": "0",
                    "totalFee": _num(fee),
                }
            ],
            "enterPointSource": "API",
            "cTime": str(ts_ms),
            "uTime": str(ts_ms),
        }
        o.fills.append(row)
        self._push(o.uid, "fill", o.symbol, [row])
        self._push_positions(o.uid)

    def position_rows(self, uid: str, symbol: str | None = None, *, ws: bool = False) -> list[dict[str, Any]]:
        rows = []
        for (u, sym), p in sorted(self.positions.items()):
            if u != uid or p.qty == 0 or (symbol is not None and sym != symbol):
                continue
            rows.append(
                {
                    "posId": f"{abs(hash((u, sym))) % 10**12}",
                    ("instId" if ws else "symbol"): sym,
                    "marginCoin": "USDT",
                    "marginSize": _num(abs(p.qty) * p.avg / 20),
                    "marginMode": "crossed",
                    "holdSide": "long" if p.qty > 0 else "short",
                    "posMode": "one_way_mode",
                    "total": _num(abs(p.qty)),
                    "available": _num(abs(p.qty)),
                    "frozen": "0",
                    "openPriceAvg": _num(p.avg),
                    # The positions channel sends leverage as a JSON number, REST as a string.
                    "leverage": 20 if ws else "20",
                    "achievedProfits": _num(p.realized),
                    "unrealizedPL": "0",
                    "liquidationPrice": _num(_liquidation_price(p)),
                    "keepMarginRate": _num(KEEP_MARGIN_RATE),
                    "cTime": str(p.c_time),
                    "uTime": str(p.u_time),
                }
            )
            # the channel's extra fields ([jk] Position.txt) and REST's (the doc's all-position row)
            rows[-1].update(
                {"unrealizedPLR": "0", "marginRate": "0", "autoMargin": "off"}
                if ws
                else {"markPrice": _num(p.avg), "marginRatio": "0"}
            )
        return rows

    def position(self, symbol: str, api_key: str | None = None) -> float:
        uid = self.accounts[api_key or next(iter(self.accounts))][2]
        p = self.positions.get((uid, symbol))
        return p.qty if p else 0.0

    def open_orders(self, symbol: str | None = None) -> list[_Order]:
        with self._lock:
            return [o for o in self.orders.values() if o.open and (symbol is None or o.symbol == symbol)]

    # ------------------------------------------------------------------ order rows

    def _order_row(self, o: _Order, *, ws: bool, state_key: str = "status") -> dict[str, Any]:
        row: dict[str, Any] = {
            "orderId": o.order_id,
            (self.client_oid_key if ws else "clientOid"): o.client_oid,
            ("instId" if ws else "symbol"): o.symbol,
            "side": o.side,
            "tradeSide": "open",
            "posSide": "net",
            "posMode": "one_way_mode",
            "orderType": o.order_type,
            "force": o.force,
            "price": o.price if o.order_type == "limit" else "0",
            "size": o.size,
            ("accBaseVolume" if ws else "baseVolume"): _num(o.filled),
            "priceAvg": _num(o.price_avg) if o.filled else "0",
            state_key: o.status if o.status != "new" else "live",
            "reduceOnly": "yes" if o.reduce_only else "no",
            "marginMode": "crossed",
            "marginCoin": "USDT",
            "leverage": "20",
            "fee": _num(o.fee),
            "feeDetail": [{"feeCoin": "USDT", "fee": _num(o.fee)}],
            "cancelReason": o.cancel_reason,
            "enterPointSource": "API",
            "cTime": str(o.c_time),
            "uTime": str(o.u_time),
        }
        if ws:  # the orders channel: the order's notional, and its realized pnl once it has fills
            ref = o.px if o.order_type == "limit" else o.price_avg
            row["notionalUsd"] = _num(ref * o.qty)
            if o.filled:
                row["pnl"] = _num(o.pnl)
        return row

    # ------------------------------------------------------------------ private pushes

    def _push_order(self, o: _Order, fill: Mapping[str, Any] | None = None) -> None:
        row = self._order_row(o, ws=True)
        if fill:
            row.update(fill)
        self._push(o.uid, "orders", o.symbol, [row])

    def _push_positions(self, uid: str) -> None:
        self._push(uid, "positions", "default", self.position_rows(uid, ws=True))

    def _push(self, uid: str, channel: str, symbol: str, data: list[dict[str, Any]]) -> None:
        frame: bytes | None = None
        for c in list(self._conns):
            if c.closed or c.uid != uid:
                continue
            if (channel, "default") not in c.subs and (channel, symbol) not in c.subs:
                continue
            if self.mute_private:
                self.pushes_lost += 1
                continue
            if frame is None:
                frame = encode_push(channel, data, self.now_ns() // 1_000_000)
            self.pushes += 1
            self._send_soon(c, frame)

    def _send_soon(self, c: _PrivConn, frame: bytes | str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            in_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            in_loop = False
        if in_loop:
            c.queue.put_nowait(frame)
        else:
            loop.call_soon_threadsafe(c.queue.put_nowait, frame)

    def drop_private(self) -> int:
        """Abort every private connection (the client sees 1006); returns how many."""
        n = 0
        for c in list(self._conns):
            if not c.closed:
                c.closed = True
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(c.ws.transport.abort)
                n += 1
        return n

    async def _private(self, ws: ServerConnection) -> None:
        c = _PrivConn(ws=ws, index=self.private_connections)
        self.private_connections += 1
        if self.refuse_private:
            ws.transport.abort()
            return
        self._conns.append(c)
        sender = asyncio.create_task(self._private_sender(c))
        try:
            async for msg in ws:
                if c.closed:
                    break
                if msg == "ping":
                    c.queue.put_nowait("pong")
                    continue
                await self._private_request(c, msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            c.closed = True
            self._conns.remove(c)
            sender.cancel()
            try:
                await sender
            except (asyncio.CancelledError, Exception):
                pass

    async def _private_sender(self, c: _PrivConn) -> None:
        while True:
            frame = await c.queue.get()
            try:
                await c.ws.send(frame, text=True)
            except websockets.ConnectionClosed:
                return

    def _ws_error(self, c: _PrivConn, code: int | str, msg: str, **extra: Any) -> None:
        c.queue.put_nowait(orjson.dumps({"event": "error", **extra, "code": code, "msg": msg}).decode())

    async def _private_request(self, c: _PrivConn, msg: str | bytes) -> None:
        try:
            req = orjson.loads(msg)
        except orjson.JSONDecodeError:
            self._ws_error(c, "30002", "Unrecognized request")
            return
        op = req.get("op") if isinstance(req, dict) else None
        args = req.get("args") if isinstance(req, dict) else None
        if op == "login":
            code, why = self._check_login(args)
            if code:
                self._ws_error(c, str(code), why, op="login")
                await asyncio.sleep(0.05)  # let the error go out, then hang up as Bitget does
                c.closed = True
                await c.ws.close(4001, "login failed")
                return
            assert isinstance(args, list)
            c.uid = self.accounts[args[0]["apiKey"]][2]
            self.logins += 1
            c.queue.put_nowait(orjson.dumps({"event": "login", "code": "0", "msg": ""}).decode())
            return
        if op not in ("subscribe", "unsubscribe"):
            self._ws_error(c, "30003", f"Invalid op: {op!r}")
            return
        if not c.uid:
            self._ws_error(c, 30004, "User not logged in", op=op)
            return
        if not isinstance(args, list) or not args:
            self._ws_error(c, 30016, "Param error", op=op)
            return
        for a in args:
            ch = a.get("channel") if isinstance(a, dict) else None
            inst = a.get("instId", "default") if isinstance(a, dict) else None
            if (
                ch not in PRIVATE_CHANNELS
                or str(a.get("instType", "")).upper() != "USDT-FUTURES"
                or not isinstance(inst, str)
                or (ch == "positions" and inst != "default")
            ):
                self._ws_error(c, 30016, "Param error", arg=a, op=op)
                continue
            if op == "subscribe":
                c.subs.add((ch, inst))
                c.queue.put_nowait(orjson.dumps({"event": "subscribe", "arg": a}).decode())
                if ch == "positions":
                    with self._lock:
                        rows = self.position_rows(c.uid, ws=True)
                    c.queue.put_nowait(encode_push("positions", rows, self.now_ns() // 1_000_000).decode())
            else:
                c.subs.discard((ch, inst))
                c.queue.put_nowait(orjson.dumps({"event": "unsubscribe", "arg": a}).decode())

    def _check_login(self, args: Any) -> tuple[int, str]:
        if not isinstance(args, list) or not args or not isinstance(args[0], dict):
            return 30016, "Param error"
        a = args[0]
        acct = self.accounts.get(str(a.get("apiKey", "")))
        if acct is None:
            return 30011, "Invalid ACCESS_KEY"
        secret, passphrase, _ = acct
        if not _same(str(a.get("passphrase", "")), passphrase):
            return 30012, "Invalid ACCESS_PASSPHRASE"
        ts = str(a.get("timestamp", ""))
        if not ts.isdigit():
            return 30013, "Invalid ACCESS_TIMESTAMP"
        now_s = self.now_ns() // 1_000_000_000
        if abs(now_s - int(ts)) > LOGIN_WINDOW_S:  # a millisecond timestamp lands here too
            return 30014, "Request timestamp expired"
        if not _same(str(a.get("sign", "")), login_sign(secret, ts)):
            return 30015, "Invalid signature"
        return 0, ""

    # ------------------------------------------------------------------ REST: auth and rate limits

    def _signed(
        self, handler: Callable[[Request, str], Response], name: str
    ) -> Callable[[Request], Response]:
        def wrapped(req: Request) -> Response:
            uid_or_err = self._authenticate(req)
            if isinstance(uid_or_err, Response):
                return uid_or_err
            if name in ORDER_ENDPOINTS and not self._allow(uid_or_err, name):
                return error("429", "Too Many Requests", req.ts_ms, status=429)
            with self._lock:
                return handler(req, uid_or_err)

        return wrapped

    def _authenticate(self, req: Request) -> str | Response:
        h = {k.lower(): v for k, v in req.headers.items()}
        key, sig = h.get("access-key", ""), h.get("access-sign", "")
        ts, passphrase = h.get("access-timestamp", ""), h.get("access-passphrase", "")
        if not key:
            return error("40001", "ACCESS_KEY cannot be empty", req.ts_ms)
        if not sig:
            return error("40003", "ACCESS_SIGN cannot be empty", req.ts_ms)
        if not passphrase:
            return error("40011", "ACCESS_PASSPHRASE cannot be empty", req.ts_ms)
        if not ts.isdigit():
            return error("40005", "Invalid ACCESS_TIMESTAMP", req.ts_ms)
        if abs(req.ts_ms - int(ts)) > TS_WINDOW_MS:
            return error("40008", "Request timestamp expired", req.ts_ms)
        acct = self.accounts.get(key)
        if acct is None:
            return error("40006", "Invalid ACCESS_KEY", req.ts_ms)
        secret, want_pass, uid = acct
        if not _same(passphrase, want_pass):
            return error("40012", "apikey/password is incorrect", req.ts_ms)
        want = sign(secret, ts, req.method, req.path, req.query_string, req.body.decode("utf-8", "replace"))
        if not _same(sig, want):
            return error("40009", "sign signature error", req.ts_ms)
        return uid

    def _allow(self, uid: str, endpoint: str) -> bool:
        now = time.monotonic()
        q = self._rate.setdefault((uid, endpoint), deque())
        while q and now - q[0] >= 1.0:
            q.popleft()
        if len(q) >= self.orders_per_s:
            return False
        q.append(now)
        return True

    @staticmethod
    def _body(req: Request) -> dict[str, Any] | Response:
        try:
            body = orjson.loads(req.body) if req.body else {}
        except orjson.JSONDecodeError:
            return error("40017", "Parameter verification failed: body is not JSON", req.ts_ms)
        if not isinstance(body, dict):
            return error("40017", "Parameter verification failed: body is not an object", req.ts_ms)
        return body

    @staticmethod
    def _require(req: Request, params: Mapping[str, Any], *names: str) -> Response | None:
        for n in names:
            if params.get(n) in (None, ""):
                return error("40019", f"Parameter {n} cannot be empty", req.ts_ms)
        p = str(params.get("productType", "USDT-FUTURES"))
        if p.upper() != "USDT-FUTURES":
            return error("40017", f"Parameter productType error: {p}", req.ts_ms)
        return None

    def _find(self, uid: str, symbol: str, order_id: str, client_oid: str) -> _Order | None:
        if order_id:  # orderId wins over clientOid
            o = self.orders.get(order_id)
        else:
            o = self.orders.get(self._by_client.get((uid, client_oid), ""))
        return o if o is not None and o.uid == uid and (not symbol or o.symbol == symbol) else None

    # ------------------------------------------------------------------ REST: orders

    def _place(self, req: Request, uid: str) -> Response:
        body = self._body(req)
        if isinstance(body, Response):
            return body
        t = req.ts_ms
        bad = self._require(
            req, body, "symbol", "productType", "marginMode", "marginCoin", "size", "side", "orderType"
        )
        if bad is not None:
            return bad
        symbol, side, otype = str(body["symbol"]), str(body["side"]), str(body["orderType"])
        v = self.venues.get(symbol)
        if v is None:
            return error("40017", f"Parameter symbol error: {symbol} does not exist", t)
        if side not in ("buy", "sell") or otype not in ("limit", "market"):
            return error("40017", "Parameter verification failed: side/orderType", t)
        force = str(body.get("force", "gtc")).lower()
        if force not in ("gtc", "ioc", "fok", "post_only"):
            return error("40017", f"Parameter force error: {force}", t)
        client_oid = str(body.get("clientOid", "")) or f"auto-{next(self._order_ids)}"
        if len(client_oid) > 50:
            return error("40305", "Client_oid length is not greater than 50", t)
        if (uid, client_oid) in self._by_client:
            return error("40017", "Duplicate clientOid", t)
        spec = v.spec
        if otype == "limit" and body.get("price") in (None, ""):
            return error("40019", "Parameter price cannot be empty", t)
        try:  # NaN, infinity and 1e400 too: Decimal parses them, but comparing or dividing them raises
            size = Decimal(str(body["size"]))
            price = Decimal(str(body["price"])) if otype == "limit" else None
            if not size.is_finite() or (price is not None and not price.is_finite()):
                raise ArithmeticError
            size_off = size <= 0 or size % spec.size_step != 0
            price_off = price is not None and (price <= 0 or price % spec.tick != 0)
        except ArithmeticError:
            return error("40017", "Parameter verification failed: size/price", t)
        if size_off:
            return error("40808", f"Parameter verification exception size scale error: {body['size']}", t)
        if price_off:
            return error("41103", f"param price scale error: {body.get('price')}", t)
        if size < spec.min_qty:
            return error("43006", f"The order quantity is less than the minimum {spec.min_qty}", t)
        mark = v.book.mid if v.book is not None else float(price or 0)
        notional = float(size) * (float(price) if price is not None else mark)
        if mark and notional < float(spec.min_notional_usdt):
            return error("45110", f"less than the minimum amount {spec.min_notional_usdt} USDT", t)
        open_notional = sum(
            o.px * (o.qty - o.filled) for o in self.orders.values() if o.open and o.uid == uid
        )
        if open_notional + notional > self.max_notional_usdt:
            return error("40762", "The order amount exceeds the balance", t)
        reduce_only = str(body.get("reduceOnly", "NO")).upper() == "YES"
        pos = self.positions.get((uid, symbol))
        held = pos.qty if pos else 0.0
        if reduce_only and not reduce_only_ok(held, side, float(size), float(spec.size_step)):
            return error(
                "40017",
                "Parameter verification failed: reduceOnly order would open or increase a position",
                t,
            )
        oid = str(next(self._order_ids))
        o = _Order(
            order_id=oid,
            client_oid=client_oid,
            uid=uid,
            symbol=symbol,
            side=side,
            order_type=otype,
            force=force,
            price=str(body.get("price", "")),
            size=str(body["size"]),
            px=float(price) if price is not None else math.nan,
            qty=float(size),
            reduce_only=reduce_only,
            c_time=t,
            u_time=t,
        )
        self.orders[oid] = o
        self._by_client[(uid, client_oid)] = oid
        now = self._advance(v)
        intent = OrderIntent(
            client_oid=oid,
            symbol=symbol,
            intent="new",
            side=side,
            order_type=otype,
            px=o.px,
            qty=o.qty,
            # checked above against this account's position; the matching engine is shared by every
            # account, so its own (venue-wide) reduce-only check must not run again
            reduce_only=False,
        )
        v.sim.submit(intent, now)
        self._drain(v)
        if o.status == "rejected":
            return error("40017", f"order refused: {o.reject_reason}", t)
        if o.open and force in ("ioc", "fok"):  # what did not match at once expires (fok treated as ioc)
            self._cancel_one(o)
        return ok({"clientOid": client_oid, "orderId": oid}, t)

    def _cancel_one(self, o: _Order) -> str:
        """Cancel ``o`` through the matching engine; "" on success, else the reason."""
        v = self.venues[o.symbol]
        if not o.open:
            return "order is not open"
        o.reject_reason = ""
        now = self._advance(v)
        v.sim.cancel(o.order_id, o.symbol, now)
        self._drain(v)
        return "" if o.status == "canceled" else (o.reject_reason or "not cancelled")

    def _cancel(self, req: Request, uid: str) -> Response:
        body = self._body(req)
        if isinstance(body, Response):
            return body
        bad = self._require(req, body, "symbol", "productType")
        if bad is not None:
            return bad
        order_id, client_oid = str(body.get("orderId", "") or ""), str(body.get("clientOid", "") or "")
        if not order_id and not client_oid:
            return error("40019", "Parameter orderId or clientOid cannot be empty", req.ts_ms)
        o = self._find(uid, str(body["symbol"]), order_id, client_oid)
        if o is None or self._cancel_one(o):
            return error("40768", "Order does not exist", req.ts_ms)
        return ok({"orderId": o.order_id, "clientOid": o.client_oid}, req.ts_ms)

    def _batch(self, orders: Iterable[_Order]) -> dict[str, list[dict[str, str]]]:
        success, failure = [], []
        for o in orders:
            why = self._cancel_one(o)
            ref = {"orderId": o.order_id, "clientOid": o.client_oid}
            if why:
                failure.append({**ref, "errorMsg": "Order does not exist", "errorCode": "40768"})
            else:
                success.append(ref)
        return {"successList": success, "failureList": failure}

    def _batch_cancel(self, req: Request, uid: str) -> Response:
        body = self._body(req)
        if isinstance(body, Response):
            return body
        bad = self._require(req, body, "productType")
        if bad is not None:
            return bad
        items = body.get("orderIdList")
        symbol = str(body.get("symbol", "") or "")
        if items:
            if not symbol:
                return error("40019", "Parameter symbol cannot be empty", req.ts_ms)
            if not isinstance(items, list) or len(items) > 50:
                return error("40017", "Parameter orderIdList error: at most 50", req.ts_ms)
            found, missing = [], []
            for it in items:
                it = it if isinstance(it, dict) else {}
                o = self._find(
                    uid, symbol, str(it.get("orderId", "") or ""), str(it.get("clientOid", "") or "")
                )
                (found.append(o) if o is not None else missing.append(it))
            data = self._batch(found)
            data["failureList"] += [
                {
                    "orderId": str(m.get("orderId", "")),
                    "clientOid": str(m.get("clientOid", "")),
                    "errorMsg": "Order does not exist",
                    "errorCode": "40768",
                }
                for m in missing
            ]
            return ok(data, req.ts_ms)
        targets = [
            o for o in self.orders.values() if o.uid == uid and o.open and (not symbol or o.symbol == symbol)
        ]
        return ok(self._batch(targets), req.ts_ms)

    def _cancel_all(self, req: Request, uid: str) -> Response:
        body = self._body(req)
        if isinstance(body, Response):
            return body
        bad = self._require(req, body, "productType")
        if bad is not None:
            return bad
        self.cancel_all_calls += 1
        targets = [o for o in self.orders.values() if o.uid == uid and o.open]
        return ok(self._batch(targets), req.ts_ms)

    def _pending(self, req: Request, uid: str) -> Response:
        bad = self._require(req, req.query, "productType")
        if bad is not None:
            return bad
        symbol = req.query.get("symbol")
        rows = [
            self._order_row(o, ws=False)
            for o in self.orders.values()
            if o.uid == uid and o.open and (not symbol or o.symbol == symbol)
        ]
        return ok({"entrustedList": rows or None, "endId": rows[-1]["orderId"] if rows else None}, req.ts_ms)

    def _detail(self, req: Request, uid: str) -> Response:
        bad = self._require(req, req.query, "symbol", "productType")
        if bad is not None:
            return bad
        q = req.query
        if not q.get("orderId") and not q.get("clientOid"):
            return error("40019", "Parameter orderId or clientOid cannot be empty", req.ts_ms)
        o = self._find(uid, q["symbol"], q.get("orderId", ""), q.get("clientOid", ""))
        if o is None:
            return error("40109", "The data of the order cannot be found", req.ts_ms)
        return ok(self._order_row(o, ws=False, state_key="state"), req.ts_ms)

    def _fills(self, req: Request, uid: str) -> Response:
        """The account's fills, newest first, ``limit`` (<= 100) a page; ``idLessThan`` pages on
        (the previous page's ``endId``); ``orderId`` and ``symbol`` filter."""
        bad = self._require(req, req.query, "productType")
        if bad is not None:
            return bad
        q = req.query
        try:
            limit = int(q.get("limit") or 100)
            below = int(q["idLessThan"]) if q.get("idLessThan") else None
        except ValueError:
            return error("40020", "Parameter limit or idLessThan error", req.ts_ms)
        if not 1 <= limit <= 100:
            return error("40020", f"Parameter limit error: {limit}", req.ts_ms)
        order_id, symbol = q.get("orderId", ""), q.get("symbol", "")
        orders = [o for o in self.orders.values() if o.uid == uid and order_id in ("", o.order_id)]
        rows = [
            f
            for o in orders
            if symbol in ("", o.symbol)
            for f in o.fills
            if below is None or int(f["tradeId"]) < below
        ]
        rows.sort(key=lambda f: int(f["tradeId"]), reverse=True)
        page = [_rest_fill(f) for f in rows[:limit]]
        return ok({"fillList": page or None, "endId": page[-1]["tradeId"] if page else None}, req.ts_ms)

    def _all_positions(self, req: Request, uid: str) -> Response:
        bad = self._require(req, req.query, "productType")
        return bad if bad is not None else ok(self.position_rows(uid), req.ts_ms)

    def _single_position(self, req: Request, uid: str) -> Response:
        bad = self._require(req, req.query, "symbol", "productType", "marginCoin")
        return bad if bad is not None else ok(self.position_rows(uid, req.query["symbol"]), req.ts_ms)


class LocalExchangeThread:
    """Runs a :class:`LocalExchange` on its own event loop in a daemon thread (tests, benchmarks).

    ``with LocalExchangeThread(LocalExchange(...)) as ex: ex.rest_url``.
    """

    def __init__(self, exchange: LocalExchange) -> None:
        self.exchange = exchange
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="local-exchange", daemon=True)

    def __enter__(self) -> LocalExchange:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.exchange.start(), self._loop).result(timeout=10)
        return self.exchange

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the exchange's loop and return its result."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def __exit__(self, *exc: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.exchange.stop(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()
