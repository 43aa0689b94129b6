"""The local Bitget exchange: signed REST order endpoints with Bitget's error codes, the private
WebSocket (login, orders, fill, positions), and matching against its own book with the replay fill
model."""

import asyncio
import socket
import time

import httpx
import orjson
import pytest
import websockets
from websockets.asyncio.client import connect

from live.gateway import BitgetGateway, RateLimiter
from tests.helpers import make_book
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import toy_frames
from wire.bitget.bitget_v2_private import (
    FillUpdate,
    OrderUpdate,
    PositionsUpdate,
    login_message,
    parse_private,
    private_args,
)
from wire.bitget.bitget_v2_rest import (
    PATH_PLACE,
    BitgetAuthError,
    BitgetNotFoundError,
    BitgetParamError,
    BitgetRateLimitError,
    Credentials,
    build_request,
    place_order_body,
)

CREDS = Credentials("local-key", "local-secret", "local-passphrase")


@pytest.fixture
def ex():
    exchange = LocalExchange(symbols=["BTCUSDT"], orders_per_s=10)
    with LocalExchangeThread(exchange) as running:
        # bids 30000.0, 29999.9, ...; asks 30000.1, ... with 1.0 each
        running.apply_book(make_book(30000.0, 30000.1, size=1.0, ts=time.time_ns()))
        yield running


def _run(coro):
    return asyncio.run(coro)


async def _with_gw(ex, fn, creds=CREDS, **kw):
    gw = BitgetGateway(ex.rest_url, creds, **kw)
    try:
        await gw.sync_time()
        return await fn(gw)
    finally:
        await gw.aclose()


def _limit(side="buy", px="29999.0", size="0.010", coid="t-1", **kw):
    return place_order_body(
        symbol="BTCUSDT", side=side, order_type="limit", size=size, price=px, client_oid=coid, **kw
    )


def test_place_rest_cancel_and_detail(ex):
    async def go(gw):
        ref, rt = await gw.place_order(_limit())
        assert ref.client_oid == "t-1" and ref.order_id and rt > 0
        (row,) = await gw.pending_orders("BTCUSDT")
        assert (row.client_oid, row.status, row.price, row.size) == ("t-1", "live", 29999.0, 0.01)
        detail = await gw.order_detail("BTCUSDT", client_oid="t-1")
        assert detail.order_id == ref.order_id and detail.status == "live"
        await gw.cancel_order("BTCUSDT", client_oid="t-1")
        assert await gw.pending_orders() == []
        assert (await gw.order_detail("BTCUSDT", order_id=ref.order_id)).status == "canceled"
        with pytest.raises(BitgetNotFoundError) as e:
            await gw.cancel_order("BTCUSDT", client_oid="t-1")
        assert e.value.code == "40768"

    _run(_with_gw(ex, go))


def test_matching_taker_walk_maker_fill_and_positions(ex):
    async def go(gw):
        body = place_order_body(
            symbol="BTCUSDT", side="buy", order_type="market", size="1.500", client_oid="m-1"
        )
        await gw.place_order(body)
        d = await gw.order_detail("BTCUSDT", client_oid="m-1")
        # walks two ask levels: 1.0 @ 30000.1 and 0.5 @ 30000.2 (taker)
        assert d.status == "filled" and d.filled == 1.5
        assert d.price_avg == pytest.approx((30000.1 + 0.5 * 30000.2) / 1.5)
        await gw.place_order(_limit(side="sell", px="30001.0", size="0.500", coid="r-1"))
        assert (await gw.order_detail("BTCUSDT", client_oid="r-1")).status == "live"
        # the book trades through the resting sell: a maker fill at its price
        ex.apply_book(make_book(30001.5, 30001.6, ts=time.time_ns()))
        d = await gw.order_detail("BTCUSDT", client_oid="r-1")
        assert d.status == "filled" and d.price_avg == 30001.0
        (pos,) = await gw.positions()
        assert pos.symbol == "BTCUSDT" and pos.hold_side == "long" and pos.total == 1.0
        assert ex.position("BTCUSDT") == 1.0

    _run(_with_gw(ex, go))


