"""Bitget v2 REST/WS signing checked against ccxt (an independent implementation, clock fixed), plus the
pure envelope, error, contract and private-channel parsers."""

import asyncio
import math
from decimal import Decimal

import orjson
import pytest

from wire.bitget.bitget_v2_private import (
    FillUpdate,
    OrderUpdate,
    PositionsUpdate,
    PrivateQuarantined,
    login_message,
    parse_private,
)
from wire.bitget.bitget_v2_rest import (
    PATH_PENDING,
    PATH_PLACE,
    BitgetAccountModeError,
    BitgetAuthError,
    BitgetBalanceError,
    BitgetError,
    BitgetNotFoundError,
    BitgetParamError,
    BitgetProtocolError,
    BitgetRateLimitError,
    Credentials,
    build_request,
    format_decimal,
    parse_contract,
    parse_envelope,
    parse_pending,
    parse_position,
    place_order_body,
    prehash,
    sign,
)

ccxt = pytest.importorskip("ccxt")  # test-only dependency (pyproject dev extras)

KEY, SECRET, PASS = "bg_test_key_0123", "s3cr3t-value-xyz", "pass-phrase-42"
CREDS = Credentials(KEY, SECRET, PASS)
TS_MS = 1_700_000_000_123


def _ccxt_exchange():
    ex = ccxt.bitget({"apiKey": KEY, "secret": SECRET, "password": PASS})
    ex.nonce = lambda: TS_MS  # the clock ccxt signs with
    ex.milliseconds = lambda: TS_MS
    return ex


def _ours(method, path, *, params=None, body=None):
    return build_request(method, path, params=params, body=body, credentials=CREDS, ts_ms=TS_MS)


def _same_headers(theirs, ours):
    # ccxt adds its broker code (X-CHANNEL-API-CODE), which is not signed and which we must not copy.
    theirs = {k: v for k, v in theirs.items() if k != "X-CHANNEL-API-CODE"}
    assert ours == theirs


def test_place_order_signature_matches_ccxt():
    body = place_order_body(
        symbol="BTCUSDT", side="buy", order_type="limit", size="0.01", price="27000.5", client_oid="dh-abc-1"
    )
    req = _ours("POST", PATH_PLACE, body=body)
    theirs = _ccxt_exchange().sign("v2/mix/order/place-order", ["private", "mix"], "POST", body)
    assert theirs["url"].endswith(req.target)
    assert theirs["body"] == req.body.decode()  # the exact bytes signed: compact JSON, same key order
    _same_headers(theirs["headers"], dict(req.headers))
    assert "X-CHANNEL-API-CODE" not in req.headers


def test_get_with_query_signature_matches_ccxt():
    params = {"symbol": "BTCUSDT", "productType": "USDT-FUTURES"}  # ccxt sorts the keys; so do we
    req = _ours("GET", PATH_PENDING, params=params)
    theirs = _ccxt_exchange().sign("v2/mix/order/orders-pending", ["private", "mix"], "GET", params)
    assert theirs["url"].endswith(req.target)
    assert req.target == f"{PATH_PENDING}?productType=USDT-FUTURES&symbol=BTCUSDT"
    assert req.body == b""
    _same_headers(theirs["headers"], dict(req.headers))


def test_doc_prehash_example():
    body = (
        '{"productType":"usdt-futures","symbol":"BTCUSDT","size":"8","marginMode":"crossed",'
        '"side":"buy","orderType":"limit","clientOid":"channel#123456"}'
    )
    assert prehash(16273667805456, "POST", PATH_PLACE, "", body) == "16273667805456POST" + PATH_PLACE + body
    # the query joins with "?" only when there is one
    assert prehash(1, "get", "/p", "a=1") == "1GET/p?a=1"


