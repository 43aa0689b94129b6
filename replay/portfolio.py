"""Replay of several instruments as one portfolio (``ReplayConfig.symbols``): one engine
(``engine/instruments.py``: a core per instrument, shared ids, one risk view), one replay clock, one
event log, a simulated exchange per instrument.

Every symbol's market data walks on the one clock, merged by (time, priority, the symbol's place in
``symbols``, its own order): ties between instruments always resolve the same way. Each instrument
has its own random streams; the first one's are those of a single-instrument replay, so a portfolio
of one instrument replays to that run's events exactly.

Sizes in the config (quote size, position and order limits) are in the first instrument's units; each
other instrument gets them scaled to the same notional at the first books' mids, rounded down to its
size step (at least its minimum order); ``ReplayConfig.instruments`` sets any of them explicitly.
Its contract (tick, size step) comes from the session's simulator manifest when it has one, else from
the decimals its recorded books show.

The compiled loop (``replay/kernel.py`` ``run_pf``) runs it where each instrument's configuration is
one it reproduces (anything but recorded order latencies mixed with drawn ones); otherwise the engine
is driven one event at a time, as ``--python-engine`` does for one instrument. Both give the same
events (``tests/replay/test_replay_portfolio.py``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from engine import assemble
from engine import kernel as K
from engine.assemble import Wiring, build_engine
from engine.clock import ReplayClock
from engine.contract import ContractConfig, grid_unit
from engine.core import PRIO_LABEL, Engine, EngineConfig
from engine.errors import DualhubError
from engine.eventlog import EventLog
from engine.events import STREAMS, BookSnapshot
from engine.instruments import Portfolio
from engine.kev.pairs import RulePairsKev
from engine.kev.sim import SimKevBackend
from engine.latency.models import LatencyModel, ScaledLatency
from engine.laya.model import Laya
from engine.legs import Legs
from engine.settings import check_latency
from engine.store import open_session
from replay import book_source, fast_path
from replay.book_source import SMALL_COLUMNS, GroupCache, StreamedBooks
from replay.config import ReplayConfig, RunResult, _sim_exchange, session_contract
from replay.fast_path import KernelRun, PortfolioRun, refuse
from replay.finish import _finish, _progress, _run_dir, _start_run_dir
from replay.kev_setup import _kev_backend, _lag_model
from replay.label_columns import LabelColumns
from replay.labels import _batch_v0, _BatchLabeler, _tick_labeler, _tick_labels, _v1_labeler
from replay.tape import (
    _NEGATIVE_LAYA,
    PRIO_EXCH_BOOK,
    PRIO_EXCH_TRADE,
    PRIO_LOCAL_BOOK,
    _check_streamable,
    _label_due,
    _Quarantine,
    _Tape,
)
from replay.tape_stream import FeedClock
from replay.walk import StreamedWalk, WalkStream
from venue.exchange import SimExchange

WALK_CHUNK = 1 << 16
_PRIO = (PRIO_EXCH_BOOK, PRIO_EXCH_TRADE, PRIO_LOCAL_BOOK)  # a walk entry's priority by its kind


def _rng(seed: int, component: int, inst: int) -> np.random.Generator:
    """Instrument ``inst``'s stream of a component; instrument 0's is the single-instrument replay's."""
    return np.random.default_rng([seed, component] if inst == 0 else [seed, component, inst])


def session_pairs(manifest: dict[str, Any], symbols: list[str]) -> tuple[tuple[str, str], ...]:
    """The pairs a portfolio fits: the simulated session's (leader, follower) pairs among ``symbols``,
    else the first symbol leading each of the others (as a live portfolio pairs them: a live
    recording's manifest names no simulator)."""
    sim = (manifest.get("simulator") or {}).get("pairs") or []
    pairs = tuple(
        (p["leader"], p["follower"]) for p in sim if p["leader"] in symbols and p["follower"] in symbols
    )
    return pairs or tuple((symbols[0], s) for s in symbols[1:])


