"""The settings of a live run (:class:`LiveConfig`, never the keys), where it connects
(:func:`endpoints`), the keys from the environment (:func:`credentials_from_env`), and the names of the
files a live session holds beside the recorder's."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from engine.bounds import check_count, check_ms, check_seconds
from engine.errors import DualhubError
from engine.laya.model import DEFAULT_MODEL
from engine.settings import EngineSettings
from engine.strategies import plugin
from live.watchdog import DEFAULT_TIMEOUT_S as WATCHDOG_S
from venue.fills import check_fill_model
from wire.bitget.bitget_v2 import REST_BASE_URL
from wire.bitget.bitget_v2_rest import Credentials

LIVE_JSON = "live.json"
KILL_FILE = "KILL"
MODES = ("paper", "live")
PORTFOLIO_RUN = "live-portfolio"  # the run of several symbols traded as one engine


@dataclass(frozen=True, kw_only=True)
class LiveConfig(EngineSettings):
    """Everything a live run needs (never the keys): the engine's settings (engine/settings.py), where
    it connects, and how it is kept and watched. Its sha256 goes into the manifests."""

    out: str
    symbols: tuple[str, ...] = ("BTCUSDT",)
    mode: str = "paper"  # "paper": simulated fills on the live book; "live": real orders
    exchange_url: str = REST_BASE_URL  # REST base of any Bitget-protocol endpoint
    ws_url: str = ""  # WebSocket base; "" derives it from exchange_url (see endpoints())
    duration_s: float | None = None
    model_path: str = str(DEFAULT_MODEL)
    laya_provider: str = "auto"
    # after each frame's work, re-run the label path on it (results discarded) so the next frame finds
    # it in the CPU caches (live/tick.py); the order decision path too (Engine.keep_warm). Figures:
    # bench/bench_tick_path.py and bench/HISTORY.md
    tick_keep_warm: bool = True
    # the cyclic GC runs between frames (CPython's thresholds), never inside a label (live/gc_policy.py)
    gc_at_idle: bool = True
    # never sleep the loop, re-warm the label path every busy_poll_warm_us (costs a core; see busy_poll)
    busy_poll: bool = False
    busy_poll_warm_us: int = 20
    fill_model: str = "touch"  # paper execution: the replay fill model
    # llama-server's client runs in its own process (engine/kev/process.py), so its HTTP and JSON work
    # never evicts the tick path from this core's caches; False keeps it on the event loop
    kev_process: bool = True
    contract_defaults: bool = False  # paper: skip the contracts request, use ContractConfig defaults
    kill_file: str = ""  # "" = <out>/KILL
    flush_interval_ms: int = 200
    # the run's write-ahead journal (live/wal.py): fsynced by a background thread this often when
    # something was written (group commit); 0: fsync inside every commit, on the loop
    wal_fsync_ms: int = 50
    drain_timeout_s: float = 5.0
    feed_silence_s: float = 30.0
    # live mode: compare the venue with the engine every reconcile_every_s (0: only after a private
    # reconnect), leaving alone orders the venue changed in the last reconcile_settle_ms
    reconcile_every_s: float = 30.0
    reconcile_settle_ms: int = 3000
    ping_interval_s: float = 25.0
    # the venue watch: a link down, or no market data for feed_stale_s, is a WARNING and a venue_status
    # event at once; a link not up for venue_lost_s ends the run (live: the kill switch), exit 1
    feed_stale_s: float = 3.0
    venue_lost_s: float = 20.0
    status_every_s: float = 10.0  # a status line this often (0: none)
    kill_flattens: bool = False  # the kill switch also closes positions: reduce-only market orders
    # live mode: a process of its own cancel-alls the venue when the engine's heartbeat stops this long
    # or the engine dies (kill -9); 0: none (live/watchdog.py). Paper orders never reach a venue: none
    watchdog_s: float = WATCHDOG_S

    def __post_init__(self) -> None:
        if not self.symbols:
            raise DualhubError("no symbols to trade")
        EngineSettings.check(self)
        if self.mode not in MODES:
            raise DualhubError(f"mode must be one of {MODES}, not {self.mode!r}")
        check_fill_model(self.fill_model)
        if self.duration_s is not None and self.duration_s <= 0:
            raise DualhubError("duration_s must be > 0")
        if not (self.feed_stale_s > 0 and self.venue_lost_s > 0 and self.status_every_s >= 0):
            raise DualhubError("feed_stale_s and venue_lost_s must be > 0, status_every_s >= 0")
        if self.duration_s is not None:
            check_seconds(self.duration_s, "duration_s")
        for name in ("feed_stale_s", "venue_lost_s", "drain_timeout_s", "feed_silence_s"):
            check_seconds(getattr(self, name), name)
        for name in ("reconcile_every_s", "ping_interval_s"):
            check_seconds(getattr(self, name), name)
        check_seconds(self.status_every_s, "status_every_s", zero=True)
        check_seconds(self.watchdog_s, "watchdog_s", zero=True)
        check_ms(self.flush_interval_ms, "flush_interval_ms")
        check_ms(self.wal_fsync_ms, "wal_fsync_ms", zero=True)
        check_ms(self.reconcile_settle_ms, "reconcile_settle_ms", zero=True)
        check_count(self.busy_poll_warm_us, "busy_poll_warm_us")
        if self.kev_hub == "llm" and not self.kev_url:
            raise DualhubError("kev_hub 'llm' asks llama-server: give its kev_url")

    @property
    def portfolio(self) -> bool:
        """Several symbols: one engine over them all (one risk gateway, one event log)."""
        return len(self.symbols) > 1

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if plugin.is_spec(self.strategy):  # which source traded
            d["strategy_sha256"] = plugin.source_sha256(self.strategy)
        return orjson.loads(orjson.dumps(d, default=str))

    def sha256(self) -> str:
        return hashlib.sha256(orjson.dumps(self.to_json(), option=orjson.OPT_SORT_KEYS)).hexdigest()


def endpoints(exchange_url: str, ws_url: str = "") -> tuple[str, str, str]:
    """``(rest, public WS, private WS)``. The WS base is ``ws_url`` when given; for Bitget's REST host
    it is ``wss://ws.bitget.com``; otherwise the same host on the REST port + 1 (``dualhub
    serve-exchange --port P`` serves REST on P and both WebSockets on P + 1)."""
    rest = exchange_url.rstrip("/")
    if ws_url:
        base = ws_url.rstrip("/")
        for suffix in ("/v2/ws/public", "/v2/ws/private"):
            base = base.removesuffix(suffix)
    else:
        u = urlsplit(rest)
        if u.hostname is None or u.scheme not in ("http", "https"):
            raise DualhubError(f"exchange URL must be http(s)://host[:port], got {exchange_url!r}")
        scheme = "wss" if u.scheme == "https" else "ws"
        if u.hostname == "api.bitget.com":
            base = "wss://ws.bitget.com"
        elif u.port is not None:
            base = f"{scheme}://{u.hostname}:{u.port + 1}"
        else:
            raise DualhubError(f"cannot derive the WebSocket URL from {exchange_url!r}: pass --ws-url")
    return rest, base + "/v2/ws/public", base + "/v2/ws/private"


def credentials_from_env(env: os._Environ[str] | dict[str, str] | None = None) -> Credentials | None:
    """``BITGET_API_KEY``, ``BITGET_API_SECRET`` (or ``BITGET_SECRET``), ``BITGET_API_PASSPHRASE`` (or
    ``BITGET_PASSPHRASE``); None unless all three are set."""
    e = os.environ if env is None else env
    key = e.get("BITGET_API_KEY", "")
    secret = e.get("BITGET_API_SECRET", "") or e.get("BITGET_SECRET", "")
    passphrase = e.get("BITGET_API_PASSPHRASE", "") or e.get("BITGET_PASSPHRASE", "")
    if not (key and secret and passphrase):
        return None
    return Credentials(key, secret, passphrase)