def test_fills_endpoint_lists_each_fill_pages_newest_first_and_filters_by_order(ex, monkeypatch):
    """``/api/v2/mix/order/fills``: each fill of an order at its own price (a taker walk of three
    levels), newest first a page at a time (``idLessThan`` = the previous ``endId``);
    ``BitgetGateway.order_fills`` reads every page and returns them oldest first."""
    import live.gateway as gateway

    async def go(gw):
        for coid, size in (("m-1", "2.500"), ("m-2", "0.300")):
            body = place_order_body(
                symbol="BTCUSDT", side="buy", order_type="market", size=size, client_oid=coid
            )
            await gw.place_order(body)
        m1 = await gw.order_detail("BTCUSDT", client_oid="m-1")
        m2 = await gw.order_detail("BTCUSDT", client_oid="m-2")
        monkeypatch.setattr(gateway, "FILLS_PAGE", 2)  # three fills of m-1: two pages
        fills = await gw.order_fills("BTCUSDT", m1.order_id)
        assert [(f.order_id, f.price, f.qty, f.liquidity) for f in fills] == [
            (m1.order_id, 30000.1, 1.0, "taker"),
            (m1.order_id, 30000.2, 1.0, "taker"),
            (m1.order_id, 30000.3, 0.5, "taker"),
        ]
        assert [int(f.trade_id) for f in fills] == sorted(int(f.trade_id) for f in fills)
        (f2,) = await gw.order_fills("BTCUSDT", m2.order_id)
        assert (f2.price, f2.qty) == (30000.1, 0.3)  # the book is the snapshot's until the next one
        raw = (await gw.request("GET", "/api/v2/mix/order/fills", params={"productType": "USDT-FUTURES",
                                                                           "limit": 3})).data  # fmt: skip
        ids = [int(r["tradeId"]) for r in raw["fillList"]]
        assert ids == sorted(ids, reverse=True) and raw["endId"] == str(ids[-1]) and len(ids) == 3
        with pytest.raises(BitgetParamError):
            await gw.request("GET", "/api/v2/mix/order/fills", params={"productType": "USDT-FUTURES",
                                                                       "limit": 101})  # fmt: skip

    _run(_with_gw(ex, go))


def test_batch_cancel_and_cancel_all(ex):
    async def go(gw):
        for i in range(4):
            await gw.place_order(_limit(px=f"{29990 - i}.0", coid=f"b-{i}"))
        res = await gw.batch_cancel("BTCUSDT", client_oids=["b-0", "b-1", "nope"])
        assert {r.client_oid for r in res.success} == {"b-0", "b-1"}
        assert [(f[0].client_oid, f[1]) for f in res.failure] == [("nope", "40768")]
        res = await gw.cancel_all()
        assert {r.client_oid for r in res.success} == {"b-2", "b-3"}
        assert await gw.pending_orders() == [] and ex.cancel_all_calls == 1

    _run(_with_gw(ex, go))


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (_limit(size="0.0105"), "40808"),  # size not a multiple of the step (0.001)
        (_limit(px="29999.05"), "41103"),  # price not a multiple of the tick (0.1)
        (_limit(size="0.000", coid="z"), "40808"),
        ({**_limit(), "size": ""}, "40019"),
        ({**_limit(), "productType": "COIN-FUTURES"}, "40017"),
        (_limit(size="0.0001"), "40808"),
        ({**_limit(), "clientOid": "x" * 51}, "40305"),
        # Decimal parses these, but comparing or dividing them raised inside the handler: the
        # connection dropped with a traceback on the server's stderr instead of an error code
        (_limit(size="NaN", coid="n1"), "40017"),
        (_limit(px="Infinity", coid="n2"), "40017"),
        (_limit(size="1e400", coid="n3"), "40017"),
        ({k: v for k, v in _limit(coid="n4").items() if k != "price"}, "40019"),  # a limit with no price
    ],
)
def test_param_errors(ex, body, code):
    async def go(gw):
        with pytest.raises(BitgetParamError) as e:
            await gw.place_order(body)
        assert e.value.code == code

    _run(_with_gw(ex, go))


