"""``dualhub live --dashboard [HOST:]PORT``: one web page that follows a live run, and ``/metrics`` for
Prometheus, served from a thread of the live process.

The server never touches the engine: it serves the last :class:`live.snapshot.Snapshot` that the run's
event loop published (:class:`live.snapshot.SnapshotPublisher`, every 250 ms), by loading one
reference. The one thing it can do to the run is the kill switch, handed to the loop with
``call_soon_threadsafe`` (the same :meth:`LiveRunner.request_kill` as SIGUSR1 and the kill file).

Routes: ``GET /`` the page; ``GET /assets/NAME`` its script, style and the bundled uPlot (MIT, its
licence beside it; nothing is fetched from elsewhere); ``GET /api/state`` the snapshot as JSON;
``GET /metrics`` Prometheus' text format (``prometheus-client``, a collector over the snapshot);
``POST /api/kill`` the kill switch: needs the token (``Authorization: Bearer TOKEN``) and the body
``{"confirm": "KILL"}``.

Access: bound to 127.0.0.1 unless HOST says otherwise. Any address that is not loopback needs a token
(``--dashboard-token`` or ``DUALHUB_DASHBOARD_TOKEN``) and then the data routes ask for it too (the
page passes on ``?token=`` from its own URL; Prometheus: ``authorization: credentials``). The kill
switch always needs the token: started without one, the page is read-only. On loopback, a request
whose ``Host`` is not a loopback name is refused (a web page elsewhere cannot read the run through a
DNS name rebound to 127.0.0.1). The token is compared in constant time and never logged or echoed.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, urlsplit

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from engine.errors import DualhubError, os_error_text
from live.snapshot import PUBLISH_EVERY_S, Snapshot, SnapshotPublisher

if TYPE_CHECKING:
    import asyncio

    from live.runner import LiveRunner

log = logging.getLogger(__name__)

ENV_TOKEN: Final = "DUALHUB_DASHBOARD_TOKEN"
DEFAULT_HOST: Final = "127.0.0.1"
KILL_CONFIRM: Final = "KILL"
KILL_SOURCE: Final = "dashboard"
_ASSETS: Final = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
}
_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})


def parse_address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` (``[::1]:PORT`` for an IPv6 host) as ``(host, port)``; host defaults to 127.0.0.1."""
    s = text.strip()
    if s.startswith("["):
        host, close, rest = s[1:].partition("]")
        if not close or not rest.startswith(":"):
            raise DualhubError(f"--dashboard {text!r}: an IPv6 host is written [HOST]:PORT")
        port_text = rest[1:]
    elif ":" in s:
        host, _, port_text = s.rpartition(":")
    else:
        host, port_text = DEFAULT_HOST, s
    if not host:
        raise DualhubError(f"--dashboard {text!r}: empty host (give PORT alone for 127.0.0.1)")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise DualhubError(f"--dashboard {text!r}: the port must be a number 0..65535 (0: any free one)")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: only "localhost" is known to stay on this machine
        return False


