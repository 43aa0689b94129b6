"""The local Bitget exchange's signed REST endpoints (``venue/bitget/exchange.py``): authentication
(signature, timestamp window, passphrase), the per-key rate limit on order endpoints, and the handlers of
``place-order``, ``cancel-order``, ``batch-cancel-orders``, ``cancel-all-orders``, ``orders-pending``,
``detail``, ``fills``, ``all-position`` and ``single-position``.

:class:`RestOrders` is mixed into :class:`~venue.bitget.exchange.LocalExchange` and reads its state
(orders, positions, venues, accounts) and its matching (``_advance``, ``_drain``, ``_order_row``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

import orjson

from engine.risk import OrderIntent, reduce_only_ok
from venue.bitget.exchange_state import ORDER_ENDPOINTS, TS_WINDOW_MS, _Order, _rest_fill, _same
from venue.bitget.rest_server import Request, Response, error, ok
from wire.bitget.bitget_v2_rest import sign


class RestOrders:
    """The signed REST endpoints of :class:`~venue.bitget.exchange.LocalExchange` (mixed into it)."""

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
