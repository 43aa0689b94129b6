"""A local WebSocket server speaking Bitget's v2 public protocol, with fault injection.

It is the peer for every recorder test (and, later, for live mode): it binds 127.0.0.1 (port 0 picks
a free port; :attr:`BitgetServer.port` reports it) and speaks the protocol of
``../shared/docs/bitget-v2.md``: ``subscribe``/``unsubscribe`` with one ack per arg, error events
(``code`` a JSON number for some codes and a string for others, as Bitget does), text ``ping`` ->
``pong``, and the ``books15``, ``books``, ``books1``, ``books5`` and ``trade`` channels.

Frames come from a *source*: an iterable of ``(ts_ns, frame_bytes)`` in time order (a stored session
rebuilt through the codec's encoders, the simulator, or any list). One broadcaster walks the source
in real time or accelerated (``speed``; 0 = as fast as the clients read) and fans each frame out to
the connections subscribed to its ``(instType, channel, instId)``. Book pushes go out in
one year's wire layout (``wire_year``, :mod:`venue.bitget.wire_layout`; the latest by default): the
fixed-depth channels are cut from the source's ``books15`` pushes, and ``books`` is the full depth
(:class:`~venue.bitget.wire_layout.DeepBook`, deeper than the checksum's 25 levels), per connection a
snapshot after each subscribe, then deltas sorted by price. After a ``trade`` subscribe the recent
trades come first as one ``snapshot`` push, as Bitget sends them.

Faults (:class:`Fault`) fire on a connection (by accept index, or every connection) when its
data-frame counter reaches ``at_frame``: ``drop``, ``close``, ``stall``, ``no_pong``, ``garbage``,
``truncated``, ``error_event``, ``skip_seq``, ``bad_checksum``. The server also enforces Bitget's
own rules: at most ``max_client_msgs_per_s`` client messages per second (error 30006, then 30007
and the connection is closed) and a ``ping`` at least every ``ping_required_s``.

Every frame the server sends is logged in :attr:`BitgetServer.log` (connection, kind, channel,
symbol, wall-clock send time, bytes), so tests can check nothing was lost outside declared gaps.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import orjson
import websockets
from websockets.asyncio.server import Server, ServerConnection, serve

from venue.bitget.wire_layout import (
    DEFAULT_BOOKS_DEPTH,
    LATEST,
    BooksStream,
    BookView,
    DeepBook,
    encode_fixed,
    is_layout,
    layout_of,
)
from wire.bitget.bitget_v2 import INST_TYPE, PING, arg, encode_books15, encode_trades

log = logging.getLogger(__name__)

# ``(ts_ns, frame)``, or ``(ts_ns, frame, (instType, channel, instId))``: that frame is sent verbatim
# (never parsed, never derived) to every connection subscribed to that arg, whatever it holds (a
# hostile frame for the tests: garbage, another instType, a books5 push)
FrameSource = Iterable[tuple[int, bytes] | tuple[int, bytes, tuple[str, str, str]]]
CHANNELS: Final = ("books", "books1", "books5", "books15", "trade")
# the older name of the layout switch: its "2024" was the doc example's layout (checksum 0 and seq),
# which real captures date to 2025
BOOK_VARIANTS: Final = {"2024": "2025", "2026": "2026"}
FIXED_DEPTH: Final = ("books1", "books5", "books15")
FAULT_KINDS: Final = (
    "drop",  # abort the TCP connection (the client sees 1006)
    "close",  # close handshake with ``close_code``
    "stall",  # send nothing at all (no data, no pong) for ``duration_s`` (None: forever), keep the socket
    "no_pong",  # keep streaming but stop answering ``ping`` for ``duration_s`` (None: forever)
    "garbage",  # send ``count`` frames of non-JSON bytes before the frame
    "truncated",  # send the frame cut in half instead of the frame
    "error_event",  # send an error event (``code``, number or string) before the frame
    "skip_seq",  # on ``books``: burn one seq (an update is never sent; the next one's pseq mismatches)
    "bad_checksum",  # on ``books``: the next update carries a wrong checksum (even in a year without one)
)


@dataclass(frozen=True, kw_only=True)
class Fault:
    """One injected fault: fires on connection ``conn`` (accept order, 0 first; None = every
    connection) when that connection's data-frame counter reaches ``at_frame``."""

    kind: str
    at_frame: int = 0
    conn: int | None = 0
    duration_s: float | None = None
    count: int = 1
    code: int | str = 30016
    msg: str = "injected error"
    close_code: int = 1011

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {FAULT_KINDS}")
        if self.at_frame < 0:
            raise ValueError(f"at_frame must be >= 0, got {self.at_frame}")

    @classmethod
    def parse(cls, spec: str) -> Fault:
        """``kind[@frame][:conn=N][:duration=S][:count=N][:code=X]``, e.g. ``drop@200:conn=0``."""
        head, *opts = spec.split(":")
        kind, _, at = head.partition("@")
        kw: dict[str, Any] = {"kind": kind, "at_frame": int(at) if at else 0}
        for o in opts:
            k, _, v = o.partition("=")
            if k == "conn":
                kw["conn"] = None if v in ("all", "*") else int(v)
            elif k == "duration":
                kw["duration_s"] = float(v)
            elif k == "count":
                kw["count"] = int(v)
            elif k == "code":
                kw["code"] = int(v) if v.isdigit() else v.strip('"')
            else:
                raise ValueError(f"unknown fault option {k!r} in {spec!r}")
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class Sent:
    """One frame the server put on the wire."""

    conn: int
    kind: str  # data | ack | error | pong | garbage | truncated
    channel: str
    symbol: str
    wall_ns: int
    frame: bytes


