"""The one reconnect loop (``wire.connection.ReconnectLoop``) under both streams: the private stream
against the local Bitget exchange (drop -> login again, resubscribe, reconnect hook), backoff against
a refused port and a flapping public server, and errors that must end the loop instead of looping.
A hand-made server appears only to inject a fault the local exchange cannot (pongs that never come).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from live.gateway import BitgetGateway
from live.private_ws import PrivateConfig, PrivateStream
from tests.helpers import make_book
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import BitgetServer, Fault, toy_frames
from wire.bitget.bitget_v2 import arg, subscribe_request
from wire.bitget.bitget_v2_private import OrderUpdate
from wire.bitget.bitget_v2_rest import Credentials, place_order_body
from wire.connection import Connection, ConnectionConfig, ReconnectLoop, SlidingWindow
from wire.journal import JournalWriter

CREDS = Credentials("local-key", "local-secret", "local-passphrase")
SECRETS = ("local-secret", "local-passphrase")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


async def until(cond: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def client_log(caplog: pytest.LogCaptureFixture) -> str:
    """Every log line of this process but the servers' own (they receive the login, we never log it)."""
    return "\n".join(
        f"{r.name} {r.getMessage()} {r.exc_text or ''}"
        for r in caplog.records
        if not r.name.startswith(("venue.", "websockets.server"))
    )


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def private_stream(ex: LocalExchange, gw: BitgetGateway | None, creds: Credentials = CREDS, **kw: Any) -> Any:
    items: list[Any] = []
    fatal: list[str] = []
    kw.setdefault("on_connected", lambda n: asyncio.sleep(0))
    stream = PrivateStream(
        PrivateConfig(url=ex.private_url, backoff_initial_s=0.02, backoff_max_s=0.1),
        creds,
        on_item=kw.pop("on_item", lambda item, ts: items.append(item)),
        on_fatal=fatal.append,
        server_s=(lambda: gw.now_ms() // 1000) if gw is not None else (lambda: time.time_ns() // 10**9),
        **kw,
    )
    return stream, items, fatal


# ---------------------------------------------------------------- the private stream


def test_private_stream_reconnects_logs_in_again_resubscribes_and_fires_the_hook(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with LocalExchangeThread(LocalExchange()) as ex:
        ex.apply_book(make_book(30000.0, 30000.1, ts=time.time_ns()))

        async def go() -> tuple[Any, ...]:
            gw = BitgetGateway(ex.rest_url, CREDS)
            await gw.sync_time()
            hooks: list[int] = []
            reconciled = asyncio.Event()

            async def on_connected(n: int) -> None:
                hooks.append(n)
                if n > 1:
                    await asyncio.sleep(0.05)  # the caller's REST reconciliation would run here
                    reconciled.set()

            stream, items, fatal = private_stream(ex, gw, on_connected=on_connected)
            task = asyncio.create_task(stream.run())
            await asyncio.wait_for(stream.connected.wait(), 5)
            assert ex.drop_private() == 1
            await asyncio.wait_for(reconciled.wait(), 5)
            await gw.place_order(
                place_order_body(
                    symbol="BTCUSDT",
                    side="buy",
                    order_type="limit",
                    size="0.010",
                    price="29000.0",
                    client_oid="after-reconnect",
                )
            )
            # the order's push arrives on the new socket: the orders channel was subscribed again
            await until(
                lambda: any(isinstance(i, OrderUpdate) and i.client_oid == "after-reconnect" for i in items)
            )
            stream.stop()
            await asyncio.wait_for(task, 5)
            await gw.aclose()
            return stream, items, fatal, hooks

        stream, items, fatal, hooks = run(go())
        assert ex.private_connections == 2 and ex.logins == 2
    assert hooks == [1, 2] and stream.connects == 2 and stream.disconnects == 1
    assert not fatal and not stream.fatal and not stream.connected.is_set()
    log_text = client_log(caplog)
    assert not any(s in log_text for s in SECRETS) and '"op":"login"' not in log_text  # not even the frame


def test_refused_login_is_fatal_once_and_names_no_secret(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    bad = Credentials("local-key", "wrong-secret-123", "wrong-passphrase-456")
    with LocalExchangeThread(LocalExchange()) as ex:

        async def go() -> tuple[Any, ...]:
            stream, _, fatal = private_stream(ex, None, bad)
            await asyncio.wait_for(stream.run(), 5)  # returns: a refused login is not retried
            return stream, fatal

        stream, fatal = run(go())
        assert ex.private_connections == 1 and ex.logins == 0
    assert fatal == [stream.fatal] and stream.fatal.startswith("login refused: code 30012")
    text = stream.fatal + client_log(caplog)
    assert not any(s in text for s in ("wrong-secret-123", "wrong-passphrase-456", *SECRETS))
    assert '"op":"login"' not in text


@pytest.mark.parametrize("where", ["on_item", "on_connected"])
def test_an_error_in_a_private_callable_propagates_instead_of_looping(where: str) -> None:
    def boom(*_: Any) -> None:
        raise RuntimeError(f"planted bug in {where}")

    async def failing_hook(n: int) -> None:
        boom()

    with LocalExchangeThread(LocalExchange()) as ex:

        async def go() -> tuple[Any, ...]:
            kw = {"on_item": boom} if where == "on_item" else {"on_connected": failing_hook}
            stream, _, fatal = private_stream(ex, None, **kw)
            with pytest.raises(RuntimeError, match="planted bug"):
                await asyncio.wait_for(stream.run(), 5)  # on_item: the positions snapshot after subscribe
            return stream, fatal

        stream, fatal = run(go())
        assert ex.private_connections == 1
    assert fatal == [stream.fatal] and "planted bug" in stream.fatal and not stream.connected.is_set()


def test_private_stream_drops_a_socket_whose_pongs_stop_and_logs_in_again(caplog) -> None:
    """Fault injection: a server that logs us in and acks, then never answers ``ping``."""
    caplog.set_level(logging.INFO)
    logins: list[int] = []

    async def mute(ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for msg in ws:
                req = orjson.loads(msg) if msg != "ping" else {}
                if req.get("op") == "login":
                    logins.append(1)
                    await ws.send('{"event":"login","code":"0","msg":""}')

    async def go() -> tuple[Any, ...]:
        async with serve(mute, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            hooks: list[int] = []

            async def on_connected(n: int) -> None:
                hooks.append(n)

            stream = PrivateStream(
                PrivateConfig(
                    url=f"ws://127.0.0.1:{port}/",
                    ping_interval_s=0.05,
                    pong_timeout_s=0.1,
                    silence_limit_s=5.0,
                    backoff_initial_s=0.01,
                    backoff_max_s=0.05,
                ),
                CREDS,
                on_item=lambda item, ts: None,
                on_connected=on_connected,
                on_fatal=lambda why: None,
                server_s=lambda: time.time_ns() // 10**9,
            )
            task = asyncio.create_task(stream.run())
            await until(lambda: len(hooks) >= 3)
            stream.stop()
            await asyncio.wait_for(task, 5)
            return stream, hooks

    stream, hooks = run(go())
    assert hooks[:3] == [1, 2, 3] and len(logins) >= 3 and stream.disconnects >= 2
    drops = [r.getMessage() for r in caplog.records if "dropping connection" in r.getMessage()]
    assert drops[:2] == ["private WebSocket: dropping connection: pong_timeout"] * 2 and not stream.fatal


# ---------------------------------------------------------------- backoff


async def _waits_against_refused_port(seed: int, n: int) -> list[float]:
    waits: list[float] = []
    cfg = ConnectionConfig(
        url=f"ws://127.0.0.1:{free_port()}/", backoff_initial_s=0.01, backoff_max_s=0.04, open_timeout_s=1.0
    )
    failed: list[bool] = []
    loop = ReconnectLoop(
        cfg,
        subscribe=lambda ws: asyncio.sleep(0),
        handler=lambda raw: None,
        on_connect_failed=lambda exc, retry: failed.append(retry),
        on_wait=waits.append,
        rng=random.Random(seed),
    )
    task = asyncio.create_task(loop.run())
    await until(lambda: len(waits) >= n)
    loop.stop()  # also ends a backoff wait in progress
    await asyncio.wait_for(task, 1)
    assert failed and all(failed) and loop.connects == 0
    return waits[:n]


def test_connect_backoff_is_jittered_exponential_and_bounded() -> None:
    a = run(_waits_against_refused_port(1, 8))
    b = run(_waits_against_refused_port(2, 8))
    caps = [0.01, 0.02, 0.04, 0.04, 0.04, 0.04, 0.04, 0.04]
    for waits in (a, b):
        assert all(c / 2 <= w <= c for w, c in zip(waits, caps, strict=True)), waits
    assert len(set(a)) == 8 and a != b  # jitter: no two equal, and the seed decides them


def test_a_flapping_connection_backs_off_and_a_stable_one_reconnects_at_once() -> None:
    async def go(min_stable_s: float) -> tuple[list[float], int]:
        frames = toy_frames(("BTCUSDT",), n=2000, interval_ms=10)
        async with BitgetServer(frames, speed=1, faults=[Fault(kind="drop", at_frame=3, conn=None)]) as srv:
            cfg = ConnectionConfig(
                url=srv.url, backoff_initial_s=0.01, backoff_max_s=0.03, min_stable_s=min_stable_s
            )
            waits: list[float] = []
            reasons: list[str] = []
            loop = ReconnectLoop(
                cfg,
                subscribe=lambda ws: ws.send(subscribe_request([arg("trade", "BTCUSDT")])),
                handler=lambda raw: None,
                on_disconnected=reasons.append,
                on_wait=waits.append,
                rng=random.Random(0),
            )
            task = asyncio.create_task(loop.run())
            await until(lambda: loop.connects >= 5)
            loop.stop()
            await asyncio.wait_for(task, 2)
            assert reasons[:4] == ["connection_lost"] * 4 and reasons[-1] == "stop"
            return waits, srv.connections

    waits, conns = run(go(min_stable_s=30.0))
    assert len(waits) >= 4 and all(0.005 <= w <= 0.03 for w in waits) and conns >= 5
    waits, conns = run(go(min_stable_s=0.0))
    assert waits == [] and conns >= 5


# ---------------------------------------------------------------- the public stream


def test_a_bug_in_the_public_handler_propagates_and_is_reported(tmp_path: Path) -> None:
    class Buggy(Connection):
        def _inspect(self, raw: bytes, ts: int) -> None:
            if b'"action"' in raw:
                raise ValueError("planted handler bug")
            super()._inspect(raw, ts)

    async def go() -> tuple[Any, ...]:
        async with BitgetServer(toy_frames(("BTCUSDT",), n=50), speed=20) as srv:
            journal = JournalWriter(tmp_path / "j")
            cfg = ConnectionConfig(url=srv.url, backoff_initial_s=0.01, min_stable_s=0.0)
            conn = Buggy(
                0,
                [arg("trade", "BTCUSDT")],
                journal,
                cfg,
                rng=random.Random(0),
                attempts=SlidingWindow(300, 300),
            )
            with pytest.raises(ValueError, match="planted handler bug"):
                await asyncio.wait_for(conn.run(), 5)
            journal.close()
            return conn, srv.connections

    conn, conns = run(go())
    assert conns == 1 and conn.stats.connects == 1 and conn.stats.disconnects == 1
    assert conn.stats.fatal == "ValueError: planted handler bug" and not conn.stats.up


def test_a_dead_watchdog_ends_the_session_with_its_error() -> None:
    """The silence watchdog (here: its per-tick hook) raises: the socket would be unwatched, so the loop
    drops it and raises that error instead of reading on."""
    ticks: list[int] = []

    def bad_tick() -> None:
        ticks.append(1)
        if len(ticks) == 3:
            raise RuntimeError("planted watchdog bug")

    async def go() -> tuple[list[str], int, int]:
        async with BitgetServer(toy_frames(("BTCUSDT",), n=5000, interval_ms=10), speed=1) as srv:
            cfg = ConnectionConfig(url=srv.url, watchdog_tick_s=0.02, backoff_initial_s=0.01)
            reasons: list[str] = []
            frames: list[int] = []
            loop = ReconnectLoop(
                cfg,
                subscribe=lambda ws: ws.send(subscribe_request([arg("trade", "BTCUSDT")])),
                handler=lambda raw: frames.append(1),
                on_disconnected=reasons.append,
                on_tick=bad_tick,
                rng=random.Random(0),
            )
            with pytest.raises(RuntimeError, match="planted watchdog bug"):
                await asyncio.wait_for(loop.run(), 5)
            return reasons, loop.connects, srv.connections

    reasons, connects, conns = run(go())
    assert reasons == ["watchdog failed"] and connects == 1 and conns == 1 and len(ticks) == 3


def test_private_config_is_the_connection_config_with_the_private_defaults() -> None:
    base = ConnectionConfig(url="ws://x/")
    cfg = PrivateConfig(url="ws://x/", ping_interval_s=5.0)
    assert isinstance(cfg, ConnectionConfig) and cfg.login_timeout_s == 5.0
    private = {
        "silence_limit_s": 40.0,
        "open_timeout_s": 5.0,
        "backoff_initial_s": 0.25,
        "backoff_max_s": 10.0,
    }
    for name, value in private.items():
        assert getattr(cfg, name) == value != getattr(base, name)
    assert (cfg.ping_interval_s, cfg.max_connect_attempts) == (5.0, base.max_connect_attempts)
    assert cfg.watchdog_tick_s == 0.5 and PrivateConfig(url="", silence_limit_s=1.0).watchdog_tick_s == 0.25
    with pytest.raises(ValueError, match="silence_limit_s"):
        PrivateConfig(url="", silence_limit_s=0.0)