def test_minimums_and_duplicate_client_oid():
    rows = [
        {
            "symbol": "BTCUSDT",
            "pricePlace": "1",
            "priceEndStep": "1",
            "sizeMultiplier": "0.001",
            "minTradeNum": "0.005",
            "minTradeUSDT": "5",
            "makerFeeRate": "0.0002",
            "takerFeeRate": "0.0006",
        }
    ]
    with LocalExchangeThread(LocalExchange(contracts=rows)) as ex:
        ex.apply_book(make_book(100.0, 100.1, ts=time.time_ns()))

        async def go(gw):
            with pytest.raises(BitgetParamError) as e:
                await gw.place_order(_limit(px="99.0", size="0.004", coid="a"))
            assert e.value.code == "43006"  # below minTradeNum
            with pytest.raises(BitgetParamError) as e:
                await gw.place_order(_limit(px="99.0", size="0.010", coid="b"))
            assert e.value.code == "45110"  # 0.99 USDT < minTradeUSDT 5
            await gw.place_order(_limit(px="99.0", size="0.060", coid="c"))
            with pytest.raises(BitgetParamError, match="Duplicate"):
                await gw.place_order(_limit(px="99.0", size="0.060", coid="c"))

        _run(_with_gw(ex, go))


def test_auth_errors(ex):
    async def expect(code, creds=CREDS, **kw):
        async def go(gw):
            with pytest.raises(BitgetAuthError) as e:
                await gw.pending_orders()
            assert e.value.code == code

        return await _with_gw(ex, go, creds, **kw)

    _run(expect("40006", Credentials("who", "local-secret", "local-passphrase")))
    _run(expect("40012", Credentials("local-key", "local-secret", "wrong")))
    _run(expect("40009", Credentials("local-key", "wrong-secret", "local-passphrase")))
    # a clock 40 s behind the server's, never synced: "request timestamp expired"
    skewed = BitgetGateway(ex.rest_url, CREDS, wall_ms=lambda: time.time_ns() // 1_000_000 - 40_000)

    async def stale():
        try:
            with pytest.raises(BitgetAuthError) as e:
                await skewed.pending_orders()
            assert e.value.code == "40008"
            await skewed.sync_time()  # ... and fine once synced
            assert await skewed.pending_orders() == []
        finally:
            await skewed.aclose()

    _run(stale())
    # missing headers, raw
    with httpx.Client(base_url=ex.rest_url) as c:
        r = c.get("/api/v2/mix/order/orders-pending?productType=USDT-FUTURES")
        assert r.status_code == 400 and r.json()["code"] == "40001" and r.json()["data"] is None
        # a signature over another query than the one sent
        req = build_request(
            "GET",
            "/api/v2/mix/order/orders-pending",
            params={"productType": "USDT-FUTURES"},
            credentials=CREDS,
            ts_ms=ex.now_ns() // 1_000_000,
        )
        r = c.get(req.target + "&symbol=BTCUSDT", headers=dict(req.headers))
        assert r.json()["code"] == "40009"
        # credentials with non-ASCII bytes: a wrong passphrase or signature (compare_digest raised on them)
        for name, code in (("ACCESS-PASSPHRASE", "40012"), ("ACCESS-SIGN", "40009")):
            headers = {k: v.encode() for k, v in req.headers.items()} | {name: "pässwörd".encode()}
            r = c.get(req.target, headers=headers)
            assert r.status_code == 400 and r.json()["code"] == code


def test_venue_rate_limit_is_429_and_ours_keeps_under_it():
    with LocalExchangeThread(LocalExchange(orders_per_s=3)) as ex:  # the venue: 3 orders per second
        ex.apply_book(make_book(30000.0, 30000.1, ts=time.time_ns()))
        with httpx.Client(base_url=ex.rest_url) as c:
            codes = []
            for i in range(6):
                req = build_request(
                    "POST",
                    PATH_PLACE,
                    body=_limit(px="29000.0", coid=f"rl-{i}"),
                    credentials=CREDS,
                    ts_ms=ex.now_ns() // 1_000_000,
                )
                r = c.post(req.target, content=req.body, headers=dict(req.headers))
                codes.append((r.status_code, r.json()["code"]))
        assert codes[:3] == [(200, "00000")] * 3 and (429, "429") in codes[3:]

        async def typed(gw):  # a client without our limit meets the venue's: a typed error
            with pytest.raises(BitgetRateLimitError):
                for i in range(8):
                    await gw.place_order(_limit(px="29000.0", coid=f"x-{i}"))

        _run(_with_gw(ex, typed, orders_per_s=100))

        async def ours(gw):
            await asyncio.sleep(1.05)
            t0 = time.monotonic()
            for i in range(4):  # 2 per second on our side: the venue never has to refuse one
                await gw.place_order(_limit(px="29000.0", coid=f"ok-{i}"))
            return time.monotonic() - t0

        assert _run(_with_gw(ex, ours, orders_per_s=2)) >= 0.95


def test_rate_limiter_is_a_sliding_window():
    now = [0.0]
    rl = RateLimiter(2, 1.0, clock=lambda: now[0])
    assert rl.wait_s() == 0
    rl._times.extend([0.0, 0.4])
    assert rl.wait_s() == pytest.approx(1.0)
    now[0] = 0.9
    assert rl.wait_s() == pytest.approx(0.1)
    now[0] = 1.0  # the first one left the window
    assert rl.wait_s() == 0


async def _private_session(ex, *, ts_s=None, creds=CREDS, subscribe=True):
    ws = await connect(ex.private_url, ping_interval=None)
    ts = int(time.time()) if ts_s is None else ts_s
    await ws.send(login_message(creds, ts).decode())
    reply = parse_private(await asyncio.wait_for(ws.recv(), 5))[0]
    if subscribe and reply.kind == "login":
        await ws.send(orjson.dumps({"op": "subscribe", "args": private_args()}).decode())
    return ws, reply


async def _collect(ws, until, timeout=5.0):
    out = []
    deadline = time.monotonic() + timeout
    while not until(out):
        raw = await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic()))
        out.extend(parse_private(raw))
    return out


