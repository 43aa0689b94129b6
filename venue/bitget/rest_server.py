"""A local REST server speaking Bitget's v2 protocol (USDT-M), public endpoints for now.

The peer for ``dualhub doctor`` and tests, and the base the signed order endpoints will extend. It binds
127.0.0.1 (port 0 picks a free port; :attr:`BitgetRestServer.url` reports it) and answers in Bitget's
envelope (``../shared/docs/bitget-v2.md`` section 4)::

    {"code": "00000", "msg": "success", "requestTime": 1695806875837, "data": ...}

Errors carry a code other than ``"00000"`` and ``data: null``. Implemented:

- ``GET /api/v2/public/time`` -> ``data.serverTime`` (a string, ms);
- ``GET /api/v2/mix/market/contracts?productType=usdt-futures[&symbol=]`` -> contract rows.

The server's clock is ``clock_ms()`` (wall clock by default) plus :attr:`BitgetRestServer.clock_offset_ms`,
which tests set to simulate a skewed exchange clock. Routes live in a table, ``(method, path) ->
handler``; a handler takes a :class:`Request` and returns a :class:`Response` built with :func:`ok` or
:func:`error`. :meth:`BitgetRestServer.add_route` adds more (the signed endpoints will).

Divergences from the venue (not verified against it): an unknown path answers HTTP 404 with code
``"40404"`` "Request URL NOT FOUND"; a missing required parameter answers HTTP 400 with 40019 and a wrong
one 40017 (the doc's "parameter cannot be empty" and "parameter verification failed"); an unlisted
symbol returns an empty list.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import orjson

from engine.contract import ContractConfig

SUCCESS: Final = "00000"
PRODUCT_TYPES: Final = ("usdt-futures",)  # USDT-M only; Bitget also accepts it upper-case
CODE_NOT_FOUND: Final = "40404"
CODE_PARAM_EMPTY: Final = "40019"
CODE_PARAM_INVALID: Final = "40017"
REQUEST_TIME_FORMS: Final = ("number", "string")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]  # first value of each parameter, as sent
    headers: Mapping[str, str]
    body: bytes
    ts_ms: int  # the server's (possibly skewed) clock when the request arrived
    query_string: str = ""  # the raw query as sent (what a signature covers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    status: int
    body: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]


def ok(data: Any, ts_ms: int) -> Response:
    """A success envelope around ``data``."""
    return Response(status=200, body={"code": SUCCESS, "msg": "success", "requestTime": ts_ms, "data": data})


def error(code: str, msg: str, ts_ms: int, *, status: int = 400) -> Response:
    """An error envelope: Bitget's ``code`` (a string), its message and ``data: null``."""
    return Response(status=status, body={"code": code, "msg": msg, "requestTime": ts_ms, "data": None})


def plain_decimal(x: float | Decimal) -> str:
    """A decimal string without exponent or trailing zeros (0.0010 -> "0.001", 1E+1 -> "10")."""
    d = Decimal(str(x)).normalize()
    return format(d, "f")


def contract_row(cfg: ContractConfig, **overrides: Any) -> dict[str, Any]:
    """A ``/api/v2/mix/market/contracts`` row for the engine's contract config (the doc's field set).

    Price tick = ``priceEndStep`` x 10^-``pricePlace``; size step = ``sizeMultiplier``.
    """
    tick = Decimal(str(cfg.tick)).normalize()
    price_place = max(0, -tick.as_tuple().exponent)  # type: ignore[operator]
    step = Decimal(str(cfg.size_step)).normalize()
    volume_place = max(0, -step.as_tuple().exponent)  # type: ignore[operator]
    base = cfg.symbol.removesuffix("USDT")
    row: dict[str, Any] = {
        "symbol": cfg.symbol,
        "baseCoin": base,
        "quoteCoin": "USDT",
        "makerFeeRate": plain_decimal(cfg.maker_fee_rate),
        "takerFeeRate": plain_decimal(cfg.taker_fee_rate),
        "supportMarginCoins": ["USDT"],
        "minTradeNum": plain_decimal(cfg.min_qty),
        "priceEndStep": plain_decimal(tick.scaleb(price_place)),
        "volumePlace": str(volume_place),
        "pricePlace": str(price_place),
        "sizeMultiplier": plain_decimal(step),
        "symbolType": "perpetual",
        "minTradeUSDT": "5",
        "symbolStatus": "normal",
        "minLever": "1",
        "maxLever": "125",
    }
    row.update(overrides)
    return row


