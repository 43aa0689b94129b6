"""What a live run holds (:class:`RunState`): its settings and endpoints, the clock, the instruments'
runs, the links, the counts and the outcome. :class:`live.runner.LiveRunner` is this state with the run's
lifecycle; the modules that build and finish a run (live/build.py, live/finish.py) take it as it is here,
so none of them imports the runner.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.core import Engine, EngineConfig
from engine.errors import DualhubError
from engine.eventlog import EventLog
from engine.instruments import Portfolio
from engine.kev.advisor import KevAdvisor
from engine.laya.model import Laya
from live.clock import LiveClock
from live.config import KILL_FILE, LiveConfig, endpoints
from live.feed import FeedConnection, GatedJournal
from live.gateway import BitgetGateway, GatewayExecution
from live.gc_policy import IdleGC
from live.health import VenueHealth
from live.private_ws import PrivateStream
from live.reconcile import Reconciler
from live.symbol import SymbolRun
from live.tick import TickLaya
from live.wal import LiveWal
from live.watchdog import Watchdog
from recorder.normalise import Normaliser
from wire.bitget.bitget_v2 import StreamCounters
from wire.bitget.bitget_v2_rest import Credentials

log = logging.getLogger("live.runner")  # the run's one logger name (live/feed.py says why)


class RunState(ABC):
    """Everything a live run holds, from the start; :class:`live.runner.LiveRunner` adds the steps
    declared abstract below."""

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
        self.syms: dict[str, SymbolRun] = {}
        self.portfolio: Portfolio | None = None  # several symbols: the one engine over them (live/build.py)
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
        self.tick: TickLaya | None = None  # built with the engines (live/build.py)
        self.laya: Laya  # ditto
        self._advisor_inner: KevAdvisor | None = None  # ditto: the advisor the engines ask, closed at the end
        self._gc = IdleGC() if cfg.gc_at_idle else None
        self._stop: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._journal: GatedJournal | None = None
        self._feed: FeedConnection | None = None
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
        self.reconciler: Reconciler | None = None  # live mode: the venue's checks (live/build.py)
        self.status = status or log.info
        self.venue_health = VenueHealth(int(cfg.venue_lost_s * 1e9))
        self.venue_lost = ""  # set when a link was out for venue_lost_s: the run ended because of it
        self.venue_at_exit: dict[str, str] = {}  # links not up when the run stopped
        self.tasks_failed: dict[str, str] = {}  # background task name -> the exception that ended it
        self._last_frame_ns = 0  # receive stamp of the last public frame (the feed's age)
        self.flatten: dict[str, dict[str, Any]] = {}  # --kill-flattens: what was sent per symbol
        self.watchdog: Watchdog | None = None  # live mode: the order watchdog process (_start)
        # per run: (its first engine, its log, its journal); the journal commits after a turn whose
        # engine step produced a row (_commit_wal)
        self._wal_heads: list[tuple[Engine, EventLog, LiveWal]] = []
        self._wals: list[LiveWal] = []
        self.dashboard = dashboard

    def _redact(self, text: str) -> str:
        return self._creds.redact(text) if self._creds is not None else text

    def _record_exec(self, symbol: str, kind: str, ts: int, dur: int) -> None:
        st = self.syms.get(symbol)
        if st is not None:
            st.sink.add(kind, ts, dur)

    # the runner's steps that what is built here hands on (the gateway's callbacks, Kev's replies)

    @abstractmethod
    def inject(self, priority: int, fn: Callable[[], None], *, ts: int | None = None) -> int: ...

    @abstractmethod
    def request_kill(self, source: str) -> None: ...

    @abstractmethod
    def _task_ended(self, task: asyncio.Task[Any]) -> None: ...

    @abstractmethod
    def _on_reconcile(self, fields: dict[str, Any]) -> None: ...
