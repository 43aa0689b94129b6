"""Replay driver: a recorded session through the same engine that trades live, on a virtual clock.

Market streams are merged in the stable total order ``(ts_recv, stream priority, seq)``; timers on
the replay clock (Laya labels, Kev replies, exchange reports) interleave by the same kind of key.
Nothing here reads the wall clock except to report how long the run took.
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.assemble import Wiring, build_engine, instrument_configs
from engine.clock import ReplayClock
from engine.core import PRIO_LABEL, Engine
from engine.errors import DualhubError
from engine.eventlog import EventLog
from engine.events import STREAMS, BookSnapshot
from engine.latency.models import LatencyModel, ScaledLatency
from engine.laya.model import Laya
from engine.settings import check_latency
from engine.store import (
    SessionError,
    open_session,
)
from replay import fast_path
from replay.book_source import InvalidRows, StreamedBooks, one_symbol
from replay.config import (
    ReplayConfig,
    RunResult,
    _rng,
    _sim_exchange,
    check_contract_units,
    check_symbol,
    with_session_contract,
)
from replay.fast_path import KernelRun, refuse
from replay.finish import _check_run_dir, _finish, _progress, _run_dir, _start_run_dir, _tmp_dir
from replay.kev_setup import _kev_backend
from replay.label_columns import LabelColumns
from replay.labels import _batch_v0, _BatchLabeler, _load_laya, _tick_labeler, _tick_labels, _v1_labeler
from replay.market_cache import CacheCorrupt, MarketCache, attach, key_for
from replay.run_metrics import MetricsLog
from replay.tape import (
    _NEGATIVE_LAYA,
    PRIO_EXCH_BOOK,
    PRIO_EXCH_TRADE,
    PRIO_LOCAL_BOOK,
    _check_streamable,
    _for_symbol,
    _label_due,
    _Quarantine,
    _Tape,
    _walk,
)
from replay.tape_stream import (
    FeedClock,
    StreamedTape,
    TapeDisorder,
    streamable,
)
from replay.walk import StreamedWalk
from venue.exchange import SimExchange

# the run's latency models (a name of this module: tests put models of their own in its place)
_checked_latency = check_latency


def run_replay(
    session_dir: Path | str,
    config: ReplayConfig | None = None,
    *,
    out_dir: Path | str | None = None,
    overwrite: bool = False,
    progress: bool = False,
    kernel: bool = True,
    market_cache: bool | MarketCache = False,
    metrics_only: bool = False,
) -> RunResult:
    """Replay ``session_dir`` and write the run (events + manifest) to ``out_dir``.

    ``kernel``: run the compiled loop (``replay/kernel.py``: the core and the simulated exchange) when
    the configuration is one it reproduces exactly; otherwise, or with ``kernel=False``, the Python
    engine runs. Both give the same events (``tests/replay/test_replay_kernel.py``); ``RunResult.path`` says
    which ran. ``market_cache``: read the books' levels and labels from the session's market cache, or
    build it (``replay.market_cache``; True: the one beside the session). ``metrics_only``: write
    nothing; the result has the digest and ``summary`` (``replay.run_metrics``; one instrument)."""
    cfg = with_session_contract(session_dir, config or ReplayConfig())
    run_dir = _run_dir(session_dir, cfg, out_dir)
    if metrics_only and cfg.symbols:
        raise DualhubError("a metrics-only run replays one instrument; a portfolio writes its log")
    if not metrics_only:
        _check_run_dir(run_dir, overwrite)  # before any work: a bad --out fails now, not after the run
    # A replay allocates millions of short-lived, acyclic objects (books, trades, event rows): the
    # cyclic collector's passes over the buffered rows cost a visible share of the run and find
    # next to nothing, so it is paused for the run and restored after.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        # not a session: one line before the model loads (and says which provider); nor an instrument
        # the core's integers cannot hold
        check_contract_units(open_session(session_dir), cfg)
        laya = _load_laya(cfg)  # once: the retries below reuse it
        if cfg.symbols:  # a portfolio: one engine over the instruments
            from replay.portfolio import run_portfolio

            try:
                return run_portfolio(
                    session_dir,
                    cfg,
                    laya,
                    out_dir=run_dir,
                    overwrite=overwrite,
                    progress=progress,
                    kernel=kernel,
                )
            except InvalidRows:  # as below: whole tables, where such rows are dropped and reported
                return run_portfolio(
                    session_dir, cfg, laya, out_dir=run_dir, overwrite=True, progress=progress, kernel=kernel,
                    stream_books=False,
                )  # fmt: skip
        extra = _Extras(market_cache, metrics_only)
        whole, stream_books = "", True
        while True:
            try:
                return _run_replay(
                    session_dir,
                    cfg,
                    laya,
                    out_dir=run_dir,
                    overwrite=overwrite or bool(whole),
                    progress=progress,
                    kernel=kernel,
                    whole_tape=whole,
                    stream_books=stream_books,
                    extra=extra,
                )
            except CacheCorrupt:  # the entry is gone: this run builds it again
                continue
            except (TapeDisorder, InvalidRows) as e:
                # Rows out of order in the files: the whole-table tape sorts them. Rows that fail
                # validation: whole tables, where they are dropped and reported. Each once at most.
                if not stream_books or (whole and isinstance(e, TapeDisorder)):
                    raise
                whole, stream_books = str(e), not isinstance(e, InvalidRows)
    except BaseException:  # an error or Ctrl-C mid-run: the half-written run goes (a finished one is moved)
        shutil.rmtree(_tmp_dir(run_dir), ignore_errors=True)
        raise
    finally:
        # The run's reference cycles (the event log and its column streams, closures: the run's
        # buffers hang off them) were all made while the collector was paused, so they are all young:
        # one pass over the youngest generation frees them now (~1 ms), where left to age they waited
        # for a full collection and a process that replays again held ~37 MB more a run.
        gc.collect(0)
        if gc_was_enabled:
            gc.enable()


@dataclass(frozen=True)
class _Extras:
    """How a run is kept, beside what it computes: the market cache to read or build (False: none) and
    whether only its digest and summary are kept (no files)."""

    market_cache: bool | MarketCache = False
    metrics_only: bool = False


def _run_replay(
    session_dir: Path | str,
    cfg: ReplayConfig,
    laya: Laya,
    *,
    out_dir: Path | str | None,
    overwrite: bool,
    progress: bool,
    kernel: bool = False,
    whole_tape: str = "",
    stream_books: bool = True,
    extra: _Extras = _Extras(),
) -> RunResult:
    """``whole_tape``: why the per-row columns must be read whole (else they are streamed where they can
    be); ``stream_books`` False: the book levels too (rows that fail validation are dropped from the
    tables, which streamed levels could not follow)."""
    t0 = time.perf_counter()
    cache_state = "off (not asked)" if extra.market_cache else ""
    session = open_session(session_dir)
    session.verify()
    if "books15" not in session.manifest["streams"]:
        raise SessionError(f"{session.root} has no books15 stream to replay")
    check_symbol(session.root, session.manifest, cfg.symbol)
    features = laya.feature_version  # cfg.laya_features, or the model's own for "auto"
    clock = FeedClock.of_session(session.manifest)
    rng_feed, rng_laya, rng_order = _rng(cfg.seed, 2), _rng(cfg.seed, 3), _rng(cfg.seed, 4)
    # One stream per order latency model, so each model's draws can be taken ahead in a batch (the
    # compiled loop does): from a shared stream they would depend on how the three interleave.
    rng_response, rng_cancel = _rng(cfg.seed, 5), _rng(cfg.seed, 6)

    def latency(spec: str, rng: np.random.Generator, scale: float, name: str) -> LatencyModel:
        model = _checked_latency(spec, rng, name)
        return model if scale == 1.0 else ScaledLatency(model, scale)

    laya_latency = latency(cfg.latency_laya, rng_laya, cfg.scale_laya, "latency_laya")
    # The kernel with v0 labels streams the book levels a block at a time, and, when the files
    # hold every stream in order, the per-row columns too (replay/tape_stream.py: flat memory); any
    # other run reads the whole table.
    streamed: StreamedBooks | None = None
    book_files = session.files("books15")
    trade_files = session.files("trade") if "trade" in session.streams else []
    tape: _Tape | StreamedTape
    if kernel and stream_books and features == "v0":
        tick = cfg.laya_mode == "tick"
        # a session of several symbols: the symbol's rows are picked out of each row group
        only = one_symbol(book_files, cfg.symbol)
        symbol = None if only else cfg.symbol
        streamed = StreamedBooks(book_files, laya, STREAMS["books15"].schema, symbol=symbol, tick=tick)
        if extra.market_cache:
            cache = extra.market_cache
            if not isinstance(cache, MarketCache):
                cache = MarketCache.beside(session.root)
            key = key_for(session.digest(), cfg.symbol, laya, cfg.laya_mode)
            cache_state = attach(cache, streamed, key)
    recorded = cfg.latency_feed == "recorded"
    feed = None if recorded else _checked_latency(cfg.latency_feed, rng_feed, "latency_feed")
    if whole_tape:
        why_whole = whole_tape
    else:
        why_whole = streamable(feed, cfg.scale_feed, cfg.exchange_feed)
    walk: StreamedWalk | None = None
    quarantine = _Quarantine()
    if streamed is not None and not why_whole:
        if streamed.num_rows == 0:
            raise DualhubError(f"{session.root} has no books15 rows for {cfg.symbol}")
        tape = StreamedTape(
            streamed,
            trade_files,
            cfg.symbol,
            cfg.exchange_feed,
            laya_latency,
            (PRIO_EXCH_BOOK, PRIO_EXCH_TRADE, PRIO_LOCAL_BOOK, PRIO_LABEL),
            clock,
            feed,
            cfg.scale_feed,
        )
        walk = tape.walk(fast_path.WALK_CHUNK)
        start_ns, n_walk = tape.first_ts(), walk.total
        n_books, n_trades = tape.n_books, tape.n_trades
        labels_walked = True
        book_table = trade_table = None
    else:
        if streamed is not None:
            book_table = streamed.small_columns()
        else:
            book_table = _for_symbol(session.read_table("books15"), cfg.symbol)
        if book_table.num_rows == 0:
            raise DualhubError(f"{session.root} has no books15 rows for {cfg.symbol}")
        trade_table = _for_symbol(
            session.read_table("trade")
            if "trade" in session.streams
            else STREAMS["trade"].schema.empty_table(),
            cfg.symbol,
        )
        if streamed is not None:  # the levels are checked block by block as they stream: here the rest
            _check_streamable(book_table, trade_table)
        else:
            book_table, trade_table = quarantine.check(session.root, cfg.symbol, book_table, trade_table)
        tape = _Tape(book_table, trade_table, feed, cfg.scale_feed, cfg.exchange_feed, streamed, clock)
        n_books, n_trades = book_table.num_rows, trade_table.num_rows
        label_due = _label_due(tape, laya_latency)
        if kernel and label_due is None:
            raise DualhubError(_NEGATIVE_LAYA)
        labels_walked = label_due is not None  # else Engine.on_book schedules each label on the clock
        # The kernel takes the walk a chunk at a time from a merge of the streams; the per-event driver
        # walks the whole sorted order. The same entries in the same order (replay/walk.py).
        if kernel and label_due is not None:
            walk = StreamedWalk(tape.walk_streams(label_due), fast_path.WALK_CHUNK)
            start_ns, n_walk = walk.first_ts(), walk.total
        else:
            ts, prio, kind, row = tape.order(label_due)
            start_ns, n_walk = int(ts[0]), len(ts)
        del label_due
    clock = ReplayClock(start_ns=start_ns)
    if features == "v1":
        assert isinstance(tape, _Tape) and book_table is not None and trade_table is not None
        labeler: Callable[[BookSnapshot], tuple[int, np.ndarray]] = _v1_labeler(
            laya, cfg.laya_mode, book_table, trade_table, tape, clock
        )
    elif streamed is not None:  # labels computed block by block as the walk reads the levels
        # a streamed tape checks its seqs as it reads them: nothing here may look at unread rows
        lazy = isinstance(tape, StreamedTape)
        labeler = _BatchLabeler(tape.b_seq, streamed.labels, streamed.probs, clock, lazy=lazy)
    elif cfg.laya_mode == "batch" or kernel:
        # per tick for the compiled loop too: it reads labels by row, each computed by the tick path
        # (a label depends on its book alone, not on the engine's state)
        assert book_table is not None
        labels, probs = _batch_v0(laya, book_table, tick=cfg.laya_mode == "tick")
        labeler = _BatchLabeler(tape.b_seq, labels, probs, clock)
    else:  # the engine driven per event labels each book as it arrives, as live mode does
        labeler = _tick_labeler(laya)
    del book_table, trade_table

    run_dir = _run_dir(session.root, cfg, out_dir)
    if extra.market_cache and streamed is None:
        cache_state = "off (this run does not stream the books' levels)"
    tmp: Path | None = None
    log: EventLog
    if extra.metrics_only:
        log = MetricsLog()
    else:
        tmp = _start_run_dir(run_dir, overwrite)
        log = EventLog(tmp / "events")
    advisor, kev = _kev_backend(cfg, clock)
    (ec,) = instrument_configs(cfg, [cfg.symbol], {cfg.symbol: cfg.contract}, {})
    exchange = _sim_exchange(cfg, clock, latency, (rng_order, rng_response, rng_cancel), ec.contract)
    wiring = Wiring(clock=clock, log=log, kev=kev, advisor_name=advisor.name, warm=False)
    engine = build_engine(ec, wiring, exchange, labeler, laya_latency)

    bar = _progress(progress, n_walk)
    if kernel:
        try:
            refuse(engine, exchange)
        except DualhubError:
            log.abandon()
            raise
        if not isinstance(labeler, _BatchLabeler):  # v1 per tick: a pass over the books first
            assert isinstance(tape, _Tape)
            labeler = _tick_labels(labeler, tape, clock)
        try:
            assert walk is not None
            _run_kernel(cfg, engine, exchange, advisor, log, tape, labeler, walk, bar)
        except BaseException:
            log.abandon()
            if streamed is not None and streamed.building is not None:
                streamed.building.abandon()
            raise
        finally:
            kev.close()
            if bar is not None:
                bar.close()
        if isinstance(tape, StreamedTape):
            path = f"kernel (books and tape streamed, {streamed.blocks_read if streamed else 0} blocks)"
        elif streamed is not None:
            path = f"kernel (books streamed, {streamed.blocks_read} blocks; tape whole: {why_whole})"
        else:
            path = f"kernel (tape whole: {whole_tape})" if whole_tape else "kernel"
        if streamed is not None and streamed.building is not None:
            cache_state = "built" if streamed.building.commit() else "off (not kept: a write failed)"
        result = _finish(
            tmp, run_dir, log, session, cfg, laya, n_books, n_trades, advisor, t0, path, quarantine, tape, kev
        )
        return dataclasses.replace(result, market_cache=cache_state) if cache_state else result
    assert isinstance(tape, _Tape)
    if bar is not None:  # a slow Kev (a real LLM) moves the bar per answer, not only per walk chunk
        kev.on_answer = lambda: bar.update(int(np.searchsorted(ts, clock.t_ns, side="right")), kev.answers)
    books_in_flight: dict[int, BookSnapshot] = {}  # seen by the exchange, not yet by the engine
    # Labels drawn up front (label_due): received books waiting for their label's time.
    labels_in_flight: dict[int, tuple[BookSnapshot, int, np.ndarray]] = {}
    receive_book, on_label = engine.receive_book, engine.on_label
    if labels_walked:  # labels delivered by the walk: their events are kept as columns
        # A batch labeler's arrays are indexed by tape row: the label columns gather from them.
        by_row = (labeler.labels, labeler.probs) if isinstance(labeler, _BatchLabeler) else (None, None)
        add_label = LabelColumns(log, tape.symbol, tape.b_evt, tape.b_seq, tape.b_loc, *by_row).add
    run_before, timers = clock.run_before, clock.timers
    try:
        for rows in _walk(ts, prio, kind, row, bar=bar):
            for t, p, k, i in rows:
                # Timers (priority >= 40) at the same timestamp come after market data (priority < 40).
                if timers and (timers[0][0] < t or (timers[0][0] == t and timers[0][1] < p)):
                    run_before(t, p)
                else:  # nothing due first (the common case): just move time on, without a call
                    clock.t_ns = t
                if k == 0:
                    book = books_in_flight[i] = tape.book(i)
                    exchange.on_book(book)
                elif k == 2:
                    book = books_in_flight.pop(i)
                    if not labels_walked:
                        engine.on_book(book)
                    else:  # Engine.on_book, with the label's timer replaced by its walk entry (kind 4)
                        labels_in_flight[i] = (book, *receive_book(book))
                elif k == 4:
                    book, label_id, probs = labels_in_flight.pop(i)
                    add_label(i, t, label_id, probs)
                    on_label(book, label_id, probs, logged=True)
                elif exchange.resting:  # k == 1: a trade can only fill resting orders, else nothing to do
                    exchange.on_trade(tape.trade(i))
        clock.run_all()
    except BaseException:
        log.abandon()  # its writer thread stops before run_replay removes the directory
        raise
    finally:
        kev.close()
        if bar is not None:
            bar.close()
    result = _finish(
        tmp,
        run_dir,
        log,
        session,
        cfg,
        laya,
        n_books,
        n_trades,
        advisor,
        t0,
        "python (kernel=False)",
        quarantine,
        tape,
        kev,
    )
    return dataclasses.replace(result, market_cache=cache_state) if cache_state else result


def _run_kernel(
    cfg: ReplayConfig,
    engine: Engine,
    exchange: SimExchange,
    advisor: Any,
    log: EventLog,
    tape: _Tape | StreamedTape,
    labeler: _BatchLabeler,
    walk: StreamedWalk,
    bar: Any,
) -> None:
    run = KernelRun.for_replay(cfg, engine, exchange, advisor, log, tape.symbol)
    labels = LabelColumns(log, tape.symbol, tape.b_evt, tape.b_seq, tape.b_loc, labeler.labels, labeler.probs)
    between: Callable[[], None] | None = None
    if isinstance(tape, StreamedTape):
        t_side = tape.t_side
        streamed_tape, chunk, cursors = tape, fast_path.WALK_CHUNK, walk.cursors

        def between() -> None:
            # Readers of book rows: the merge's three book streams (in row order, so a cursor is the
            # next row), the engine's last book and the label events not yet written.
            at = b0, _, b2, b4 = tuple(int(c) for c in cursors)
            needed = min(streamed_tape.lowest_book_row(b0, b2, b4), int(run.S[fast_path.K.S_ENG_ROW]))
            pending = labels.oldest_row()
            if pending is not None:
                needed = min(needed, pending)
            streamed_tape.release(needed, at)
            streamed_tape.fill(at, chunk)

    else:
        t_side = tape.t_side_codes()
    fast_path.run_kernel(
        run,
        walk,
        tape.levels,
        tape.b_loc,
        labeler.labels,  # the same arrays: a streamed tape fills them block by block
        labeler.probs,
        (tape.t_px, tape.t_sz, t_side),
        labels.add_many,
        bar,
        between,
    )
