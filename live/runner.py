"""``dualhub live``: the replay engine on a real-time clock, trading on paper or through Bitget.

One asyncio loop runs everything; nothing on the tick path waits for Kev or the network:

- **public feed**: the shared :class:`~wire.connection.Connection` (reconnect, keepalive,
  rate limits, gaps) journals every frame raw first, then hands it to :meth:`LiveRunner.deliver`, which
  decodes it with the shared codec and schedules ``exchange.on_book``/``engine.on_book`` (priorities
  5/10, trades 6/20, as replay merges them) at the frame's receive stamp, then dispatches at once: the
  label is computed inline and scheduled at ``receipt + measured compute time``;
- **the clock** (:class:`~live.clock.LiveClock`): every input is stamped and pushed on the timer
  heap, the heap is run in key order and each entry runs *at its own timestamp*; a pump task runs
  timers as they fall due;
- **Kev** (:class:`LiveKevBackend`): ``advisor.advise`` runs as an asyncio task; its reply is stamped
  when it returns and delivered at that time (priority 52), ``lag = stamp - request``. llama-server's
  client runs in its own process (:mod:`engine.kev.process`; ``kev_process``), so the loop's share of
  a request is a pipe write and a read. The advisor is
  wrapped in a :class:`~engine.kev.cassette.RecordingAdvisor`, so the run's ``kev_response`` events
  are a cassette;
- **execution**: ``paper`` is :class:`venue.exchange.SimExchange` (the replay fill model) on the
  live clock, fed the live book at receipt; ``live`` is
  :class:`~live.gateway.GatewayExecution` (Bitget REST + private WebSocket, reconciliation after
  every reconnect);
- **recording**: market data goes into a session exactly as ``dualhub record`` writes one (journal,
  then the recorder's normaliser, so ``dualhub recover`` finishes a crashed run); the engine's events
  into ``<out>/runs/live-<SYMBOL>/`` with every delay the run observed (``latency_recorded.parquet``)
  and the Kev cassette. :func:`replay.parity.replay_config_for` gives the replay config that
  reproduces the run.

Safety: a kill switch (SIGUSR1, the kill file ``<out>/KILL`` that ``dualhub kill`` writes, or
:meth:`LiveRunner.request_kill`) stops new orders, cancels working ones through the engine and
cancel-alls at the venue (with ``kill_flattens``, reduce-only market orders close the positions first);
SIGINT/SIGTERM, ``duration_s`` or a crash stop the run, and the venue is always cancel-all'ed on the way
out (``left_open``: what is still open there, or in words why that is unknown). The venue watch
(:mod:`live.health`) warns within a fraction of a second when a link drops (``feed_stale_s`` when the
feed only goes silent), writes ``venue_status`` events, prints a status line every ``status_every_s``,
and ends the run, exit 1, when a link stays out for ``venue_lost_s``. What no exit of this process can do
after ``kill -9``, the order watchdog (:mod:`live.watchdog`, live mode, ``watchdog_s``) does from a
process of its own: it cancel-alls the venue when the engine dies or its heartbeat stops. Keys come
only from the caller (the CLI reads the environment); nothing written or logged here contains them.

Layering: ``live/`` is an application package beside ``replay/`` and ``recorder/``; it uses the
wire code the recorder uses (``wire/``: connection and journal), the recorder's session writer and
the venue simulation replay uses (``venue/``: the simulated exchange in paper mode) rather than
copies, and imports nothing of ``replay/`` (``tests/test_layout.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import logging
import math
import os
import random
import shutil
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import orjson

from engine.bounds import check_count, check_engine_settings, check_ms, check_seconds
from engine.contract import ContractConfig
from engine.core import PRIO_KEV, Engine, EngineConfig, KevDone, engine_config_from, engine_identity
from engine.errors import DualhubError
from engine.eventlog import RUN_SCHEMA_VERSION, EventLog
from engine.events import (
    BookSnapshot,
    InputQuarantined,
    Quarantined,
    ReconcileEvent,
    Trade,
    VenueStatus,
    events_to_table,
)
from engine.instruments import SIZE_FIELDS, Portfolio, checked_instruments, resolve_instruments
from engine.kev.advisor import KevAdvisor, KevContext, KevReply
from engine.kev.cassette import CASSETTE_FILE, Cassette, CassetteEntry, RecordingAdvisor
from engine.kev.health import answer_times_ns, run_health
from engine.kev.pairs import RulePairsKev
from engine.kev.queue import POLICIES
from engine.kev.rules import RuleKev
from engine.laya.model import DEFAULT_MODEL, Laya, LayaConfig  # DEFAULT_MODEL: re-exported for the CLI
from engine.risk import RiskLimits
from engine.store import MANIFEST, atomic_write_parquet, open_session, sha256_file, write_json
from engine.strategies import plugin
from engine.strategies.registry import resolve as resolve_strategy
from engine.strategy import QuoteConfig
from engine.validate import WireLimits, book_reason, top_ok, trade_ok, trade_reason
from engine.venues.bitget_v2 import INST_TYPE, REST_BASE_URL, StreamCounters, arg, wire_guard
from engine.venues.bitget_v2_rest import BitgetError, ContractSpec, Credentials
from live.clock import LiveClock
from live.gateway import BitgetGateway, GatewayExecution, GatewayTransportError, reconcile_event, ticker_mids
from live.gc_policy import IdleGC
from live.health import LOST, Change, VenueHealth
from live.private_ws import PrivateConfig, PrivateStream, describe
from live.tick import TickLaya
from live.wal import WAL_FILE, JournaledLog, JournaledSink, LiveWal
from live.watchdog import DEFAULT_TIMEOUT_S as WATCHDOG_S
from live.watchdog import Watchdog
from recorder.normalise import Normaliser, discard_reason
from recorder.record import JOURNAL_DIR, RECORD_JSON, finish, new_writer, normalise_segment
from venue.exchange import SimExchange
from venue.fills import FILL_MODELS
from venue.latency import parse_latency
from venue.recorded_latency import RECORDED_FILE, LatencySink, RecordingLatency
from wire.connection import Connection, ConnectionConfig, SlidingWindow
from wire.journal import RECV, JournalWriter

log = logging.getLogger(__name__)

LIVE_JSON = "live.json"
KILL_FILE = "KILL"
# Inputs at one timestamp, as replay merges them: the exchange sees market data before the engine.
PRIO_KILL, PRIO_EXCH_BOOK, PRIO_EXCH_TRADE, PRIO_BOOK, PRIO_TRADE = 0, 5, 6, 10, 20
MODES = ("paper", "live")
PORTFOLIO_RUN = "live-portfolio"  # the run of several symbols traded as one engine
EXIT_OK, EXIT_KILLED, EXIT_FAILED = 0, 3, 1
FLATTEN_TRIES, FLATTEN_RETRY_S = 5, 0.5  # --kill-flattens: what is left is sent again, 0.5 s apart
_NO_ROWS = bytes(8 * 8)  # the core's output row counts (NOUT: 8 int64) when it holds none


@dataclass(frozen=True, kw_only=True)
class LiveConfig:
    """Everything a live run needs (never the keys). Its sha256 goes into the manifests."""

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
    latency_order_entry: str = "const:5ms"  # paper execution: modelled like replay (and recorded)
    latency_order_response: str = "const:5ms"
    latency_cancel: str = "const:5ms"
    kev_url: str = ""  # llama-server; "" = the rule advisor
    # llama-server's client runs in its own process (engine/kev/process.py), so its HTTP and JSON work
    # never evicts the tick path from this core's caches; False keeps it on the event loop
    kev_process: bool = True
    kev_queue_max: int = 2
    kev_stale_after_ms: int = 1000
    kev_advice_ttl_ms: int = 5000
    kev_min_interval_ms: int = 0
    kev_queue_policy: str = "drop_oldest"
    kev_max_in_flight: int = 1
    kev_timeout_ms: int = 2000
    risk: RiskLimits = field(default_factory=RiskLimits)
    quotes: QuoteConfig = field(default_factory=QuoteConfig)
    # how the engine quotes (engine/strategies, docs/STRATEGY.md) and that strategy's parameters
    strategy: str = "baseline"
    strategy_params: dict[str, float] = field(default_factory=dict)
    contract_defaults: bool = False  # paper: skip the contracts request, use ContractConfig defaults
    kill_file: str = ""  # "" = <out>/KILL
    seed: int = 1
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
    # per-instrument settings over the config (engine.instruments.INSTRUMENT_FIELDS); sizes not named
    # are the first symbol's scaled at the tickers' mids, as replay scales them (resolve_instruments)
    instruments: dict[str, dict[str, float]] = field(default_factory=dict)
    # Kev as the portfolio's hub (several symbols): "" (each asks on its own) or "pairs" (the pairs
    # rule answers for the portfolio, the first symbol leading the others; engine/instruments.py)
    kev_hub: str = ""
    pair_entry_z: float = 2.0
    pair_exit_z: float = 0.5
    pair_half_life_ms: int = 60_000
    # a hub command's legs: one that lags this long after another filled is hedged (engine/legs.py),
    # "cross" (a market order) or "reprice" (a limit order at the far touch, sent again each timeout)
    leg_timeout_ms: int = 1_000
    leg_hedge: str = "cross"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise DualhubError(f"mode must be one of {MODES}, not {self.mode!r}")
        if not self.symbols:
            raise DualhubError("no symbols to trade")
        if self.fill_model not in FILL_MODELS:
            raise DualhubError(f"unknown fill model {self.fill_model!r}; known: {', '.join(FILL_MODELS)}")
        if self.kev_queue_policy not in POLICIES:
            raise DualhubError(f"unknown Kev queue policy {self.kev_queue_policy!r}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise DualhubError("duration_s must be > 0")
        if not (self.feed_stale_s > 0 and self.venue_lost_s > 0 and self.status_every_s >= 0):
            raise DualhubError("feed_stale_s and venue_lost_s must be > 0, status_every_s >= 0")
        check_engine_settings(self)
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
        rng = np.random.default_rng(0)
        for name in ("latency_order_entry", "latency_order_response", "latency_cancel"):
            try:
                parse_latency(getattr(self, name), rng)
            except ValueError as e:
                raise DualhubError(f"{name}: {e}") from None
        object.__setattr__(self, "strategy", plugin.canonical(self.strategy))
        resolve_strategy(self.strategy, self.strategy_params, self.quotes)
        object.__setattr__(self, "instruments", checked_instruments(self.instruments))
        if len(set(self.symbols)) != len(self.symbols):
            raise DualhubError(f"a symbol is given twice in {','.join(self.symbols)}")
        if self.kev_hub not in ("", "pairs", "llm"):
            raise DualhubError(f"kev_hub must be '', 'pairs' or 'llm', not {self.kev_hub!r}")
        if self.kev_hub == "llm" and not self.kev_url:
            raise DualhubError("kev_hub 'llm' asks llama-server: give its kev_url")
        if self.kev_hub and len(self.symbols) < 2:
            raise DualhubError("Kev as the portfolio hub needs a portfolio: give two symbols or more")
        if not (0 <= self.pair_exit_z < self.pair_entry_z and self.pair_half_life_ms > 0):
            raise DualhubError("pairs: need 0 <= pair_exit_z < pair_entry_z and pair_half_life_ms > 0")

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


class LiveKevBackend:
    """Kev off the tick path: ``advise`` runs as a task; the reply is delivered when it returns.

    Every answer is also kept as a cassette entry with the lag the engine saw (``stamp - request``),
    in request order, late ones (after the engine's timeout) included: replayed, a late answer is
    late again, at the same time.
    """

    def __init__(self, advisor: RecordingAdvisor, runner: LiveRunner, sink: LatencySink) -> None:
        self.advisor = advisor
        self.runner = runner
        self.sink = sink
        self.wal: LiveWal | None = None  # every answer is journaled before the engine hears it
        self._slots: list[CassetteEntry | None] = []  # one per request, in request order

    def start(self, ctx: KevContext, now_ns: int, done: KevDone) -> None:
        task = asyncio.get_running_loop().create_task(self.advisor.advise(ctx))
        self.runner.kev_tasks.add(task)
        self._slots.append(None)
        task.add_done_callback(partial(self._finished, ctx, now_ns, done, len(self._slots) - 1))

    def _finished(
        self, ctx: KevContext, started: int, done: KevDone, slot: int, task: asyncio.Task[KevReply]
    ) -> None:
        self.runner.kev_tasks.discard(task)
        if task.cancelled():
            if not self.runner.stopping:
                return
            # Given up on at shutdown: on the record as an answer that never came, so that a replay
            # of the run (this cassette) sees the same thing at the same time.
            reply = KevReply(raw=None, error="no answer: the run stopped first", key=self.advisor.key(ctx))
        elif (exc := task.exception()) is not None:
            reply = KevReply(raw=None, error=f"kev failed: {type(exc).__name__}", key=self.advisor.key(ctx))
        else:
            reply = task.result()
        t = self.runner.clock.stamp()
        lag = t - started
        self.sink.add("kev", started, lag)
        key = reply.key or self.advisor.key(ctx)
        entry = self._slots[slot] = CassetteEntry.from_reply(
            key, reply, lag_ns=lag, request_id=ctx.request_id, advisor=self.advisor.name
        )
        if self.wal is not None:
            self.wal.cassette(slot, entry)
        self.runner.inject(PRIO_KEV, partial(done, ctx, reply, lag), ts=t)

    def cassette(self) -> Cassette:
        cas = Cassette(meta={"recorded_by": "dualhub live", "lag": "engine-observed"})
        for e in self._slots:
            if e is not None:
                cas.add(e)
        return cas


class _GatedJournal:
    """The journal, closed to received frames once the feed stops: the session holds exactly the
    frames the engine saw."""

    def __init__(self, inner: JournalWriter) -> None:
        self.inner = inner
        self.open = True

    def append(self, ts_recv_ns: int, conn_id: int, payload: bytes, kind: int = RECV) -> None:
        if kind == RECV and not self.open:
            return
        self.inner.append(ts_recv_ns, conn_id, payload, kind)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _FeedConnection(Connection):
    """The shared wire connection, also handing every frame (after the journal) to the runner, and
    every journal note (connect, disconnect, failed connect) to ``on_meta``."""

    def __init__(
        self,
        *args: Any,
        deliver: Callable[[bytes, int], None],
        on_meta: Callable[[dict[str, Any]], None],
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self._deliver = deliver
        self._on_meta = on_meta

    def _inspect(self, raw: bytes, ts: int) -> None:
        super()._inspect(raw, ts)
        self._deliver(raw, ts)

    def _meta(self, obj: dict[str, Any], ts_ns: int | None = None) -> None:
        super()._meta(obj, ts_ns)
        self._on_meta(obj)


@dataclass
class _Symbol:
    symbol: str
    contract: ContractConfig
    run_dir: Path
    tmp: Path
    log: EventLog
    sink: LatencySink
    advisor: RecordingAdvisor
    kev: LiveKevBackend
    engine: Engine
    paper: SimExchange | None
    reconcile: list[ReconcileEvent] = field(default_factory=list)
    venue: list[VenueStatus] = field(default_factory=list)
    quarantine: list[InputQuarantined] = field(default_factory=list)  # decoded events kept from the engine
    wal: LiveWal | None = None  # the run's write-ahead journal (live/wal.py)


@dataclass(frozen=True)
class LiveResult:
    session_dir: Path
    run_dirs: dict[str, Path]
    stopped_by: str
    killed: str
    exit_code: int
    counts: dict[str, dict[str, int]]
    summary: dict[str, Any]


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


class LiveRunner:
    def __init__(
        self,
        cfg: LiveConfig,
        *,
        credentials: Credentials | None = None,
        advisor: KevAdvisor | None = None,
        install_signals: bool = False,
        status: Callable[[str], None] | None = None,
        dashboard: Any = None,
    ) -> None:
        """``status``: where the status line goes every ``status_every_s`` (default: INFO log).
        ``dashboard``: a bound :class:`live.dashboard.Dashboard` (its owner closes it), fed snapshots."""
        if cfg.mode == "live" and credentials is None:
            raise DualhubError(
                "live mode needs API keys (BITGET_API_KEY, BITGET_API_SECRET, BITGET_API_PASSPHRASE)"
            )
        self.cfg = cfg
        self._creds = credentials if cfg.mode == "live" else None
        self._inner_advisor = advisor
        self.install_signals = install_signals
        self.root = Path(cfg.out)
        self.rest_url, self.public_url, self.private_url = endpoints(cfg.exchange_url, cfg.ws_url)
        self.kill_file = Path(cfg.kill_file) if cfg.kill_file else self.root / KILL_FILE
        self.clock = LiveClock()
        self.counters = StreamCounters()
        self.syms: dict[str, _Symbol] = {}
        self.portfolio: Portfolio | None = None  # several symbols: the one engine over them (_build)
        self.kev_tasks: set[asyncio.Task[Any]] = set()
        self.stop_reason = ""
        self.killed = ""
        self.killed_at_ns = 0
        self.crash: BaseException | None = None
        self.feeding = False
        self.frames = 0
        self.books = 0
        self.trades = 0
        self.quarantined: dict[str, int] = {}  # "stream:reason" -> decoded events kept from the engine
        self.execution: GatewayExecution | None = None
        self.gateway: BitgetGateway | None = None
        self.private: PrivateStream | None = None
        self.contract_source = "defaults"
        # every instrument's engine config, as replay resolves them (engine.instruments.resolve_instruments)
        self.engine_configs: dict[str, EngineConfig] = {}
        self.ref_mids: dict[str, float] = {}  # the tickers' mids a portfolio's sizes were scaled by
        self.shutdown_info: dict[str, Any] = {}
        self.errors: list[str] = []
        self.kev_health: dict[str, dict[str, Any]] = {}  # per symbol, engine.kev.health.run_health
        self._dispatching = False
        self.tick: TickLaya | None = None  # built with the engines (_build)
        self._gc = IdleGC() if cfg.gc_at_idle else None
        self._stop: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._journal: _GatedJournal | None = None
        self._feed: _FeedConnection | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._segments: list[Path] = []
        self._norm: Normaliser | None = None
        self._writer: Any = None
        self._asked: dict[str, Any] = {}
        self.started_ns = 0
        self._kill_tasks: set[asyncio.Task[Any]] = set()
        self._prepared = False
        self._made_root = False  # the session directory was made by this run (a refused start removes it)
        self._tmp_runs: list[Path] = []  # run directories in the making
        self._norm_task: asyncio.Future[Any] | None = None
        self.feed_failed = ""
        self.stopping = False
        self._reconciling = asyncio.Lock()  # one reconciliation at a time (reconnect or periodic)
        self.reconciles = 0  # periodic checks completed
        self.status = status or log.info
        self.venue_health = VenueHealth(int(cfg.venue_lost_s * 1e9))
        self.venue_lost = ""  # set when a link was out for venue_lost_s: the run ended because of it
        self.venue_at_exit: dict[str, str] = {}  # links not up when the run stopped
        self.tasks_failed: dict[str, str] = {}  # background task name -> the exception that ended it
        self._last_frame_ns = 0  # receive stamp of the last public frame (the feed's age)
        self._feed_note = ""  # the public feed's last disconnect or failed connect
        self.flatten: dict[str, dict[str, Any]] = {}  # --kill-flattens: what was sent per symbol
        self.watchdog: Watchdog | None = None  # live mode: the order watchdog process (_start)
        # per run: (its first engine, its log, its journal); the journal commits after a turn whose
        # engine step produced a row (_commit_wal)
        self._wal_heads: list[tuple[Engine, EventLog, LiveWal]] = []
        self._wals: list[LiveWal] = []
        self.dashboard = dashboard

    # ------------------------------------------------------------------ the clock and inputs

    def inject(self, priority: int, fn: Callable[[], None], *, ts: int | None = None) -> int:
        """Stamp an input (or use ``ts``, a stamp just taken), schedule it and run everything due."""
        t = self.clock.stamp() if ts is None else ts
        self.clock.schedule(t, priority, fn)
        self.dispatch()
        return t

    def dispatch(self, ran: bool = False) -> None:
        """Run every entry due, in clock order. ``ran``: the caller has just run one itself
        (:meth:`deliver`), which counts as work done for keep-warm."""
        if self._dispatching:
            return
        self._dispatching = True
        try:
            while (item := self.clock.pop_next_due()) is not None:
                item[1]()
                ran = True
        except Exception as e:  # an engine bug: stop trading, cancel everything
            self._fail(e)
        finally:
            self._dispatching = False
        if ran and self._wal_heads:
            self._commit_wal()  # before the loop runs anything this turn caused (a REST send)
        if self._gc is not None:
            self._gc.collect_if_due()  # between frames, never inside a label (live/gc_policy.py)
        if ran and self.tick is not None and self.cfg.tick_keep_warm:
            # after any work (a frame, a Kev reply, an exchange report), not only after frames: the
            # next frame's label should not pay for whatever ran last (live/tick.py keep_warm); the
            # order decision path too (Engine.keep_warm), before the label path, which comes first
            self._keep_warm(engines=True)
        if self._wake is not None and self.clock.pending:
            self._wake.set()

    def _keep_warm(self, *, engines: bool) -> None:
        try:
            if engines:
                for st in self.syms.values():
                    st.engine.keep_warm()
            if self.tick is not None:
                self.tick.keep_warm()
        except Exception as e:  # an engine bug, as in dispatch
            self._fail(e)

    def deliver(self, raw: bytes, ts: int) -> None:
        """A public frame, already journaled with its receive stamp ``ts``."""
        if not self.feeding:
            return
        self.frames += 1
        self._last_frame_ns = ts
        clock = self.clock
        sched = clock.schedule
        any_event = ran = False
        try:
            evs = self.tick.decode(raw, ts, self.counters)
        except Exception as e:  # a decoder bug costs this frame (the journal keeps it), never the run
            self._wire_quarantined(f"internal: {type(e).__name__}: {str(e)[:200]}")
            return
        # one event (a books15 frame): each step runs at once when nothing on the clock goes before it
        # (LiveClock.take_next); several keep the clock's order (all paper steps first, as in replay)
        direct = len(evs) == 1 and not self._dispatching
        for ev in evs:
            is_book = isinstance(ev, BookSnapshot)
            if not (is_book or isinstance(ev, Trade)):
                if type(ev) is Quarantined:
                    self._wire_quarantined(ev.reason)  # type: ignore[union-attr]
                continue
            st = self.syms.get(ev.symbol)  # type: ignore[union-attr]
            if st is None:
                continue
            if not (top_ok(ev) if is_book else trade_ok(ev)):  # type: ignore[arg-type]
                self._quarantine(ev, is_book)  # type: ignore[arg-type]
                continue
            if is_book:
                self.books += 1
            else:
                self.trades += 1
            # The paper exchange sees the event before the engine does (same order as in replay).
            if st.paper is not None:
                paper = st.paper.on_book if is_book else st.paper.on_trade
                prio = PRIO_EXCH_BOOK if is_book else PRIO_EXCH_TRADE
                if direct and clock.take_next(ts, prio):
                    ran = True
                    direct = self._run_now(paper, ev)  # after a failure the rest waits its turn
                else:
                    sched(ts, prio, partial(paper, ev))
            on_event = st.engine.on_book if is_book else st.engine.on_trade
            prio = PRIO_BOOK if is_book else PRIO_TRADE
            if direct and clock.take_next(ts, prio):
                ran = True
                self._run_now(on_event, ev)
            else:
                sched(ts, prio, partial(on_event, ev))
            any_event = True
        if any_event:
            self.dispatch(ran)

    def _run_now(self, fn: Callable[[Any], None], ev: Any) -> bool:
        """``fn(ev)`` as :meth:`dispatch` runs an entry (an engine bug stops trading); whether it ran
        without one."""
        self._dispatching = True
        try:
            fn(ev)
        except Exception as e:
            self._fail(e)
            return False
        finally:
            self._dispatching = False
        return True

    def _commit_wal(self, force: bool = False) -> None:
        """Make the journal hold what the engine did: the core's rows are handed over (only when its
        step produced some: most frames produce a label and nothing else) and, when the core or the
        runner added a record (or ``force``: the periodic flush), one write per run. The market-data
        journal is flushed first, so every label journaled has its book in the session. A journal that
        cannot be written stops the run (live: the kill switch): orders must not outrun their record."""
        if self._dispatching:  # inside a step: the dispatch around it commits when the step is done
            return
        try:
            due = []
            for engine, evlog, wal in self._wal_heads:
                # the core's row counts, compared as bytes: a twentieth of NOUT.any()'s cost, every turn
                if engine.core.NOUT.tobytes() != _NO_ROWS:
                    evlog.counts()  # reading the log hands the core's rows over (JournaledLog.watch)
                if force or wal.tables or wal.writer.pending:
                    due.append(wal)
            if due:
                if self._journal is not None:
                    self._journal.inner.flush()
                for wal in due:
                    wal.commit()
        except OSError as e:
            self._wal_failed(e)

    def _wal_failed(self, e: OSError) -> None:
        why = f"write-ahead journal: {type(e).__name__}: {e}"
        if why not in self.errors:
            log.error("%s", why)
            self.errors.append(why)
        if self.crash is None:
            self.crash = e
        if self.cfg.mode == "live" and not self.stopping:
            self.request_kill("wal_failed")
        self.request_stop("crash")

    def _wire_quarantined(self, reason: str) -> None:
        """A frame the codec or the wire checks refused: counted by its tag (the session's quarantine
        stream, rebuilt from the journal, holds it with the reason and the raw text)."""
        key = f"wire:{discard_reason(reason)}"
        if key not in self.quarantined:
            log.warning("quarantined a frame: %s", reason[:300])
        self.quarantined[key] = self.quarantined.get(key, 0) + 1

    def _quarantine(self, ev: BookSnapshot | Trade, is_book: bool) -> None:
        """A decoded event the engine must not see (the codec checks levels; this is the last guard)."""
        stream = "books15" if is_book else "trade"
        reason = book_reason(ev) if is_book else trade_reason(ev)  # type: ignore[arg-type]
        key = f"{stream}:{reason}"
        self.quarantined[key] = self.quarantined.get(key, 0) + 1
        log.warning("quarantined %s (%s seq %d)", key, ev.symbol, ev.seq)
        st = self.syms[ev.symbol]  # the caller found it
        q = InputQuarantined(
            ts_event=ev.ts_event,
            ts_recv=ev.ts_recv,
            seq=len(st.quarantine),
            symbol=ev.symbol,
            stream=stream,
            row_seq=ev.seq,
            reason=reason,
        )
        st.quarantine.append(q)
        if st.wal is not None:
            st.wal.event("input_quarantine", q)

    def _fail(self, e: BaseException) -> None:
        if self.crash is None:
            self.crash = e
            log.error("live run failed: %s: %s", type(e).__name__, self._redact(str(e)))
        self.request_stop("crash")

    def _redact(self, text: str) -> str:
        return self._creds.redact(text) if self._creds is not None else text

    def request_stop(self, reason: str) -> None:
        if not self.stop_reason:
            self.stop_reason = reason
        if self._stop is not None:
            self._stop.set()

    def request_kill(self, source: str) -> None:
        """The kill switch: no new orders, working orders cancelled, the venue cancel-all'ed, stop."""
        if self.killed:
            return
        self.killed = source
        log.warning("kill switch: %s", source)
        for st in self.syms.values():
            t = self.inject(PRIO_KILL, partial(self._kill_engine, st))
            self.killed_at_ns = self.killed_at_ns or t
        if self.execution is not None:
            task = asyncio.get_running_loop().create_task(
                self.execution.cancel_everything(), name="kill-cancel-all"
            )
            task.add_done_callback(self._task_ended)
            self._kill_tasks.add(task)
        self.request_stop(f"kill:{source}")

    def _kill_engine(self, st: _Symbol) -> None:
        """The kill switch on one engine; with ``kill_flattens``, then its position is closed."""
        st.engine.kill()
        if self.cfg.kill_flattens:
            pos = float(st.engine.portfolio.position)
            self.flatten[st.symbol] = {"position_before": pos, "orders": [], "refused": 0}
            self._flatten(st)

    def _flatten(self, st: _Symbol) -> None:
        """:meth:`Engine.flatten`: reduce-only market orders for what of the position no flatten order
        covers yet (the kill switch lets only these through; every other rule applies, so a stale or
        missing book refuses them: the position stays, and the summary says so). What is left after a
        refusal (the order rate limit, most often: the strategy's last second counts) or a venue reject
        is sent again at shutdown (:meth:`_finish_flatten`)."""
        f = self.flatten[st.symbol]
        sent, refused = st.engine.flatten()
        f["orders"] += sent
        f["refused"] += int(refused)

    async def _finish_flatten(self) -> None:
        """``kill_flattens``: wait for the flatten orders to finish, then send what is still open of a
        position, ``FLATTEN_RETRY_S`` apart, until it is closed or ``FLATTEN_TRIES`` rounds are spent."""
        for _ in range(FLATTEN_TRIES):
            if self.execution is not None:
                await self.execution.wait_done([o for f in self.flatten.values() for o in f["orders"]], 5.0)
            todo = [
                self.syms[sym]
                for sym in self.flatten
                if abs(float(self.syms[sym].engine.portfolio.position)) >= self.syms[sym].contract.min_qty
            ]
            if not todo:
                return
            await asyncio.sleep(FLATTEN_RETRY_S)
            for st in todo:
                self.inject(PRIO_KILL, partial(self._flatten, st))
            await self._drain()  # paper: the simulated exchange fills on the clock

    def _on_feed_meta(self, obj: dict[str, Any]) -> None:
        t = obj.get("t")
        if t == "disconnect":
            self._feed_note = f"disconnected ({obj.get('reason')})"
        elif t == "connect_failed":
            self._feed_note = f"reconnecting: {obj.get('error')}"
        elif t == "fatal":
            self._feed_note = f"gave up: {obj.get('error')}"

    def _check_venue(self) -> None:
        """Look at every link once; each change is a WARNING and a venue_status event."""
        now = self.clock.wall_ns()
        stale_ns = int(self.cfg.feed_stale_s * 1e9)
        seen: list[tuple[str, str, str, int | None]] = []
        feed = self._feed
        if feed is not None:
            age = now - self._last_frame_ns
            if not feed.stats.up and (feed.stats.connects or age > stale_ns):
                seen.append(("public_feed", "down", self._feed_note or "not connected", None))
            elif feed.stats.up and age > stale_ns:
                seen.append(
                    ("public_feed", "stale", f"no market data for {age / 1e9:.1f} s", self._last_frame_ns)
                )
            else:
                seen.append(("public_feed", "up", "", None))
        if self.private is not None:
            up = self.private.connected.is_set()
            seen.append(
                ("private_ws", "up" if up else "down", self.private.fatal or self.private.last_error, None)
            )
        if self.gateway is not None and self.cfg.mode == "live":
            err = self.gateway.transport_error
            seen.append(("rest", "down" if err else "up", err, None))
        for component, state, detail, since in seen:
            change = self.venue_health.observe(component, state, detail, now, since)
            if change is not None:
                self._venue_change(change)

    def _venue_change(self, ch: Change) -> None:
        ts = self.clock.stamp()
        for sym, st in self.syms.items():
            vs = VenueStatus(
                ts_event=ts,
                ts_recv=ts,
                seq=len(st.venue),
                symbol=sym,
                component=ch.component,
                state=ch.state,
                detail=ch.detail[:300],
                age_ns=ch.age_ns,
            )
            st.venue.append(vs)
            if st.wal is not None:
                st.wal.event("venue_status", vs)
        text = self._redact(f"venue: {ch.component} {ch.state}: {ch.detail}")
        log.warning("%s", text)
        if ch.state == LOST and not self.venue_lost:
            self.venue_lost = text
            self.errors.append(text)
            if self.cfg.mode == "live":
                self.request_kill(f"venue_lost:{ch.component}")
            else:
                self.request_stop(f"venue_lost:{ch.component}")

    async def _watch_venue(self) -> None:
        every = min(0.25, self.cfg.feed_stale_s / 4)
        status_every = self.cfg.status_every_s
        next_status = time.monotonic() + status_every
        while True:
            await asyncio.sleep(every)
            self._check_venue()
            if status_every and time.monotonic() >= next_status:
                next_status += status_every
                self.status(self.status_line())

    def status_line(self) -> str:
        """One line: uptime, market data age, each link, and per symbol position, open orders, fills
        and Kev (answers, in flight, queued)."""
        now = self.clock.wall_ns()
        age = (now - self._last_frame_ns) / 1e9 if self._last_frame_ns else math.nan
        links = " ".join(f"{c} {state}" for c, state in self.venue_health.states().items())
        parts = [f"live {self.cfg.mode} {(now - self.started_ns) / 1e9:.0f}s", f"feed age {age:.1f}s {links}"]
        for sym, st in self.syms.items():
            e, c = st.engine, st.log.counts()
            parts.append(
                f"{sym} pos {float(e.portfolio.position):g} open {e.open_orders} "
                f"orders {c.get('order', 0)} fills {c.get('fill', 0)} "
                f"kev {c.get('kev_response', 0)} answers {e.kev_in_flight} in flight "
                f"{e.kev_queued} queued" + (" KILLED" if e.kill_switch else "")
            )
        return " | ".join(parts)

    # ------------------------------------------------------------------ setup

    def _prepare_dirs(self) -> None:
        if (self.root / MANIFEST).exists():
            raise DualhubError(f"{self.root} already holds a finished session")
        if (self.root / RECORD_JSON).exists():
            raise DualhubError(f"{self.root} holds an unfinished recording; `dualhub recover {self.root}` it")
        if self.kill_file.exists():
            raise DualhubError(f"kill file {self.kill_file} exists: remove it to trade")
        parent = self.kill_file.parent  # the switch must be reachable (the default's is the run's own)
        if parent != self.root and not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
            raise DualhubError(
                f"kill file {self.kill_file} could never be created: {parent} is not a writable directory"
            )
        self._made_root = not self.root.exists()
        self.root.mkdir(parents=True, exist_ok=True)
        cfg_json = self.cfg.to_json()
        self._asked = {
            "url": self.public_url,
            "inst_type": INST_TYPE,
            "symbols": list(self.cfg.symbols),
            "channels": ["books15", "trade"],
            "connections": 1,
            "config": cfg_json,
            "config_sha256": self.cfg.sha256(),
        }
        self.started_ns = time.time_ns()
        write_json(self.root / RECORD_JSON, {**self._asked, "started_ns": self.started_ns})
        self._prepared = True
        write_json(
            self.root / LIVE_JSON,
            {
                "pid": os.getpid(),
                "mode": self.cfg.mode,
                "started_ns": self.started_ns,
                "rest_url": self.rest_url,
                "public_url": self.public_url,
                "private_url": self.private_url if self.cfg.mode == "live" else "",
                "kill_file": str(self.kill_file),
                "running": True,
            },
        )

    async def _contracts(self) -> dict[str, ContractSpec]:
        cfg = self.cfg
        if cfg.mode == "paper" and cfg.contract_defaults:
            return {}
        gw = self.gateway or BitgetGateway(self.rest_url, timeout_s=3.0)
        try:
            specs = {s.symbol: s for s in await gw.contracts()}
        except (BitgetError, GatewayTransportError) as e:
            if cfg.mode == "live":
                raise DualhubError(f"cannot read contracts from {self.rest_url}: {e}") from None
            log.warning("contracts unavailable (%s): using the engine's defaults", e)
            self.errors.append(f"contracts: {e}")
            return {}
        finally:
            if gw is not self.gateway:
                await gw.aclose()
        missing = [s for s in cfg.symbols if s not in specs]
        if missing:
            raise DualhubError(f"{self.rest_url} lists no contract for {missing}")
        bad = [s for s in cfg.symbols if not specs[s].tradable]
        if bad and cfg.mode == "live":
            raise DualhubError(f"not tradable now: {[(s, specs[s].status) for s in bad]}")
        self.contract_source = "exchange"
        return {s: specs[s] for s in cfg.symbols}

    async def _resolve(self, specs: dict[str, ContractSpec]) -> None:
        """Every instrument's engine config, resolved as replay resolves a session's: a portfolio's sizes
        scaled from the first instrument's at the tickers' mids (asked only where a size is not named),
        or one error line naming the instrument and the --instrument way out."""
        cfg = self.cfg
        scaled = [s for s in cfg.symbols[1:] if any(k not in cfg.instruments.get(s, {}) for k in SIZE_FIELDS)]
        if scaled:
            self.ref_mids, unread = await ticker_mids(self.rest_url, [cfg.symbols[0], *scaled], self.gateway)
            for sym, why in unread.items():
                log.warning("%s: no ticker from %s (%s)", sym, self.rest_url, why)
                self.errors.append(f"ticker {sym}: {why}")
        self._configs(specs)

    def _configs(self, specs: dict[str, ContractSpec]) -> None:
        """The engine configs at the reference mids read so far (engine.instruments.resolve_instruments)."""
        cfg = self.cfg
        contracts = {s: specs[s].config() if s in specs else ContractConfig(symbol=s) for s in cfg.symbols}
        base = engine_config_from(cfg, symbol=cfg.symbols[0], contract=contracts[cfg.symbols[0]])
        configs = resolve_instruments(base, cfg.symbols, contracts, self.ref_mids, cfg.instruments)
        self.engine_configs = {e.symbol: e for e in configs}

    async def _setup_gateway(self) -> None:
        assert self._creds is not None
        self.gateway = gw = BitgetGateway(self.rest_url, self._creds)
        try:
            await gw.sync_time()
            positions = await gw.positions()  # the first signed call: are the keys good?
        except BitgetError as e:
            raise DualhubError(f"the exchange refused us at startup: {self._redact(str(e))}") from None
        except GatewayTransportError as e:
            raise DualhubError(f"exchange unreachable: {e}") from None
        held = [(p.symbol, p.signed_size) for p in positions if p.symbol in self.cfg.symbols and p.total]
        if held:
            raise DualhubError(f"open positions {held}: the engine starts flat; close them first")

    def _build(self, specs: dict[str, ContractSpec]) -> None:
        cfg = self.cfg
        if not self.engine_configs:  # built without _resolve (tests, benches): no ticker asked
            self._configs(specs)
        laya = Laya(LayaConfig(model_path=Path(cfg.model_path), provider=cfg.laya_provider))
        self.laya = laya
        # decoder + labeler + Laya latency in one: books15 frames are labelled before their event exists
        # with the recorder's wire checks (limits as the session's record says: the normaliser's)
        guard = wire_guard(WireLimits.from_json(self._asked.get("wire_limits")), inst_type=INST_TYPE)
        self.tick = tick = TickLaya(laya, self.clock.wall_ns, guard)

        inner = self._inner_advisor
        if inner is None:
            if cfg.kev_url:
                from engine.kev.llama import LlamaAdvisor, LlamaConfig
                from engine.kev.process import ProcessAdvisor

                kev_cfg = LlamaConfig.for_engine(cfg.kev_url, cfg.kev_timeout_ms)
                inner = ProcessAdvisor.llama(kev_cfg) if cfg.kev_process else LlamaAdvisor(kev_cfg)
            elif cfg.kev_hub == "pairs":
                inner = RulePairsKev(entry_z=cfg.pair_entry_z, exit_z=cfg.pair_exit_z)
            else:
                inner = RuleKev()
        self._advisor_inner = inner
        run_tag = f"dh{self.started_ns // 1_000_000 % 10**10:010d}-"
        if cfg.mode == "live":
            assert self.gateway is not None
            self.execution = GatewayExecution(
                self.gateway,
                specs,
                run_tag=run_tag,
                inject=lambda prio, fn: self.inject(prio, fn),
                now_ns=self.clock.now_ns,
                record=self._record_exec,
                on_reconcile=self._on_reconcile,
                on_kill=self.request_kill,
                on_task_done=self._task_ended,
            )
        rng_root = int(cfg.seed)
        # several symbols: one engine over them (engine/instruments.py), one run, one log, one Kev
        portfolio = (
            Portfolio(
                cfg.symbols,
                pairs=tuple((cfg.symbols[0], x) for x in cfg.symbols[1:]) if cfg.kev_hub else (),
                hub=bool(cfg.kev_hub),
                pair_half_life_ns=cfg.pair_half_life_ms * 1_000_000,
                leg_timeout_ns=cfg.leg_timeout_ms * 1_000_000,
                leg_hedge=cfg.leg_hedge,
            )
            if cfg.portfolio
            else None
        )
        shared: tuple[Any, ...] | None = None
        contracts = {s: specs[s].config() if s in specs else ContractConfig(symbol=s) for s in cfg.symbols}
        for i, symbol in enumerate(cfg.symbols):
            contract = contracts[symbol]
            if shared is None:
                run_dir = self.root / "runs" / (PORTFOLIO_RUN if portfolio else f"live-{symbol}")
                tmp = run_dir.with_name(run_dir.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                self._tmp_runs.append(tmp)
                (tmp / "events").mkdir(parents=True)
                advisor = RecordingAdvisor(inner)
                # the journal first: from the first event on, a kill -9 leaves a run `recover` rebuilds
                wal = LiveWal(
                    tmp / WAL_FILE,
                    self._wal_header(run_dir, symbol, contracts, advisor.name, run_tag),
                    fsync_ms=cfg.wal_fsync_ms,
                )
                self._wals.append(wal)
                sink = JournaledSink(wal)
                evlog = JournaledLog(tmp / "events", wal)
                kev = LiveKevBackend(advisor, self, sink)
                kev.wal = wal
                lists: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
                if portfolio is not None:
                    shared = (run_dir, tmp, sink, evlog, advisor, kev, lists, wal)
            else:
                run_dir, tmp, sink, evlog, advisor, kev, lists, wal = shared
            paper = None
            execution: Any = self.execution
            if cfg.mode == "paper":
                # One stream per order latency model, components 4, 5, 6 as replay's: for the first
                # symbol the streams are replay's own (a seed sequence pads its entropy with zeros), so
                # a replay with the run's seed and models draws what the paper venue drew.
                entry, response, cancel = (np.random.default_rng([rng_root, c, i]) for c in (4, 5, 6))
                paper = SimExchange(
                    self.clock,  # type: ignore[arg-type]  # schedule/now_ns: the live clock fits
                    fill_model=FILL_MODELS[cfg.fill_model](),
                    entry_latency=RecordingLatency(
                        parse_latency(cfg.latency_order_entry, entry), "order_entry", sink
                    ),
                    response_latency=RecordingLatency(
                        parse_latency(cfg.latency_order_response, response), "order_response", sink
                    ),
                    cancel_latency=RecordingLatency(
                        parse_latency(cfg.latency_cancel, cancel), "cancel", sink
                    ),
                    size_step=contract.size_step,
                    tick=contract.tick,
                )
                execution = paper
            engine = Engine(
                self.engine_configs[symbol],
                clock=self.clock,
                log=evlog,
                labeler=tick,
                kev=kev,
                execution=execution,
                advisor_name=advisor.name,
                laya_latency=RecordingLatency(tick, "laya", sink),
                portfolio=portfolio,
            )
            if paper is not None:
                paper.engine = engine
            if self.execution is not None:
                self.execution.engines[symbol] = engine
            self.syms[symbol] = _Symbol(
                symbol, contract, run_dir, tmp, evlog, sink, advisor, kev, engine, paper, *lists, wal=wal
            )
            if i == 0 or portfolio is None:  # a portfolio's engines share one core buffer and streams
                evlog.watch(engine.core.streams)
                self._wal_heads.append((engine, evlog, wal))
        self.portfolio = portfolio
        # Everything built so far (models, sessions, modules) lives for the whole run: move it out of
        # the cyclic collector's reach, so a full collection during trading scans only what the run
        # allocates instead of stalling the loop mid-trade (it showed in the order latency's p99).
        gc.freeze()
        if self._gc is not None:
            self._gc.start()

    def _static_manifest(self, symbol: str, contracts: dict[str, ContractConfig]) -> dict[str, Any]:
        """What a run's manifest says of how the run was set up: in its journal's header from the start
        (``dualhub recover`` builds a killed run's manifest from it) and in the manifest at the end."""
        info = self.laya.describe()
        return {
            "run_schema_version": RUN_SCHEMA_VERSION,
            "kind": "live",
            "model": {
                "file": Path(self.cfg.model_path).name,
                "path": str(Path(self.cfg.model_path).resolve()),
                "sha256": info["model_sha256"],
                "feature_version": info["feature_version"],
            },
            "seeds": {"live": self.cfg.seed},
            "symbol": symbol if not self.cfg.portfolio else "",
            "symbols": list(self.cfg.symbols),
            "config": self.cfg.to_json(),
            "config_sha256": self.cfg.sha256(),
            "engine_config": _engine_config_json(self.engine_configs[symbol]),
            # every instrument's as resolved at the start (a portfolio's first is engine_config): what
            # `dualhub parity` replays them with
            "engine_configs": {s: _engine_config_json(self.engine_configs[s]) for s in contracts},
            # the tickers' mids a portfolio's sizes were scaled by (none asked: every size was named)
            **({"reference_mids": dict(self.ref_mids)} if self.ref_mids else {}),
            "contract_source": self.contract_source,
        }

    def _runtime(self) -> dict[str, Any]:
        info = self.laya.describe()
        return {
            **{k: info.get(k) for k in ("requested_providers", "active_provider", "fallback_reason")},
            **engine_identity(),
        }

    def _wal_header(
        self, run_dir: Path, symbol: str, contracts: dict[str, ContractConfig], advisor: str, run_tag: str
    ) -> dict[str, Any]:
        return {
            "run": run_dir.name,
            "session": str(self.root.resolve()),
            "mode": self.cfg.mode,
            "rest_url": self.rest_url,
            "run_tag": run_tag,  # the venue's client oid of engine order dh-N is run_tag + "dh-N"
            "started_ns": self.started_ns,
            "advisor": advisor,
            "kev_timeout_ms": self.cfg.kev_timeout_ms,
            "manifest": self._static_manifest(symbol, contracts),
            "runtime": self._runtime(),
        }

    def _record_exec(self, symbol: str, kind: str, ts: int, dur: int) -> None:
        st = self.syms.get(symbol)
        if st is not None:
            st.sink.add(kind, ts, dur)

    def _on_reconcile(self, fields: dict[str, Any]) -> None:
        st = self.syms.get(fields["symbol"]) or next(iter(self.syms.values()))
        ts = self.clock.stamp()
        ev = reconcile_event(fields, ts=ts, seq=len(st.reconcile))
        st.reconcile.append(ev)
        if st.wal is not None:
            st.wal.event("reconcile", ev)
            self._commit_wal()
        log.warning("reconcile: %s", fields)

    # ------------------------------------------------------------------ running

    async def run(self) -> LiveResult:
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._prepare_dirs()
        try:
            if self.cfg.mode == "live":
                await self._setup_gateway()
            specs = await self._contracts()
            await self._resolve(specs)
            self._build(specs)
            if self.install_signals:
                for sig, fn in (
                    (signal.SIGINT, lambda: self.request_stop("signal:SIGINT")),
                    (signal.SIGTERM, lambda: self.request_stop("signal:SIGTERM")),
                    (signal.SIGUSR1, lambda: self.request_kill("signal:SIGUSR1")),
                ):
                    loop.add_signal_handler(sig, fn)
            await self._start()
            if not self._stop.is_set():
                if self.cfg.duration_s is not None:
                    try:
                        async with asyncio.timeout(self.cfg.duration_s):
                            await self._stop.wait()
                    except TimeoutError:
                        self.request_stop("duration")
                else:
                    await self._stop.wait()
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError | KeyboardInterrupt):
                self._fail(e)
            else:
                self.request_stop("cancelled")
            raise
        finally:
            try:
                await self._shutdown()
            finally:
                self._stop_watchdog()  # after a failed shutdown too (then it cancels: left_open unknown)
                if self._gc is not None:
                    self._gc.stop()
                gc.unfreeze()
                if self.install_signals:
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
                        loop.remove_signal_handler(sig)
        return self._result()

    async def _start(self) -> None:
        cfg = self.cfg
        self._journal = _GatedJournal(
            JournalWriter(self.root / JOURNAL_DIR, rotate_s=900.0, rotate_bytes=64 << 20)
        )
        self._norm = Normaliser(self._asked)
        self._writer = new_writer(self.root, self._asked)
        self._journal.meta(time.time_ns(), 0xFFFF, {"t": "start", "asked": self._asked})
        if cfg.mode == "live":
            assert self._creds is not None and self.gateway is not None and self.execution is not None
            gw = self.gateway
            self.private = PrivateStream(
                PrivateConfig(url=self.private_url, ping_interval_s=cfg.ping_interval_s),
                self._creds,
                on_item=lambda item, ts: self.execution.on_private(item),  # type: ignore[union-attr]
                on_connected=self._on_private_connected,
                on_fatal=lambda why: self.request_kill(f"private_ws:{why}"),
                server_s=lambda: gw.now_ms() // 1000,
                stamp=time.time_ns,
            )
            self._spawn(self.private.run(), "private-ws")
            try:
                async with asyncio.timeout(10.0):
                    await self.private.connected.wait()
            except TimeoutError:
                raise DualhubError(
                    f"private WebSocket {self.private_url} did not log in: {self.private.fatal or 'timeout'}"
                ) from None
            if cfg.watchdog_s > 0:  # before the first order: from here on a kill -9 orphans nothing
                self.watchdog = await Watchdog.start(
                    self.root, self.rest_url, self._creds, timeout_s=cfg.watchdog_s, demo=gw.demo
                )
                self.watchdog.start_beating()
            else:
                log.warning("no order watchdog (watchdog_s 0): a kill -9 would leave orders at the venue")
        conn_cfg = ConnectionConfig(
            url=self.public_url, silence_limit_s=cfg.feed_silence_s, ping_interval_s=cfg.ping_interval_s
        )
        args = [arg(ch, s) for s in cfg.symbols for ch in ("books15", "trade")]
        self._feed = _FeedConnection(
            0,
            args,
            self._journal,  # type: ignore[arg-type]
            conn_cfg,
            rng=random.Random(cfg.seed),
            attempts=SlidingWindow(conn_cfg.max_connect_attempts, conn_cfg.connect_window_s),
            wall_ns=self.clock.stamp,
            deliver=self.deliver,
            on_meta=self._on_feed_meta,
        )
        self._last_frame_ns = self.clock.wall_ns()  # the feed's age counts from its start
        self.feeding = True
        self._spawn(self._feed.run(), "public-feed", self._feed_ended)
        self._spawn(self._pump(), "timer-pump")
        self._spawn(self._flusher(), "journal-flush")
        self._spawn(self._kill_watch(), "kill-file")
        self._spawn(self._watch_venue(), "venue-watch")
        if self.dashboard is not None:  # it publishes snapshots on this loop; its thread serves them
            self._spawn(self.dashboard.start(self), "dashboard")
        if self.cfg.busy_poll:
            self._spawn(self.busy_poll(), "busy-poll")
        if cfg.mode == "live" and cfg.reconcile_every_s > 0:
            self._spawn(self._reconcile_periodically(), "reconcile")

    def _spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        name: str,
        on_done: Callable[[asyncio.Task[Any]], None] | None = None,
    ) -> asyncio.Task[Any]:
        """A background task of the run, supervised (:meth:`_task_ended`, after ``on_done``)."""
        task = asyncio.create_task(coro, name=name)
        if on_done is not None:
            task.add_done_callback(on_done)
        task.add_done_callback(self._task_ended)
        self._tasks.append(task)
        return task

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        """A background task that raised is never silent: every one of them watches or feeds the run
        (the venue watch, the timer pump, the kill file, the journal), so the run cannot go on without
        it; nor can an order task of the gateway (the venue may hold an order the engine does not know
        about). One ERROR line, the summary's ``tasks_failed`` and ``errors``, and the run ends as a lost
        venue ends it: live, the kill switch; paper, a stop; exit 1 either way."""
        if task.cancelled() or (exc := task.exception()) is None:
            return
        name = task.get_name()
        why = self._redact(f"{type(exc).__name__}: {exc}")[:300]
        log.error("background task %s failed: %s", name, why)
        self.tasks_failed[name] = why
        self.errors.append(f"task {name} failed: {why}")
        if self.stopping:
            return
        if self.cfg.mode == "live":
            self.request_kill(f"task_failed:{name}")
        else:
            self.request_stop(f"task_failed:{name}")

    def _feed_ended(self, task: asyncio.Task[Any]) -> None:
        if not self.feeding:
            return  # we stopped it
        self.feed_failed = (self._feed.stats.fatal if self._feed is not None else "") or "ended"
        self.errors.append(f"public feed: {self.feed_failed}")
        self.request_stop("feed_failed")

    async def _on_private_connected(self, n: int) -> None:
        if n > 1 and self.execution is not None:
            try:
                async with self._reconciling:
                    diffs = await self.execution.reconcile(f"reconnect{n}")
                log.info("reconciled after private reconnect %d: %d differences", n, diffs)
            except (BitgetError, GatewayTransportError) as e:
                self.errors.append(f"reconcile: {e}")
                self.request_kill("reconcile_failed")

    async def _reconcile_periodically(self) -> None:
        """A private WebSocket can stay up and still lose pushes: compare the venue with the engine
        every ``reconcile_every_s`` too. A failed check is retried at the next one; three in a row
        trip the kill switch (the engine's state can no longer be verified)."""
        assert self.execution is not None
        failures = 0
        while True:
            await asyncio.sleep(self.cfg.reconcile_every_s)
            try:
                async with self._reconciling:
                    diffs = await self.execution.reconcile("periodic", settle_ms=self.cfg.reconcile_settle_ms)
                failures = 0
                self.reconciles += 1
                if diffs:
                    log.warning("periodic reconciliation: %d differences", diffs)
            except (BitgetError, GatewayTransportError) as e:
                failures += 1
                self.errors.append(f"periodic reconcile: {e}")
                if failures >= 3:
                    self.request_kill("reconcile_failed")
                    return

    async def busy_poll(self) -> None:
        """``busy_poll``: the loop never sleeps, and the label path is re-run (results discarded) every
        ``busy_poll_warm_us``, so a frame finds a hot core and hot caches. Costs one core, as busy-polling
        network stacks do; off by default (measured in bench/bench_tick_path.py --spin)."""
        every = max(1, self.cfg.busy_poll_warm_us) * 1000
        next_warm = 0
        n = 0
        while True:
            now = time.perf_counter_ns()
            if now >= next_warm:
                n += 1
                # the decision path every 10th time: it is longer, and a frame waits while it runs
                self._keep_warm(engines=n % 10 == 0)
                next_warm = now + every
            await asyncio.sleep(0)

    async def _pump(self) -> None:
        assert self._wake is not None
        while True:
            self.dispatch()
            k = self.clock.next_key()
            timeout = 0.25 if k is None else (k.ts_ns - time.time_ns()) / 1e9
            if timeout > 0:
                # A timer handle, not asyncio.wait_for: 3.11's wait_for can swallow a cancellation.
                self._wake.clear()
                handle = asyncio.get_running_loop().call_later(min(timeout, 0.25), self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    handle.cancel()
            else:
                await asyncio.sleep(0)

    async def _flusher(self) -> None:
        assert self._journal is not None
        j = self._journal.inner
        while True:
            await asyncio.sleep(self.cfg.flush_interval_ms / 1000)
            j.flush()
            self._commit_wal(force=True)  # labels and delays: at most this late
            if j.rotate_due():
                path = j.rotate()
                assert self._norm is not None
                # shielded: a shutdown waits for it (segments are normalised strictly in order)
                self._norm_task = asyncio.ensure_future(
                    asyncio.to_thread(normalise_segment, path, self._norm, self._writer)
                )
                await asyncio.shield(self._norm_task)
                self._segments.append(path)

    async def _kill_watch(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            if self.kill_file.exists():
                try:
                    why = self.kill_file.read_text()[:200].strip()
                except OSError:
                    why = ""
                self.request_kill("file" + (f":{why}" if why else ""))
                return

    # ------------------------------------------------------------------ stopping

    async def _drain(self) -> None:
        """Stop like a replay ends: every pending timer runs (Kev replies still coming are awaited)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.drain_timeout_s
        while self.crash is None:
            busy = set(self.kev_tasks)
            if self.execution is not None:
                busy |= self.execution.tasks
            if busy:
                if loop.time() > deadline:
                    for t in busy:
                        t.cancel()
                    await asyncio.gather(*busy, return_exceptions=True)
                    continue
                await asyncio.wait(busy, timeout=0.05)
                self.dispatch()
                continue
            item = self.clock.pop_next_due(force=True)
            if item is None:
                return
            try:
                item[1]()
            except Exception as e:
                self._fail(e)

    async def _shutdown(self) -> None:
        if not self._prepared:  # refused before anything was created
            return
        if self._feed is not None:  # how the links stood when the run stopped (before we close them)
            self._check_venue()
            self.venue_at_exit = self.venue_health.degraded(self.clock.wall_ns())
        # 1. the feed stops: nothing more reaches the engine or the session
        self.feeding = False
        self.stopping = True
        if self._journal is not None:
            self._journal.open = False
        if self._feed is not None:
            self._feed.stop()
        if self.execution is not None:
            self.execution.closing = True
        for t in self._tasks:
            if t.get_name() not in ("private-ws",):
                t.cancel()
        await asyncio.gather(
            *(t for t in self._tasks if t.get_name() != "private-ws"), return_exceptions=True
        )
        # 2. every pending timer runs, as at the end of a replay (not after a crash)
        if self.syms:
            try:
                await self._drain()
            except Exception as e:
                self._fail(e)
        # 3. the venue: cancel everything of ours, always
        if self._kill_tasks:
            await asyncio.gather(*self._kill_tasks, return_exceptions=True)
        if self.flatten:  # before the private socket closes: the venue's fill reports come on it
            await self._finish_flatten()
        for sym, f in self.flatten.items():
            f["position_after"] = float(self.syms[sym].engine.portfolio.position)
        self.shutdown_info["cancel_all"] = await self._cancel_all()
        if self.cfg.mode == "live" and self.execution is not None and self.crash is None:
            await self._final_reconcile()
        if self.private is not None:
            self.private.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.gateway is not None:
            await self.gateway.aclose()
        aclose = getattr(getattr(self, "_advisor_inner", None), "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception as e:  # closing an HTTP client must not hide the run's outcome
                self.errors.append(f"kev close: {e}")
        self._stop_watchdog()  # the venue is as clean as the engine can make it: the record says how
        # 4. files: the session first (its digest goes into the run manifests)
        if self._norm_task is not None:
            await asyncio.gather(self._norm_task, return_exceptions=True)
        # the files' thread closes the journals (after the log's last rows): no commit from the loop now
        self._wal_heads = []
        await asyncio.to_thread(self._finish_files)

    def _stop_watchdog(self) -> None:
        """Tell the watchdog the engine ends: it exits quietly when the exit cancel-all left nothing
        open, and cancel-alls itself otherwise (the engine could not confirm the venue clean)."""
        if self.watchdog is None or self.watchdog.stopped:
            return
        left = (self.shutdown_info.get("cancel_all") or {}).get("left_open")
        self.shutdown_info["watchdog"] = self.watchdog.stop(venue_clean=left == [])

    async def _final_reconcile(self) -> None:
        """One last check against the venue after the cancel-all: what it did that no push told the
        engine (fills during the cancel-all, pushes lost since the last periodic check) is booked before
        the run's files are written, so they end with the venue's account of the run."""
        assert self.execution is not None
        try:
            async with asyncio.timeout(10.0):
                self.shutdown_info["final_reconcile"] = await self.execution.reconcile("final")
            await self._drain()
        except Exception as e:  # the run's outcome stands; the summary says the check did not happen
            self.errors.append(f"final reconcile: {type(e).__name__}: {e}")
            self.shutdown_info["final_reconcile"] = f"failed: {e}"

    async def _cancel_all(self) -> dict[str, Any]:
        if self.execution is not None:
            await self.execution.wait_idle(3.0)
            try:
                async with asyncio.timeout(10.0):
                    return await self.execution.cancel_everything()
            except TimeoutError:
                return {"error": "cancel-all timed out", "left_open": "unknown: cancel-all failed: timed out"}
        resting = {s: st.paper.drop_resting() for s, st in self.syms.items() if st.paper is not None}
        return {"paper_resting_dropped": resting, "left_open": []}  # paper orders never reach a venue

    def _finish_files(self) -> None:
        session_manifest: dict[str, Any] | None = None
        if self._journal is None:  # never started (refused at setup): leave nothing half-made behind
            self._close_wals()
            for tmp in self._tmp_runs:  # an instrument refused mid-build has a directory, no engine
                shutil.rmtree(tmp, ignore_errors=True)
            self.syms.clear()
            for made in (self.root / RECORD_JSON, self.root / LIVE_JSON):
                made.unlink(missing_ok=True)
            _rmdir_if_empty(self.root / "runs")
            if self._made_root:
                _rmdir_if_empty(self.root)
            return
        else:
            j = self._journal.inner
            end = time.time_ns()
            if self._feed is not None:
                for key in list(self._feed.open_gaps):
                    self._feed.close_gap(key, end, how="shutdown")
            j.meta(end, 0xFFFF, {"t": "stop", "reason": self.stop_reason or "stopped"})
            last = j.close()
            assert self._norm is not None
            if last is not None:
                normalise_segment(last, self._norm, self._writer)
                self._segments.append(last)
            extra = {
                "recovered": False,
                "stopped_by": self.stop_reason,
                "journal": {
                    "segments": [p.name for p in j.finished],
                    "records": j.records,
                    "frames": j.frames,
                },
                "live": {
                    "mode": self.cfg.mode,
                    "runs": sorted({f"runs/{st.run_dir.name}" for st in self.syms.values()}),
                },
            }
            session_manifest = finish(self._writer, self._norm, extra)
        finished: set[Path] = set()
        for st in self.syms.values():
            if st.run_dir in finished:  # a portfolio's instruments share one run
                continue
            finished.add(st.run_dir)
            try:
                self._finish_run(st, session_manifest is not None)
            except Exception as e:
                self.errors.append(f"{st.symbol}: finishing the run failed: {type(e).__name__}: {e}")
                log.error("%s: finishing the run failed: %s", st.symbol, e)
        self._close_wals()  # a run that could not be finished keeps its journal: `dualhub recover` it
        write_json(self.root / LIVE_JSON, {**self._live_json(), "running": False, "summary": self._summary()})

    def _close_wals(self) -> None:
        for wal in self._wals:
            try:
                wal.close()
            except OSError as e:
                self.errors.append(f"write-ahead journal: {type(e).__name__}: {e}")

    def _live_json(self) -> dict[str, Any]:
        try:
            return orjson.loads((self.root / LIVE_JSON).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}

    def _finish_run(self, st: _Symbol, have_session: bool) -> None:
        files = st.log.write()
        rec_path = st.tmp / "events" / "reconcile.parquet"
        atomic_write_parquet(events_to_table(st.reconcile, "reconcile"), rec_path)
        files["events/reconcile.parquet"] = {"rows": len(st.reconcile), "sha256": sha256_file(rec_path)}
        ven_path = st.tmp / "events" / "venue_status.parquet"
        atomic_write_parquet(events_to_table(st.venue, "venue_status"), ven_path)
        files["events/venue_status.parquet"] = {"rows": len(st.venue), "sha256": sha256_file(ven_path)}
        # the same file a replay writes for the session rows it kept out (outside the digest)
        q_path = st.tmp / "events" / "input_quarantine.parquet"
        atomic_write_parquet(events_to_table(st.quarantine, "input_quarantine"), q_path)
        files["events/input_quarantine.parquet"] = {"rows": len(st.quarantine), "sha256": sha256_file(q_path)}
        if self.portfolio is not None:  # a hub's legging episodes (engine/legs.py), as a replay writes them
            self.portfolio.legs.finish(self.clock.now_ns())
            files.update(self.portfolio.legs.write(st.tmp / "events"))
        lat = st.sink.write(st.tmp)
        files[RECORDED_FILE] = {"rows": len(st.sink), "sha256": sha256_file(lat)}
        cassette = st.kev.cassette()
        cas = cassette.write(st.tmp / CASSETTE_FILE)
        files[CASSETTE_FILE] = {"rows": len(cassette), "sha256": sha256_file(cas)}
        answers = answer_times_ns(cassette)
        health = self.kev_health[st.symbol] = run_health(
            st.tmp / "events", self.cfg.kev_timeout_ms, answers, answers_only=True
        )
        if health["warning"]:
            log.warning("%s: %s", st.symbol, health["warning"])
        session: dict[str, Any] = {"path": str(self.root.resolve())}
        if have_session:
            s = open_session(self.root)
            session.update(digest=s.digest(), files=s.manifest["files"])
        contracts = {x.symbol: x.contract for x in self.syms.values() if x.run_dir == st.run_dir}
        # everything is in the journal now (the log's write handed the core's last rows over)
        wal = st.wal.close() if st.wal is not None else {}
        manifest = {
            **self._static_manifest(st.symbol, contracts),
            "digest": st.log.digest,
            "decision_digest": st.log.decision_digest,
            "session": session,
            "inputs": {"books15": self.books, "trade": self.trades},
            "advisor": {"mode": "live", "name": st.advisor.name, "recorded": len(cassette), "health": health},
            "counts": st.log.counts(),
            "reconcile": len(st.reconcile),
            "venue_status": len(st.venue),
            "stopped_by": self.stop_reason,
            "killed": self.killed,
            "killed_at_ns": self.killed_at_ns,
            "crash": self._redact(f"{type(self.crash).__name__}: {self.crash}") if self.crash else "",
            "shutdown": self.shutdown_info,
            "files": files,
            "wal": wal,
            "recovered": False,  # `dualhub recover` writes what it rebuilt from the journal here
        }
        write_json(st.tmp / "manifest.json", manifest)
        write_json(st.tmp / "runtime.json", self._runtime())
        if st.run_dir.exists():
            shutil.rmtree(st.run_dir)
        st.tmp.rename(st.run_dir)

    def _summary(self) -> dict[str, Any]:
        return {
            "stopped_by": self.stop_reason,
            "killed": self.killed,
            "crash": self._redact(f"{type(self.crash).__name__}: {self.crash}") if self.crash else "",
            "frames": self.frames,
            "books": self.books,
            "trades": self.trades,
            "quarantined": dict(sorted(self.quarantined.items())),
            "counts": {s: st.log.counts() for s, st in self.syms.items()},
            "reconcile": {s: len(st.reconcile) for s, st in self.syms.items()},
            "periodic_reconciles": self.reconciles,
            "venue": {
                "lost": self.venue_lost,
                "at_exit": self.venue_at_exit,
                "links": self.venue_health.states(),
            },
            "tasks_failed": self.tasks_failed,
            "flatten": self.flatten,
            "shutdown": self.shutdown_info,
            "private_ws": describe(self.private),
            "gateway": {"requests": self.gateway.requests, "errors": self.gateway.errors}
            if self.gateway is not None
            else {},
            "errors": [self._redact(e) for e in self.errors[-20:]],
            "kev_health": self.kev_health,
        }

    def _result(self) -> LiveResult:
        # a run that lost the venue, or ended while a link was out, did not end well, whatever stopped it
        failed = (
            self.crash is not None
            or self.feed_failed
            or self.venue_lost
            or self.venue_at_exit
            or self.tasks_failed
        )
        code = EXIT_FAILED if failed else EXIT_KILLED if self.killed else EXIT_OK
        return LiveResult(
            session_dir=self.root,
            run_dirs={s: st.run_dir for s, st in self.syms.items()},
            stopped_by=self.stop_reason,
            killed=self.killed,
            exit_code=code,
            counts={s: st.log.counts() for s, st in self.syms.items()},
            summary=self._summary(),
        )


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:  # not there, or holds what this run did not make
        pass


def _engine_config_json(ec: EngineConfig) -> dict[str, Any]:
    def conv(o: Any) -> Any:
        if isinstance(o, Decimal):
            return str(o)
        raise TypeError(type(o).__name__)

    return orjson.loads(orjson.dumps(dataclasses.asdict(ec), default=conv))


def run_live(cfg: LiveConfig, **kw: Any) -> LiveResult:
    return asyncio.run(LiveRunner(cfg, **kw).run())
