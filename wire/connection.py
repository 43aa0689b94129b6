"""Bitget v2 WebSockets that survive the network: one reconnect loop for every stream, and the public
market-data connection built on it.

* :class:`ReconnectLoop` (as cryptofeed's ``ConnectionHandler``): one loop with injected ``login``,
  ``subscribe``, ``handler`` and ``on_connected``/``on_disconnected`` callables, used by the public
  :class:`Connection` here and the private stream (``live/private_ws.py``). Pure retry policy
  :func:`retryable`, jittered exponential backoff :func:`backoff_delays` (seeded ``random.Random``);
  a dropped connection reconnects at once unless it lived less than ``min_stable_s``. Every attempt
  counts against Bitget's 300 connection attempts per 5 minutes (:class:`SlidingWindow`).
* Keepalive is Bitget's text ``ping`` every ``ping_interval_s`` (protocol pings are off); ``pong``
  is checked before any JSON parsing. A monotonic-clock watchdog drops the connection when nothing
  at all arrives for ``silence_limit_s`` or a ``pong`` is ``pong_timeout_s`` late.
* Raw first: every received frame goes to the journal with its receive time before it is looked at.
* Our own sends are rate limited (``max_msgs_per_s`` per sliding ``send_window_s``), subscribe args
  are split into requests of at most 4096 bytes, and every disconnect opens a gap (journal ``META``
  ``gap_open``) for each subscribed arg, closed by the arg's next subscribe ack (``gap_close``).
* ``books``: the local book is applied live (``seq``/``pseq`` and the checksum where present); a
  broken book opens a gap and resubscribes that arg (unsubscribe + subscribe -> a fresh snapshot).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import orjson
import websockets
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from wire.bitget.bitget_v2 import PONG, subscribe_request
from wire.bitget.bitget_v2_books import BookError, BooksState
from wire.journal import JournalWriter

log = logging.getLogger(__name__)

MAX_SUBSCRIBE_ARGS_BYTES: Final = 4096
MAX_CHANNELS_PER_CONNECTION: Final = 50
REJECTING_CODES: Final = frozenset({30001, 30016})  # the arg itself is wrong: do not resubscribe it

ArgKey = tuple[str, str]  # (channel, instId)


# ---------------------------------------------------------------- pure policy pieces


def retryable(exc: BaseException) -> bool:
    """True if a failed connect is worth retrying (network trouble, 5xx, 429); False if fatal."""
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        return status >= 500 or status in (408, 429)
    if isinstance(exc, InvalidURI):
        return False
    if isinstance(exc, ssl.SSLCertVerificationError):
        return False
    if isinstance(exc, OSError | EOFError | TimeoutError | asyncio.TimeoutError):
        return True
    if isinstance(exc, websockets.ConnectionClosed | InvalidHandshake):
        return True  # InvalidMessage (peer hung up during the handshake), bad headers from a proxy
    return False


def backoff_delays(
    rng: random.Random, *, initial_s: float = 1.0, max_s: float = 60.0, factor: float = 2.0
) -> Iterator[float]:
    """Exponential backoff with "equal jitter": the k-th delay is uniform in [d/2, d], d = initial * factor^k
    (capped at ``max_s``). Seeded by the caller's ``rng``, so a run's delays are reproducible."""
    d = initial_s
    while True:
        yield rng.uniform(d / 2, d)
        d = min(max_s, d * factor)


class SlidingWindow:
    """At most ``limit`` events in any ``window_s``; pure (the caller passes the time)."""

    def __init__(self, limit: int, window_s: float) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError(f"limit {limit} and window_s {window_s} must be positive")
        self.limit = limit
        self.window_s = window_s
        self._times: deque[float] = deque()

    def wait_s(self, now_s: float) -> float:
        """Seconds to wait before one more event is allowed at ``now_s``."""
        while self._times and now_s - self._times[0] >= self.window_s:
            self._times.popleft()
        if len(self._times) < self.limit:
            return 0.0
        return self._times[0] + self.window_s - now_s

    def record(self, now_s: float) -> None:
        self._times.append(now_s)

    async def acquire(self, clock: Callable[[], float] = time.monotonic) -> None:
        while (w := self.wait_s(clock())) > 0:
            await asyncio.sleep(w)
        self.record(clock())


def shard_args(
    args: Sequence[Mapping[str, str]], max_per_conn: int = MAX_CHANNELS_PER_CONNECTION
) -> list[list[dict[str, str]]]:  # noqa: E501
    """Split args over connections, at most ``max_per_conn`` each, keeping a symbol's channels together
    where possible (args are grouped by instId, then packed in order)."""
    if max_per_conn < 1:
        raise ValueError("max_per_conn must be >= 1")
    ordered = sorted((dict(a) for a in args), key=lambda a: (a["instId"], a["channel"]))
    return [ordered[i : i + max_per_conn] for i in range(0, len(ordered), max_per_conn)]


def chunk_subscribe(
    args: Sequence[Mapping[str, str]], max_args_bytes: int = MAX_SUBSCRIBE_ARGS_BYTES
) -> list[list[dict[str, str]]]:
    """Group args into requests whose serialised ``args`` stay within ``max_args_bytes``."""
    out: list[list[dict[str, str]]] = []
    cur: list[dict[str, str]] = []
    size = 2  # "[]"
    for a in args:
        n = len(orjson.dumps(a)) + 1
        if cur and size + n > max_args_bytes:
            out.append(cur)
            cur, size = [], 2
        cur.append(dict(a))
        size += n
    if cur:
        out.append(cur)
    return out


def arg_key(a: Mapping[str, Any]) -> ArgKey:
    return (str(a.get("channel", "")), str(a.get("instId", "")))


def arg_span(raw: bytes) -> bytes | None:
    """The bytes of a data push's ``arg`` object (``arg`` has no nesting), not parsed."""
    i = raw.find(b'"arg":')
    if i < 0 or i > 64:
        return None
    j = raw.find(b"}", i)
    if j < 0:
        return None
    return raw[i + 6 : j + 1]


