"""Live order gateway for Bitget v2 USDT-M: an async REST client and the engine's execution client.

:class:`BitgetGateway` is the HTTP side (``httpx.AsyncClient``): server-time sync, signed requests
(:mod:`wire.bitget.bitget_v2_rest`), place/cancel/batch-cancel/cancel-all, pending orders, order
detail, positions, contracts and tickers. Orders are rate limited on our side to ``orders_per_s`` (Bitget:
10/s per UID per endpoint) so the venue never has to refuse us. Errors arrive as the typed
:class:`~wire.bitget.bitget_v2_rest.BitgetError` subclasses; network trouble as
:class:`GatewayTransportError`. Neither ever carries a secret.

:class:`GatewayExecution` is the engine's :class:`~engine.core.ExecutionClient`: every accepted
intent becomes a ``place-order`` (client oid ``<run tag><engine oid>``, at most 50 characters),
every cancel a ``cancel-order`` sent only once the place request has answered. Reports (REST replies
and the private WebSocket's ``orders``/``fill`` pushes, whichever comes first, deduplicated by trade
id) go back to the engine through ``inject`` (the live runner stamps and orders them on its clock).
:meth:`GatewayExecution.reconcile` compares the exchange (open orders, order details, positions) with
what the engine was told, after a private WebSocket reconnect: missed fills and finished orders are
applied, unknown orders of ours are cancelled, and every difference becomes a ``ReconcileEvent``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import httpx

from engine.core import PRIO_EXCH_OUT
from engine.errors import DualhubError
from engine.events import Nanos, ReconcileEvent
from engine.risk import OrderIntent
from wire.bitget.bitget_v2_private import FillUpdate, OrderUpdate, PositionsUpdate, parse_fill_page
from wire.bitget.bitget_v2_rest import (
    MARGIN_COIN,
    MAX_CLIENT_OID_LEN,
    PATH_ALL_POSITIONS,
    PATH_BATCH_CANCEL,
    PATH_CANCEL,
    PATH_CANCEL_ALL,
    PATH_CONTRACTS,
    PATH_DETAIL,
    PATH_FILLS,
    PATH_PENDING,
    PATH_PLACE,
    PATH_TICKER,
    PATH_TIME,
    PRODUCT_TYPE,
    BatchResult,
    BitgetError,
    BitgetNotFoundError,
    ContractSpec,
    Credentials,
    Envelope,
    OrderRef,
    OrderRow,
    PositionRow,
    Ticker,
    batch_cancel_body,
    build_request,
    cancel_all_body,
    cancel_order_body,
    format_decimal,
    net_position,
    parse_batch,
    parse_contract,
    parse_envelope,
    parse_order_ref,
    parse_order_row,
    parse_pending,
    parse_position,
    parse_ticker,
    place_order_body,
)

log = logging.getLogger(__name__)

MS: Final = 1_000_000
FILLS_PAGE: Final = 100  # the fills endpoint's largest page
# After lost pushes the fill list is read again while it shows less than a push told of.
CATCH_UP_TRIES: Final = 5
CATCH_UP_WAIT_S: Final = 0.05


class GatewayTransportError(DualhubError):
    """The request did not get an answer (connection refused, timeout, reset)."""


class RateLimiter:
    """At most ``limit`` acquisitions in any sliding ``window_s`` (monotonic clock)."""

    def __init__(
        self, limit: int, window_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError(f"limit {limit} and window_s {window_s} must be positive")
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self._times: deque[float] = deque()
        self.waited_s = 0.0

    def wait_s(self) -> float:
        now = self._clock()
        while self._times and now - self._times[0] >= self.window_s:
            self._times.popleft()
        return 0.0 if len(self._times) < self.limit else self._times[0] + self.window_s - now

    async def acquire(self) -> None:
        while (w := self.wait_s()) > 0:
            self.waited_s += w
            await asyncio.sleep(w)
        self._times.append(self._clock())


class BitgetGateway:
    """Async Bitget v2 REST client. ``credentials`` None: public endpoints only."""

    def __init__(
        self,
        base_url: str,
        credentials: Credentials | None = None,
        *,
        orders_per_s: int = 10,
        timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // MS,
        demo: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._creds = credentials
        self._wall_ms = wall_ms
        self.demo = demo
        self.offset_ms = 0  # server clock - ours, from sync_time()
        self.rtt_ms = 0
        self._limiters = {p: RateLimiter(orders_per_s) for p in (PATH_PLACE, PATH_CANCEL, PATH_BATCH_CANCEL)}
        self._limiters[PATH_CANCEL_ALL] = RateLimiter(orders_per_s)
        self.requests = 0
        self.errors: dict[str, int] = {}
        # the last request that got no answer at all ("" once one is answered again): the runner's
        # venue watch reports the REST link down while it is set
        self.transport_error = ""
        self._client = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s), transport=transport
        )

    @property
    def signed(self) -> bool:
        return self._creds is not None

    def now_ms(self) -> int:
        """Our clock corrected to the server's (what ``ACCESS-TIMESTAMP`` carries)."""
        return self._wall_ms() + self.offset_ms

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        signed: bool = True,
    ) -> Envelope:
        limiter = self._limiters.get(path)
        if limiter is not None:
            await limiter.acquire()
        if signed and self._creds is None:
            raise DualhubError(f"{path} needs API keys (BITGET_API_KEY/SECRET/PASSPHRASE)")
        req = build_request(
            method,
            path,
            params=params,
            body=body,
            credentials=self._creds if signed else None,
            ts_ms=self.now_ms(),
            demo=self.demo,
        )
        self.requests += 1
        try:
            resp = await self._client.request(
                req.method, req.target, content=req.body or None, headers=dict(req.headers)
            )
        except httpx.HTTPError as e:
            # httpx messages name the URL, never headers: nothing secret here.
            self.transport_error = f"{method} {path}: {type(e).__name__}: {e}"
            raise GatewayTransportError(self.transport_error) from None
        self.transport_error = ""
        try:
            return parse_envelope(resp.status_code, resp.content)
        except BitgetError as e:
            self.errors[e.code] = self.errors.get(e.code, 0) + 1
            raise

    # -- public ----------------------------------------------------------------------------------------

    async def sync_time(self) -> int:
        """Measure the server clock's offset from ours (midpoint of the round trip); returns it in ms."""
        t0 = self._wall_ms()
        env = await self.request("GET", PATH_TIME, signed=False)
        t1 = self._wall_ms()
        server = int(env.data["serverTime"])
        self.offset_ms = server - (t0 + t1) // 2
        self.rtt_ms = t1 - t0
        return self.offset_ms

    async def contracts(self, symbol: str | None = None) -> list[ContractSpec]:
        params = {"productType": PRODUCT_TYPE, "symbol": symbol}
        env = await self.request("GET", PATH_CONTRACTS, params=params, signed=False)
        return [parse_contract(r) for r in env.data or []]

    async def ticker(self, symbol: str) -> Ticker | None:
        """The symbol's ticker (unsigned), or None when the venue lists none for it."""
        params = {"productType": PRODUCT_TYPE, "symbol": symbol}
        env = await self.request("GET", PATH_TICKER, params=params, signed=False)
        rows = [parse_ticker(r) for r in env.data or [] if isinstance(r, dict)]
        return next((t for t in rows if t.symbol == symbol), None)

    # -- orders ----------------------------------------------------------------------------------------

    async def place_order(self, body: Mapping[str, Any]) -> tuple[OrderRef, int]:
        """Returns the order reference and the venue's ``requestTime`` (ms)."""
        env = await self.request("POST", PATH_PLACE, body=body)
        return parse_order_ref(env.data), env.request_time_ms or self.now_ms()

    async def cancel_order(self, symbol: str, *, order_id: str = "", client_oid: str = "") -> OrderRef:
        env = await self.request(
            "POST",
            PATH_CANCEL,
            body=cancel_order_body(symbol=symbol, order_id=order_id, client_oid=client_oid),
        )
        return parse_order_ref(env.data)

    async def batch_cancel(
        self, symbol: str, *, client_oids: Sequence[str] = (), order_ids: Sequence[str] = ()
    ) -> BatchResult:
        body = batch_cancel_body(symbol=symbol, client_oids=client_oids, order_ids=order_ids)
        return parse_batch((await self.request("POST", PATH_BATCH_CANCEL, body=body)).data)

    async def cancel_all(self) -> BatchResult:
        return parse_batch((await self.request("POST", PATH_CANCEL_ALL, body=cancel_all_body())).data)

    async def pending_orders(self, symbol: str | None = None) -> list[OrderRow]:
        params = {"productType": PRODUCT_TYPE, "symbol": symbol}
        return parse_pending((await self.request("GET", PATH_PENDING, params=params)).data)

    async def order_detail(self, symbol: str, *, client_oid: str = "", order_id: str = "") -> OrderRow:
        params = {"symbol": symbol, "productType": PRODUCT_TYPE}
        params.update({"orderId": order_id} if order_id else {"clientOid": client_oid})
        return parse_order_row((await self.request("GET", PATH_DETAIL, params=params)).data)

    async def order_fills(self, symbol: str, order_id: str) -> list[FillUpdate]:
        """Every fill of one order, oldest first (the endpoint pages newest first)."""
        fills: list[FillUpdate] = []
        below = ""
        while True:
            params = {"productType": PRODUCT_TYPE, "symbol": symbol, "orderId": order_id, "limit": FILLS_PAGE}
            if below:
                params["idLessThan"] = below
            page, below = parse_fill_page((await self.request("GET", PATH_FILLS, params=params)).data)
            fills.extend(page)
            if len(page) < FILLS_PAGE or not below:
                break
        # Trade ids are decimal strings of growing numbers: by length, then text, is by number.
        return sorted(fills, key=lambda f: (f.time_ms, len(f.trade_id), f.trade_id))

    async def positions(self) -> list[PositionRow]:
        params = {"productType": PRODUCT_TYPE, "marginCoin": MARGIN_COIN}
        return [
            parse_position(r)
            for r in (await self.request("GET", PATH_ALL_POSITIONS, params=params)).data or []
        ]