class SnapshotCollector(Collector):
    """Prometheus metrics from the latest snapshot: counters are the run's totals, so they move with it."""

    def __init__(self, latest: Callable[[], Snapshot | None]) -> None:
        self.latest = latest

    def collect(self) -> Iterator[Metric]:
        snap = self.latest()
        up = GaugeMetricFamily("dualhub_live_up", "1 while the live run is running, 0 once it stops")
        if snap is None or "instruments" not in snap.data:
            up.add_metric([], 0)
            yield up
            return
        d = snap.data
        up.add_metric([], 1 if d["running"] else 0)
        yield up
        yield _gauge("dualhub_live_snapshot_seq", "snapshots published so far", d["seq"])
        yield _gauge("dualhub_live_uptime_seconds", "seconds since the run started", d["uptime_s"])
        yield _gauge(
            "dualhub_live_kill_switch", "1 once the kill switch is engaged", int(d["kill"]["engaged"])
        )
        per_sym = {
            "position": ("dualhub_live_position", "position per instrument (contracts, signed)"),
            "pnl": ("dualhub_live_pnl_usd", "cash plus the position at the mid, net of fees, per instrument"),
            "fees": ("dualhub_live_fees_usd", "fees paid per instrument"),
            "open_orders": ("dualhub_live_open_orders", "orders sent and not finished, per instrument"),
            "kev_queue": ("dualhub_live_kev_queue_depth", "Kev requests waiting, per instrument"),
            "kev_in_flight": ("dualhub_live_kev_in_flight", "Kev requests asked and not answered"),
        }
        for key, (name, doc) in per_sym.items():
            g = GaugeMetricFamily(name, doc, labels=["symbol"])
            for sym, inst in d["instruments"].items():
                g.add_metric([sym], float(inst[key]))
            yield g
        pf = d["portfolio"]
        yield _gauge("dualhub_live_portfolio_pnl_usd", "every instrument's PnL summed", pf["pnl"])
        yield _gauge("dualhub_live_portfolio_gross_usd", "sum of |position x mid|", pf["gross_usd"])
        ev = CounterMetricFamily(
            "dualhub_live_events", "events the engine logged, by stream", labels=["stream"]
        )
        for stream, n in d["counts"].items():
            ev.add_metric([stream], n)
        yield ev
        feed = d["feed"]
        yield _counter("dualhub_live_frames", "public frames received", feed["frames"])
        yield _counter("dualhub_live_books", "books15 snapshots the engine saw", feed["books"])
        yield _counter("dualhub_live_quarantined", "inputs kept from the engine", feed["quarantined"])
        risk = d["risk"]
        yield _counter("dualhub_live_risk_decisions", "orders the risk gateway decided on", risk["decisions"])
        ref = CounterMetricFamily("dualhub_live_risk_refusals", "orders refused, by rule", labels=["rule"])
        for rule, n in risk["by_rule"].items():
            ref.add_metric([rule], n)
        yield ref
        yield _gauge(
            "dualhub_live_label_rate", "Laya labels per second (last 2 s)", d["labels"]["rate_per_s"]
        )
        kev = d["kev"]
        yield _counter("dualhub_live_kev_answers", "Kev answers received", kev["answers"])
        if kev["lag_ms"]["last"] is not None:
            yield _gauge(
                "dualhub_live_kev_lag_seconds", "the last Kev answer's lag", kev["lag_ms"]["last"] / 1e3
            )
        h = d["tick_to_order_hist"]
        buckets, acc = [], 0
        for bound, n in zip([*h["bounds_s"], float("inf")], h["counts"], strict=True):
            acc += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), acc))
        hist = HistogramMetricFamily(
            "dualhub_live_tick_to_order_seconds", "frame receipt to order sent", buckets=buckets,
            sum_value=h["sum_s"],
        )  # fmt: skip
        yield hist
        q = GaugeMetricFamily(
            "dualhub_live_tick_to_order_quantile_seconds",
            "tick-to-order percentiles over the last 2048 orders",
            labels=["quantile"],
        )
        for key, label in (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99")):
            v = d["tick_to_order_us"][key]
            if v is not None:
                q.add_metric([label], v / 1e6)
        yield q
        link = GaugeMetricFamily(
            "dualhub_live_venue_link", "1 for each link's current state", labels=["link", "state"]
        )
        for name, info in d["venue"].items():
            link.add_metric([name, info["state"]], 1)
        yield link


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))


