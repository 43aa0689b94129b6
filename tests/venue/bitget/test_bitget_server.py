"""The local Bitget v2 protocol server: protocol, derived ``books``, every fault, its own limits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
import websockets
from websockets.asyncio.client import connect

from engine.events import BookSnapshot, Trade
from engine.store import SessionWriter
from venue.bitget.public_server import BitgetServer, Fault, session_frames, simulator_frames, toy_frames
from wire.bitget.bitget_v2 import StreamCounters, arg, decode, subscribe_request
from wire.bitget.bitget_v2_books import BookFault, BooksState, decode_with_books

SYMS = ("BTCUSDT", "ETHUSDT")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


async def _client(url: str) -> Any:
    return await connect(url, compression=None, ping_interval=None, proxy=None, close_timeout=0.5)


async def _collect(ws: Any, seconds: float, until: Any = None) -> list[bytes]:
    out: list[bytes] = []
    end = time.monotonic() + seconds
    try:
        while (left := end - time.monotonic()) > 0:
            m = await asyncio.wait_for(ws.recv(decode=False), left)
            out.append(m)
            if until is not None and until(out):
                break
    except (TimeoutError, websockets.ConnectionClosed):
        pass
    return out


def _events(frames: Sequence[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(f) for f in frames if f.startswith(b'{"event"') or f.startswith(b'{"op"')]


def _data(frames: Sequence[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(f) for f in frames if f.startswith(b'{"action"')]


# ---------------------------------------------------------------- protocol


def test_subscribe_acks_errors_ping_and_unsubscribe() -> None:
    async def go() -> None:
        async with BitgetServer(toy_frames(SYMS, n=40), speed=50, symbols=SYMS) as srv:
            ws = await _client(srv.url)
            await ws.send(
                subscribe_request(
                    [
                        arg("books15", "BTCUSDT"),
                        arg("trade", "BTCUSDT"),
                        arg("books50", "BTCUSDT"),  # 30016, code a number
                        arg("books", "NOPEUSDT"),  # 30001, code a number
                    ]
                )
            )
            await ws.send("ping")
            await ws.send('{"op":"ping"}')  # 30002 [probe]
            await ws.send("hello")  # not JSON: 30002 as a string
            await ws.send('{"op":"login","args":[]}')  # 30003 as a string
            got = await _collect(ws, 0.6)
            ev = _events(got)
            acks = [e["arg"]["channel"] for e in ev if e.get("event") == "subscribe"]
            assert acks == ["books15", "trade"]
            errs = [(e.get("arg", {}).get("channel"), e["code"]) for e in ev if e.get("event") == "error"]
            assert errs == [
                ("books50", 30016),
                ("books", 30001),
                (None, 30002),
                (None, "30002"),
                (None, "30003"),
            ]
            assert b"pong" in got
            data = _data(got)
            assert {(d["arg"]["channel"], d["arg"]["instId"]) for d in data} == {
                ("books15", "BTCUSDT"),
                ("trade", "BTCUSDT"),
            }
            # decoded by the shared codec without a single quarantine
            c = StreamCounters()
            evs = [e for f in got for e in decode(f, 0, c)]
            assert all(type(e).__name__ in ("BookSnapshot", "Trade", "Control") for e in evs)
            await ws.send(subscribe_request([arg("books15", "BTCUSDT")], op="unsubscribe"))
            got = await _collect(ws, 0.3, until=lambda o: any(b'"unsubscribe"' in x for x in o))
            assert orjson.loads(got[-1]) == {"event": "unsubscribe", "arg": arg("books15", "BTCUSDT")}
            after = await _collect(ws, 0.3)
            assert not any(b'"books15"' in f for f in after)
            await ws.close()
        assert srv.connections == 1

    run(go())


def test_unsubscribe_op_style_ack_and_wrong_inst_type_is_silent() -> None:
    async def go() -> None:
        async with BitgetServer(toy_frames(SYMS, n=30), speed=50, unsubscribe_ack="op") as srv:
            ws = await _client(srv.url)
            await ws.send(
                subscribe_request([arg("books15", "BTCUSDT", "COIN-FUTURES"), arg("trade", "ETHUSDT")])
            )
            got = await _collect(ws, 0.4)
            acks = [e["arg"] for e in _events(got) if e.get("event") == "subscribe"]
            assert acks == [arg("books15", "BTCUSDT", "COIN-FUTURES"), arg("trade", "ETHUSDT")]
            assert not any(
                b"COIN-FUTURES" in f for f in got if f.startswith(b'{"action"')
            )  # acked, never data
            assert any(b'"trade"' in f for f in got if f.startswith(b'{"action"'))
            await ws.send(subscribe_request([arg("trade", "ETHUSDT")], op="unsubscribe"))
            got = await _collect(ws, 0.3, until=lambda o: any(b'"op"' in x for x in o))
            assert orjson.loads(got[-1]) == {"op": "unsubscribe", "args": [arg("trade", "ETHUSDT")]}
            await ws.close()

    run(go())


def test_books_channel_snapshot_updates_seq_and_checksum() -> None:
    async def go() -> None:
        # the latest layout (seq, pseq) with a checksum forced on, to check both at once
        async with BitgetServer(toy_frames(SYMS, n=3000), speed=100, books_checksum=True) as srv:
            ws = await _client(srv.url)
            await ws.send(subscribe_request([arg("books", "ETHUSDT"), arg("books1", "BTCUSDT")]))
            seen = [0]

            def enough(frames: list[bytes]) -> bool:  # 31 books frames, however slow the machine
                last = frames[-1]
                if last.startswith(b'{"action"') and orjson.loads(last)["arg"]["channel"] == "books":
                    seen[0] += 1
                return seen[0] > 30

            got = await _collect(ws, 20.0, until=enough)
            books = [d for d in _data(got) if d["arg"]["channel"] == "books"]
            assert books[0]["action"] == "snapshot" and books[0]["data"][0]["pseq"] == 0
            assert all(b["action"] == "update" for b in books[1:]) and len(books) > 30
            for prev, cur in zip(books, books[1:], strict=False):
                assert cur["data"][0]["pseq"] == prev["data"][0]["seq"]
            st, c = BooksState(), StreamCounters()
            for f in got:
                out = decode_with_books(f, 0, c, st)
                assert not any(isinstance(e, BookFault) for e in out)
            assert st.checksums_verified == len(books) - 1
            one = [d for d in _data(got) if d["arg"]["channel"] == "books1"]
            assert one and all(len(d["data"][0]["bids"]) == 1 for d in one)
            # resubscribing gives a fresh snapshot
            await ws.send(subscribe_request([arg("books", "ETHUSDT")], op="unsubscribe"))
            await ws.send(subscribe_request([arg("books", "ETHUSDT")]))

            def after_ack(frames: list[bytes]) -> list[dict[str, Any]]:
                ack = [i for i, f in enumerate(frames) if f.startswith(b'{"event":"subscribe"')]
                return [d for d in _data(frames[ack[0] :]) if d["arg"]["channel"] == "books"] if ack else []

            # until the new subscription's first books frame: on a loaded machine the frames already
            # queued for the first one can hold its ack back for a while
            again = after_ack(await _collect(ws, 10.0, until=after_ack))
            assert again and again[0]["action"] == "snapshot"
            await ws.close()

    run(go())


def test_sent_log_matches_what_the_client_received() -> None:
    async def go() -> None:
        async with BitgetServer(toy_frames(SYMS, n=50), speed=0) as srv:
            ws = await _client(srv.url)
            await ws.send(
                subscribe_request([arg(ch, s) for s in SYMS for ch in ("books15", "trade", "books")])
            )
            got = await _collect(ws, 3.0, until=lambda o: srv.finished.is_set() and len(o) >= srv.sent_count)
            await ws.close()
        assert srv.finished.is_set()
        assert [s.frame for s in srv.log] == got
        assert (
            len(srv.data_frames()) == 50 * 2 * 2 + 25 * 2
        )  # books15 + books per symbol, trades every 2nd step

    run(go())


# ---------------------------------------------------------------- faults


def test_fault_drop_closes_abnormally() -> None:
    async def go() -> None:
        async with BitgetServer(
            toy_frames(SYMS, n=100), speed=100, faults=[Fault(kind="drop", at_frame=10)]
        ) as srv:
            ws = await _client(srv.url)
            await ws.send(subscribe_request([arg("books15", "BTCUSDT")]))
            got = await _collect(ws, 2.0)
            assert len(_data(got)) == 10
            assert ws.protocol.close_rcvd is None  # no close frame: an abrupt drop (1006)
            ws2 = await _client(srv.url)  # the fault was for connection 0 only
            await ws2.send(subscribe_request([arg("books15", "BTCUSDT")]))
            assert len(_data(await _collect(ws2, 0.5))) > 10
            await ws2.close()

    run(go())


def test_fault_close_with_code() -> None:
    async def go() -> None:
        f = Fault(kind="close", at_frame=3, close_code=4001)
        async with BitgetServer(toy_frames(SYMS, n=50), speed=100, faults=[f]) as srv:
            ws = await _client(srv.url)
            await ws.send(subscribe_request([arg("books15", "BTCUSDT")]))
            await _collect(ws, 1.0)
            assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 4001

    run(go())


def test_fault_stall_keeps_socket_open_and_silent() -> None:
    async def go() -> None:
        f = Fault(kind="stall", at_frame=5, duration_s=1.2)
        async with BitgetServer(toy_frames(SYMS, n=2000), speed=50, faults=[f]) as srv:
            ws = await _client(srv.url)
            await ws.send(subscribe_request([arg("books15", "BTCUSDT")]))
            first = await _collect(ws, 0.5)
            assert len(_data(first)) == 5
            await ws.send("ping")
            during = await _collect(ws, 0.3)
            assert during == []  # no data, no pong, but not closed
            assert ws.protocol.close_rcvd is None and ws.state.name == "OPEN"
            after = await _collect(ws, 1.0)
            assert len(_data(after)) > 3  # resumes after the stall
            assert any(w.reason == "stall" for w in srv.withheld)
            await ws.close()

    run(go())


def test_fault_no_pong_keeps_streaming() -> None:
    async def go() -> None:
        async with BitgetServer(
            toy_frames(SYMS, n=200), speed=50, faults=[Fault(kind="no_pong", at_frame=2)]
        ) as srv:
            ws = await _client(srv.url)
            await ws.send(subscribe_request([arg("books15", "BTCUSDT")]))
            await _collect(ws, 0.3)
            await ws.send("ping")
            got = await _collect(ws, 0.4)
            assert b"pong" not in got and len(_data(got)) > 3
            await ws.close()

    run(go())


def test_fault_garbage_truncated_and_error_event() -> None:
    async def go() -> None:
        faults = [
            Fault(kind="garbage", at_frame=2, count=2),
            Fault(kind="truncated", at_frame=4),
            Fault(kind="error_event", at_frame=6, code="30016"),
            Fault(kind="error_event", at_frame=7, code=30001),
        ]
        async with BitgetServer(toy_frames(SYMS, n=40), speed=100, faults=faults) as srv:
            ws = await _client(srv.url)
            await ws.send(subscribe_request([arg("books15", "BTCUSDT")]))
            got = await _collect(ws, 0.6)
            await ws.close()
        kinds = [s.kind for s in srv.log]
        assert kinds.count("garbage") == 2 and kinds.count("truncated") == 1
        c = StreamCounters()
        reasons = [e.reason for f in got for e in decode(f, 0, c) if type(e).__name__ == "Quarantined"]
        assert len(reasons) == 3 and all(r.startswith("not JSON") for r in reasons)
        codes = [e["code"] for e in _events(got) if e.get("event") == "error"]
        assert codes == ["30016", 30001]  # a string and a number, both as sent

    run(go())


def test_fault_skip_seq_and_bad_checksum_on_books() -> None:
    async def go() -> None:
        faults = [Fault(kind="skip_seq", at_frame=5), Fault(kind="bad_checksum", at_frame=15)]
        async with BitgetServer(toy_frames(SYMS, n=40), speed=100, faults=faults) as srv:
            ws = await _client(srv.url)
            await ws.send(subscribe_request([arg("books", "BTCUSDT")]))
            got = await _collect(ws, 0.5)
            await ws.close()
        st, c = BooksState(), StreamCounters()
        faults_seen = []
        for f in got:
            for e in decode_with_books(f, 0, c, st):
                if isinstance(e, BookFault):
                    faults_seen.append(e.reason)
                    # as a recorder would after a resubscribe: start over from a snapshot
        assert faults_seen[0] == "seq_gap"
        assert [w.reason for w in srv.withheld] == ["skip_seq"]

        # bad checksum alone (skip disabled): the checksum is off by one on exactly one update
        async with BitgetServer(toy_frames(SYMS, n=40), speed=100, faults=[faults[1]]) as srv:
            ws = await _client(srv.url)
            await ws.send(subscribe_request([arg("books", "BTCUSDT")]))
            got = await _collect(ws, 0.5)
            await ws.close()
        st, c = BooksState(), StreamCounters()
        seen = [e.reason for f in got for e in decode_with_books(f, 0, c, st) if isinstance(e, BookFault)]
        assert seen[0] == "checksum"

    run(go())


def test_rate_limit_30006_then_30007_and_close() -> None:
    async def go() -> None:
        async with BitgetServer(toy_frames(SYMS, n=50), speed=10, max_client_msgs_per_s=10) as srv:
            ws = await _client(srv.url)
            for _ in range(11):
                await ws.send("ping")
            got = await _collect(ws, 1.0)
            codes = [e["code"] for e in _events(got) if e.get("event") == "error"]
            assert codes == [30006, "30007"]
            assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 4000
            assert srv.rate_limited == 1
            # ten a second is fine
            ws = await _client(srv.url)
            for _ in range(10):
                await ws.send("ping")
            got = await _collect(ws, 0.3)
            assert got.count(b"pong") == 10
            await ws.close()

    run(go())


def test_no_ping_for_too_long_disconnects() -> None:
    async def go() -> None:
        async with BitgetServer(toy_frames(SYMS, n=500), speed=20, ping_required_s=0.4) as srv:
            ws = await _client(srv.url)
            await ws.send(subscribe_request([arg("books15", "BTCUSDT")]))
            t = time.monotonic()
            await _collect(ws, 3.0)
            assert 0.3 < time.monotonic() - t < 2.0

    run(go())


def test_fault_parse() -> None:
    assert Fault.parse("drop@200") == Fault(kind="drop", at_frame=200)
    assert Fault.parse("stall@5:conn=all:duration=1.5") == Fault(
        kind="stall", at_frame=5, conn=None, duration_s=1.5
    )
    assert Fault.parse("error_event@3:code=30001").code == 30001
    assert Fault.parse("error_event@3:code=x30").code == "x30"
    with pytest.raises(ValueError):
        Fault.parse("explode@1")


# ---------------------------------------------------------------- sources


def test_session_source_round_trips_through_the_codec(tmp_path: Any) -> None:
    c = StreamCounters()
    events = [e for _, f in toy_frames(SYMS, n=30) for e in decode(f, 1_000 + len(f), c)]
    # give each frame its own receive time so frames regroup exactly
    c = StreamCounters()
    events = []
    for i, (_, f) in enumerate(toy_frames(SYMS, n=30)):
        events.extend(decode(f, 1_000_000 * (i + 1), c))
    w = SessionWriter(tmp_path / "s", source="test", symbols=SYMS)
    w.add_all(events)
    w.close()
    frames = session_frames(tmp_path / "s")
    c2 = StreamCounters()
    again = [e for ts, f in frames for e in decode(f, ts, c2)]
    strip = [
        (
            type(e).__name__,
            e.symbol,
            e.ts_event,
            e.ts_recv,
            getattr(e, "px", None),
            getattr(e, "bid_px", None),
            getattr(e, "ask_sz", None),
        )
        for e in events
    ]
    strip2 = [
        (
            type(e).__name__,
            e.symbol,
            e.ts_event,
            e.ts_recv,
            getattr(e, "px", None),
            getattr(e, "bid_px", None),
            getattr(e, "ask_sz", None),
        )
        for e in again
    ]
    assert strip2 == strip
    assert sum(isinstance(e, BookSnapshot) for e in again) == 60
    assert sum(isinstance(e, Trade) for e in again) == 30


def test_simulator_source_streams() -> None:
    async def go() -> None:
        src = simulator_frames(["BTCUSDT"], minutes=0.2, seed=3)
        async with BitgetServer(src, speed=0, wire_year="2025") as srv:  # books15 verbatim, checksums
            ws = await _client(srv.url)
            await ws.send(
                subscribe_request(
                    [arg("books15", "BTCUSDT"), arg("trade", "BTCUSDT"), arg("books", "BTCUSDT")]
                )
            )
            got = await _collect(ws, 5.0, until=lambda o: srv.finished.is_set() and len(o) >= srv.sent_count)
            await ws.close()
        st, c = BooksState(), StreamCounters()
        out = [e for f in got for e in decode_with_books(f, 0, c, st)]
        assert not any(isinstance(e, BookFault) or type(e).__name__ == "Quarantined" for e in out)
        assert sum(isinstance(e, Trade) for e in out) > 10 and st.checksums_verified > 50

    run(go())


def test_simulator_source_serves_each_symbol_to_its_subscribers() -> None:
    """Several simulated symbols on one feed: a connection gets exactly the symbols it subscribed to,
    ETHUSDT's derived ``books`` (two-decimal prices) checksum-verified."""
    src = list(simulator_frames(SYMS, minutes=0.2, seed=3))
    want = [raw for _, raw in src if b'"instId":"ETHUSDT"' in raw]
    assert 0 < len(want) < len(src)

    async def go() -> tuple[list[bytes], list[bytes]]:
        async with BitgetServer(src, speed=0, wire_year="2025") as srv:
            eth, btc = await _client(srv.url), await _client(srv.url)
            await eth.send(subscribe_request([arg(c, "ETHUSDT") for c in ("books15", "trade", "books")]))
            await btc.send(subscribe_request([arg("books15", "BTCUSDT")]))
            got_eth = await _collect(eth, 8.0, until=lambda o: srv.finished.is_set())
            got_eth += await _collect(eth, 0.5)  # what was in flight when the feed ended
            got_btc = await _collect(btc, 1.0)
            return got_eth, got_btc

    got_eth, got_btc = run(go())
    eth_data = _data(got_eth)
    assert {d["arg"]["instId"] for d in eth_data} == {"ETHUSDT"}
    pushed = [f for f in got_eth if f.startswith(b'{"action"') and b'"channel":"books"' not in f[:90]]
    assert pushed == want
    st, c = BooksState(), StreamCounters()
    out = [e for f in got_eth for e in decode_with_books(f, 0, c, st)]
    assert not any(isinstance(e, BookFault) or type(e).__name__ == "Quarantined" for e in out)
    assert st.checksums_verified > 50
    assert {d["arg"]["instId"] for d in _data(got_btc)} == {"BTCUSDT"}
    assert all(d["arg"]["channel"] == "books15" for d in _data(got_btc))
