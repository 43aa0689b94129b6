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
treated as ``gtc`` and ``fok`` as ``ioc``; ``reduceOnly`` is checked once, when the order is placed,
against the account's position then (an order that would open or increase it is refused with 40017),
and not again as it fills, so resting reduce-only orders together may take the position through zero;
business errors use HTTP 400.

The parts live by job: the records (orders, positions, a symbol's venue, a private connection) in
``venue/bitget/exchange_state.py``, the signed REST endpoints in ``venue/bitget/exchange_rest.py`` and
the private WebSocket in ``venue/bitget/exchange_private.py`` (both mixed into :class:`LocalExchange`);
this module keeps the exchange's lifecycle, its book and matching, and the rows it reports.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from decimal import Decimal
from typing import Any

import orjson

from engine.clock import ReplayClock
from engine.events import BookSnapshot, Trade
from engine.latency.models import ConstantLatency
from venue.bitget.exchange_private import PrivateChannels
from venue.bitget.exchange_rest import RestOrders
from venue.bitget.exchange_state import (
    DEFAULT_ACCOUNTS,
    KEEP_MARGIN_RATE,
    PRIVATE_PATH,
    PUBLIC_PATH,
    _liquidation_price,
    _num,
    _Order,
    _Position,
    _PrivConn,
    _Venue,
    default_contract,
)
from venue.bitget.public_server import BitgetServer, Fault, FrameSource
from venue.bitget.rest_server import BitgetRestServer, Request, Response, contract_row, ok
from venue.bitget.ticker import FrameLookahead, ticker_row
from venue.exchange import SimExchange
from venue.fills import FILL_MODELS
from wire.bitget.bitget_v2 import StreamCounters, decode
from wire.bitget.bitget_v2_rest import PATH_TICKER, ContractSpec, parse_contract

log = logging.getLogger(__name__)


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


class LocalExchange(RestOrders, PrivateChannels):
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