# ---------------------------------------------------------------------------------------------------
# the engine's execution client


@dataclass
class _Track:
    """What we know about one engine order on the exchange."""

    engine_oid: str
    client_oid: str
    symbol: str
    side: str
    order_type: str
    qty: float
    sent_ns: Nanos
    order_id: str = ""
    acked: bool = False
    done: bool = False
    cancel_requested: bool = False
    cancel_sent_ns: Nanos = 0
    filled: float = 0.0
    trades: set[str] = field(default_factory=set)
    place_task: asyncio.Task[Any] | None = None
    # Pushes were lost: the venue's fill list is being read (catch_up) to book fills up to ``behind``;
    # a final status that came meanwhile waits in ``final`` until they are booked.
    catch_up: asyncio.Task[Any] | None = None
    behind: float = 0.0
    final: OrderUpdate | None = None


Inject = Callable[[int, Callable[[], None]], int]  # (priority, callback) -> the stamp it ran at


class GatewayExecution:
    """The engine's execution client on Bitget's REST API + private WebSocket.

    ``engines``: symbol -> engine (reports go to ``engine.on_ack`` & co.); ``inject(prio, fn)``
    stamps a report and runs it in order on the live clock; ``record(symbol, kind, ts, dur)`` gets the
    observed delays; ``on_reconcile(event_fields)`` the reconciliation differences;
    ``on_task_done(task)`` sees every order task end (the runner supervises them).
    """

    def __init__(
        self,
        gateway: BitgetGateway,
        contracts: Mapping[str, ContractSpec],
        *,
        run_tag: str,
        inject: Inject,
        now_ns: Callable[[], Nanos],
        record: Callable[[str, str, Nanos, Nanos], None] = lambda *a: None,
        on_reconcile: Callable[[dict[str, Any]], None] = lambda e: None,
        on_kill: Callable[[str], None] = lambda why: None,
        on_task_done: Callable[[asyncio.Task[Any]], None] = lambda task: None,
    ) -> None:
        self.gw = gateway
        self.contracts = dict(contracts)
        self.run_tag = run_tag
        self.inject = inject
        self.now_ns = now_ns
        self.record = record
        self.on_reconcile = on_reconcile
        self.on_kill = on_kill
        self.on_task_done = on_task_done
        self.engines: dict[str, Any] = {}
        self.orders: dict[str, _Track] = {}  # engine oid -> track
        self._by_client: dict[str, str] = {}  # exchange client oid -> engine oid
        self._by_order_id: dict[str, str] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closing = False  # shutdown: new orders are refused locally (not the kill switch's flatten)
        self.foreign_updates = 0
        self.fill_channel_trades: set[str] = set()
        self.fills_booked = 0
        # Size sent per symbol so far: orders sent after a reconciliation's sweep may be filled at the
        # venue before the engine hears of it, so a position check allows that much difference.
        self.qty_sent: dict[str, float] = {}
        self.position_checks = 12
        self.position_settle_s = 0.25
        self.positions: dict[str, float] = {}  # the latest ``positions`` push, net per symbol
        self.errors: list[str] = []

    # -- ExecutionClient -------------------------------------------------------------------------------

    def exchange_client_oid(self, engine_oid: str) -> str:
        coid = f"{self.run_tag}{engine_oid}"
        if len(coid) > MAX_CLIENT_OID_LEN:
            raise DualhubError(f"client oid {coid!r} is longer than {MAX_CLIENT_OID_LEN} characters")
        return coid

    def submit(self, intent: OrderIntent, now_ns: Nanos) -> None:
        coid = self.exchange_client_oid(intent.client_oid)
        t = _Track(intent.client_oid, coid, intent.symbol, intent.side, intent.order_type, intent.qty, now_ns)
        self.orders[intent.client_oid] = t
        self._by_client[coid] = intent.client_oid
        self.qty_sent[intent.symbol] = self.qty_sent.get(intent.symbol, 0.0) + intent.qty
        engine = self.engines[intent.symbol]
        # At shutdown nothing new goes out but the kill switch's own flatten orders; a refusal is
        # reported on the clock right after the decision that sent it (never re-entrant).
        if self.closing and not (intent.reduce_only and intent.source == "flatten"):
            self._at(now_ns, partial(engine.on_reject, intent.client_oid, "shutdown", now_ns))
            t.done = True
            return
        t.place_task = self._spawn(self._place(t, intent), f"place {t.client_oid}")

    def cancel(self, client_oid: str, symbol: str, now_ns: Nanos) -> None:
        t = self.orders.get(client_oid)
        if t is None or t.done:
            return
        t.cancel_requested = True
        t.cancel_sent_ns = now_ns
        self._spawn(self._cancel(t), f"cancel {t.client_oid}")

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(self.on_task_done)
        return task

    def _at(self, ts: Nanos, fn: Callable[[], None]) -> None:
        clock = self.engines[next(iter(self.engines))].clock
        clock.schedule(ts, PRIO_EXCH_OUT, fn)

    def _engine(self, t: _Track) -> Any:
        return self.engines[t.symbol]

    # -- REST side -------------------------------------------------------------------------------------

    def _body(self, t: _Track, intent: OrderIntent) -> dict[str, str]:
        spec = self.contracts[intent.symbol]
        return place_order_body(
            symbol=intent.symbol,
            side=intent.side,
            order_type=intent.order_type,
            size=format_decimal(intent.qty, spec.size_step),
            price=format_decimal(intent.px, spec.tick) if intent.order_type == "limit" else None,
            client_oid=t.client_oid,
            reduce_only=intent.reduce_only,
        )

    async def _place(self, t: _Track, intent: OrderIntent) -> None:
        try:
            ref, rt_ms = await self.gw.place_order(self._body(t, intent))
        except BitgetError as e:
            self._report(t, "reject", f"bitget {e.code}: {e.msg}")
            return
        except (GatewayTransportError, DualhubError, ValueError) as e:
            # The venue may or may not have the order: ask it by client oid.
            self.errors.append(str(e))
            try:
                row = await self.gw.order_detail(t.symbol, client_oid=t.client_oid)
            except (BitgetError, GatewayTransportError):
                self._report(t, "reject", f"transport: {e}"[:200])
                return
            ref, rt_ms = OrderRef(order_id=row.order_id, client_oid=t.client_oid), row.c_time_ms
        if ref.order_id:
            t.order_id = ref.order_id
            self._by_order_id[ref.order_id] = t.engine_oid
        self._ack(t, rt_ms * MS)

    async def _cancel(self, t: _Track) -> None:
        if t.place_task is not None and not t.place_task.done():
            await asyncio.wait([t.place_task])  # never cancel what the venue may not have yet
        if t.done:
            return
        try:
            await self.gw.cancel_order(
                t.symbol, order_id=t.order_id, client_oid="" if t.order_id else t.client_oid
            )
        except BitgetNotFoundError:
            # Filled (or cancelled) already: fills still arrive on the private WebSocket / reconcile.
            self._report(t, "reject", "cancel_rejected:order_not_found")
            return
        except (BitgetError, GatewayTransportError) as e:
            self.errors.append(str(e))
            log.warning("cancel of %s failed: %s", t.client_oid, e)
            return
        self._finish(t, "cancel_ack", "")

    # -- reports into the engine -----------------------------------------------------------------------

    def _ack(self, t: _Track, ts_event: Nanos) -> None:
        if t.acked or t.done:
            return
        t.acked = True
        stamp = self.inject(PRIO_EXCH_OUT, lambda: self._engine(t).on_ack(t.engine_oid, ts_event))
        self.record(t.symbol, "order_entry", t.sent_ns, stamp - t.sent_ns)

    def _report(self, t: _Track, kind: str, reason: str) -> None:
        if t.done:
            return
        t.done = True
        if kind == "reject":
            self.inject(PRIO_EXCH_OUT, lambda: self._engine(t).on_reject(t.engine_oid, reason, self.now_ns()))

    def _finish(self, t: _Track, kind: str, reason: str, ts_event: Nanos | None = None) -> None:
        if t.done:
            return
        if not t.acked:
            self._ack(t, ts_event or self.now_ns())
        t.done = True
        e = self._engine(t)
        if kind == "cancel_ack":
            stamp = self.inject(
                PRIO_EXCH_OUT, lambda: e.on_cancel_ack(t.engine_oid, ts_event or self.now_ns())
            )
            if t.cancel_sent_ns:
                self.record(t.symbol, "cancel", t.cancel_sent_ns, stamp - t.cancel_sent_ns)
        else:
            self.inject(PRIO_EXCH_OUT, lambda: e.on_done(t.engine_oid, reason, ts_event or self.now_ns()))

    def _fill(self, t: _Track, trade_id: str, px: float, qty: float, liquidity: str, ts_event: Nanos) -> None:
        if trade_id in t.trades or qty <= 0:
            return
        t.trades.add(trade_id)
        if not t.acked:
            self._ack(t, ts_event)
        t.filled += qty
        self.fills_booked += 1
        e = self._engine(t)
        self.inject(PRIO_EXCH_OUT, lambda: e.on_fill(t.engine_oid, px, qty, liquidity, ts_event))

    def _book_cumulative(self, t: _Track, item: OrderUpdate) -> None:
        new = round(item.acc_filled - t.filled, 12)
        if new <= 1e-12:
            return
        f = item.fill
        if f is not None and abs(new - f.qty) <= 1e-12 and not self._catching_up(t):
            self._fill(t, f.trade_id, f.price, new, f.liquidity, f.time_ms * MS)
            return
        # Pushes were lost between this one and the last: book what is new from the venue's fill
        # list, each fill at its own price. (Their average need not be a price on the tick, and the
        # engine books only prices on the tick.)
        t.behind = max(t.behind, item.acc_filled)
        if not self._catching_up(t):
            t.catch_up = self._spawn(self._catch_up(t), f"fills {t.client_oid}")

    @staticmethod
    def _catching_up(t: _Track) -> bool:
        return t.catch_up is not None and not t.catch_up.done()

    def _book_missed(self, t: _Track, fills: Sequence[FillUpdate]) -> None:
        """Book the fills of ``fills`` (the venue's list, oldest first) past what the engine was told.
        Pushes carry cumulative sizes, so what was booked ends on a fill's boundary."""
        seen = 0.0
        for f in fills:
            before, seen = seen, round(seen + f.qty, 12)
            new = round(seen - max(before, t.filled), 12)
            if new > 1e-12:
                self._fill(t, f.trade_id, f.price, new, f.liquidity, f.time_ms * MS)

    async def _catch_up(self, t: _Track) -> None:
        for attempt in range(CATCH_UP_TRIES):
            if t.filled + 1e-12 >= t.behind or t.done:
                break
            if attempt:
                await asyncio.sleep(CATCH_UP_WAIT_S)  # the list may lag the push that told of the fill
            try:
                fills = await self.gw.order_fills(t.symbol, t.order_id)
            except (BitgetError, GatewayTransportError) as e:
                self.errors.append(f"fills of {t.client_oid}: {e}")
                continue
            self._book_missed(t, fills)
        if t.filled + 1e-12 < t.behind:
            # The next reconciliation books them and finishes the order from its detail.
            log.warning("fills of %s: the venue's list shows %s of %s", t.client_oid, t.filled, t.behind)
            return
        if t.final is not None:
            self._apply_status(t, t.final)

    def _track_for(self, client_oid: str, order_id: str) -> _Track | None:
        oid = self._by_client.get(client_oid) or self._by_order_id.get(order_id)
        return self.orders.get(oid) if oid else None

    def on_private(self, item: OrderUpdate | FillUpdate | PositionsUpdate) -> None:
        """A private WebSocket update (called in arrival order)."""
        if isinstance(item, PositionsUpdate):
            self.positions = {s: net_position(item.positions, s) for s in {p.symbol for p in item.positions}}
            return
        if isinstance(item, FillUpdate):
            # Fills are booked from the ``orders`` channel, whose cumulative ``accBaseVolume`` also
            # covers what a reconciliation already applied; ``fill`` only cross-checks.
            self.fill_channel_trades.add(item.trade_id)
            return
        t = self._track_for(item.client_oid, item.order_id)
        if t is None:
            self.foreign_updates += 1
            return
        if item.order_id and not t.order_id:
            t.order_id = item.order_id
            self._by_order_id[item.order_id] = t.engine_oid
        self._book_cumulative(t, item)
        if self._catching_up(t) and item.status in ("filled", "canceled"):
            t.final = item  # after the missed fills (the engine takes no fill on a finished order)
            return
        self._apply_status(t, item)

    def _apply_status(self, t: _Track, item: OrderUpdate) -> None:
        ts = item.u_time_ms * MS
        if item.status in ("live", "partially_filled"):
            self._ack(t, ts)
        elif item.status == "filled":
            if t.filled + 1e-12 < item.acc_filled:
                return  # the fill carrying the rest comes in its own push; finish then
            self._finish(t, "done", "filled", ts)
        elif item.status == "canceled":
            if t.cancel_requested:
                self._finish(t, "cancel_ack", "", ts)
            else:
                reason = (
                    "ioc_remainder_expired" if t.order_type == "market" else f"canceled:{item.cancel_reason}"
                )
                self._finish(t, "done", reason, ts)

    # -- reconciliation --------------------------------------------------------------------------------

    def _diff(self, symbol: str, kind: str, t: _Track | None, eng: float, exch: float, action: str) -> None:
        self.on_reconcile(
            {
                "symbol": symbol,
                "kind": kind,
                "client_oid": t.client_oid if t else "",
                "order_id": t.order_id if t else "",
                "engine_value": float(eng),
                "exchange_value": float(exch),
                "action": action,
            }
        )

    async def reconcile(self, reason: str, *, settle_ms: int = 0) -> int:
        """Compare the exchange with what the engine was told; returns the number of differences.

        ``settle_ms``: leave alone an order the venue changed less than this long ago (its pushes may
        still be on the way). A periodic check passes a few seconds, so a fill in flight is not
        reported as missed; a check after a reconnect passes 0 (what was pushed meanwhile is lost).
        Positions are compared only when no order was left for later (they could not agree yet).
        """
        n = 0
        unsettled = False  # an order was left for the next check: positions cannot agree yet
        sent_before = dict(self.qty_sent)
        pending = await self.gw.pending_orders()
        by_coid = {r.client_oid: r for r in pending}
        for t in list(self.orders.values()):
            if t.done:
                continue
            if t.place_task is not None and not t.place_task.done():  # the venue may have filled it
                unsettled = unsettled or settle_ms > 0
                continue
            row = by_coid.get(t.client_oid)
            if row is None:
                try:
                    row = await self.gw.order_detail(t.symbol, client_oid=t.client_oid)
                except BitgetError:
                    n += 1
                    self._diff(t.symbol, "missing_on_exchange", t, t.qty - t.filled, 0.0, "finished")
                    self._report(t, "reject", "reconcile:not_on_exchange")
                    continue
            if settle_ms and self.gw.now_ms() - max(row.u_time_ms, row.c_time_ms) < settle_ms:
                unsettled = True
                continue
            if row.order_id and not t.order_id:
                t.order_id = row.order_id
                self._by_order_id[row.order_id] = t.engine_oid
            missed = round(row.filled - t.filled, 12)
            if missed > 1e-12:
                try:
                    fills = await self.gw.order_fills(t.symbol, t.order_id)
                except (BitgetError, GatewayTransportError) as e:
                    self.errors.append(f"fills of {t.client_oid}: {e}")
                    unsettled = True  # the next check tries again
                    continue
                n += 1
                self._diff(t.symbol, "missed_fill", t, t.filled, row.filled, "fill_applied")
                self._book_missed(t, fills)
            if row.status in ("filled", "canceled"):
                n += 1
                self._diff(t.symbol, "missed_done", t, 0.0, 1.0, row.status)
                if row.status == "filled":
                    self._finish(t, "done", "filled", row.u_time_ms * MS)
                elif t.cancel_requested:
                    self._finish(t, "cancel_ack", "", row.u_time_ms * MS)
                else:
                    self._finish(t, "done", f"canceled:{reason}", row.u_time_ms * MS)
            elif row.status in ("live", "partially_filled"):
                self._ack(t, row.c_time_ms * MS)
        for row in pending:
            if row.client_oid in self._by_client:
                continue
            n += 1
            if row.client_oid.startswith(self.run_tag):
                self._diff(row.symbol, "unknown_order", None, 0.0, row.size, "cancelled")
                try:
                    await self.gw.cancel_order(row.symbol, order_id=row.order_id)
                except BitgetError as e:
                    self.errors.append(str(e))
            else:
                self._diff(row.symbol, "foreign_order", None, 0.0, row.size, "left_alone")
        if unsettled:
            return n
        for symbol, (mine, exch) in (await self._position_mismatches(sent_before)).items():
            n += 1
            self._diff(symbol, "position_mismatch", None, mine, exch, "kill_switch")
            self.on_kill(f"position_mismatch:{symbol}")
        return n

    async def _position_mismatches(self, sent_before: dict[str, float]) -> dict[str, tuple[float, float]]:
        """Engine vs venue positions, compared only when they describe the same moment: trading goes
        on during the REST call, so a difference counts once it was seen twice with no fill reaching
        the engine during the call, ``position_settle_s`` apart (pushes in flight land meanwhile).
        Orders sent since the order sweep (``sent_before``: size sent per symbol then) were not checked
        by it and the venue may have filled them already: a difference up to their size waits for the
        next check, which sweeps them first."""
        found: dict[str, tuple[float, float]] = {}
        quiet = 0
        for _ in range(self.position_checks):
            fills_before = self.fills_booked
            positions = await self.gw.positions()
            found = {}
            for symbol, engine in self.engines.items():
                exch = net_position(positions, symbol)
                mine = float(engine.portfolio.position)
                step = float(self.contracts[symbol].size_step) if symbol in self.contracts else 1e-9
                unseen = self.qty_sent.get(symbol, 0.0) - sent_before.get(symbol, 0.0)
                if not math.isclose(mine, exch, abs_tol=unseen + step / 2):
                    found[symbol] = (mine, exch)
            if not found:
                return {}
            quiet += self.fills_booked == fills_before
            if quiet >= 2:
                return found
            await asyncio.sleep(self.position_settle_s)
        return found  # never quiet: a difference that stays through the whole window is real too

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait for in-flight REST calls; True if none is left."""
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout_s)
        return not self.tasks

    async def wait_done(self, client_oids: Sequence[str], timeout_s: float) -> bool:
        """Wait until the venue has finished these engine orders (filled, cancelled, rejected)."""
        deadline = time.monotonic() + timeout_s
        while any(not self.orders[o].done for o in client_oids if o in self.orders):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def cancel_everything(self) -> dict[str, Any]:
        """Cancel-all at the venue, then list what of ours is still open there (retry once).

        ``left_open``: the client oids of ours the venue still lists as open, or ``"unknown: cancel-all
        failed: <reason>"`` when the venue could not be asked (orders may still be open there)."""
        out: dict[str, Any] = {"calls": 0, "cancelled": 0, "failed": 0, "left_open": [], "error": ""}
        for _ in range(2):
            try:
                res = await self.gw.cancel_all()
                out["calls"] += 1
                out["cancelled"] += len(res.success)
                out["failed"] += len(res.failure)
                pending = await self.gw.pending_orders()
                out["left_open"] = [r.client_oid for r in pending if r.client_oid.startswith(self.run_tag)]
                out["error"] = ""
                if not out["left_open"]:
                    break
            except (BitgetError, GatewayTransportError) as e:
                out["error"] = str(e)
                out["left_open"] = f"unknown: cancel-all failed: {e}"
        return out


async def ticker_mids(
    rest_url: str, symbols: Sequence[str], gateway: BitgetGateway | None = None
) -> tuple[dict[str, float], dict[str, str]]:
    """The symbols' ticker mids (``gateway``'s, else a client of its own for the call), and for a symbol
    whose ticker gives no price, why."""
    gw = gateway or BitgetGateway(rest_url, timeout_s=3.0)
    mids: dict[str, float] = {}
    unread: dict[str, str] = {}
    try:
        for s in symbols:
            try:
                t = await gw.ticker(s)
            except (BitgetError, GatewayTransportError, ValueError) as e:
                unread[s] = str(e)
                continue
            if t is not None and math.isfinite(t.mid) and t.mid > 0:
                mids[s] = t.mid
            else:
                unread[s] = "no ticker listed" if t is None else "no price in its ticker"
    finally:
        if gw is not gateway:
            await gw.aclose()
    return mids, unread


def reconcile_event(fields: Mapping[str, Any], *, ts: Nanos, seq: int) -> ReconcileEvent:
    return ReconcileEvent(ts_event=ts, ts_recv=ts, seq=seq, **fields)