def recorded_contract(
    manifest: dict[str, Any], books: pa.Table, trades: pa.Table, base: ContractConfig
) -> ContractConfig:
    """A symbol's contract: the session's spec (its fees included, as a single-instrument replay
    takes them), or for a session that names none, the finest price and size steps its books and
    trades show (the decimals of the exchange's strings) with ``base``'s fees."""
    symbol = books.column("symbol")[0].as_py()
    given = session_contract(manifest, symbol)
    if given is not None:
        return given
    col = lambda n: books.column(n).to_numpy(zero_copy_only=False)  # noqa: E731
    tcol = lambda n: trades.column(n).to_numpy(zero_copy_only=False)  # noqa: E731
    px = np.concatenate([col("bid_px_0"), col("ask_px_0"), tcol("px")])
    sz = np.concatenate([col("bid_sz_0"), col("ask_sz_0"), tcol("sz")])
    tick, step = grid_unit(px), grid_unit(sz)  # the importers' inference (engine/contract.py)
    if tick is None or step is None:
        what = "prices" if tick is None else "sizes"
        raise DualhubError(f"{symbol}: the data's {what} lie on no decimal grid of at most 12 decimals")
    return dataclasses.replace(base, symbol=symbol, tick=tick, size_step=step, min_qty=step)


def _first_mid(books: pa.Table) -> float | None:
    """The mid of the symbol's first usable book (None: none is)."""
    bid = books.column("bid_px_0").to_numpy(zero_copy_only=False)
    ask = books.column("ask_px_0").to_numpy(zero_copy_only=False)
    ok = np.isfinite(bid) & np.isfinite(ask) & (bid > 0) & (ask > bid)
    if not ok.any():
        return None
    j = int(np.argmax(ok))
    return float((bid[j] + ask[j]) / 2)


def _keys(seq: np.ndarray, j: int) -> np.ndarray:
    """Tie-break keys of instrument ``j``'s entries of one stream: its seqs, the instrument above them,
    so entries of one time and priority go by instrument, then in their tape's order."""
    if len(seq) and (int(seq.min()) < 0 or int(seq.max()) >= 1 << _INST_SHIFT):
        seq = np.argsort(np.argsort(seq, kind="stable"), kind="stable")  # their ranks: the same order
    return seq.astype(np.int64) + (j << _INST_SHIFT)


_INST_SHIFT = 40  # seqs below 2**40 keep their values in the keys; an instrument is the bits above


def portfolio_walk(tapes: list[_Tape], dues: list[np.ndarray] | None, chunk: int) -> StreamedWalk:
    """The merged walk of every instrument's tape, ``chunk`` entries at a time: (ts, priority, kind,
    row, instrument) by (ts, priority, instrument, the entry's place in its tape's order). With
    ``dues`` (per instrument, when each book's label becomes visible) the labels too (kind 4): labels
    due at the same time keep the order their books reached the engine in, across the instruments, as
    the label timers the per-event engine schedules then."""
    streams: list[WalkStream] = []
    book_keys = []
    for j, t in enumerate(tapes):
        bk = _keys(t.b_seq, j)
        book_keys.append(bk)
        streams += [
            WalkStream(t.b_exch, PRIO_EXCH_BOOK, bk, 0, j),
            WalkStream(t.t_exch, PRIO_EXCH_TRADE, _keys(t.t_seq, j), 1, j),
            WalkStream(t.b_loc, PRIO_LOCAL_BOOK, bk, 2, j),
        ]
    if dues is not None:
        # every instrument's books in the order the engine receives them: (arrival, instrument, seq)
        order = np.lexsort((np.concatenate(book_keys), np.concatenate([t.b_loc for t in tapes])))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        first = 0
        for j, due in enumerate(dues):
            streams.append(WalkStream(due, PRIO_LABEL, rank[first : first + len(due)], 4, j))
            first += len(due)
    return StreamedWalk(streams, chunk)


# Besides the small columns, what a streamed symbol's contract and first mid are read from.
_TOP_COLUMNS = ("bid_px_0", "ask_px_0", "bid_sz_0", "ask_sz_0")