def peek_arg(raw: bytes) -> dict[str, Any] | None:
    """The ``arg`` object of a data push without parsing the whole frame."""
    span = arg_span(raw)
    if span is None:
        return None
    try:
        a = orjson.loads(span)
    except orjson.JSONDecodeError:
        return None
    return a if isinstance(a, dict) else None


class ArgKeys:
    """``arg_key(peek_arg(raw))`` memoised on the ``arg`` bytes: a connection sees a few dozen distinct
    ``arg`` objects, so the live path parses each once instead of once per frame."""

    __slots__ = ("_keys",)
    MAX: Final = 4096  # distinct spans remembered; past that, parsed every time (still correct)

    def __init__(self) -> None:
        self._keys: dict[bytes, ArgKey | None] = {}

    def __call__(self, raw: bytes) -> ArgKey | None:
        span = arg_span(raw)
        if span is None:
            return None
        try:
            return self._keys[span]
        except KeyError:
            pass
        a = peek_arg(raw)
        key = arg_key(a) if a is not None else None
        if len(self._keys) < self.MAX:
            self._keys[span] = key
        return key


# ---------------------------------------------------------------- config and state


@dataclass(frozen=True, kw_only=True)
class ConnectionConfig:
    url: str
    ping_interval_s: float = 25.0
    pong_timeout_s: float = 10.0
    silence_limit_s: float = 30.0
    watchdog_tick_s: float = 0.5
    open_timeout_s: float = 10.0
    close_timeout_s: float = 2.0
    max_msgs_per_s: int = 10
    send_window_s: float = 1.1  # a little over 1 s so the server's window never sees 11
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    backoff_factor: float = 2.0
    min_stable_s: float = 5.0
    max_connect_attempts: int = 300
    max_subscriptions_per_hour: int = 240
    connect_window_s: float = 300.0
    silent_after_s: float = 60.0
    max_frame_bytes: int = 16 << 20
    max_queue: int = 4096

    def __post_init__(self) -> None:
        # NaN and infinity too: a NaN timeout never fires, an infinite one overflows the int ns clock
        for name in (
            "ping_interval_s",
            "pong_timeout_s",
            "silence_limit_s",
            "watchdog_tick_s",
            "send_window_s",
            "open_timeout_s",
            "close_timeout_s",
            "backoff_initial_s",
            "backoff_max_s",
            "connect_window_s",
            "silent_after_s",
        ):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if not (self.min_stable_s >= 0 and math.isfinite(self.min_stable_s)):
            raise ValueError(f"min_stable_s must be a finite number >= 0, got {self.min_stable_s}")
        if not (1 <= self.backoff_factor and math.isfinite(self.backoff_factor)):
            raise ValueError(f"backoff_factor must be a finite number >= 1, got {self.backoff_factor}")
        for name in ("max_msgs_per_s", "max_connect_attempts", "max_subscriptions_per_hour", "max_queue"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.max_frame_bytes >= 1 << 10:
            raise ValueError(f"max_frame_bytes must be >= 1024, got {self.max_frame_bytes}")


@dataclass(slots=True)
class ArgState:
    arg: dict[str, str]
    acked_ns: int = 0
    frames: int = 0
    first_ns: int = 0
    last_ns: int = 0
    rejected: str = ""  # error code/msg when the exchange refused the arg
    silent_flagged: bool = False


@dataclass(slots=True)
class ConnStats:
    frames: int = 0
    bytes: int = 0
    by_channel: dict[str, int] = field(default_factory=dict)
    connects: int = 0
    failed_connects: int = 0
    disconnects: int = 0
    gaps: int = 0
    book_faults: int = 0
    quarantined_live: int = 0
    errors: int = 0
    up: bool = False
    fatal: str = ""


# ---------------------------------------------------------------- the reconnect loop (every stream)

# What a dropped or refused connection can raise; :func:`retryable` sorts them into "reconnect" and
# "give up". Anything else (a bug in a callable, a refused login) is not caught: it ends the loop.
NETWORK_ERRORS: Final = (OSError, EOFError, TimeoutError, websockets.WebSocketException)


class FatalConnectError(Exception):
    """A connect failure :func:`retryable` calls fatal (4xx, bad URL, bad certificate)."""


def closed_reason(ws: ClientConnection) -> str:
    rcvd = ws.protocol.close_rcvd
    return f"closed_by_server:{rcvd.code}" if rcvd is not None else "connection_lost"


Hook = Callable[[ClientConnection], Awaitable[None]]


async def _send_ping(ws: ClientConnection) -> None:
    await ws.send("ping")


class ReconnectLoop:
    """One WebSocket kept up until :meth:`stop`, for every stream (public market data, private orders).

    Each session: connect, ``await login(ws)`` (optional), ``await subscribe(ws)``, ``on_connected(n)``
    (n = 1 for the first; an awaitable it returns runs alongside the reader, e.g. a REST reconciliation,
    and gets ``hook_grace_s`` after a drop to finish), then every received frame goes to ``handler(raw)``
    until the socket closes; ``on_disconnected(reason)`` follows every socket handed to login/subscribe
    (which get ``silence_limit_s`` together, or the socket is dropped as stale). Meanwhile
    ``ping(ws)`` every ``ping_interval_s`` (Bitget's text ``ping``) and a watchdog that drops the socket
    after ``silence_limit_s`` without any frame or a ``pong`` ``pong_timeout_s`` late, calling
    ``on_tick()`` each ``watchdog_tick_s``.

    Reconnects: failed connects and connections that lived under ``min_stable_s`` wait a jittered
    exponential delay (:func:`backoff_delays`, capped at ``backoff_max_s``); a connection that lived
    longer reconnects at once. Every attempt counts against ``attempts`` (Bitget: 300 per 5 minutes).
    Only network errors mean "reconnect"; a connect error :func:`retryable` rejects is raised as
    :class:`FatalConnectError`, and anything a callable raises propagates. Frames sent on the socket
    are never logged here (a login carries credentials).
    """

    def __init__(
        self,
        config: ConnectionConfig,
        *,
        subscribe: Hook,
        handler: Callable[[bytes], None],
        login: Hook | None = None,
        ping: Hook = _send_ping,
        on_connected: Callable[[int], Awaitable[None] | None] = lambda n: None,
        on_disconnected: Callable[[str], None] = lambda reason: None,
        on_connect_failed: Callable[[BaseException, bool], None] = lambda exc, retry: None,
        on_wait: Callable[[float], None] = lambda delay_s: None,
        on_tick: Callable[[], None] = lambda: None,
        rng: random.Random,
        attempts: SlidingWindow | None = None,
        hook_grace_s: float = 10.0,
        name: str = "ws",
        logger: logging.Logger | None = None,
    ) -> None:
        self.cfg = config
        self.subscribe, self.handler, self.login, self.ping = subscribe, handler, login, ping
        self.on_connected, self.on_disconnected = on_connected, on_disconnected
        self.on_connect_failed, self.on_wait, self.on_tick = on_connect_failed, on_wait, on_tick
        self.rng = rng
        self.attempts = attempts or SlidingWindow(config.max_connect_attempts, config.connect_window_s)
        self.hook_grace_s = hook_grace_s
        self.name = name
        self.logger = logger
        self.connects = 0  # sessions that got through login and subscribe
        self.stopping = False
        self._stop = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._reason = ""
        self._last_rx = 0.0
        self._ping_sent: float | None = None
        self._helper_error: BaseException | None = None

    def _delays(self) -> Iterator[float]:
        c = self.cfg
        return backoff_delays(
            self.rng, initial_s=c.backoff_initial_s, max_s=c.backoff_max_s, factor=c.backoff_factor
        )

    def stop(self) -> None:
        self.stopping = True
        self._stop.set()
        self.drop("stop")

    def drop(self, reason: str) -> None:
        """Abort the current socket (if any); the loop reconnects unless stopping."""
        if self._ws is not None and not self._reason:
            self._reason = reason
            if reason != "stop":
                log.info("%s: dropping connection: %s", self.name, reason)
            self._ws.transport.abort()

    async def run(self) -> None:
        c = self.cfg
        delays: Iterator[float] | None = None
        while not self.stopping:
            self.attempts.record(time.monotonic())
            try:
                ws = await connect(
                    c.url,
                    compression=None,
                    ping_interval=None,  # Bitget wants a text "ping": our keepalive
                    proxy=None,
                    open_timeout=c.open_timeout_s,
                    close_timeout=c.close_timeout_s,
                    max_size=c.max_frame_bytes,
                    max_queue=c.max_queue,
                    logger=self.logger,
                )
            except NETWORK_ERRORS as e:
                retry = retryable(e)
                self.on_connect_failed(e, retry)
                log.info(
                    "%s: connect failed (%s): %s: %s",
                    self.name,
                    "retry" if retry else "fatal",
                    type(e).__name__,
                    e,
                )
                if not retry:
                    raise FatalConnectError(f"{type(e).__name__}: {e}"[:300]) from e
                delays = delays or self._delays()
                await self._pause(next(delays))
                continue
            opened = time.monotonic()
            await self._session(ws)
            if time.monotonic() - opened < c.min_stable_s:  # flapping: back off
                delays = delays or self._delays()
                await self._pause(next(delays))
            else:
                delays = None
                await self._pause(0.0)

    async def _pause(self, delay: float) -> None:
        delay = max(delay, self.attempts.wait_s(time.monotonic()))
        if delay <= 0 or self.stopping:
            return
        self.on_wait(delay)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):  # not wait_for: its 3.11 cancellation can hang
                await self._stop.wait()

    async def _session(self, ws: ClientConnection) -> None:
        if self.stopping:
            ws.transport.abort()
            return
        self._ws, self._reason, self._helper_error = ws, "", None
        self._last_rx, self._ping_sent = time.monotonic(), None
        helpers: list[asyncio.Future[Any]] = []
        hook: asyncio.Future[None] | None = None
        try:
            handshake = asyncio.timeout(self.cfg.silence_limit_s)  # a hung login or subscribe is stale too
            try:
                async with handshake:
                    if self.login is not None:
                        await self.login(ws)
                    await self.subscribe(ws)
            except websockets.ConnectionClosed:
                return  # dropped before we were in
            except TimeoutError:
                if not handshake.expired():
                    raise
                self._reason = "handshake_timeout"
                return
            self.connects += 1
            helpers = [
                asyncio.create_task(self._keepalive(ws), name=f"{self.name} keepalive"),
                asyncio.create_task(self._watchdog(), name=f"{self.name} watchdog"),
            ]
            started = self.on_connected(self.connects)
            if started is not None:
                hook = asyncio.ensure_future(started)
                helpers.append(hook)
            for t, what in zip(helpers, ("keepalive", "watchdog", "on_connected"), strict=False):
                t.add_done_callback(partial(self._helper_done, what))
            await self._read(ws)
            if hook is not None and not hook.done() and not self.stopping:
                await asyncio.wait([hook], timeout=self.hook_grace_s)
            if self._helper_error is not None:
                raise self._helper_error
        except asyncio.CancelledError:
            self._reason = self._reason or "cancelled"
            raise
        except Exception:
            self._reason = self._reason or "error"
            raise
        finally:
            for t in helpers:
                t.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            ws.transport.abort()
            self._ws = None
            self.on_disconnected(self._reason or closed_reason(ws))

    def _helper_done(self, what: str, t: asyncio.Future[Any]) -> None:
        """The keepalive, the watchdog or the ``on_connected`` hook raised: without it the socket is
        unwatched (or the caller's reconnect work undone), so the session ends and raises the error."""
        if not t.cancelled() and (exc := t.exception()) is not None and self._helper_error is None:
            self._helper_error = exc
            self.drop(f"{what} failed")

    async def _read(self, ws: ClientConnection) -> None:
        handler = self.handler
        while True:
            try:
                raw = await ws.recv(decode=False)
            except websockets.ConnectionClosed:
                return
            self._last_rx = time.monotonic()
            if raw == PONG:
                self._ping_sent = None
            handler(raw)

    async def _keepalive(self, ws: ClientConnection) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                await asyncio.sleep(self.cfg.ping_interval_s)
                await self.ping(ws)
                if self._ping_sent is None:
                    self._ping_sent = time.monotonic()

    async def _watchdog(self) -> None:
        c = self.cfg
        while True:
            await asyncio.sleep(c.watchdog_tick_s)
            now = time.monotonic()
            if now - self._last_rx > c.silence_limit_s:
                return self.drop("silence")
            if self._ping_sent is not None and now - self._ping_sent > c.pong_timeout_s:
                return self.drop("pong_timeout")
            self.on_tick()


