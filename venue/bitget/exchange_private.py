"""The local Bitget exchange's private WebSocket (``/v2/ws/private``, ``venue/bitget/exchange.py``):
login (key, passphrase, timestamp window, signature), ``orders``/``fill``/``positions`` subscriptions,
and the pushes of order and position changes to the logged-in connections of their account.

:class:`PrivateChannels` is mixed into :class:`~venue.bitget.exchange.LocalExchange` and reads its
state (accounts, connections, the event loop, the lock) and its rows (``_order_row``, ``position_rows``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import orjson
import websockets
from websockets.asyncio.server import ServerConnection

from venue.bitget.exchange_state import LOGIN_WINDOW_S, _Order, _PrivConn, _same
from wire.bitget.bitget_v2_private import PRIVATE_CHANNELS, encode_push, login_sign


class PrivateChannels:
    """The private WebSocket of :class:`~venue.bitget.exchange.LocalExchange` (mixed into it)."""

    # ------------------------------------------------------------------ private pushes

    def _push_order(self, o: _Order, fill: Mapping[str, Any] | None = None) -> None:
        row = self._order_row(o, ws=True)
        if fill:
            row.update(fill)
        self._push(o.uid, "orders", o.symbol, [row])

    def _push_positions(self, uid: str) -> None:
        self._push(uid, "positions", "default", self.position_rows(uid, ws=True))

    def _push(self, uid: str, channel: str, symbol: str, data: list[dict[str, Any]]) -> None:
        frame: bytes | None = None
        for c in list(self._conns):
            if c.closed or c.uid != uid:
                continue
            if (channel, "default") not in c.subs and (channel, symbol) not in c.subs:
                continue
            if self.mute_private:
                self.pushes_lost += 1
                continue
            if frame is None:
                frame = encode_push(channel, data, self.now_ns() // 1_000_000)
            self.pushes += 1
            self._send_soon(c, frame)

    def _send_soon(self, c: _PrivConn, frame: bytes | str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            in_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            in_loop = False
        if in_loop:
            c.queue.put_nowait(frame)
        else:
            loop.call_soon_threadsafe(c.queue.put_nowait, frame)

    def drop_private(self) -> int:
        """Abort every private connection (the client sees 1006); returns how many."""
        n = 0
        for c in list(self._conns):
            if not c.closed:
                c.closed = True
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(c.ws.transport.abort)
                n += 1
        return n

    async def _private(self, ws: ServerConnection) -> None:
        c = _PrivConn(ws=ws, index=self.private_connections)
        self.private_connections += 1
        if self.refuse_private:
            ws.transport.abort()
            return
        self._conns.append(c)
        sender = asyncio.create_task(self._private_sender(c))
        try:
            async for msg in ws:
                if c.closed:
                    break
                if msg == "ping":
                    c.queue.put_nowait("pong")
                    continue
                await self._private_request(c, msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            c.closed = True
            self._conns.remove(c)
            sender.cancel()
            try:
                await sender
            except (asyncio.CancelledError, Exception):
                pass

    async def _private_sender(self, c: _PrivConn) -> None:
        while True:
            frame = await c.queue.get()
            try:
                await c.ws.send(frame, text=True)
            except websockets.ConnectionClosed:
                return

    def _ws_error(self, c: _PrivConn, code: int | str, msg: str, **extra: Any) -> None:
        c.queue.put_nowait(orjson.dumps({"event": "error", **extra, "code": code, "msg": msg}).decode())

    async def _private_request(self, c: _PrivConn, msg: str | bytes) -> None:
        try:
            req = orjson.loads(msg)
        except orjson.JSONDecodeError:
            self._ws_error(c, "30002", "Unrecognized request")
            return
        op = req.get("op") if isinstance(req, dict) else None
        args = req.get("args") if isinstance(req, dict) else None
        if op == "login":
            code, why = self._check_login(args)
            if code:
                self._ws_error(c, str(code), why, op="login")
                await asyncio.sleep(0.05)  # let the error go out, then hang up as Bitget does
                c.closed = True
                await c.ws.close(4001, "login failed")
                return
            assert isinstance(args, list)
            c.uid = self.accounts[args[0]["apiKey"]][2]
            self.logins += 1
            c.queue.put_nowait(orjson.dumps({"event": "login", "code": "0", "msg": ""}).decode())
            return
        if op not in ("subscribe", "unsubscribe"):
            self._ws_error(c, "30003", f"Invalid op: {op!r}")
            return
        if not c.uid:
            self._ws_error(c, 30004, "User not logged in", op=op)
            return
        if not isinstance(args, list) or not args:
            self._ws_error(c, 30016, "Param error", op=op)
            return
        for a in args:
            ch = a.get("channel") if isinstance(a, dict) else None
            inst = a.get("instId", "default") if isinstance(a, dict) else None
            if (
                ch not in PRIVATE_CHANNELS
                or str(a.get("instType", "")).upper() != "USDT-FUTURES"
                or not isinstance(inst, str)
                or (ch == "positions" and inst != "default")
            ):
                self._ws_error(c, 30016, "Param error", arg=a, op=op)
                continue
            if op == "subscribe":
                c.subs.add((ch, inst))
                c.queue.put_nowait(orjson.dumps({"event": "subscribe", "arg": a}).decode())
                if ch == "positions":
                    with self._lock:
                        rows = self.position_rows(c.uid, ws=True)
                    c.queue.put_nowait(encode_push("positions", rows, self.now_ns() // 1_000_000).decode())
            else:
                c.subs.discard((ch, inst))
                c.queue.put_nowait(orjson.dumps({"event": "unsubscribe", "arg": a}).decode())

    def _check_login(self, args: Any) -> tuple[int, str]:
        if not isinstance(args, list) or not args or not isinstance(args[0], dict):
            return 30016, "Param error"
        a = args[0]
        acct = self.accounts.get(str(a.get("apiKey", "")))
        if acct is None:
            return 30011, "Invalid ACCESS_KEY"
        secret, passphrase, _ = acct
        if not _same(str(a.get("passphrase", "")), passphrase):
            return 30012, "Invalid ACCESS_PASSPHRASE"
        ts = str(a.get("timestamp", ""))
        if not ts.isdigit():
            return 30013, "Invalid ACCESS_TIMESTAMP"
        now_s = self.now_ns() // 1_000_000_000
        if abs(now_s - int(ts)) > LOGIN_WINDOW_S:  # a millisecond timestamp lands here too
            return 30014, "Request timestamp expired"
        if not _same(str(a.get("sign", "")), login_sign(secret, ts)):
            return 30015, "Invalid signature"
        return 0, ""