def test_ws_login_matches_ccxt_pro():
    import ccxt.pro as ccxtpro

    async def capture():
        ex = ccxtpro.bitget({"apiKey": KEY, "secret": SECRET, "password": PASS})
        ex.seconds = lambda: TS_MS // 1000
        got = {}

        def watch(url, message_hash, message=None, *a, **k):
            got["m"] = message
            ex.client(url).resolve(True, message_hash)

        ex.watch = watch
        try:
            await asyncio.wait_for(ex.authenticate({"url": "wss://ws.bitget.com/v2/ws/private"}), 5)
        finally:
            await ex.close()
        return got["m"]

    theirs = asyncio.run(capture())
    ours = orjson.loads(login_message(CREDS, TS_MS // 1000))
    assert ours["op"] == theirs["op"] == "login"
    assert ours["args"] == theirs["args"]
    assert ours["args"][0]["timestamp"] == str(TS_MS // 1000)  # seconds, not ms


def test_secrets_never_in_repr():
    req = _ours("POST", PATH_PLACE, body={"a": "b"})
    for text in (repr(CREDS), str(CREDS), repr(req), str(req)):
        assert SECRET not in text and PASS not in text
    assert CREDS.redact(f"x{SECRET}y{PASS}") == "x<hidden>y<hidden>"
    with pytest.raises(ValueError):
        Credentials("k", "", "p")


@pytest.mark.parametrize(
    ("status", "body", "cls"),
    [
        (400, {"code": "40009", "msg": "sign signature error"}, BitgetAuthError),
        (400, {"code": 40012, "msg": "apikey/password is incorrect"}, BitgetAuthError),
        (400, {"code": "40008", "msg": "Request timestamp expired"}, BitgetAuthError),
        (400, {"code": "40019", "msg": "Parameter cannot be empty"}, BitgetParamError),
        (400, {"code": "40305", "msg": "Client_oid length is not greater than 50"}, BitgetParamError),
        (400, {"code": "45110", "msg": "less than the minimum amount 5 USDT"}, BitgetParamError),
        (400, {"code": "40762", "msg": "The order amount exceeds the balance"}, BitgetBalanceError),
        (400, {"code": "43012", "msg": "Insufficient balance"}, BitgetBalanceError),
        (400, {"code": "40768", "msg": "Order does not exist"}, BitgetNotFoundError),
        (400, {"code": "43001", "msg": "The order does not exist"}, BitgetNotFoundError),
        (429, {"code": "429", "msg": "Too Many Requests"}, BitgetRateLimitError),
        (200, {"code": "429", "msg": "too many"}, BitgetRateLimitError),
        (429, b"<html>busy</html>", BitgetRateLimitError),
        (400, {"code": "40085", "msg": "Unified Account mode"}, BitgetAccountModeError),
        (400, {"code": "99999", "msg": "unknown"}, BitgetError),
        (502, b"bad gateway", BitgetProtocolError),
    ],
)
def test_envelope_errors_are_typed(status, body, cls):
    raw = body if isinstance(body, bytes) else orjson.dumps({**body, "requestTime": 1, "data": None})
    with pytest.raises(cls) as e:
        parse_envelope(status, raw)
    assert type(e.value) is cls


def test_envelope_success_request_time_number_or_string():
    for rt in (1695806875837, "1695806875837"):
        env = parse_envelope(200, {"code": "00000", "msg": "success", "requestTime": rt, "data": {"x": 1}})
        assert env.request_time_ms == 1695806875837 and env.data == {"x": 1}


def test_contract_row_doc_example():
    row = {
        "symbol": "BTCUSDT",
        "baseCoin": "BTC",
        "quoteCoin": "USDT",
        "makerFeeRate": "0.0004",
        "takerFeeRate": "0.0006",
        "minTradeNum": "0.01",
        "priceEndStep": "1",
        "volumePlace": "2",
        "pricePlace": "1",
        "sizeMultiplier": "0.01",
        "minTradeUSDT": "5",
        "symbolStatus": "normal",
        "maxLever": "125",
    }
    spec = parse_contract(row)
    assert spec.tick == Decimal("0.1") and spec.size_step == Decimal("0.01")
    assert spec.min_qty == Decimal("0.01") and spec.min_notional_usdt == Decimal("5")
    cfg = spec.config()
    assert (cfg.tick, cfg.size_step, cfg.min_qty) == (0.1, 0.01, 0.01)
    assert cfg.maker_fee_rate == Decimal("0.0004") and cfg.taker_fee_rate == Decimal("0.0006")
    assert parse_contract({**row, "priceEndStep": "5", "pricePlace": "2"}).tick == Decimal("0.05")
    with pytest.raises(ValueError, match="pricePlace"):
        parse_contract({k: v for k, v in row.items() if k != "pricePlace"})


def test_format_decimal_and_client_oid_limit():
    assert format_decimal(27000.05, "0.1") in ("27000.0", "27000.1")
    assert format_decimal(0.0123, Decimal("0.001")) == "0.012"
    assert format_decimal(30000.0, Decimal("0.1")) == "30000.0"
    with pytest.raises(ValueError, match="50"):
        place_order_body(symbol="X", side="buy", order_type="market", size="1", client_oid="x" * 51)


def test_pending_and_positions_variants():
    rows = parse_pending(
        {"entrustedList": [{"orderId": "1", "clientOId": "a", "status": "live", "baseVolume": "0.1"}]}
    )
    assert rows[0].client_oid == "a" and rows[0].filled == 0.1
    assert parse_pending({"entrustedList": None}) == [] and parse_pending(None) == []
    detail = parse_pending([{"orderId": "2", "clientOid": "b", "state": "cancelled"}])[0]
    assert detail.status == "canceled"
    p = parse_position({"symbol": "BTCUSDT", "holdSide": "short", "total": "0.1", "leverage": 20})
    assert p.signed_size == -0.1 and p.leverage == "20"
    assert (
        parse_position({"symbol": "X", "holdSide": "long", "total": "1", "leverage": "20"}).leverage == "20"
    )


def test_private_orders_both_spellings_and_fill_fields():
    base = {
        "orderId": "13333333333333333333",
        "instId": "ETHUSDT",
        "side": "buy",
        "orderType": "limit",
        "price": "3000",
        "size": "0.4",
        "accBaseVolume": "0.1",
        "status": "partially_filled",
        "reduceOnly": "no",
        "leverage": "12",
        "uTime": "1760461517274",
        "tradeId": "777",
        "fillPrice": "2999.5",
        "baseVolume": "0.1",
        "fillFee": "-0.01",
        "tradeScope": "M",
        "fillTime": "1760461517270",
    }
    for spelling in ("clientOid", "clientOId"):
        frame = {"action": "snapshot", "arg": {"channel": "orders"}, "data": [{**base, spelling: "dh-1"}]}
        (u,) = parse_private(orjson.dumps(frame))
        assert isinstance(u, OrderUpdate) and u.client_oid == "dh-1"
        assert u.fill is not None and u.fill.liquidity == "maker" and u.fill.qty == 0.1
        assert u.fill.price == 2999.5 and u.fill.time_ms == 1760461517270
    frame = {"arg": {"channel": "orders"}, "data": [{**base, "clientOid": "x", "status": "cancelled"}]}
    assert parse_private(orjson.dumps(frame))[0].status == "canceled"


def test_private_fill_positions_controls_and_garbage():
    fill = {
        "arg": {"channel": "fill"},
        "data": [
            {
                "orderId": "111",
                "tradeId": "222",
                "symbol": "BTCUSDT",
                "side": "buy",
                "price": "51000.5",
                "baseVolume": "0.01",
                "tradeScope": "taker",
                "feeDetail": [{"feeCoin": "USDT", "totalFee": "-0.183717"}],
                "cTime": "1703577336606",
            }
        ],
        "ts": 1703577336700,
    }
    (f,) = parse_private(orjson.dumps(fill))
    assert isinstance(f, FillUpdate) and f.liquidity == "taker" and math.isclose(f.fee, -0.183717)
    pos = {
        "arg": {"channel": "positions"},
        "data": [{"instId": "ETHUSDT", "holdSide": "short", "total": "0.1", "leverage": 20}],
        "ts": 5,
    }
    (p,) = parse_private(orjson.dumps(pos))
    assert isinstance(p, PositionsUpdate) and p.positions[0].signed_size == -0.1
    assert p.positions[0].leverage == "20"
    (login,) = parse_private(b'{"event":"login","code":"0","msg":""}')
    assert login.kind == "login" and login.code == 0
    (login,) = parse_private(b'{"event":"login","code":0}')
    assert login.code == 0
    (err,) = parse_private(b'{"event":"error","code":"30005","msg":"error"}')
    assert err.kind == "error" and err.code == 30005
    assert parse_private(b"pong")[0].kind == "pong"
    assert isinstance(parse_private(b"\x00junk")[0], PrivateQuarantined)
    bad = {"arg": {"channel": "orders"}, "data": [{"orderId": "1", "size": "abc"}]}
    assert isinstance(parse_private(orjson.dumps(bad))[0], PrivateQuarantined)


def test_sign_is_base64_hmac_sha256():
    import base64
    import hashlib
    import hmac

    want = base64.b64encode(hmac.new(b"k", b"1GET/p", hashlib.sha256).digest()).decode()
    assert sign("k", 1, "GET", "/p") == want