def refuse_portfolio(cfg: ReplayConfig) -> None:
    """What the portfolio's loop cannot take, refused before the run: recorded order latencies (a live
    portfolio's: one table of each kind, looked up by every instrument in turn) beside drawn ones (one
    stream per instrument), as the loop's cores share their latency tables or keep their own."""
    recorded = [
        s.startswith("recorded:")
        for s in (cfg.latency_order_entry, cfg.latency_order_response, cfg.latency_cancel)
    ]
    if any(recorded) and not all(recorded):
        raise DualhubError(
            "a portfolio replays recorded order latencies for entry, response and cancel together or "
            "none of them (--latency-order-entry/--latency-order-response/--latency-cancel)"
        )


class _Clamped:
    """The feed floors of every instrument's tape, summed (what ``_finish`` reports)."""

    def __init__(self, tapes: list[_Tape]) -> None:
        self.clamped = {k: sum(t.clamped[k] for t in tapes) for k in ("books15", "trade")}


def run_portfolio(
    session_dir: Path | str,
    cfg: ReplayConfig,
    laya: Laya,
    *,
    out_dir: Path | str | None,
    overwrite: bool,
    progress: bool,
    kernel: bool = True,
    stream_books: bool = True,
) -> RunResult:
    """``kernel``: the compiled loop (False: the engines driven per event, as live drives them).
    ``stream_books``: on the compiled loop, each symbol's book levels are read (and labelled) a block
    at a time as the walk needs them, as a single-instrument replay's are; a row that fails validation
    raises InvalidRows, and the caller reruns it on whole tables, where such rows are dropped and
    reported."""
    t0 = time.perf_counter()
    symbols = list(cfg.symbols)
    session = open_session(session_dir)
    session.verify()
    if "books15" not in session.manifest["streams"]:
        raise DualhubError(f"{session.root} has no books15 stream to replay")
    have = set(session.manifest.get("symbols") or [])
    if missing := [s for s in symbols if s not in have]:
        raise DualhubError(
            f"{session.root} has no {', '.join(missing)}; its symbols: {', '.join(sorted(have)) or 'none'}"
        )
    features = laya.feature_version
    feed_clock = FeedClock.of_session(session.manifest)
    if kernel:
        refuse_portfolio(cfg)
    streamed: list[StreamedBooks | None] = [None] * len(symbols)
    # v0 labels (batch or per tick) are computed block by block as the levels stream; features v1 are
    # computed before the walk from whole tables, as the per-event engine's.
    if kernel and stream_books and features == "v0":
        # The symbols walk the same files side by side: a group one reads, the next reads too. A walk
        # chunk holds a share of each symbol's rows: blocks of that size keep what is held small (the
        # labels keep their bits: tests compare batches of 16 rows with whole tables).
        cache = GroupCache()
        schema = STREAMS["books15"].schema
        files = session.files("books15")
        block = max(book_source.BLOCK // 16, book_source.BLOCK // (2 * len(symbols)))
        tick = cfg.laya_mode == "tick"
        streamed = [
            StreamedBooks(files, laya, schema, symbol=s, cache=cache, block=block, tick=tick) for s in symbols
        ]
        cache.symbols_done()
        # the levels stay in the files; what the tape, the contracts and the first mids need
        books_of = session.read_symbols("books15", symbols, [*SMALL_COLUMNS, *_TOP_COLUMNS])
    else:
        books_of = session.read_symbols("books15", symbols)
    trades_of = (
        session.read_symbols("trade", symbols)
        if "trade" in session.streams
        else [STREAMS["trade"].schema.empty_table()] * len(symbols)
    )
    quarantine = _Quarantine()

    recorded: dict[tuple[str, str], LatencyModel] = {}

    def latency(spec: str, rng: np.random.Generator, scale: float, name: str) -> LatencyModel:
        # A recorded model (a live portfolio's delays, one table for every instrument) is one model:
        # each delay is looked up once, in the order the instruments asked for them.
        if spec.startswith("recorded:"):
            model = recorded.get((spec, name))
            if model is None:
                model = recorded[(spec, name)] = check_latency(spec, rng, name)
        else:
            model = check_latency(spec, rng, name)
        return model if scale == 1.0 else ScaledLatency(model, scale)

    tapes: list[_Tape] = []
    tables: list[tuple[pa.Table, pa.Table]] = []
    for j, sym in enumerate(symbols):
        books, trades = books_of[j], trades_of[j]
        if books.num_rows == 0:
            raise DualhubError(f"{session.root} has no books15 rows for {sym}")
        if streamed[j] is not None:  # the levels are checked block by block as they stream: here the rest
            _check_streamable(books, trades)
        else:
            books, trades = quarantine.check(session.root, sym, books, trades)
        feed = (
            None
            if cfg.latency_feed == "recorded"
            else check_latency(cfg.latency_feed, _rng(cfg.seed, 2, j), "latency_feed")
        )
        tapes.append(_Tape(books, trades, feed, cfg.scale_feed, cfg.exchange_feed, streamed[j], feed_clock))
        if streamed[j] is not None:  # the tape has its times and seqs: what the contracts still need
            books, trades = books.select(["symbol", *_TOP_COLUMNS]), trades.select(["symbol", "px", "sz"])
        tables.append((books, trades))
    del books_of, trades_of, books, trades  # `tables` holds them until the engines are built

    if kernel:
        # A recorded Laya table (one model for every instrument) is keyed by receive time, and the
        # engine takes books of one receive time by instrument: each instrument drawing its books in
        # turn takes each key's delays in the order the per-event engines do.
        dues = [
            _label_due(t, latency(cfg.latency_laya, _rng(cfg.seed, 3, j), cfg.scale_laya, "latency_laya"))
            for j, t in enumerate(tapes)
        ]
        if any(d is None for d in dues):
            raise DualhubError(_NEGATIVE_LAYA)
        return _run_compiled(
            session, cfg, laya, tapes, tables, [d for d in dues if d is not None], quarantine,
            latency, out_dir=out_dir, overwrite=overwrite, progress=progress, t0=t0,
        )  # fmt: skip

    # The merged walk, whole: the engine schedules the labels on the clock itself.
    ts, _, kind, row, inst = portfolio_walk(tapes, None, fast_path.WALK_CHUNK).all_entries()
    clock = ReplayClock(start_ns=int(ts[0]))
    run_dir = _run_dir(session.root, cfg, out_dir)
    tmp = _start_run_dir(run_dir, overwrite)
    log = EventLog(tmp / "events")
    advisor, kev = _portfolio_kev(cfg, clock)
    portfolio = _portfolio(session, cfg)
    configs = _instrument_configs(session, cfg, symbols, tables)
    wiring = Wiring(clock=clock, log=log, kev=kev, advisor_name=advisor.name, portfolio=portfolio, warm=False)
    exchanges: list[SimExchange] = []
    engines: list[Engine] = []
    for j in range(len(symbols)):
        books, trades = tables[j]
        tape = tapes[j]
        if features == "v1":
            labeler: Any = _v1_labeler(laya, cfg.laya_mode, books, trades, tape, clock)
        elif cfg.laya_mode == "batch":
            labels, probs = _batch_v0(laya, books)
            labeler = _BatchLabeler(tape.b_seq, labels, probs, clock)
        else:
            labeler = _tick_labeler(laya)
        exchange = _exchange(cfg, clock, latency, j, configs[j].contract)
        laya_latency = latency(cfg.latency_laya, _rng(cfg.seed, 3, j), cfg.scale_laya, "latency_laya")
        engine = build_engine(configs[j], wiring, exchange, labeler, laya_latency)
        exchanges.append(exchange)
        engines.append(engine)
    del tables

    n_walk = len(ts)
    bar = _progress(progress, n_walk)
    books_in_flight: list[dict[int, BookSnapshot]] = [{} for _ in symbols]
    run_before, timers = clock.run_before, clock.timers
    try:
        for c0 in range(0, n_walk, WALK_CHUNK):
            c1 = min(n_walk, c0 + WALK_CHUNK)
            for t, k, i, j in zip(
                ts[c0:c1].tolist(),
                kind[c0:c1].tolist(),
                row[c0:c1].tolist(),
                inst[c0:c1].tolist(),
                strict=True,
            ):
                p = _PRIO[k]
                if timers and (timers[0][0] < t or (timers[0][0] == t and timers[0][1] < p)):
                    run_before(t, p)
                else:
                    clock.t_ns = t
                if k == 0:
                    book = books_in_flight[j][i] = tapes[j].book(i)
                    exchanges[j].on_book(book)
                elif k == 2:
                    engines[j].on_book(books_in_flight[j].pop(i))
                elif k == 1 and exchanges[j].resting:  # a trade can only fill resting orders
                    exchanges[j].on_trade(tapes[j].trade(i))
            if bar is not None:
                bar.update(c1)
        portfolio.ending = True  # a leg check with nothing left to fill a leg is left out, as the loop does
        clock.run_all()
        portfolio.legs.finish(clock.now_ns())
    except BaseException:
        log.abandon()
        raise
    finally:
        kev.close()
        if bar is not None:
            bar.close()
    n_books = sum(len(t.b_seq) for t in tapes)
    n_trades = sum(len(t.t_seq) for t in tapes)
    path = f"python (a portfolio of {len(symbols)}, the engine driven per event: kernel=False)"
    return _finish(
        tmp, run_dir, log, session, cfg, laya, n_books, n_trades, advisor, t0, path,
        _WithLegs(quarantine, portfolio.legs), _Clamped(tapes), kev,
    )  # fmt: skip


def _portfolio_kev(cfg: ReplayConfig, clock: ReplayClock) -> tuple[Any, SimKevBackend]:
    """The portfolio's one Kev: each instrument asking on its own, or the hub answering for all of them
    (the pairs rule, or with ``kev_mode llm`` llama-server)."""
    if cfg.kev_hub == "pairs" and cfg.kev_mode == "sim":
        advisor = RulePairsKev(entry_z=cfg.pair_entry_z, exit_z=cfg.pair_exit_z)
        return advisor, SimKevBackend(advisor, _lag_model(cfg), clock)
    return _kev_backend(cfg, clock)


def _portfolio(session: Any, cfg: ReplayConfig) -> Portfolio:
    """The portfolio's shared state; with Kev as the hub, the pairs it fits (the session's)."""
    symbols = list(cfg.symbols)
    return assemble.portfolio(cfg, symbols, session_pairs(session.manifest, symbols) if cfg.kev_hub else ())


class _WithLegs:
    """The run's quarantine, writing the portfolio's ``legging.parquet`` beside its own file."""

    def __init__(self, quarantine: _Quarantine, legs: Legs) -> None:
        self.quarantine, self.legs = quarantine, legs

    def write(self, events_dir: Path) -> dict[str, dict[str, Any]]:
        return {**self.quarantine.write(events_dir), **self.legs.write(events_dir)}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.quarantine, name)


