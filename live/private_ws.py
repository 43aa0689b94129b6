"""Bitget v2 private WebSocket: login, ``orders``/``fill``/``positions``, keepalive, reconnect.

One connection, reconnecting until stopped (the ``websockets`` connect iterator with the recorder's
retry policy, plus our own backoff for drops). Each session: send the login (seconds timestamp from
the server-synced clock), wait for ``{"event":"login","code":"0"}``, subscribe, then read. Every
update is parsed by :mod:`engine.venues.bitget_v2_private` and handed to ``on_item`` with its receive
time. After every (re)connection ``on_connected(n)`` runs (n = 1 for the first): the runner reconciles
the engine with the exchange's REST view there, because pushes sent while we were away are lost.

A refused login (wrong key, passphrase, signature or timestamp) is fatal: ``on_fatal`` is called and
the stream stops, since trading without order reports is not safe. Keepalive is the text ``ping``
every ``ping_interval_s``; silence for ``silence_limit_s`` drops the connection. Nothing sent on this
socket (the login carries the passphrase) is ever logged or journaled.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any

import orjson
import websockets
from websockets.asyncio.client import ClientConnection, connect

from engine.events import Nanos
from engine.venues.bitget_v2 import Control
from engine.venues.bitget_v2_private import (
    PRIVATE_CHANNELS,
    FillUpdate,
    OrderUpdate,
    PositionsUpdate,
    PrivateQuarantined,
    login_message,
    parse_private,
    private_args,
)
from engine.venues.bitget_v2_rest import Credentials
from wire.connection import backoff_delays, retryable

log = logging.getLogger(__name__)
# The websockets library logs every frame at DEBUG, and the login frame carries the passphrase: this
# connection gets its own logger, capped at INFO whatever the root level (``dualhub -v``) says.
_WIRE_LOG = logging.getLogger(__name__ + ".wire")
_WIRE_LOG.setLevel(logging.INFO)


@dataclass(frozen=True, kw_only=True)
class PrivateConfig:
    url: str
    ping_interval_s: float = 25.0
    silence_limit_s: float = 40.0
    login_timeout_s: float = 5.0
    open_timeout_s: float = 5.0
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 10.0


class PrivateAuthError(Exception):
    """The venue refused our login; the message has its code and text, never the credentials."""


class PrivateStream:
    def __init__(
        self,
        config: PrivateConfig,
        credentials: Credentials,
        *,
        on_item: Callable[[OrderUpdate | FillUpdate | PositionsUpdate, Nanos], None],
        on_connected: Callable[[int], Coroutine[Any, Any, None]],
        on_fatal: Callable[[str], None],
        server_s: Callable[[], int],
        stamp: Callable[[], Nanos] = time.time_ns,
        channels: tuple[str, ...] = PRIVATE_CHANNELS,
        seed: int = 0,
    ) -> None:
        self.cfg = config
        self._creds = credentials
        self.on_item = on_item
        self.on_connected = on_connected
        self.on_fatal = on_fatal
        self.server_s = server_s
        self.stamp = stamp
        self.channels = channels
        self._rng = random.Random(seed)
        self._stopping = False
        self._ws: ClientConnection | None = None
        self.connected = asyncio.Event()
        self.connects = 0
        self.disconnects = 0
        self.quarantined = 0
        self.errors: list[str] = []
        self.fatal = ""
        self.last_error = ""  # why it is not connected now: the last drop or failed connect

    def _connect_delays(self) -> Generator[float, None, None]:
        yield from backoff_delays(
            self._rng, initial_s=self.cfg.backoff_initial_s, max_s=self.cfg.backoff_max_s
        )

    def stop(self) -> None:
        self._stopping = True
        if self._ws is not None:
            self._ws.transport.abort()

    async def run(self) -> None:
        delays = backoff_delays(self._rng, initial_s=self.cfg.backoff_initial_s, max_s=self.cfg.backoff_max_s)
        connector = connect(
            self.cfg.url,
            compression=None,
            ping_interval=None,
            proxy=None,
            open_timeout=self.cfg.open_timeout_s,
            process_exception=self._connect_failed,
            # failed connects back off on our schedule too (the library's starts at several seconds)
            reconnect_delays=self._connect_delays,
            logger=_WIRE_LOG,
        )
        try:
            async for ws in connector:
                if self._stopping:
                    await ws.close()
                    break
                opened = time.monotonic()
                try:
                    await self._session(ws)
                except PrivateAuthError as e:
                    self.fatal = str(e)
                    self.on_fatal(self.fatal)
                    return
                finally:
                    self.connected.clear()
                    self._ws = None
                    self.last_error = self.last_error or "connection closed"
                if self._stopping:
                    break
                self.disconnects += 1
                # A connection that lived a while reconnects at once; a flapping one backs off.
                if time.monotonic() - opened < 5.0:
                    await asyncio.sleep(next(delays))
                else:
                    delays = backoff_delays(
                        self._rng, initial_s=self.cfg.backoff_initial_s, max_s=self.cfg.backoff_max_s
                    )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a fatal connect error (bad URL, 4xx): reported, not hidden
            self.fatal = f"private WebSocket: {type(e).__name__}: {e}"[:300]
            self.on_fatal(self.fatal)

    def _connect_failed(self, e: Exception) -> Exception | None:
        self.last_error = f"connect failed: {type(e).__name__}: {e}"[:200]
        return None if retryable(e) else e

    async def _session(self, ws: ClientConnection) -> None:
        self._ws = ws
        try:
            await ws.send(login_message(self._creds, self.server_s()), text=True)
            await self._await_login(ws)
            await ws.send(orjson.dumps({"op": "subscribe", "args": private_args(self.channels)}), text=True)
        except websockets.ConnectionClosed:
            return  # dropped before we were in: reconnect
        self.connects += 1
        self.last_error = ""
        self.connected.set()
        pinger = asyncio.create_task(self._pinger(ws))
        reconcile = asyncio.create_task(self.on_connected(self.connects))
        try:
            await self._reader(ws)
        finally:
            pinger.cancel()
            await asyncio.gather(pinger, return_exceptions=True)
            if not reconcile.done():
                await asyncio.wait([reconcile], timeout=10)
            if reconcile.done() and not reconcile.cancelled() and reconcile.exception() is not None:
                self.errors.append(f"reconcile: {reconcile.exception()}")
            ws.transport.abort()

    async def _await_login(self, ws: ClientConnection) -> None:
        deadline = time.monotonic() + self.cfg.login_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PrivateAuthError("no login reply from the private WebSocket")
            try:
                async with asyncio.timeout(left):  # not wait_for: its 3.11 cancellation can hang
                    raw = await ws.recv(decode=False)
            except TimeoutError:
                raise PrivateAuthError("no login reply from the private WebSocket") from None
            for item in parse_private(raw):
                if isinstance(item, Control) and item.kind == "login":
                    if item.code in (0, None):
                        return
                    raise PrivateAuthError(f"login refused: code {item.code} {item.msg}")
                if isinstance(item, Control) and item.kind == "error":
                    raise PrivateAuthError(f"login refused: code {item.code} {item.msg}")

    async def _pinger(self, ws: ClientConnection) -> None:
        try:
            while True:
                await asyncio.sleep(self.cfg.ping_interval_s)
                await ws.send("ping")
        except websockets.ConnectionClosed:
            return

    async def _reader(self, ws: ClientConnection) -> None:
        while True:
            try:
                async with asyncio.timeout(self.cfg.silence_limit_s):
                    raw = await ws.recv(decode=False)
            except TimeoutError:
                log.warning("private WebSocket silent for %.0f s: reconnecting", self.cfg.silence_limit_s)
                self.last_error = f"silent for {self.cfg.silence_limit_s:.0f} s"
                return
            except websockets.ConnectionClosed:
                return
            ts = self.stamp()
            for item in parse_private(raw):
                if isinstance(item, Control):
                    if item.kind == "error":
                        self.errors.append(f"{item.code} {item.msg}"[:200])
                    continue
                if isinstance(item, PrivateQuarantined):
                    self.quarantined += 1
                    log.warning("private frame quarantined: %s", item.reason)
                    continue
                self.on_item(item, ts)


def describe(stream: PrivateStream | None) -> dict[str, Any]:
    if stream is None:
        return {}
    return {
        "connects": stream.connects,
        "disconnects": stream.disconnects,
        "quarantined": stream.quarantined,
        "errors": stream.errors[-20:],
        "fatal": stream.fatal,
    }
