"""The local Bitget server's wire facts this slice pins: error 30001's message as captured, the trade
snapshot after a subscribe (newest first, then updates), both fixed-depth layouts."""

from __future__ import annotations

import asyncio

import orjson
import websockets

from engine.venues.bitget_v2 import arg, subscribe_request
from venue.bitget.public_server import BitgetServer, toy_frames


async def _session(srv_kw: dict, args: list, n_frames: int) -> list[dict]:
    async with BitgetServer(toy_frames(("BTCUSDT",), n=40), speed=0, **srv_kw) as srv:
        async with websockets.connect(srv.url, close_timeout=0.2) as ws:
            await ws.send(subscribe_request(args))
            out = []
            for _ in range(n_frames):
                out.append(orjson.loads(await asyncio.wait_for(ws.recv(), 5)))
            return out


def test_30001_message_ends_with_precision_null() -> None:
    got = asyncio.run(_session({"symbols": {"BTCUSDT"}}, [arg("books15", "NOPEUSDT")], 1))
    assert got[0]["code"] == 30001
    assert (
        got[0]["msg"] == "instType:USDT-FUTURES,channel:books15,instId:NOPEUSDT,precision:null doesn't exist"
    )


def test_trade_snapshot_first_then_updates_and_the_2026_layout() -> None:
    async def go() -> tuple[list[dict], list[dict]]:
        async with BitgetServer(
            toy_frames(("BTCUSDT",), n=40), speed=0, trade_snapshot=5, book_variant="2026"
        ) as srv:
            async with websockets.connect(
                srv.url, close_timeout=0.2
            ) as ws:  # a first client makes the feed run
                await ws.send(subscribe_request([arg("books15", "BTCUSDT"), arg("trade", "BTCUSDT")]))
                first = [orjson.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(30)]
            async with websockets.connect(
                srv.url, close_timeout=0.2
            ) as ws:  # a later one gets the recent trades first
                await ws.send(subscribe_request([arg("trade", "BTCUSDT")]))
                second = [orjson.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(2)]
            return first, second

    first, second = asyncio.run(go())
    books = [f for f in first if f.get("arg", {}).get("channel") == "books15" and "data" in f]
    assert list(books[0]["data"][0]) == ["asks", "bids", "ts", "seq", "pseq"]
    assert [b["data"][0]["pseq"] for b in books[1:3]] == [b["data"][0]["seq"] for b in books[0:2]]
    ack, snap = second
    assert ack["event"] == "subscribe" and snap["action"] == "snapshot" and len(snap["data"]) == 5
    ts = [int(d["ts"]) for d in snap["data"]]
    assert ts == sorted(ts, reverse=True)  # newest first