def _exchange(
    cfg: ReplayConfig, clock: ReplayClock, latency: Any, j: int, contract: ContractConfig
) -> SimExchange:
    """Instrument ``j``'s simulated exchange, its order latencies drawn from its own streams."""
    rngs = (_rng(cfg.seed, 4, j), _rng(cfg.seed, 5, j), _rng(cfg.seed, 6, j))
    return _sim_exchange(cfg, clock, latency, rngs, contract)


def _instrument_configs(
    session: Any, cfg: ReplayConfig, symbols: list[str], tables: list[tuple[pa.Table, pa.Table]]
) -> list[EngineConfig]:
    """Each instrument's engine config (engine.instruments.resolve_instruments, as live resolves them):
    the replay's, with its contract, sizes scaled to the first instrument's notional at the first books'
    mids, then the settings named for it."""
    contracts = {
        sym: recorded_contract(session.manifest, books, trades, cfg.contract)
        for sym, (books, trades) in zip(symbols, tables, strict=True)
    }
    mids = {sym: _first_mid(books) for sym, (books, _) in zip(symbols, tables, strict=True)}
    return assemble.instrument_configs(cfg, symbols, contracts, mids)


def _run_compiled(
    session: Any,
    cfg: ReplayConfig,
    laya: Laya,
    tapes: list[_Tape],
    tables: list[tuple[pa.Table, pa.Table]],
    dues: list[np.ndarray],
    quarantine: _Quarantine,
    latency: Any,
    *,
    out_dir: Path | str | None,
    overwrite: bool,
    progress: bool,
    t0: float,
) -> RunResult:
    """The portfolio on the compiled loop: a core and a simulated exchange per instrument."""
    symbols = list(cfg.symbols)
    walk = portfolio_walk(tapes, dues, fast_path.WALK_CHUNK)
    del dues
    clock = ReplayClock(start_ns=walk.first_ts())
    run_dir = _run_dir(session.root, cfg, out_dir)
    tmp = _start_run_dir(run_dir, overwrite)
    log = EventLog(tmp / "events")
    advisor, kev = _portfolio_kev(cfg, clock)
    configs = _instrument_configs(session, cfg, symbols, tables)
    wiring = Wiring(clock=clock, log=log, kev=kev, advisor_name=advisor.name, warm=False)
    labels, probs = [], []
    runs: list[KernelRun] = []
    try:
        built = []
        for j, tape in enumerate(tapes):
            lab, pr = _labels(cfg, laya, tape, *tables[j], clock)
            labels.append(lab)
            probs.append(pr)
            exchange = _exchange(cfg, clock, latency, j, configs[j].contract)
            engine = build_engine(configs[j], wiring, exchange, _no_labeler)
            refuse(engine, exchange)
            built.append((engine, exchange))
        # after every Engine: the first run's output streams are the ones the log reads
        for sym, (engine, exchange) in zip(symbols, built, strict=True):
            share = runs[0] if runs else None
            runs.append(KernelRun.for_replay(cfg, engine, exchange, advisor, log, sym, share=share))
        del tables[:]
        label_cols = LabelColumns.of_instruments(
            log,
            symbols,
            [t.b_evt for t in tapes],
            [t.b_seq for t in tapes],
            [t.b_loc for t in tapes],
            labels,
            probs,
        )
        bar = _progress(progress, walk.total)
        try:
            state = _portfolio(session, cfg)
            fast_path.run_portfolio_kernel(
                PortfolioRun(runs, state),
                walk,
                [t.levels for t in tapes],
                [t.b_loc for t in tapes],
                labels,
                probs,
                [(t.t_px, t.t_sz, t.t_side_codes()) for t in tapes],
                label_cols.add_many,
                bar,
            )
        finally:
            if bar is not None:
                bar.close()
    except BaseException:
        log.abandon()
        raise
    finally:
        kev.close()
    n_books = sum(len(t.b_seq) for t in tapes)
    n_trades = sum(len(t.t_seq) for t in tapes)
    path = f"kernel (a portfolio of {len(symbols)})"
    if all(t.streamed is not None for t in tapes):
        blocks = sum(t.streamed.blocks_read for t in tapes if t.streamed is not None)
        path = f"kernel (a portfolio of {len(symbols)}, books streamed, {blocks} blocks)"
    state.legs.finish(max(int(r.S[K.S_NOW]) for r in runs))
    return _finish(
        tmp, run_dir, log, session, cfg, laya, n_books, n_trades, advisor, t0, path,
        _WithLegs(quarantine, state.legs), _Clamped(tapes), kev,
    )  # fmt: skip


def _labels(
    cfg: ReplayConfig, laya: Laya, tape: _Tape, books: pa.Table, trades: pa.Table, clock: ReplayClock
) -> tuple[np.ndarray, np.ndarray]:
    """An instrument's labels and probabilities by tape row, for the compiled loop: a streamed tape's
    (labelled block by block as the walk reads the levels), or the whole table's, in batch or each row
    through the tick path (v1 per tick: each book's labelled in the order the engine receives them,
    the trades before it fed in: the bits the per-event engine computes)."""
    if tape.streamed is not None:
        return tape.streamed.labels, tape.streamed.probs
    if laya.feature_version != "v1":
        return _batch_v0(laya, books, tick=cfg.laya_mode == "tick")
    labeler: Any = _v1_labeler(laya, cfg.laya_mode, books, trades, tape, clock)
    if not isinstance(labeler, _BatchLabeler):
        labeler = _tick_labels(labeler, tape, clock)
    return labeler.labels, labeler.probs


def _no_labeler(book: BookSnapshot) -> tuple[int, np.ndarray]:
    raise AssertionError("the compiled loop labels the books itself")
