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
- **Kev** (:class:`~live.kev_backend.LiveKevBackend`): ``advisor.advise`` runs as an asyncio task; its
  reply is stamped when it returns and delivered at that time (priority 52), ``lag = stamp - request``.
  llama-server's client runs in its own process (:mod:`engine.kev.process`; ``kev_process``), so the
  loop's share of a request is a pipe write and a read. The advisor is wrapped in a
  :class:`~engine.kev.cassette.RecordingAdvisor`, so the run's ``kev_response`` events are a cassette;
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

This module is the run's lifecycle (start, the clock and the tick path, shutdown); by job, the rest:
:mod:`live.config` (settings, endpoints, keys), :mod:`live.build` (contracts, engine configs, the
engines), :mod:`live.feed` (journal gate, feed connection, quarantine, the venue watch's view),
:mod:`live.kev_backend` (Kev off the tick path), :mod:`live.reconcile` (reconciliation, flatten,
cancel-all) and :mod:`live.finish` (the session's and the runs' files, summary, result).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import signal
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from engine.errors import DualhubError
from engine.events import BookSnapshot, Quarantined, Trade
from engine.validate import top_ok, trade_ok
from live.build import build, read_contracts, resolve, setup_gateway
from live.config import LiveConfig
from live.feed import (
    FeedConnection,
    GatedJournal,
    links,
    quarantine,
    record_venue_change,
    status_line,
    wire_quarantined,
)
from live.finish import LiveResult, finish_files, prepare_dirs, result, summary
from live.gateway import reconcile_event
from live.health import LOST, Change
from live.private_ws import PrivateConfig, PrivateStream
from live.reconcile import PRIO_KILL, cancel_all, finish_flatten, start_flatten
from live.state import RunState
from live.symbol import SymbolRun
from live.watchdog import Watchdog
from recorder.normalise import Normaliser
from recorder.record import JOURNAL_DIR, new_writer, normalise_segment
from wire.bitget.bitget_v2 import arg
from wire.bitget.bitget_v2_rest import ContractSpec
from wire.connection import ConnectionConfig, SlidingWindow
from wire.journal import JournalWriter

log = logging.getLogger(__name__)

# Inputs at one timestamp, as replay merges them: the exchange sees market data before the engine (the
# kill switch, PRIO_KILL, goes first: live/reconcile.py).
PRIO_EXCH_BOOK, PRIO_EXCH_TRADE, PRIO_BOOK, PRIO_TRADE = 5, 6, 10, 20
_NO_ROWS = bytes(8 * 8)  # the core's output row counts (NOUT: 8 int64) when it holds none


class LiveRunner(RunState):
    """A live run: its state (:class:`~live.state.RunState`, built as ``LiveRunner(cfg, credentials=...)``)
    and its lifecycle: :meth:`run` sets up, trades until stopped, shuts down."""

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
            wire_quarantined(self.quarantined, f"internal: {type(e).__name__}: {str(e)[:200]}")
            return
        # one event (a books15 frame): each step runs at once when nothing on the clock goes before it
        # (LiveClock.take_next); several keep the clock's order (all paper steps first, as in replay)
        direct = len(evs) == 1 and not self._dispatching
        for ev in evs:
            is_book = isinstance(ev, BookSnapshot)
            if not (is_book or isinstance(ev, Trade)):
                if type(ev) is Quarantined:
                    wire_quarantined(self.quarantined, ev.reason)  # type: ignore[union-attr]
                continue
            st = self.syms.get(ev.symbol)  # type: ignore[union-attr]
            if st is None:
                continue
            if not (top_ok(ev) if is_book else trade_ok(ev)):  # type: ignore[arg-type]
                quarantine(self.quarantined, st, ev, is_book)  # type: ignore[arg-type]
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

    def _fail(self, e: BaseException) -> None:
        if self.crash is None:
            self.crash = e
            log.error("live run failed: %s: %s", type(e).__name__, self._redact(str(e)))
        self.request_stop("crash")

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

    def _kill_engine(self, st: SymbolRun) -> None:
        """The kill switch on one engine; with ``kill_flattens``, then its position is closed."""
        st.engine.kill()
        if self.cfg.kill_flattens:
            start_flatten(st, self.flatten)  # live/reconcile.py

    def _check_venue(self) -> None:
        """Look at every link once; each change is a WARNING and a venue_status event."""
        now = self.clock.wall_ns()
        rest = self.gateway.transport_error if self.gateway is not None and self.cfg.mode == "live" else None
        seen = links(
            now, int(self.cfg.feed_stale_s * 1e9), self._feed, self._last_frame_ns, self.private, rest
        )
        for component, state, detail, since in seen:
            change = self.venue_health.observe(component, state, detail, now, since)
            if change is not None:
                self._venue_change(change)

    def _venue_change(self, ch: Change) -> None:
        record_venue_change(self.syms, ch, self.clock.stamp())
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
        return status_line(
            self.cfg.mode, now, self.started_ns, self._last_frame_ns, self.venue_health, self.syms
        )

    # ------------------------------------------------------------------ setup

    # the runner's own steps, as tests and benches drive them (live/finish.py, live/build.py)
    def _prepare_dirs(self) -> None:
        prepare_dirs(self)

    def _build(self, specs: dict[str, ContractSpec]) -> None:
        build(self, specs)

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
                await setup_gateway(self)
            specs = await read_contracts(self)
            await resolve(self, specs)
            build(self, specs)
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
        return result(self)

    async def _start(self) -> None:
        cfg = self.cfg
        self._journal = GatedJournal(
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
                on_connected=self.reconciler.on_private_connected,  # type: ignore[union-attr]
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
        self._feed = FeedConnection(
            0,
            args,
            self._journal,  # type: ignore[arg-type]
            conn_cfg,
            rng=random.Random(cfg.seed),
            attempts=SlidingWindow(conn_cfg.max_connect_attempts, conn_cfg.connect_window_s),
            wall_ns=self.clock.stamp,
            deliver=self.deliver,
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
            assert self.reconciler is not None
            self._spawn(
                self.reconciler.periodically(cfg.reconcile_every_s, cfg.reconcile_settle_ms), "reconcile"
            )

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
            await finish_flatten(self.execution, self.syms, self.flatten, self.inject, self._drain)
        for sym, f in self.flatten.items():
            f["position_after"] = float(self.syms[sym].engine.portfolio.position)
        self.shutdown_info["cancel_all"] = await cancel_all(self.execution, self.syms)
        if self.reconciler is not None and self.crash is None:  # live mode
            self.shutdown_info["final_reconcile"] = await self.reconciler.final(self._drain)
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
        await asyncio.to_thread(finish_files, self)

    def _stop_watchdog(self) -> None:
        """Tell the watchdog the engine ends: it exits quietly when the exit cancel-all left nothing
        open, and cancel-alls itself otherwise (the engine could not confirm the venue clean)."""
        if self.watchdog is None or self.watchdog.stopped:
            return
        left = (self.shutdown_info.get("cancel_all") or {}).get("left_open")
        self.shutdown_info["watchdog"] = self.watchdog.stop(venue_clean=left == [])

    def _summary(self) -> dict[str, Any]:
        return summary(self)  # live/finish.py


def run_live(cfg: LiveConfig, **kw: Any) -> LiveResult:
    return asyncio.run(LiveRunner(cfg, **kw).run())