def test_private_login_variants(ex):
    async def go():
        ws, reply = await _private_session(ex, subscribe=False)
        assert reply.kind == "login" and reply.code == 0
        await ws.close()
        for kw, code in (
            ({"ts_s": int(time.time() * 1000)}, 30014),  # milliseconds: expired, as Bitget expects seconds
            ({"creds": Credentials("local-key", "nope", "local-passphrase")}, 30015),
            ({"creds": Credentials("local-key", "local-secret", "nope")}, 30012),
            ({"creds": Credentials("local-key", "local-secret", "pässwörd")}, 30012),  # non-ASCII
            ({"creds": Credentials("nobody", "local-secret", "local-passphrase")}, 30011),
        ):
            ws, reply = await _private_session(ex, subscribe=False, **kw)
            assert reply.kind == "error" and reply.code == code
            with pytest.raises(websockets.ConnectionClosed):  # a failed login hangs up
                await asyncio.wait_for(ws.recv(), 2)
        ws = await connect(ex.private_url, ping_interval=None)
        await ws.send(orjson.dumps({"op": "subscribe", "args": private_args()}).decode())
        (err,) = parse_private(await asyncio.wait_for(ws.recv(), 2))
        assert err.kind == "error" and err.code == 30004  # login first
        await ws.send("ping")
        assert await asyncio.wait_for(ws.recv(), 2) == "pong"
        await ws.close()

    _run(go())


@pytest.mark.parametrize("key", ["clientOid", "clientOId"])
def test_private_pushes_orders_fill_positions(key):
    with LocalExchangeThread(LocalExchange(client_oid_key=key)) as ex:
        ex.apply_book(make_book(30000.0, 30000.1, ts=time.time_ns()))

        async def go():
            ws, _ = await _private_session(ex)
            acks = await _collect(
                ws,
                lambda o: (
                    sum(1 for i in o if getattr(i, "kind", "") == "subscribe") == 3
                    and any(isinstance(i, PositionsUpdate) for i in o)
                ),
            )
            assert any(isinstance(i, PositionsUpdate) and i.positions == [] for i in acks)
            raw_seen = []

            async def go_gw(gw):
                body = place_order_body(
                    symbol="BTCUSDT", side="sell", order_type="market", size="0.300", client_oid="p-1"
                )
                await gw.place_order(body)

            await _with_gw(ex, go_gw)
            items = await _collect(
                ws,
                lambda o: (
                    any(isinstance(i, OrderUpdate) and i.status == "filled" for i in o)
                    and any(isinstance(i, PositionsUpdate) for i in o)
                    and any(isinstance(i, FillUpdate) for i in o)
                ),
            )
            raw_seen.extend(items)
            orders = [i for i in items if isinstance(i, OrderUpdate)]
            assert [o.status for o in orders] == ["live", "partially_filled", "filled"]
            assert all(o.client_oid == "p-1" for o in orders)
            fill = orders[1].fill
            assert (
                fill is not None and fill.liquidity == "taker" and fill.price == 30000.0 and fill.qty == 0.3
            )
            assert fill.fee < 0
            (f,) = [i for i in items if isinstance(i, FillUpdate)]
            assert f.order_id == orders[0].order_id and f.trade_id == fill.trade_id
            (p,) = [i for i in items if isinstance(i, PositionsUpdate)]
            assert p.positions[0].signed_size == -0.3 and p.positions[0].leverage == "20"
            await ws.close()

        _run(go())