class Connection:
    """One shard of args on one WebSocket (a :class:`ReconnectLoop`), reconnecting until :meth:`stop`."""

    def __init__(
        self,
        conn_id: int,
        args: Sequence[Mapping[str, str]],
        journal: JournalWriter,
        config: ConnectionConfig,
        *,
        rng: random.Random,
        attempts: SlidingWindow,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if len(args) > MAX_CHANNELS_PER_CONNECTION:
            raise ValueError(f"{len(args)} args on one connection; Bitget recommends < 50 (shard them)")
        self.conn_id = conn_id
        self.cfg = config
        self.journal = journal
        self.wall_ns = wall_ns
        self.args: dict[ArgKey, ArgState] = {arg_key(a): ArgState(dict(a)) for a in args}
        self.stats = ConnStats()
        self.open_gaps: dict[ArgKey, tuple[int, str]] = {}
        self._ws: ClientConnection | None = None
        self._limiter = SlidingWindow(config.max_msgs_per_s, config.send_window_s)
        self._sub_budget = SlidingWindow(config.max_subscriptions_per_hour, 3600.0)
        self._books = BooksState()
        self._last_rx_ns = 0
        self._send_tasks: set[asyncio.Task[Any]] = set()
        self._arg_keys = ArgKeys()
        self.loop = ReconnectLoop(
            config,
            subscribe=self._begin,
            handler=self._on_frame,
            ping=lambda ws: self._send(b"ping"),
            on_disconnected=self._ended,
            on_connect_failed=self._connect_failed,
            on_wait=lambda delay_s: self._meta({"t": "reconnect_wait", "delay_s": round(delay_s, 3)}),
            on_tick=self._flag_silent,
            rng=rng,
            attempts=attempts,
            name=f"conn {conn_id}",
        )

    # ------------------------------------------------------------ journal helpers

    def _meta(self, obj: dict[str, Any], ts_ns: int | None = None) -> None:
        self.journal.meta(self.wall_ns() if ts_ns is None else ts_ns, self.conn_id, obj)

    def open_gap(self, key: ArgKey, start_ns: int, reason: str) -> None:
        if key in self.open_gaps:
            return
        self.open_gaps[key] = (start_ns, reason)
        self.stats.gaps += 1
        self._meta(
            {"t": "gap_open", "channel": key[0], "instId": key[1], "start_ns": start_ns, "reason": reason}
        )

    def close_gap(self, key: ArgKey, end_ns: int, how: str = "resubscribed") -> None:
        if self.open_gaps.pop(key, None) is None:
            return
        self._meta({"t": "gap_close", "channel": key[0], "instId": key[1], "end_ns": end_ns, "how": how})

    # ------------------------------------------------------------ the loop's callables

    def stop(self) -> None:
        self.loop.stop()

    async def run(self) -> None:
        """Connect, subscribe, read; reconnect on any drop until stopped. A fatal connect error is reported
        in ``stats.fatal`` and the journal; anything else is reported there too and raised."""
        try:
            await self.loop.run()
        except FatalConnectError as e:
            self._fatal(str(e))
        except Exception as e:
            self._fatal(f"{type(e).__name__}: {e}"[:300])
            raise

    def _fatal(self, why: str) -> None:
        self.stats.fatal = why
        self._meta({"t": "fatal", "error": why})
        log.error("conn %d: giving up: %s", self.conn_id, why)

    def _connect_failed(self, exc: BaseException, retry: bool) -> None:
        self.stats.failed_connects += 1
        self._meta({"t": "connect_failed", "error": f"{type(exc).__name__}: {exc}"[:300], "retry": retry})

    async def _begin(self, ws: ClientConnection) -> None:
        """A fresh socket: new book state and subscription budget (both per connection), then subscribe."""
        self._ws = ws
        self._books = BooksState()
        self._sub_budget = SlidingWindow(self.cfg.max_subscriptions_per_hour, 3600.0)
        self._last_rx_ns = now_ns = self.wall_ns()
        for st in self.args.values():
            st.acked_ns = 0
        self.stats.connects += 1
        self.stats.up = True
        self._meta({"t": "connect", "url": self.cfg.url, "args": [s.arg for s in self.args.values()]}, now_ns)
        for chunk in chunk_subscribe([st.arg for st in self.args.values() if not st.rejected]):
            await self._send(subscribe_request(chunk), subscription=True)

    def _ended(self, reason: str) -> None:
        for t in self._send_tasks:
            t.cancel()
        self._ws = None
        self.stats.up = False
        self.stats.disconnects += 1
        self._meta({"t": "disconnect", "reason": reason, "last_rx_ns": self._last_rx_ns})
        if not self.loop.stopping:
            for key, st in self.args.items():
                if not st.rejected:
                    self.open_gap(key, self._last_rx_ns, f"disconnect:{reason}")

    def _on_frame(self, raw: bytes) -> None:
        ts = self.wall_ns()
        self.journal.append(ts, self.conn_id, raw)  # raw first: before anything looks at it
        self._last_rx_ns = ts
        stats = self.stats
        stats.frames += 1
        stats.bytes += len(raw)
        if raw != PONG:
            self._inspect(raw, ts)

    # ------------------------------------------------------------ frame inspection (live)

    def _inspect(self, raw: bytes, ts: int) -> None:
        key = self._arg_keys(raw) if raw.startswith(b'{"action"') else None
        if key is not None:
            prev_ns = self._count_data(key, ts)
            if key[0] == "books":
                self._check_books(raw, key, ts, prev_ns)
            return
        try:
            frame = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self.stats.quarantined_live += 1
            return
        if not isinstance(frame, dict):
            self.stats.quarantined_live += 1
            return
        event = frame.get("event")
        if event == "subscribe":
            self._on_ack(frame.get("arg") or {}, ts)
        elif event == "error":
            self._on_error(frame, ts)
        elif event is None and "arg" in frame and isinstance(frame["arg"], dict) and "data" in frame:
            # a data push in an unusual key order: count it like any other
            key = arg_key(frame["arg"])
            prev_ns = self._count_data(key, ts)
            if key[0] == "books":
                self._check_books(raw, key, ts, prev_ns, frame)

    def _count_data(self, key: ArgKey, ts: int) -> int:
        """Count a data push; returns the receive time of the arg's previous push (or ``ts``)."""
        by = self.stats.by_channel
        by[key[0]] = by.get(key[0], 0) + 1
        st = self.args.get(key)
        if st is None:
            return ts
        prev = st.last_ns or ts
        st.frames += 1
        st.last_ns = ts
        if not st.first_ns:
            st.first_ns = ts
        return prev

    def _on_ack(self, a: Mapping[str, Any], ts: int) -> None:
        key = arg_key(a)
        st = self.args.get(key)
        if st is None:
            return
        st.acked_ns = ts
        self.close_gap(key, ts)

    def _on_error(self, frame: Mapping[str, Any], ts: int) -> None:
        self.stats.errors += 1
        try:
            code: int | None = int(frame.get("code"))  # type: ignore[arg-type]  # number or string
        except (TypeError, ValueError):
            code = None
        a = frame.get("arg")
        if isinstance(a, dict):
            st = self.args.get(arg_key(a))
            if st is not None and code in REJECTING_CODES:
                # not asked again; a gap already open for it (refused after a reconnect) stays open
                st.rejected = f"{code}: {frame.get('msg', '')}"
        log.warning("conn %d: error event code=%s msg=%s arg=%s", self.conn_id, code, frame.get("msg"), a)

    def _check_books(self, raw: bytes, key: ArgKey, ts: int, prev_ns: int, frame: Any = None) -> None:
        """Apply a ``books`` push to the live book; a break opens a gap from the previous push."""
        if frame is None:
            try:
                frame = orjson.loads(raw)
            except orjson.JSONDecodeError:
                self.stats.quarantined_live += 1
                self._book_fault(key, prev_ns, "malformed")
                return
        data = frame.get("data")
        if not isinstance(data, list) or not data:
            self._book_fault(key, prev_ns, "malformed")
            return
        try:
            for d in data:
                if not isinstance(d, dict):
                    raise BookError("malformed", "data element is not an object")
                self._books.apply(key[1], frame.get("action"), d)
        except BookError as e:
            self._book_fault(key, prev_ns, e.reason)

    def _book_fault(self, key: ArgKey, start_ns: int, reason: str) -> None:
        self.stats.book_faults += 1
        if key in self.open_gaps:
            return  # already resyncing
        self.open_gap(key, start_ns, f"books_{reason}")
        st = self.args.get(key)
        if st is None or self._ws is None:
            return
        t = asyncio.create_task(self._resubscribe(st.arg), name=f"conn{self.conn_id}-resub")
        self._send_tasks.add(t)
        t.add_done_callback(self._send_tasks.discard)

    # ------------------------------------------------------------ sending

    async def _send(self, text: str | bytes, *, subscription: bool = False) -> None:
        ws = self._ws
        if ws is None:
            raise websockets.ConnectionClosedError(None, None)
        if subscription:  # Bitget: 240 subscription requests per hour per connection
            await self._sub_budget.acquire()
        await self._limiter.acquire()
        payload = text if isinstance(text, bytes) else text.encode()
        self.journal.sent(self.wall_ns(), self.conn_id, payload)
        await ws.send(payload, text=True)

    async def _resubscribe(self, a: dict[str, str]) -> None:
        try:
            self._meta({"t": "resubscribe", "arg": a})
            await self._send(subscribe_request([a], op="unsubscribe"), subscription=True)
            await self._send(subscribe_request([a]), subscription=True)
        except websockets.ConnectionClosed:
            return

    def _flag_silent(self) -> None:
        """Each watchdog tick: an arg acked ``silent_after_s`` ago that never sent data is reported once."""
        wall = self.wall_ns()
        limit_s = self.cfg.silent_after_s
        for key, st in self.args.items():
            if (
                st.acked_ns
                and not st.frames
                and not st.silent_flagged
                and (wall - st.acked_ns) / 1e9 > limit_s
            ):
                st.silent_flagged = True
                self._meta({"t": "silent", "channel": key[0], "instId": key[1], "acked_ns": st.acked_ns})
                log.warning("conn %d: %s/%s acked but silent for %.0fs", self.conn_id, *key, limit_s)