@dataclass(frozen=True, slots=True)
class Withheld:
    """A data frame the server deliberately did not send (stall, skip_seq): a declared loss."""

    conn: int
    reason: str
    channel: str
    symbol: str
    wall_ns: int


@dataclass(slots=True)
class _Conn:
    index: int
    ws: ServerConnection
    subs: set[tuple[str, str, str]] = field(default_factory=set)
    books: dict[str, BooksStream] = field(default_factory=dict)
    queue: deque[Any] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    space: asyncio.Event = field(default_factory=asyncio.Event)
    data_index: int = 0
    stalled_until: float = 0.0  # monotonic s
    no_pong_until: float = 0.0
    skip_pending: bool = False
    bad_checksum_pending: bool = False
    fired: set[int] = field(default_factory=set)
    msg_times: deque[float] = field(default_factory=deque)
    last_ping: float = field(default_factory=time.monotonic)
    closed: bool = False
    last_seq: dict[tuple[str, str], int] = field(default_factory=dict)  # 2026 fixed-depth pseq


def _plain(x: float) -> str:
    """A float as a plain decimal string (no exponent), shortest round-trip digits."""
    s = repr(float(x))
    if "e" in s or "E" in s:
        s = format(Decimal(s), "f")
    return s


class BitgetServer:
    """The local Bitget v2 public WebSocket. ``async with BitgetServer(src) as srv: srv.url``."""

    def __init__(
        self,
        source: FrameSource,
        *,
        speed: float = 1.0,
        faults: Sequence[Fault] = (),
        inst_type: str = INST_TYPE,
        symbols: Iterable[str] | None = None,
        max_client_msgs_per_s: int = 10,
        ping_required_s: float = 120.0,
        wire_year: str | None = None,
        books_checksum: bool | None = None,
        books_depth: int = DEFAULT_BOOKS_DEPTH,
        trade_snapshot: int = 50,
        book_variant: str | None = None,
        unsubscribe_ack: str = "event",
        start_on_subscribe: bool = True,
        keep_frames: bool = True,
        high_water: int = 20_000,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        path_handlers: Mapping[str, Callable[[ServerConnection], Awaitable[None]]] | None = None,
    ) -> None:
        if unsubscribe_ack not in ("event", "op"):
            raise ValueError("unsubscribe_ack is 'event' or 'op'")
        self._source = source
        self.speed = speed
        self.faults = list(faults)
        self.inst_type = inst_type
        self.symbols = set(symbols) if symbols is not None else None
        self.max_client_msgs_per_s = max_client_msgs_per_s
        self.ping_required_s = ping_required_s
        # after a ``trade`` subscribe, a ``snapshot`` push of up to this many recent trades of the
        # symbol (newest first) before the updates, as Bitget does; 0: none
        self.trade_snapshot = trade_snapshot
        if book_variant is not None:
            if book_variant not in BOOK_VARIANTS:
                raise ValueError(f"book_variant is one of {tuple(BOOK_VARIANTS)}, got {book_variant!r}")
            if wire_year is None:
                wire_year = BOOK_VARIANTS[book_variant]
        layout = layout_of(wire_year if wire_year is not None else LATEST)
        if books_checksum is not None:  # a checksum on ``books`` whatever the year says (or none)
            layout = replace(layout, books_checksum=books_checksum)
        self.layout = layout
        self.wire_year = layout.year
        self.books_depth = books_depth
        self._deep: dict[tuple[str, str], DeepBook] = {}
        self._recent: dict[tuple[str, str], deque[Any]] = {}
        self.unsubscribe_ack = unsubscribe_ack
        self.start_on_subscribe = start_on_subscribe
        self.keep_frames = keep_frames
        self.high_water = high_water
        self.host = host
        self._port = port
        self._rng = random.Random(seed)
        self._seed = seed
        # Other WebSocket paths served on the same port (the local exchange's /v2/ws/private).
        self.path_handlers = dict(path_handlers or {})
        self.log: list[Sent] = []
        self.withheld: list[Withheld] = []
        self.sent_count = 0
        self.source_frames = 0
        self.connections = 0
        self.rate_limited = 0
        self._conns: list[_Conn] = []
        self._server: Server | None = None
        self._go = asyncio.Event()
        self.finished = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    # ------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/v2/ws/public"

    async def start(self) -> BitgetServer:
        self._server = await serve(
            self._handler,
            self.host,
            self._port,
            compression=None,
            ping_interval=None,
            max_size=1 << 20,
            max_queue=64,
        )
        if not self.start_on_subscribe:
            self._go.set()
        self._tasks.append(asyncio.create_task(self._broadcast(), name="bitget-server-broadcast"))
        return self

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> BitgetServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------ log helpers

    def data_frames(self, conn: int | None = None) -> list[Sent]:
        return [s for s in self.log if s.kind == "data" and (conn is None or s.conn == conn)]

    def _record(self, c: _Conn, kind: str, channel: str, symbol: str, frame: bytes) -> None:
        self.sent_count += 1
        self.log.append(
            Sent(c.index, kind, channel, symbol, time.time_ns(), frame if self.keep_frames else b"")
        )

    async def _send(self, c: _Conn, kind: str, channel: str, symbol: str, frame: bytes | str) -> bool:
        if c.closed:
            return False
        try:
            await c.ws.send(frame, text=True)
        except websockets.ConnectionClosed:
            c.closed = True
            return False
        self._record(c, kind, channel, symbol, frame if isinstance(frame, bytes) else frame.encode())
        return True

    # ------------------------------------------------------------ broadcast

    async def _broadcast(self) -> None:
        await self._go.wait()
        t0 = time.monotonic()
        ts0: int | None = None
        n = 0
        for item in self._source:
            ts_ns, frame = item[0], item[1]
            if ts0 is None:
                ts0 = ts_ns
            if self.speed > 0:
                delay = t0 + (ts_ns - ts0) / 1e9 / self.speed - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            n += 1
            if self.speed <= 0 and n % 64 == 0:
                await asyncio.sleep(0)
            self.source_frames += 1
            if len(item) > 2:  # routed: sent as it is
                key = tuple(item[2])  # type: ignore[misc]
                for c in list(self._conns):
                    if not c.closed and key in c.subs:
                        await self._enqueue(c, ("data", key[1], key[2], frame, False))  # False: verbatim
                continue
            parsed = orjson.loads(frame)
            a = parsed.get("arg") or {}
            key = (a.get("instType", ""), a.get("channel", ""), a.get("instId", ""))
            if self.trade_snapshot and key[1] == "trade":
                recent = self._recent.setdefault((key[0], key[2]), deque(maxlen=self.trade_snapshot))
                recent.extendleft(reversed(parsed.get("data") or []))  # newest first, as on the wire
            if key[1] != "books15":
                for c in list(self._conns):  # connections come and go while we await
                    if not c.closed and key in c.subs:
                        await self._enqueue(c, ("data", key[1], key[2], frame, None))
                continue
            view = self._deep_view(key, parsed)
            for c in list(self._conns):
                if c.closed:
                    continue
                for ch in FIXED_DEPTH:
                    if (key[0], ch, key[2]) in c.subs:
                        await self._enqueue(c, ("data", ch, key[2], frame, parsed))
                if view is not None and (key[0], "books", key[2]) in c.subs:
                    await self._enqueue(c, ("data", "books", key[2], frame, view))
        # let every connection drain what it has queued, then say so
        while any(c.queue and not c.closed for c in self._conns):
            await asyncio.sleep(0.005)
        self.finished.set()

    async def _enqueue(self, c: _Conn, item: tuple[Any, ...]) -> None:
        c.queue.append(item)
        c.wake.set()
        if len(c.queue) > self.high_water and not c.closed and time.monotonic() >= c.stalled_until:
            c.space.clear()
            # back-pressure: a slow reader slows the feed (as ``speed=0`` wants); a dead one is dropped
            try:
                await asyncio.wait_for(c.space.wait(), timeout=30.0)
            except TimeoutError:
                log.warning("conn %d: slow consumer, closing", c.index)
                c.ws.transport.abort()
                c.closed = True

    # ------------------------------------------------------------ per-connection sender

    async def _sender(self, c: _Conn) -> None:
        while not c.closed:
            if not c.queue:
                c.wake.clear()
                await c.wake.wait()
                continue
            item = c.queue.popleft()
            if len(c.queue) < self.high_water // 2:
                c.space.set()
            if item[0] == "reset":
                enc = c.books.get(item[1])
                if enc is not None:
                    enc.reset()
                continue
            if item[0] == "ctrl":
                _, kind, frame = item
                if time.monotonic() < c.stalled_until:
                    continue
                await self._send(c, kind, "", "", frame)
                continue
            await self._deliver(c, item)

    def _faults_due(self, c: _Conn) -> list[tuple[int, Fault]]:
        return [
            (i, f)
            for i, f in enumerate(self.faults)
            if i not in c.fired and (f.conn is None or f.conn == c.index) and c.data_index >= f.at_frame
        ]

    async def _deliver(self, c: _Conn, item: tuple[Any, ...]) -> None:
        _, channel, symbol, frame, parsed = item
        now = time.monotonic()
        truncate = False
        for i, f in self._faults_due(c):
            c.fired.add(i)
            log.info("conn %d: fault %s at data frame %d", c.index, f.kind, c.data_index)
            if f.kind == "drop":
                c.ws.transport.abort()
                c.closed = True
                return
            if f.kind == "close":
                c.closed = True
                try:
                    await c.ws.close(f.close_code, "injected close")
                except websockets.ConnectionClosed:
                    pass
                return
            if f.kind == "stall":
                c.stalled_until = math.inf if f.duration_s is None else now + f.duration_s
            elif f.kind == "no_pong":
                c.no_pong_until = math.inf if f.duration_s is None else now + f.duration_s
            elif f.kind == "garbage":
                for _ in range(f.count):
                    junk = bytes(self._rng.randrange(33, 127) for _ in range(24)).replace(b"{", b"(")
                    await self._send(c, "garbage", channel, symbol, b"\x00garbage " + junk)
            elif f.kind == "truncated":
                truncate = True
            elif f.kind == "error_event":
                ev = {"event": "error", "code": f.code, "msg": f.msg, "op": "subscribe"}
                await self._send(c, "error", "", "", orjson.dumps(ev))
            elif f.kind == "skip_seq":
                c.skip_pending = True
            elif f.kind == "bad_checksum":
                c.bad_checksum_pending = True
        c.data_index += 1
        if now < c.stalled_until:
            self.withheld.append(Withheld(c.index, "stall", channel, symbol, time.time_ns()))
            return
        if isinstance(parsed, BookView):
            frame = self._books(c, symbol, parsed)
            if frame is None:
                return
        elif parsed:  # a fixed-depth push cut from a books15 frame, in the server's layout
            frame = self._fixed(c, channel, symbol, frame, parsed)
        if truncate:
            await self._send(c, "truncated", channel, symbol, frame[: max(1, len(frame) // 2)])
            return
        await self._send(c, "data", channel, symbol, frame)

    def _deep_view(self, key: tuple[str, str, str], parsed: dict[str, Any]) -> BookView | None:
        """The symbol's full book after this books15 push, kept only while a connection wants ``books``
        (it starts from the push in hand when the first one subscribes)."""
        bkey = (key[0], key[2])
        if not any((key[0], "books", key[2]) in c.subs for c in self._conns if not c.closed):
            self._deep.pop(bkey, None)
            return None
        deep = self._deep.get(bkey)
        if deep is None:
            deep = self._deep[bkey] = DeepBook(key[2], depth=self.books_depth, seed=self._seed)
        return deep.update(parsed)

    def _fixed(self, c: _Conn, channel: str, symbol: str, frame: bytes, parsed: dict[str, Any]) -> bytes:
        """A fixed-depth push in the server's layout (``pseq``: the previous push's seq on that
        connection and channel); a books15 source push already in that layout goes out as it is."""
        data = parsed.get("data") or [{}]
        pseq = c.last_seq.get((channel, symbol), 0)
        c.last_seq[(channel, symbol)] = data[-1].get("seq", 0)
        if channel == "books15" and not self.layout.fixed_pseq and is_layout(frame, self.layout):
            return frame
        return encode_fixed(parsed, channel, self.layout, pseq)

    def _books(self, c: _Conn, symbol: str, view: BookView) -> bytes | None:
        stream = c.books.get(symbol)
        if stream is None:
            a = arg("books", symbol, view.inst_type)
            stream = c.books[symbol] = BooksStream(a, self.layout, first_seq=1000 * (c.index + 1))
        started = stream.started
        if c.skip_pending and started:
            c.skip_pending = False
            if stream.encode(view, burn=True) == b"":
                self.withheld.append(Withheld(c.index, "skip_seq", "books", symbol, time.time_ns()))
                return None
            c.skip_pending = True  # nothing changed: the next change is the one withheld
            return None
        offset = 1 if c.bad_checksum_pending and started else 0
        frame = stream.encode(view, checksum_offset=offset)
        if frame is not None and offset:
            c.bad_checksum_pending = False
        return frame

    # ------------------------------------------------------------ per-connection reader

    async def _handler(self, ws: ServerConnection) -> None:
        other = self.path_handlers.get(ws.request.path if ws.request is not None else "")
        if other is not None:
            await other(ws)
            return
        c = _Conn(index=self.connections, ws=ws)
        c.space.set()
        self.connections += 1
        self._conns.append(c)
        sender = asyncio.create_task(self._sender(c), name=f"bitget-server-send-{c.index}")
        watchdog = asyncio.create_task(self._ping_watchdog(c), name=f"bitget-server-ping-{c.index}")
        try:
            async for msg in ws:
                now = time.monotonic()
                c.msg_times.append(now)
                while c.msg_times and now - c.msg_times[0] > 1.0:
                    c.msg_times.popleft()
                if len(c.msg_times) > self.max_client_msgs_per_s:
                    await self._rate_limited(c)
                    break
                if msg == "ping" or msg == PING:
                    c.last_ping = now
                    if now >= c.no_pong_until and now >= c.stalled_until:
                        self._ctrl(c, "pong", b"pong")
                    continue
                await self._request(c, msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            c.closed = True
            c.wake.set()
            c.space.set()
            watchdog.cancel()
            sender.cancel()
            for t in (watchdog, sender):
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
            self._conns.remove(c)

    def _ctrl(self, c: _Conn, kind: str, frame: bytes) -> None:
        c.queue.append(("ctrl", kind, frame))
        c.wake.set()

    async def _ping_watchdog(self, c: _Conn) -> None:
        while not c.closed:
            await asyncio.sleep(min(1.0, self.ping_required_s / 4))
            if time.monotonic() - c.last_ping > self.ping_required_s:
                log.info("conn %d: no ping for %.1fs, closing", c.index, self.ping_required_s)
                c.ws.transport.abort()  # Bitget: close code 1006 after ~2 min without ping
                c.closed = True

    async def _rate_limited(self, c: _Conn) -> None:
        self.rate_limited += 1
        c.queue.clear()
        for code, msg in ((30006, "request too many"), ("30007", "request over limit,connection close")):
            await self._send(c, "error", "", "", orjson.dumps({"event": "error", "code": code, "msg": msg}))
        c.closed = True
        try:
            await c.ws.close(4000, "30007 request over limit")
        except websockets.ConnectionClosed:
            pass

    def _error(self, c: _Conn, code: int | str, msg: str, a: Any = None, op: str | None = None) -> None:
        ev: dict[str, Any] = {"event": "error"}
        if a is not None:
            ev["arg"] = a
        ev["code"] = code
        ev["msg"] = msg
        if op is not None:
            ev["op"] = op
        self._ctrl(c, "error", orjson.dumps(ev))

    async def _request(self, c: _Conn, msg: str | bytes) -> None:
        try:
            req = orjson.loads(msg)
        except orjson.JSONDecodeError:
            self._error(c, "30002", "Unrecognized request")  # a string code, as Bitget sometimes sends
            return
        if not isinstance(req, dict) or req.get("op") == "ping":
            self._error(c, 30002, "Unrecognized request")  # {"op":"ping"} -> 30002 [probe]
            return
        op = req.get("op")
        if op not in ("subscribe", "unsubscribe"):
            self._error(c, "30003", f"Invalid op: {op!r}")
            return
        args = req.get("args")
        if not isinstance(args, list) or not args:
            self._error(c, 30016, "Param error", op=op)
            return
        for a in args:
            if not isinstance(a, dict) or not all(isinstance(a.get(k), str) for k in ("instType", "channel")):
                self._error(c, 30016, "Param error", a, op)
                continue
            inst_id = a.get("instId")
            if a["channel"] not in CHANNELS or not isinstance(inst_id, str):
                self._error(c, 30016, "Param error", a, op)  # e.g. books50 on v2
                continue
            if self.symbols is not None and inst_id not in self.symbols:
                self._error(
                    c,
                    30001,
                    # as captured from Bitget (2026): the message ends with ",precision:null"
                    f"instType:{a['instType']},channel:{a['channel']},instId:{inst_id},precision:null"
                    " doesn't exist",
                    a,
                    op,
                )
                continue
            key = (a["instType"], a["channel"], inst_id)
            if op == "subscribe":
                c.subs.add(key)  # a wrong instType is acked but never delivers data (as Bitget does)
                if a["channel"] == "books":
                    c.queue.append(("reset", inst_id))  # in stream order: the next push is a snapshot
                self._ctrl(c, "ack", orjson.dumps({"event": "subscribe", "arg": a}))
                recent = self._recent.get((a["instType"], inst_id))
                if a["channel"] == "trade" and recent:
                    snap = orjson.dumps(
                        {"action": "snapshot", "arg": a, "data": list(recent), "ts": int(recent[0]["ts"])}
                    )
                    c.queue.append(("data", "trade", inst_id, snap, None))  # after the ack, as Bitget
                    c.wake.set()
                self._go.set()
            else:
                c.subs.discard(key)
                if self.unsubscribe_ack == "event":
                    self._ctrl(c, "ack", orjson.dumps({"event": "unsubscribe", "arg": a}))
                else:
                    self._ctrl(c, "ack", orjson.dumps({"op": "unsubscribe", "args": [a]}))


# ---------------------------------------------------------------- frame sources


def merge_sources(*sources: FrameSource) -> Iterator[tuple[int, bytes]]:
    """Merge time-ordered sources by ``ts_ns`` (ties keep argument order)."""
    return heapq.merge(*sources, key=lambda t: t[0])


def session_frames(root: Path | str, *, symbols: Iterable[str] | None = None) -> list[tuple[int, bytes]]:
    """Rebuild wire frames from a stored session's ``books15`` and ``trade`` events, by ``ts_recv``.

    Prices and sizes were parsed to floats when recorded; they go back out as their shortest
    round-trip decimal strings. Trades received together (same ``ts_recv`` and symbol) share a frame.
    """
    from engine.store import open_session

    s = open_session(root)
    want = set(symbols) if symbols is not None else None
    out: list[tuple[int, int, bytes]] = []
    if "books15" in s.streams:
        for i, b in enumerate(s.read_events("books15")):
            if want is not None and b.symbol not in want:
                continue
            bids = [(_plain(p), _plain(q)) for p, q in zip(b.bid_px, b.bid_sz, strict=True) if p == p]
            asks = [(_plain(p), _plain(q)) for p, q in zip(b.ask_px, b.ask_sz, strict=True) if p == p]
            ts_ms = b.ts_event // 1_000_000
            frame = encode_books15(
                b.symbol, ts_ms=ts_ms, seq=b.exch_seq, bids=bids, asks=asks, push_ts_ms=ts_ms
            )
            out.append((b.ts_recv, i, frame))
    if "trade" in s.streams:
        groups: dict[tuple[int, str], list[Any]] = {}
        for t in s.read_events("trade"):
            if want is None or t.symbol in want:
                groups.setdefault((t.ts_recv, t.symbol), []).append(t)
        for j, ((ts_recv, sym), trades) in enumerate(sorted(groups.items())):
            rows = [
                {
                    "ts": str(t.ts_event // 1_000_000),
                    "price": _plain(t.px),
                    "size": _plain(t.sz),
                    "side": t.side,
                    "tradeId": t.trade_id,
                }
                for t in reversed(trades)  # newest first, as Bitget sends
            ]
            push = max(t.ts_event for t in trades) // 1_000_000
            out.append((ts_recv, 1 << 40 | j, encode_trades(sym, rows, push_ts_ms=push)))
    out.sort(key=lambda r: (r[0], r[1]))
    return [(ts, f) for ts, _, f in out]


def simulator_frames(symbols: Sequence[str], *, minutes: float, seed: int) -> Iterator[tuple[int, bytes]]:
    """Frames of ``venue.simulator``: one symbol's (``generate_frames``), or several symbols' correlated
    markets merged by receive time (``MultiSim``: the first symbol leads, each on its own contract).
    A bad symbol list is a ``DualhubError`` here, before any frame."""
    from venue.simulator import MultiSim  # imported only when asked for

    return MultiSim(symbols, minutes=minutes, seed=seed).frames()


def toy_frames(
    symbols: Sequence[str] = ("BTCUSDT",),
    *,
    n: int = 100,
    interval_ms: int = 100,
    start_ms: int = 1_700_000_000_000,
    trades_every: int = 2,
    seed: int = 0,
    inst_type: str = INST_TYPE,
) -> list[tuple[int, bytes]]:
    """A small deterministic books15 + trade feed (a random walk) for tests and benchmarks."""
    rng = random.Random(seed)
    out: list[tuple[int, bytes]] = []
    mids = {s: 30000.0 + 1000 * i for i, s in enumerate(symbols)}
    trade_id = 1
    for k in range(n):
        ts_ms = start_ms + k * interval_ms
        for s in symbols:
            mid = mids[s] = round(mids[s] + rng.choice((-0.5, 0.0, 0.5)), 1)
            bids = [(f"{mid - 0.5 * (i + 1):.1f}", f"{rng.randint(1, 5000) / 1000:.3f}") for i in range(15)]
            asks = [(f"{mid + 0.5 * i:.1f}", f"{rng.randint(1, 5000) / 1000:.3f}") for i in range(15)]
            frame = encode_books15(s, ts_ms=ts_ms, seq=k + 1, bids=bids, asks=asks, push_ts_ms=ts_ms + 1)
            if inst_type != INST_TYPE:
                f = orjson.loads(frame)
                f["arg"] = arg("books15", s, inst_type)
                frame = orjson.dumps(f)
            out.append((ts_ms * 1_000_000, frame))
            if trades_every and k % trades_every == 0:
                side = rng.choice(("buy", "sell"))
                px = asks[0][0] if side == "buy" else bids[0][0]
                rows = [
                    {"ts": str(ts_ms), "price": px, "size": "0.010", "side": side, "tradeId": str(trade_id)}
                ]
                trade_id += 1
                out.append((ts_ms * 1_000_000 + 1, encode_trades(s, rows, push_ts_ms=ts_ms + 1)))
    out.sort(key=lambda t: t[0])
    return out


async def serve_forever(server: BitgetServer, *, on_ready: Any = None) -> None:
    """Run until cancelled (or until the source is exhausted and ``exit_when_done``)."""
    await server.start()
    if on_ready is not None:
        on_ready(server)
    try:
        await asyncio.Future()
    finally:
        await server.stop()
