"""Bitget v2 private WebSocket: login, ``orders``/``fill``/``positions``, keepalive, reconnect.

One connection on the shared :class:`~wire.connection.ReconnectLoop` (backoff, keepalive ``ping``,
staleness watchdog, narrow reconnect policy). Each session: send the login (seconds timestamp from
the server-synced clock), wait for ``{"event":"login","code":"0"}``, subscribe, then read. Every
update is parsed by :mod:`wire.bitget.bitget_v2_private` and handed to ``on_item`` with its receive
time. After every (re)connection ``on_connected(n)`` runs (n = 1 for the first) alongside the reader:
the runner reconciles the engine with the exchange's REST view there, because pushes sent while we
were away are lost.

A refused login (wrong key, passphrase, signature or timestamp) is fatal: ``on_fatal`` is called and
the stream stops, since trading without order reports is not safe; so is a fatal connect error or
an error raised by ``on_item``/``on_connected`` (that one is raised again after ``on_fatal``).
Nothing sent on this socket (the login carries the passphrase) is ever logged or journaled, and
no message here carries the credentials.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection

from engine.events import Nanos
from wire.bitget.bitget_v2 import Control
from wire.bitget.bitget_v2_private import (
    PRIVATE_CHANNELS,
    FillUpdate,
    OrderUpdate,
    PositionsUpdate,
    PrivateQuarantined,
    login_message,
    parse_private,
    private_args,
)
from wire.bitget.bitget_v2_rest import Credentials
from wire.connection import ConnectionConfig, FatalConnectError, ReconnectLoop

log = logging.getLogger(__name__)
# The websockets library logs every frame at DEBUG, and the login frame carries the passphrase: this
# connection gets its own logger, capped at INFO whatever the root level (``dualhub -v``) says.
_WIRE_LOG = logging.getLogger(__name__ + ".wire")
_WIRE_LOG.setLevel(logging.INFO)


@dataclass(frozen=True, kw_only=True)
class PrivateConfig(ConnectionConfig):
    """The shared connection settings, with the private stream's own defaults: order reports matter
    more than market data, so it reconnects sooner and gives up on a silent socket later than the feed
    (Bitget pushes nothing on a quiet account; the keepalive ``pong`` is what keeps it alive)."""

    silence_limit_s: float = 40.0
    open_timeout_s: float = 5.0
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 10.0
    login_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        # A short silence limit (tests) needs a watchdog that looks often enough to honour it.
        object.__setattr__(self, "watchdog_tick_s", min(self.watchdog_tick_s, self.silence_limit_s / 4))
        super().__post_init__()


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
        self.connected = asyncio.Event()
        self.connects = 0
        self.disconnects = 0
        self.quarantined = 0
        self.errors: list[str] = []
        self.fatal = ""
        self.last_error = ""  # why it is not connected now: the last drop or failed connect
        self.loop = ReconnectLoop(
            config,
            login=self._login,
            subscribe=self._subscribe,
            handler=self._on_frame,
            on_connected=self._connected,
            on_disconnected=self._disconnected,
            on_connect_failed=self._connect_failed,
            rng=random.Random(seed),
            name="private WebSocket",
            logger=_WIRE_LOG,
        )

    def stop(self) -> None:
        self.loop.stop()

    async def run(self) -> None:
        try:
            await self.loop.run()
        except PrivateAuthError as e:
            self._give_up(str(e))
        except FatalConnectError as e:  # bad URL, 4xx on the upgrade: reported, not hidden
            self._give_up(f"private WebSocket: {e}")
        except Exception as e:
            self._give_up(f"private WebSocket: {type(e).__name__}: {e}"[:300])
            raise

    def _give_up(self, why: str) -> None:
        self.fatal = why
        self.connected.clear()
        self.on_fatal(why)

    # ---------------------------------------------------------------- the loop's callables

    def _connect_failed(self, e: BaseException, retry: bool) -> None:
        self.last_error = f"connect failed: {type(e).__name__}: {e}"[:200]

    async def _login(self, ws: ClientConnection) -> None:
        await ws.send(login_message(self._creds, self.server_s()), text=True)
        try:
            async with asyncio.timeout(
                self.cfg.login_timeout_s
            ):  # not wait_for: its 3.11 cancellation can hang
                while True:
                    for item in parse_private(await ws.recv(decode=False)):
                        if isinstance(item, Control) and item.kind in ("login", "error"):
                            if item.kind == "login" and item.code in (0, None):
                                return
                            raise PrivateAuthError(f"login refused: code {item.code} {item.msg}")
        except TimeoutError:
            raise PrivateAuthError("no login reply from the private WebSocket") from None

    async def _subscribe(self, ws: ClientConnection) -> None:
        await ws.send(orjson.dumps({"op": "subscribe", "args": private_args(self.channels)}), text=True)

    def _connected(self, n: int) -> Coroutine[Any, Any, None]:
        self.connects = n
        self.last_error = ""
        self.connected.set()
        return self.on_connected(n)

    def _disconnected(self, reason: str) -> None:
        self.connected.clear()
        if self.loop.stopping:
            return
        self.disconnects += 1
        if reason == "silence":
            self.last_error = f"silent for {self.cfg.silence_limit_s:.0f} s"
            log.warning("private WebSocket silent for %.0f s: reconnecting", self.cfg.silence_limit_s)
        else:
            self.last_error = f"connection closed ({reason})"

    def _on_frame(self, raw: bytes) -> None:
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