class BitgetRestServer:
    """``with BitgetRestServer(clock_offset_ms=5000) as srv: srv.url`` -> a skewed local Bitget.

    ``contracts``: the rows ``/api/v2/mix/market/contracts`` serves (default: the engine's BTCUSDT).
    ``clock_ms``: the server's time source before the offset. ``request_time``: the envelope's
    ``requestTime`` as a JSON ``"number"`` or a ``"string"`` (Bitget's doc pages show both). Every
    request is appended to :attr:`requests` (method, path, query) for tests.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock_offset_ms: int = 0,
        contracts: Iterable[Mapping[str, Any]] | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        request_time: str = "number",
    ) -> None:
        if request_time not in REQUEST_TIME_FORMS:
            raise ValueError(f"request_time is one of {REQUEST_TIME_FORMS}, got {request_time!r}")
        self.request_time = request_time
        self.host = host
        self._port = port
        self.clock_offset_ms = clock_offset_ms
        self._clock_ms = clock_ms
        self.contracts: list[dict[str, Any]] = [
            dict(r) for r in (contracts if contracts is not None else [contract_row(ContractConfig())])
        ]
        self.routes: dict[tuple[str, str], Handler] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.add_route("GET", "/api/v2/public/time", self._time)
        self.add_route("GET", "/api/v2/mix/market/contracts", self._contracts)

    # -- clock and routes --------------------------------------------------------------------------

    def now_ms(self) -> int:
        return self._clock_ms() + self.clock_offset_ms

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        self.routes[(method.upper(), path)] = handler

    def _time(self, req: Request) -> Response:
        return ok({"serverTime": str(req.ts_ms)}, req.ts_ms)

    def _contracts(self, req: Request) -> Response:
        product = req.query.get("productType")
        if not product:
            return error(CODE_PARAM_EMPTY, "Parameter productType cannot be empty", req.ts_ms)
        if product.lower() not in PRODUCT_TYPES:
            return error(CODE_PARAM_INVALID, f"Parameter productType error: {product}", req.ts_ms)
        symbol = req.query.get("symbol")
        rows = [r for r in self.contracts if symbol is None or r["symbol"] == symbol]
        return ok(rows, req.ts_ms)

    def handle(self, req: Request) -> Response:
        """Route one request (also callable without HTTP, for unit tests)."""
        with self._lock:
            self.requests.append((req.method, req.path, dict(req.query)))
        handler = self.routes.get((req.method, req.path))
        if handler is None:
            resp = error(CODE_NOT_FOUND, "Request URL NOT FOUND", req.ts_ms, status=404)
        else:
            resp = handler(req)
        if self.request_time == "string" and isinstance(resp.body.get("requestTime"), int):
            body = {**resp.body, "requestTime": str(resp.body["requestTime"])}
            resp = Response(status=resp.status, body=body, headers=resp.headers)
        return resp

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> BitgetRestServer:
        if self._httpd is not None:
            return self
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                ts_ms = server.now_ms()
                parts = urlsplit(self.path)
                length = self.headers.get("Content-Length") or "0"
                if not (length.isascii() and length.isdigit()):  # a reply, not a dead handler thread
                    self.close_connection = True
                    resp = error(CODE_PARAM_INVALID, "Bad Content-Length", ts_ms)
                else:
                    body = self.rfile.read(int(length)) if int(length) > 0 else b""
                    query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                    req = Request(
                        method=self.command,
                        path=parts.path,
                        query=query,
                        headers={k: v for k, v in self.headers.items()},
                        body=body,
                        ts_ms=ts_ms,
                        query_string=parts.query,
                    )
                    resp = server.handle(req)
                payload = orjson.dumps(resp.body)
                self.send_response(resp.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in resp.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _serve
            do_POST = _serve
            do_DELETE = _serve
            do_PUT = _serve

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                pass  # requests are kept in server.requests; no stderr noise

        httpd = ThreadingHTTPServer((self.host, self._port), _Handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="bitget-rest", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> BitgetRestServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
