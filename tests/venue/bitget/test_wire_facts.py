"""The local Bitget venue speaks like the real one: each fact from real v2 captures (issue 53), in
each year's wire layout (``wire_year``, the latest by default), and the project's own clients take
every variant: the general and compiled decoders, the ``books`` rebuilder, the private channel
parser, the REST envelope, and ``dualhub record`` end to end."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
import time
import zlib
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import websockets

from engine.events import BookSnapshot, Quarantined
from engine.store import open_session
from live.gateway import BitgetGateway
from tests.helpers import REPO, make_book
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import BitgetServer, Fault, toy_frames
from venue.bitget.wire_layout import DEFAULT_BOOKS_DEPTH, FIXED_DEPTH, YEARS
from wire.bitget.bitget_v2 import StreamCounters, arg, decode, subscribe_request
from wire.bitget.bitget_v2_books import BookFault, BooksState, book_checksum, decode_with_books
from wire.bitget.bitget_v2_fast import Books15Scanner, decode_fast
from wire.bitget.bitget_v2_private import (
    OrderUpdate,
    PositionsUpdate,
    PrivateQuarantined,
    login_message,
    parse_private,
    private_args,
)
from wire.bitget.bitget_v2_rest import Credentials, parse_envelope, place_order_body

SYM = "BTCUSDT"
SRC = toy_frames((SYM,), n=80)
SRC_BOOKS = [orjson.loads(f) for _, f in SRC if b'"books15"' in f[:90]]
FIXED_KEYS = {
    "2024": ["asks", "bids", "checksum", "ts"],
    "2025": ["asks", "bids", "checksum", "seq", "ts"],
    "2026": ["asks", "bids", "ts", "seq", "pseq"],
}
BOOKS_KEYS = FIXED_KEYS  # the same optional keys, year by year, on ``books``
CREDS = Credentials("local-key", "local-secret", "local-passphrase")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _read_until_quiet(srv: BitgetServer, ws: Any) -> list[bytes]:
    out: list[bytes] = []
    while True:
        try:
            out.append(await asyncio.wait_for(ws.recv(decode=False), 0.5 if srv.finished.is_set() else 10))
        except TimeoutError:
            return out


@functools.cache
def _session(year: str | None, channels: tuple[str, ...]) -> tuple[bytes, ...]:
    """Every frame one client gets subscribing ``channels`` on SYM for the whole toy feed."""

    async def go() -> list[bytes]:
        kw = {} if year is None else {"wire_year": year}
        async with BitgetServer(SRC, speed=0, **kw) as srv:
            async with websockets.connect(srv.url, close_timeout=0.2, max_size=None) as ws:
                await ws.send(subscribe_request([arg(c, SYM) for c in channels]))
                return await _read_until_quiet(srv, ws)

    return tuple(run(go()))


def _pushes(raw: tuple[bytes, ...], channel: str) -> list[tuple[bytes, dict[str, Any]]]:
    out = []
    for r in raw:
        f = orjson.loads(r)
        if "data" in f and f["arg"]["channel"] == channel:
            out.append((r, f))
    return out


# ---------------------------------------------------------------- fixed-depth channels


@pytest.mark.parametrize("channel", list(FIXED_DEPTH))
@pytest.mark.parametrize("year", YEARS)
def test_fixed_depth_layout_of_each_year(year: str, channel: str) -> None:
    """2024: ``checksum: 0`` and no ``seq``; 2025: ``checksum: 0`` and ``seq``; 2026: ``seq`` and
    ``pseq`` (the previous push's seq), no checksum. Every push a snapshot of the channel's depth."""
    pushes = _pushes(_session(year, tuple(FIXED_DEPTH)), channel)
    assert len(pushes) == len(SRC_BOOKS)
    n = FIXED_DEPTH[channel]
    prev = 0
    for (_, f), src in zip(pushes, SRC_BOOKS, strict=True):
        d, sd = f["data"][0], src["data"][0]
        assert f["action"] == "snapshot" and list(d) == FIXED_KEYS[year]
        assert (d["bids"], d["asks"], d["ts"]) == (sd["bids"][:n], sd["asks"][:n], sd["ts"])
        assert d.get("checksum", 0) == 0 and d.get("seq", sd["seq"]) == sd["seq"]
        if "pseq" in d:
            assert d["pseq"] == prev
            prev = d["seq"]


@pytest.mark.parametrize("year", YEARS)
def test_fixed_depth_pushes_decode_the_same_on_both_decoders(year: str) -> None:
    """The general decoder and the compiled one take every year's push, alike (a missing seq is 0);
    the compiled scan takes every books15 push of every year."""
    scanner = Books15Scanner()
    for channel, n in FIXED_DEPTH.items():
        for raw, f in _pushes(_session(year, tuple(FIXED_DEPTH)), channel):
            slow = decode(raw, 5, StreamCounters())
            assert slow == decode_fast(raw, 5, StreamCounters(), scanner)
            (b,) = slow
            assert isinstance(b, BookSnapshot) and b.exch_seq == f["data"][0].get("seq", 0)
            assert sum(p == p for p in b.bid_px) == n
            if channel == "books15":
                assert scanner.scan(raw)


def test_the_latest_year_is_the_default() -> None:
    assert BitgetServer(SRC).wire_year == "2026" == LocalExchange().public.wire_year
    assert _session(None, ("books15", "books")) == _session("2026", ("books15", "books"))


def test_an_unknown_year_is_refused() -> None:
    with pytest.raises(ValueError, match="2024, 2025, 2026"):
        BitgetServer(SRC, wire_year="2023")


# ---------------------------------------------------------------- the books channel


@pytest.mark.parametrize("year", YEARS)
def test_books_is_the_full_depth_with_updates_sorted_by_price(year: str) -> None:
    """A snapshot of every level (deeper than the checksum's 25, not 15), then updates whose levels
    are sorted by price (bids down, asks up); each year's keys; a snapshot's checksum is 0."""
    pushes = [f for _, f in _pushes(_session(year, ("books",)), "books")]
    snap, updates = pushes[0], pushes[1:]
    d = snap["data"][0]
    assert snap["action"] == "snapshot" and list(d) == BOOKS_KEYS[year]
    assert len(d["bids"]) == len(d["asks"]) == DEFAULT_BOOKS_DEPTH > 25
    assert d.get("checksum", 0) == 0 and d.get("pseq", 0) == 0
    assert len(updates) > 40 and all(u["action"] == "update" for u in updates)
    prev = d.get("seq")
    for u in updates:
        e = u["data"][0]
        assert list(e) == BOOKS_KEYS[year]
        bids = [Decimal(p) for p, _ in e["bids"]]
        asks = [Decimal(p) for p, _ in e["asks"]]
        assert bids == sorted(bids, reverse=True) and asks == sorted(asks)
        assert len(set(bids)) == len(bids) and len(set(asks)) == len(asks)
        if "pseq" in e:
            assert e["pseq"] == prev
        if "seq" in e:
            assert e["seq"] == prev + 1
            prev = e["seq"]


def _crc_by_hand(bids: list[list[str]], asks: list[list[str]]) -> int:
    parts = []
    for i in range(25):
        for side in (bids, asks):
            if i < len(side):
                parts += side[i]
    u = zlib.crc32(":".join(parts).encode())
    return u - (1 << 32) if u >= 1 << 31 else u


@pytest.mark.parametrize("year", ["2024", "2025"])
def test_books_checksum_is_crc32_of_the_top_25_levels_of_the_full_book(year: str) -> None:
    """The client that applies every delta checks every update's CRC32 (the top 25 levels of the
    full book, which a 15-level book would not give) and never finds a fault."""
    raw = _session(year, ("books",))
    state, counters = BooksState(), StreamCounters()
    differs_from_15 = 0
    for r, f in _pushes(raw, "books"):
        out = decode_with_books(r, 5, counters, state)
        assert not any(isinstance(e, BookFault | Quarantined) for e in out), out
        book = state.book(SYM)
        bids, asks = [list(x) for x in book.bids()], [list(x) for x in book.asks()]
        assert len(bids) > 25 and len(asks) > 25
        if f["action"] == "update":
            assert f["data"][0]["checksum"] == _crc_by_hand(bids, asks)
            differs_from_15 += f["data"][0]["checksum"] != book_checksum(bids[:15], asks[:15], 15)
    n_updates = len(_pushes(raw, "books")) - 1
    assert state.checksums_verified == n_updates > 40 and differs_from_15 == n_updates


@pytest.mark.parametrize("year", YEARS)
def test_books_top_is_exactly_what_the_feed_sent(year: str) -> None:
    """After each ``books`` push, the rebuilt book's top 15 levels are the same instant's books15
    push, strings and all: a level the feed dropped is gone, and none is promoted from below."""
    state, counters = BooksState(), StreamCounters()
    last15: dict[str, Any] | None = None
    checked = 0
    for r in _session(year, ("books15", "books")):
        f = orjson.loads(r)
        if "data" not in f:
            continue
        if f["arg"]["channel"] == "books15":
            last15 = f["data"][0]
            continue
        assert not any(isinstance(e, BookFault) for e in decode_with_books(r, 5, counters, state))
        book = state.book(SYM)
        assert last15 is not None
        assert [list(x) for x in book.bids(15)] == last15["bids"]
        assert [list(x) for x in book.asks(15)] == last15["asks"]
        checked += 1
    assert checked > 40


@pytest.mark.parametrize(("kind", "reason"), [("skip_seq", "seq_gap"), ("bad_checksum", "checksum")])
def test_books_faults_still_fire_in_the_latest_layout(kind: str, reason: str) -> None:
    """``bad_checksum`` puts a wrong checksum on an update even in 2026, which has none (a hostile
    frame); ``skip_seq`` withholds an update: the client finds each."""

    async def go() -> list[bytes]:
        async with BitgetServer(SRC, speed=0, faults=(Fault(kind=kind, at_frame=10),)) as srv:
            async with websockets.connect(srv.url, close_timeout=0.2, max_size=None) as ws:
                await ws.send(subscribe_request([arg("books", SYM)]))
                return await _read_until_quiet(srv, ws)

    state, counters = BooksState(), StreamCounters()
    faults = [e.reason for r in run(go()) for e in decode_with_books(r, 5, counters, state)
              if isinstance(e, BookFault)]  # fmt: skip
    assert faults and faults[0] == reason


# ---------------------------------------------------------------- trade, errors


@pytest.mark.parametrize("year", YEARS)
def test_trade_subscribe_gets_a_snapshot_of_recent_trades_then_updates(year: str) -> None:
    async def go() -> tuple[list[dict], list[dict]]:
        async with BitgetServer(toy_frames((SYM,), n=400), speed=5, wire_year=year) as srv:
            async with websockets.connect(srv.url, close_timeout=0.2) as ws:  # makes the feed run
                await ws.send(subscribe_request([arg("books15", SYM), arg("trade", SYM)]))
                first = [orjson.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(40)]
            async with websockets.connect(srv.url, close_timeout=0.2) as ws:  # a later one
                await ws.send(subscribe_request([arg("trade", SYM)]))
                second = [orjson.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(5)]
            return first, second

    first, second = run(go())
    seen = {d["tradeId"] for f in first if "data" in f and f["arg"]["channel"] == "trade" for d in f["data"]}
    ack, snap, *updates = second
    assert ack == {"event": "subscribe", "arg": arg("trade", SYM)}
    assert snap["action"] == "snapshot" and 1 < len(snap["data"]) <= 50
    ts = [int(d["ts"]) for d in snap["data"]]
    assert ts == sorted(ts, reverse=True)  # newest first
    assert {d["tradeId"] for d in snap["data"]} & seen  # recent trades: the first client had them
    assert all(u["action"] == "update" for u in updates)
    snap_ids = {d["tradeId"] for d in snap["data"]}
    assert not snap_ids & {d["tradeId"] for u in updates for d in u["data"]}


def test_30001_message_ends_with_precision_null() -> None:
    async def go() -> dict:
        async with BitgetServer(SRC, speed=0, symbols={SYM}) as srv:
            async with websockets.connect(srv.url, close_timeout=0.2) as ws:
                await ws.send(subscribe_request([arg("books15", "NOPEUSDT")]))
                return orjson.loads(await asyncio.wait_for(ws.recv(), 5))

    got = run(go())
    assert got["code"] == 30001 and got["event"] == "error"
    assert got["msg"] == "instType:USDT-FUTURES,channel:books15,instId:NOPEUSDT,precision:null doesn't exist"
    (ctl,) = decode(orjson.dumps(got), 5, StreamCounters())
    assert ctl.code == 30001 and ctl.msg.endswith(",precision:null doesn't exist")


# ---------------------------------------------------------------- private channels and REST


@pytest.fixture(params=["number", "string"])
def ex(request: pytest.FixtureRequest) -> Any:
    exchange = LocalExchange(symbols=[SYM], request_time=request.param)
    with LocalExchangeThread(exchange) as running:
        running.apply_book(make_book(30000.0, 30000.1, size=1.0, ts=time.time_ns()))
        yield running


async def _private(ex: Any, act: Any) -> list[dict]:
    async with websockets.connect(ex.private_url, close_timeout=0.2) as ws:
        await ws.send(login_message(CREDS, int(time.time())))
        await asyncio.wait_for(ws.recv(), 5)
        await ws.send(orjson.dumps({"op": "subscribe", "args": private_args()}))
        for _ in private_args():
            await asyncio.wait_for(ws.recv(), 5)  # the acks
        gw = BitgetGateway(ex.rest_url, CREDS)
        try:
            await gw.sync_time()
            await act(gw)
        finally:
            await gw.aclose()
        out = []
        while True:  # every push the actions caused: until the socket has been quiet a while
            try:
                out.append(orjson.loads(await asyncio.wait_for(ws.recv(), 1.0)))
            except TimeoutError:
                return out


def _limit(coid: str, side: str = "buy", px: str = "29999.0") -> dict:
    return place_order_body(
        symbol=SYM, side=side, order_type="limit", size="0.010", price=px, client_oid=coid
    )


def test_orders_push_carries_notional_usd_and_pnl_once_filled(ex: Any) -> None:
    async def act(gw: BitgetGateway) -> None:
        await gw.place_order(_limit("rest-1"))  # rests: live, no fill
        await gw.place_order(_limit("take-1", px="30000.1"))  # crosses: filled

    pushes = run(_private(ex, act))
    orders = [d for p in pushes if p["arg"]["channel"] == "orders" for d in p["data"]]
    resting = next(d for d in orders if d["clientOid"] == "rest-1")
    filled = next(d for d in orders if d["clientOid"] == "take-1" and d["status"] == "filled")
    assert Decimal(resting["notionalUsd"]) == Decimal("299.99") and "pnl" not in resting
    assert Decimal(filled["notionalUsd"]) == Decimal("300.001") and filled["pnl"] == "0.0"
    for p in pushes:
        items = parse_private(orjson.dumps(p))
        assert items and not any(isinstance(i, PrivateQuarantined) for i in items)
    with_fill = next(d for d in orders if d["clientOid"] == "take-1" and "tradeId" in d)
    assert with_fill["pnl"] == "0.0"  # an opening fill realizes nothing
    (upd,) = parse_private(orjson.dumps(next(p for p in pushes if with_fill in p["data"])))
    assert isinstance(upd, OrderUpdate) and upd.fill is not None and upd.fill.qty == 0.01


def test_positions_push_carries_the_margin_fields(ex: Any) -> None:
    async def act(gw: BitgetGateway) -> None:
        await gw.place_order(_limit("take-1", px="30000.1"))

    pushes = run(_private(ex, act))
    p = [p for p in pushes if p["arg"]["channel"] == "positions"][-1]  # after the fill
    (pos,) = p["data"]
    for k in ("unrealizedPLR", "liquidationPrice", "keepMarginRate", "marginRate", "autoMargin"):
        assert k in pos, k
    assert pos["autoMargin"] == "off" and 0 < float(pos["liquidationPrice"]) < 30000.1
    assert isinstance(pos["leverage"], int)  # a JSON number on the channel
    (upd,) = parse_private(orjson.dumps(p))
    assert isinstance(upd, PositionsUpdate) and upd.positions[0].total == 0.01


def test_rest_fill_rows_carry_enter_point_source_and_a_null_deduction_fee(ex: Any) -> None:
    async def go() -> tuple[Any, list[Any]]:
        gw = BitgetGateway(ex.rest_url, CREDS)
        try:
            await gw.sync_time()
            ref, _ = await gw.place_order(_limit("take-1", px="30000.1"))
            env = await gw.request("GET", "/api/v2/mix/order/fills", params={"productType": "USDT-FUTURES"})
            return env, await gw.order_fills(SYM, ref.order_id)
        finally:
            await gw.aclose()

    env, fills = run(go())
    (row,) = env.data["fillList"]
    assert row["enterPointSource"] == "API" and row["feeDetail"][0]["totalDeductionFee"] is None
    (f,) = fills  # the gateway reads it
    assert f.qty == 0.01 and f.fee < 0 and f.price == 30000.1


def test_request_time_is_a_number_or_a_string_and_both_are_read(ex: Any) -> None:
    form = ex.rest.request_time
    body = httpx.get(f"{ex.rest_url}/api/v2/public/time", timeout=5).json()
    assert isinstance(body["requestTime"], int if form == "number" else str)
    env = parse_envelope(200, orjson.dumps(body))
    assert env.request_time_ms == int(body["requestTime"]) > 0

    async def go() -> int:
        gw = BitgetGateway(ex.rest_url, CREDS)
        try:
            await gw.sync_time()
            _, rt = await gw.place_order(_limit("rest-1"))
            return rt
        finally:
            await gw.aclose()

    assert abs(run(go()) - time.time() * 1000) < 60_000


# ---------------------------------------------------------------- dualhub record, end to end


def _dualhub() -> list[str]:
    exe = Path(sys.executable).with_name("dualhub")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dualhub.cli"]


@pytest.mark.parametrize("year", YEARS)
def test_dualhub_record_takes_every_year_without_a_quarantine(year: str, tmp_path: Path) -> None:
    """``dualhub record`` of every book channel and trades from the local venue in that year's layout:
    no frame quarantined, no book fault; a dropped connection makes it resubscribe, and the trade
    snapshot that follows repeats trades it already has, which are stored once."""
    syms = ("BTCUSDT", "ETHUSDT")
    src = toy_frames(syms, n=300)
    out = tmp_path / "s"

    async def go() -> BitgetServer:
        faults = (Fault(kind="drop", at_frame=500),)
        async with BitgetServer(src, speed=10, wire_year=year, faults=faults) as srv:
            cmd = [*_dualhub(), "record", "--symbols", ",".join(syms), "--channels",
                   "books,books15,books5,books1,trade", "--out", str(out), "--url", srv.url,
                   "--flush-ms", "50", "--ping-s", "0.5", "--no-status"]  # fmt: skip
            proc = await asyncio.create_subprocess_exec(
                *cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            await asyncio.wait_for(srv.finished.wait(), 40)
            await asyncio.sleep(1.0)
            os.kill(proc.pid, signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0, err.decode()[-2000:]
        return srv

    srv = asyncio.run(asyncio.wait_for(go(), 90))
    s = open_session(out)
    r = s.manifest["recorder"]
    assert r["quarantined"] == 0 and not r["discarded"], r["discarded"]
    assert not any(r["book_faults"].values()), r["book_faults"]
    assert r["connects"] >= 2  # the drop (a loaded machine may add a watchdog reconnect)
    for ch in ("books", "books15", "books5", "books1"):  # every book channel came, and was taken
        assert sum(v["frames"] for k, v in r["received"].items() if k.startswith(f"{ch}:")) > 300, ch
    assert {g["reason"].split(":")[0] for g in r["gaps"]} == {"disconnect"}, r["gaps"]  # the drop alone
    sent = [orjson.loads(x.frame) for x in srv.log if x.kind == "data" and b'"trade"' in x.frame[:90]]
    snaps = [f for f in sent if f["action"] == "snapshot"]
    before = {d["tradeId"] for f in sent[: sent.index(snaps[0])] for d in f["data"]} if snaps else set()
    assert snaps and {d["tradeId"] for d in snaps[0]["data"]} & before  # the repeat happened
    assert sum(r["duplicate_trades"].values()) > 0
    t = s.read_table("trade")
    ids = list(zip(t.column("symbol").to_pylist(), t.column("trade_id").to_pylist(), strict=True))
    assert len(ids) == len(set(ids)) == r["events"]["Trade"]  # never twice
    src_ids = {(f["arg"]["instId"], d["tradeId"]) for f in map(orjson.loads, (x for _, x in src))
               if f["arg"]["channel"] == "trade" for d in f["data"]}  # fmt: skip
    assert set(ids) <= src_ids and len(ids) > 0.9 * len(src_ids)
    books = s.read_table("books15")
    assert books.num_rows > 300
    crossed = sum(b >= a for b, a in zip(books.column("bid_px_0").to_pylist(),
                                         books.column("ask_px_0").to_pylist(), strict=True))  # fmt: skip
    assert crossed == 0


@pytest.mark.parametrize("year", YEARS)
def test_the_bitget_v2_importer_takes_a_capture_of_every_year(year: str, tmp_path: Path) -> None:
    """A capture of the local venue in that year's layout (``<ts_recv_ns> <json>`` lines, every book
    channel and trades, a trade snapshot repeating trades among them) imports without a quarantine,
    each trade once."""
    from recorder.importers.bitget_v2_raw import import_bitget_v2_raw

    raw = _session(year, ("books", "books15", "books5", "books1", "trade"))
    data = [(r, orjson.loads(r)) for r in raw]
    data = [(r, f) for r, f in data if "data" in f]
    trades = [f for _, f in data if f["arg"]["channel"] == "trade"]
    repeat = {**trades[-1], "action": "snapshot", "data": [d for f in trades[-3:] for d in f["data"]][::-1]}
    data.append((orjson.dumps(repeat), repeat))
    lines = [f"{(int(f['ts']) + 5) * 1_000_000} ".encode() + r for r, f in data]
    cap = tmp_path / "cap.txt"
    cap.write_bytes(b"\n".join(lines) + b"\n")
    m = import_bitget_v2_raw(cap, tmp_path / "s")
    imp = m["import"]
    assert imp["discarded"] == {} and not any(imp["book_faults"].values()) and imp["gaps"] == 0
    assert set(imp["channels"]) == {"books", "books15", "books5", "books1", "trade"}
    assert sum(imp["duplicate_trades"].values()) == len(repeat["data"])
    t = open_session(tmp_path / "s").read_table("trade")
    n_ids = len({d["tradeId"] for f in trades for d in f["data"]})
    assert t.num_rows == len(set(t.column("trade_id").to_pylist())) == n_ids