class Dashboard:
    """The dashboard's server, bound at construction (a busy port is one clear error before the run
    starts); :meth:`start` (from the run's loop) attaches it to a runner; :meth:`close` stops it."""

    def __init__(self, address: str, token: str = "", *, every_s: float = PUBLISH_EVERY_S) -> None:
        self.host, port = parse_address(address)
        self.token = token
        self.every_s = every_s
        self.public = not is_loopback(self.host)
        if self.public and not token:
            raise DualhubError(
                f"--dashboard {address}: {self.host} is not a loopback address; serving the run there "
                f"needs a token (--dashboard-token or {ENV_TOKEN})"
            )
        files = resources.files("live") / "dashboard_assets"
        self.assets = {name: (files.joinpath(name).read_bytes(), kind) for name, kind in _ASSETS.items()}
        self.publisher: SnapshotPublisher | None = None
        self._kill: Callable[[], object] | None = None
        self._metrics: tuple[int, bytes] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(self.latest))
        try:
            self.server = _Server((self.host, port), _Handler)
        except OSError as e:
            raise DualhubError(f"--dashboard {address}: cannot listen there: {os_error_text(e)}") from None
        self.server.dash = self
        self.port = int(self.server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def latest(self) -> Snapshot | None:
        p = self.publisher
        return None if p is None else p.latest

    def start(self, runner: LiveRunner) -> Coroutine[Any, Any, None]:
        """Called on the run's event loop: serve from now on; returns the publisher's task body."""
        import asyncio

        loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self.publisher = SnapshotPublisher(runner, self.every_s)
        self.publisher.publish()  # the page has something to show from its first request
        self._kill = lambda: loop.call_soon_threadsafe(runner.request_kill, KILL_SOURCE)
        self.serve()
        return self.publisher.run()

    def serve(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, name="dashboard", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(5.0)
            self._thread = None
        self.server.server_close()

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ requests (server threads)

    def metrics(self) -> bytes:
        """The Prometheus text of the latest snapshot, made once per snapshot however many scrape it."""
        snap = self.latest()
        seq = -1 if snap is None else snap.seq
        cached = self._metrics
        if cached is None or cached[0] != seq:
            cached = self._metrics = (seq, generate_latest(self.registry))
        return cached[1]

    def token_ok(self, given: str) -> bool:
        return bool(self.token) and hmac.compare_digest(given.encode(), self.token.encode())

    def kill(self) -> tuple[int, dict[str, str]]:
        if self._kill is None:
            return 409, {"error": "the run has not started"}
        try:
            self._kill()
        except RuntimeError:  # the run's loop is closed: the run is over
            return 409, {"error": "the run is over"}
        log.warning("kill switch requested from the dashboard")
        return 202, {"kill": "requested"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    dash: Dashboard

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-answer is ordinary (a closed tab); anything else is one line, no traceback."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError | TimeoutError):
            log.error("dashboard request failed: %s: %s", type(exc).__name__, str(exc)[:200])


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "dualhub-dashboard"
    sys_version = ""
    # keep-alive: a page polling twice a second reuses one connection (and one thread) instead of a
    # new one per request; an idle connection is dropped after `timeout` seconds
    protocol_version = "HTTP/1.1"
    timeout = 30

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # a request line may carry ?token=: nothing of it is written anywhere

    def _send(self, code: int, body: bytes, kind: str, *, cacheable: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=300" if cacheable else "no-store")
        self.send_header("Content-Security-Policy", _CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, orjson.dumps(obj), "application/json")

    def _given_token(self, query: dict[str, list[str]]) -> str:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[7:].strip()
        return (query.get("token") or [""])[0]

    def _host_ok(self) -> bool:
        """On a loopback bind: the Host header names this machine (DNS rebinding)."""
        if self.server.dash.public:
            return True
        host = self.headers.get("Host", "")
        name = host[1:].partition("]")[0] if host.startswith("[") else host.rpartition(":")[0] or host
        return name in _LOOPBACK_NAMES or name == self.server.dash.host

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        dash = self.server.dash
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if not self._host_ok():
            return self._json(403, {"error": "Host is not this machine"})
        path = url.path
        if path in ("/", "/index.html"):
            body, kind = dash.assets["index.html"]
            return self._send(200, body, kind)
        if path.startswith("/assets/"):
            asset = dash.assets.get(path[len("/assets/") :])
            if asset is None:
                return self._json(404, {"error": "no such asset"})
            return self._send(200, asset[0], asset[1], cacheable=True)
        if path not in ("/api/state", "/metrics"):
            return self._json(404, {"error": "not found"})
        if dash.public and not dash.token_ok(self._given_token(query)):
            return self._json(403, {"error": "token required"})
        if path == "/metrics":
            return self._send(200, dash.metrics(), CONTENT_TYPE_LATEST)
        snap = dash.latest()
        if snap is None:
            return self._json(503, {"error": "the run has not started"})
        return self._send(200, snap.body, "application/json")

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        dash = self.server.dash
        url = urlsplit(self.path)
        if not self._host_ok():
            return self._json(403, {"error": "Host is not this machine"})
        if url.path != "/api/kill":
            return self._json(404, {"error": "not found"})
        n = int(self.headers.get("Content-Length") or 0)
        if n > 4096:  # unread, it would be taken for the next request on this connection
            self.close_connection = True
            return self._json(413, {"error": "the body is too large"})
        body = self.rfile.read(n) if n > 0 else b""
        if not dash.token:
            return self._json(403, {"error": "the kill switch needs the dashboard started with a token"})
        if not dash.token_ok(self._given_token({})):  # a header only: never a token in a POST's URL
            return self._json(403, {"error": "wrong or missing token"})
        try:
            confirm = orjson.loads(body).get("confirm") if body else None
        except (orjson.JSONDecodeError, AttributeError):
            confirm = None
        if confirm != KILL_CONFIRM:
            return self._json(400, {"error": f'confirm with the body {{"confirm": "{KILL_CONFIRM}"}}'})
        code, obj = dash.kill()
        return self._json(code, obj)