def test_public_feed_rebased_to_the_exchange_clock():
    frames = toy_frames(n=20, interval_ms=100, start_ms=1_600_000_000_000)

    async def go():
        async with LocalExchange(frames, speed=0) as ex:
            ws = await connect(ex.public_url, ping_interval=None)
            await ws.send(
                '{"op":"subscribe","args":[{"instType":"USDT-FUTURES","channel":"books15","instId":"BTCUSDT"}]}'
            )
            got = []
            while len(got) < 3:
                m = orjson.loads(await asyncio.wait_for(ws.recv(), 5))
                if m.get("action"):
                    got.append(m)
            now_ms = time.time() * 1000
            ws.transport.abort()
            for m in got:
                assert abs(int(m["data"][0]["ts"]) - now_ms) < 10_000  # not 2020 any more
            await asyncio.sleep(0.2)
            assert ex.venues["BTCUSDT"].book is not None  # the exchange matches against what it sent

    _run(go())


def test_reduce_only_is_enforced_per_account(ex):
    def market(side, size, coid, reduce_only):
        return place_order_body(
            symbol="BTCUSDT",
            side=side,
            order_type="market",
            size=size,
            client_oid=coid,
            reduce_only=reduce_only,
        )

    async def go(gw):
        with pytest.raises(BitgetParamError) as e:  # flat: a reduce-only order has nothing to reduce
            await gw.place_order(market("sell", "0.100", "ro-0", True))
        assert e.value.code == "40017" and "reduceOnly" in str(e.value)
        await gw.place_order(market("buy", "0.300", "ro-1", False))
        with pytest.raises(BitgetParamError):  # would increase the long
            await gw.place_order(market("buy", "0.100", "ro-2", True))
        with pytest.raises(BitgetParamError):  # would flip it short
            await gw.place_order(market("sell", "0.500", "ro-3", True))
        await gw.place_order(market("sell", "0.100", "ro-4", True))
        assert ex.position("BTCUSDT") == pytest.approx(0.2)

    _run(_with_gw(ex, go))


def test_simulated_symbols_get_their_contracts():
    """Without contract rows, a symbol the simulator knows trades on its contract (ETHUSDT: tick 0.01,
    size step 0.01) beside BTCUSDT's."""
    with LocalExchangeThread(LocalExchange(symbols=["BTCUSDT", "ETHUSDT"])) as ex:
        ex.apply_book(make_book(3000.0, 3000.01, tick=0.01, symbol="ETHUSDT", ts=time.time_ns()))

        def eth(px, size, coid):
            return place_order_body(
                symbol="ETHUSDT", side="buy", order_type="limit", size=size, price=px, client_oid=coid
            )

        async def go(gw):
            specs = {s.symbol: s for s in await gw.contracts()}
            assert (str(specs["ETHUSDT"].tick), str(specs["ETHUSDT"].size_step)) == ("0.01", "0.01")
            assert (str(specs["BTCUSDT"].tick), str(specs["BTCUSDT"].size_step)) == ("0.1", "0.001")
            await gw.place_order(eth("2999.99", "0.05", "e-1"))
            with pytest.raises(BitgetParamError) as e:
                await gw.place_order(eth("2999.995", "0.05", "e-2"))
            assert e.value.code == "41103"
            with pytest.raises(BitgetParamError) as e:
                await gw.place_order(eth("2999.99", "0.055", "e-3"))
            assert e.value.code == "40808"

        _run(_with_gw(ex, go))


@pytest.mark.parametrize("length", [b"abc", b"-5", b"\xd9\xa1"])
def test_a_bad_content_length_is_a_400_reply(ex, length):
    """A request whose Content-Length is not a decimal number gets a 400 envelope. Before, int() raised
    in the handler thread: no reply, the connection dropped, a traceback on the server's stderr."""
    host, port = ex.rest_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST /api/v2/mix/order/place-order HTTP/1.1\r\nContent-Length: " + length + b"\r\n\r\n")
        reply = b""
        while chunk := s.recv(65536):  # the server closes the connection after the reply
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and orjson.loads(body)["code"] == "40017"
