"""Replay driver: a recorded session through the same engine that trades live, on a virtual clock.

Market streams are merged in the stable total order ``(ts_recv, stream priority, seq)``; timers on
the replay clock (Laya labels, Kev replies, exchange reports) interleave by the same kind of key.
Nothing here reads the wall clock except to report how long the run took.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engine import validate
from engine.assemble import Wiring, build_engine, instrument_configs
from engine.bounds import check_ms
from engine.clock import ReplayClock
from engine.contract import ContractConfig, check_units, contract_of, tick_parts
from engine.core import PRIO_LABEL, Engine, engine_identity
from engine.errors import DualhubError, check_output_path
from engine.eventlog import RUN_SCHEMA_VERSION, EventLog
from engine.events import STREAMS, BookSnapshot, Trade
from engine.fastinit import frozen_maker
from engine.kev.cassette import Cassette, CassetteAdvisor, answered_by
from engine.kev.health import run_health
from engine.kev.lag import EmpiricalLag
from engine.kev.llama import LlamaAdvisor, LlamaConfig
from engine.kev.pairs import RulePairsKev
from engine.kev.rules import RuleKev
from engine.kev.sim import SimKevBackend
from engine.latency.batch import sample_each
from engine.latency.models import LatencyModel, LognormalLatency, ScaledLatency
from engine.laya.features import features_v0, features_v0_batch
from engine.laya.features_v1 import FeaturesV1, features_v1_batch
from engine.laya.model import DEFAULT_MODEL, FEATURE_SIZES, N_CLASSES, Laya, LayaConfig, training_sessions
from engine.risk import DEFAULT_RULES
from engine.settings import EngineSettings, check_latency
from engine.store import (
    SeqOrderError,
    SessionError,
    atomic_write_parquet,
    open_session,
    sha256_file,
    write_json,
)
from engine.strategies import plugin
from replay import fast_path
from replay.book_source import InvalidRows, StreamedBooks, one_symbol
from replay.fast_path import KernelRun, LookAheadError, refuse
from replay.label_columns import LabelColumns
from replay.market_cache import CacheCorrupt, MarketCache, attach, key_for
from replay.run_metrics import MetricsLog
from replay.tape_stream import (
    ONE_CLOCK,
    FeedClock,
    StreamedTape,
    TapeDisorder,
    arrival_times,
    exchange_times,
    side_codes,
    streamable,
)
from replay.walk import StreamedWalk, WalkStream
from venue.exchange import SimExchange
from venue.fills import check_fill_model

CLOCK_WARN_NS = 100_000_000  # a session whose clocks disagree by more than this is warned about
KEV_MODES = ("sim", "cassette", "llm")
KEV_LAG_SOURCES = ("measured", "model")

# Merge priorities at one timestamp: the exchange sees market data before the engine does.
PRIO_EXCH_BOOK, PRIO_EXCH_TRADE = 5, 6
PRIO_LOCAL_BOOK, PRIO_LOCAL_TRADE = STREAMS["books15"].priority, STREAMS["trade"].priority


# the run's latency models (a name of this module: tests put models of their own in its place)
_checked_latency = check_latency


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayConfig(EngineSettings):
    """Everything that determines a replay's output: the engine's settings (engine/settings.py) and
    where its data, labels, latencies and Kev's answers come from. Its sha256 is part of the run
    manifest."""

    symbol: str = "BTCUSDT"  # the instrument, when ``symbols`` names no portfolio
    model_path: Path = DEFAULT_MODEL
    laya_provider: str = "auto"
    laya_mode: str = "batch"  # "batch": features+inference over the whole session; "tick": per snapshot
    # "auto": the features the model was trained on (its metadata); "v0" (books15) or "v1" (books15 +
    # trades): those, and the model must match
    laya_features: str = "auto"
    latency_laya: str = "const:200us"  # Laya compute: the label is an event at book receipt + this
    latency_feed: str = "recorded"  # exchange -> local market data: the recorded ts_recv, or a model
    # When the simulated exchange sees market data: "event" (exchange time, as a venue does) or "local"
    # (at local receipt, as live mode's paper exchange did: what replaying a paper run needs).
    exchange_feed: str = "event"
    kev_lag_p5_ms: float = 200.0
    kev_lag_p95_ms: float = 350.0
    kev_mode: str = "sim"  # "sim": rule advisor + lag model; "cassette": recorded replies and lags;
    #                        "llm": a running llama-server, cached by key, lag per kev_lag_source
    kev_cassette: str = ""  # cassette.parquet or a run directory (cassette mode)
    kev_miss_policy: str = "fail"  # cassette miss: "fail", "sim" (rules + lag model) or "live" (llm)
    kev_lag_fit: str = ""  # lag.json from `dualhub kev fit-lag`: measured lag instead of lognormal
    fill_model: str = "queue_power2"  # venue.fills.FILL_MODELS; a queue position, not touch's none
    # What-if multipliers on modelled latencies (``--scale-latency kev=2,laya=1,order=0.5,feed=1``).
    scale_kev: float = 1.0
    scale_laya: float = 1.0
    scale_order: float = 1.0
    scale_feed: float = 1.0
    contract: ContractConfig = field(default_factory=ContractConfig)
    # where ``contract`` came from: "" (the engine's default, Bitget's BTCUSDT perpetual, or a simulator
    # session's instrument), "session:exchange|known|inferred" (the session's manifest ``contracts``,
    # as its recorder or importer wrote it), "flag" (--contract / --contract-defaults)
    contract_source: str = ""
    # Kev's lag when a live model answers (llm mode, cassette misses under --kev-miss live): "measured"
    # (each call's wall time x scale_kev, so a 2.5 s answer is 2.5 s late on the virtual clock and the
    # engine's Kev timeout can fire) or "model" (drawn from the lag model, as sim mode).
    kev_lag_source: str = "measured"

    def __post_init__(self) -> None:
        EngineSettings.check(self)
        if self.contract_source not in ("", "flag") and not self.contract_source.startswith("session:"):
            raise DualhubError(
                f"contract_source must be '', 'flag' or 'session:<spec_source>', not {self.contract_source!r}"
            )
        if self.kev_hub == "llm" and self.kev_mode not in ("llm", "cassette"):
            raise DualhubError(
                "kev_hub 'llm' asks the portfolio's questions of llama-server: needs kev_mode llm "
                "(or cassette: a run's recorded answers)"
            )
        if self.kev_lag_source not in KEV_LAG_SOURCES:
            raise DualhubError(f"kev_lag_source must be 'measured' or 'model', not {self.kev_lag_source!r}")
        check_ms(self.kev_lag_p5_ms, "kev_lag_p5_ms")
        check_ms(self.kev_lag_p95_ms, "kev_lag_p95_ms")
        if not self.kev_lag_p5_ms < self.kev_lag_p95_ms:
            p5, p95 = self.kev_lag_p5_ms, self.kev_lag_p95_ms
            raise DualhubError(f"kev_lag_p5_ms must be below kev_lag_p95_ms, got {p5} and {p95}")
        if self.laya_mode not in ("batch", "tick"):
            raise DualhubError(f"laya_mode must be 'batch' or 'tick', not {self.laya_mode!r}")
        if self.laya_features not in ("auto", *FEATURE_SIZES):
            raise DualhubError(f"laya_features must be 'auto', 'v0' or 'v1', not {self.laya_features!r}")
        check_fill_model(self.fill_model)
        if self.exchange_feed not in ("event", "local"):
            raise DualhubError(f"exchange_feed must be 'event' or 'local', not {self.exchange_feed!r}")
        if self.kev_mode not in KEV_MODES:
            raise DualhubError(f"unknown Kev mode {self.kev_mode!r}; known: {', '.join(KEV_MODES)}")
        if self.kev_mode == "cassette" and not self.kev_cassette:
            raise DualhubError("Kev cassette mode needs a cassette (--kev-cassette FILE_OR_RUN)")
        if (self.kev_mode == "llm" or self.kev_miss_policy == "live") and not self.kev_url:
            raise DualhubError("Kev llm mode and the live miss policy need a llama-server URL (--kev-url)")
        for name in ("scale_kev", "scale_laya", "scale_order", "scale_feed"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise DualhubError(f"{name} must be a finite number >= 0, got {v}")
        rng = np.random.default_rng(0)
        check_latency(self.latency_laya, rng, "latency_laya")
        if self.latency_feed != "recorded":
            check_latency(self.latency_feed, rng, "latency_feed")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["model_path"] = Path(self.model_path).name  # identity is the model's sha256, not where it lives
        if d["exchange_feed"] == "event":  # the default leaves earlier config hashes (run names) unchanged
            del d["exchange_feed"]
        if not self.asks_live_model():  # the lag source means nothing there: run names stay as they were
            del d["kev_lag_source"]
        if self.strategy == "baseline" and not self.strategy_params:  # run names stay as they were
            del d["strategy"], d["strategy_params"]
        if plugin.is_spec(self.strategy):  # its source is part of the run: an edit is another run
            d["strategy_sha256"] = plugin.source_sha256(self.strategy)
        if self.risk.rules == DEFAULT_RULES:  # run names stay as they were; runtime.json names the rules
            del d["risk"]["rules"]
        for name in ("portfolio_max_net_delta_usd", "portfolio_max_gross_usd", "portfolio_loss_stop_usd"):
            if math.isinf(d["risk"][name]):  # unbound (the default): run names stay as they were
                del d["risk"][name]
        if not self.contract_source:  # the default contract: run names stay as they were
            del d["contract_source"]
        if not self.symbols:
            del d["symbols"]
        if not self.instruments:
            del d["instruments"]
        if not self.kev_hub:  # the pairs' settings mean nothing without the hub: run names stay
            for name in (
                "kev_hub",
                "pair_entry_z",
                "pair_exit_z",
                "pair_half_life_ms",
                "leg_timeout_ms",
                "leg_hedge",
            ):
                del d[name]
        return orjson.loads(orjson.dumps(d, default=str))

    def asks_live_model(self) -> bool:
        """Whether a running llama-server answers any request (llm mode, or live cassette misses)."""
        return self.kev_mode == "llm" or (self.kev_mode == "cassette" and self.kev_miss_policy == "live")

    def sha256(self) -> str:
        return hashlib.sha256(orjson.dumps(self.to_json(), option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    digest: str
    counts: dict[str, int]
    books: int
    trades: int
    wall_s: float
    laya: dict[str, Any]
    kev: dict[str, Any]
    path: str = "python"  # "kernel ...", or "python (why not the kernel)"
    quarantine: dict[str, dict[str, int]] = field(default_factory=dict)  # stream -> reason -> rows
    decision_digest: str = ""  # the digest without wall-time columns (engine.events.NON_DECISION_COLUMNS)
    in_sample: dict[str, Any] = field(default_factory=dict)  # the manifest's "in_sample"
    feed: dict[str, Any] = field(default_factory=dict)  # the manifest's "feed": clocks and feed latency
    warnings: tuple[str, ...] = ()  # what a researcher must not miss (the CLI prints them loudly)
    market_cache: str = ""  # replay.market_cache: "reused", "built", "off (why)"; "" when not asked
    summary: dict[str, Any] = field(default_factory=dict)  # a metrics-only run's (replay.run_metrics)

    @property
    def snapshots_per_s(self) -> float:
        return self.books / self.wall_s if self.wall_s > 0 else float("inf")


def _rng(seed: int, component: int) -> np.random.Generator:
    """One independent stream per component, so adding a component never shifts another's draws."""
    return np.random.default_rng([seed, component])


class _BatchLabeler:
    """Labels for a whole session computed up front (features and inference over all rows at once).

    It answers only for a book the engine has already received (``ts_recv <= now``): precomputed
    labels of future books exist in memory, and this guard is what keeps them unreadable.
    """

    def __init__(
        self, seqs: np.ndarray, labels: np.ndarray, probs: np.ndarray, clock: ReplayClock, lazy: bool = False
    ) -> None:
        """``lazy``: the arrays are filled as the replay goes (a streamed tape, which checks the seqs
        itself); they are looked at on the first call, which only the per-event driver makes."""
        self.seqs = np.asarray(seqs, dtype=np.int64)
        self.labels, self.probs, self.clock = labels, probs, clock
        self._n = len(self.seqs)
        self._ready = False
        if not lazy:
            self._prepare()

    def _prepare(self) -> None:
        # Book seqs are per stream across symbols, so one symbol's seqs can skip: look rows up by seq
        # (binary search over the sorted seqs; a dict of a million ints would cost ~100 MB).
        n, seqs = self._n, self.seqs
        if n > 1 and not bool(np.all(np.diff(seqs) > 0)):
            raise SeqOrderError("book seqs must be strictly increasing within a session stream")
        # Contiguous seqs (the usual one-symbol session): a row is seq - first, no search needed.
        self._first = int(seqs[0]) if n else 0
        self._contiguous = n > 0 and int(seqs[-1]) - self._first == n - 1
        self._label_ids: list[int] = np.asarray(self.labels).tolist()  # ints: cheaper than int(a[i])
        self._ready = True

    def __call__(self, book: BookSnapshot) -> tuple[int, np.ndarray]:
        if not self._ready:
            self._prepare()
        if book.ts_recv > self.clock.now_ns():
            raise LookAheadError(
                f"label of book seq {book.seq} asked at {self.clock.now_ns()} < {book.ts_recv}"
            )
        seq = book.seq
        if self._contiguous:
            i = seq - self._first
            if not 0 <= i < self._n:
                raise KeyError(f"book seq {seq} is not in this session")
        else:
            i = int(np.searchsorted(self.seqs, seq))
            if i >= self._n or self.seqs[i] != seq:
                raise KeyError(f"book seq {seq} is not in this session")
        return self._label_ids[i], self.probs[i]


def _batch_v0(
    laya: Laya, books: pa.Table, chunk_rows: int = 65_536, tick: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Features v0 and inference over the session in chunks, so only labels and probabilities stay in
    memory (a 1M-row feature matrix alone would be 512 MB). ``tick``: each row through Laya's tick
    path (``predict_each``), as live labels it; the features are the tick path's bits either way."""
    predict = laya.predict_each if tick else laya.predict_batch
    labels, probs = [], []
    for start in range(0, books.num_rows, chunk_rows):
        # one pass per chunk
        lab, pr = predict(features_v0_batch(books.slice(start, chunk_rows)))
        labels.append(lab.astype(np.int8))
        probs.append(pr.astype(np.float32))
    return np.concatenate(labels), np.concatenate(probs)


def _tick_labeler(laya: Laya) -> Callable[[BookSnapshot], tuple[int, np.ndarray]]:
    buf = np.zeros(128, dtype=np.float32)

    def label(book: BookSnapshot) -> tuple[int, np.ndarray]:
        return laya.predict(features_v0(book, out=buf))

    return label


def _tick_labels(
    labeler: Callable[[BookSnapshot], tuple[int, np.ndarray]], tape: _Tape, clock: ReplayClock
) -> _BatchLabeler:
    """A tick labeler's labels of every book, called in the order the engine receives the books (a v1
    labeler feeds itself the trades before each), as a batch labeler's arrays: the compiled loop reads
    labels by row. A label depends on the book (and trades before it), never on the engine's state, so
    these are the bits the engine computes per tick."""
    n = len(tape.b_seq)
    labels = np.empty(n, dtype=np.int8)
    probs = np.empty((n, N_CLASSES), dtype=np.float32)
    book = tape.book
    for i in tape.engine_book_order().tolist():
        labels[i], probs[i] = labeler(book(i))
    return _BatchLabeler(tape.b_seq, labels, probs, clock)


def _v1_labeler(
    laya: Laya, mode: str, books: pa.Table, trades: pa.Table, tape: _Tape, clock: ReplayClock
) -> Callable[[BookSnapshot], tuple[int, np.ndarray]]:
    """Features v1 (books15 + the trades received strictly before each book, on the replay's local
    timeline): all at once (batch) or per snapshot (tick); bit-identical either way."""
    if mode == "batch":
        x = features_v1_batch(books, trades, book_ts_recv=tape.b_loc, trade_ts_recv=tape.t_loc)
        labels, probs = laya.predict_batch(x)
        return _BatchLabeler(tape.b_seq, labels, probs, clock)
    order = np.lexsort((tape.t_seq, tape.t_loc)).tolist()  # the order the engine receives trades in
    state, buf, fed = FeaturesV1(), np.zeros(laya.n_features, dtype=np.float32), 0

    def label(book: BookSnapshot) -> tuple[int, np.ndarray]:
        nonlocal fed
        while fed < len(order) and tape.t_loc[order[fed]] < book.ts_recv:
            state.on_trade(tape.trade(order[fed]))
            fed += 1
        return laya.predict(state.features(book, out=buf))

    return label


def _col(table: pa.Table, name: str, dtype: str = "float64") -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(dtype, copy=False)


class _Tape:
    """A session's market data as columns, with both timelines: exchange time and local time.

    Events are built lazily while the replay walks the merged order, so memory holds columns, not
    millions of objects.
    """

    def __init__(
        self,
        books: pa.Table,
        trades: pa.Table,
        feed: LatencyModel | None,
        scale_feed: float,
        exchange_feed: str = "event",
        streamed: StreamedBooks | None = None,
        clock: FeedClock = ONE_CLOCK,
    ) -> None:
        self.symbol = books.column("symbol")[0].as_py()
        self.streamed = streamed
        self.b_seq = _col(books, "seq", "int64")
        self.b_evt = _col(books, "ts_event", "int64")
        self.b_exch_seq = _col(books, "exch_seq", "int64")
        # Book levels stay in the Arrow table; (chunk x 15) arrays per side are built on demand.
        self._books = (
            books.select([f"{s}_{i}" for s in ("bid_px", "bid_sz", "ask_px", "ask_sz") for i in range(15)])
            if streamed is None
            else None
        )
        self._chunks: dict[int, tuple[np.ndarray, list[int], list[int], list[int], list[int]]] = {}
        self._trade_chunk_no = -1
        self._trade_chunk: tuple[list[Any], ...] = ()
        self.t_seq = _col(trades, "seq", "int64")
        self.t_evt = _col(trades, "ts_event", "int64")
        self.t_px = _col(trades, "px")
        self.t_sz = _col(trades, "sz")
        # Python strings per trade only for the per-event driver's Trade objects (built on first use)
        self._trades_side, self._trades_id = trades.column("side"), trades.column("trade_id")
        self._t_side: list[str] | None = None
        self._t_id: list[str] | None = None
        off = clock.offset_ns
        self.b_loc = arrival_times(_col(books, "ts_recv", "int64"), self.b_evt, feed, scale_feed, off)
        self.t_loc = arrival_times(_col(trades, "ts_recv", "int64"), self.t_evt, feed, scale_feed, off)
        self.b_exch, nb = exchange_times(self.b_evt, self.b_loc, exchange_feed, clock)
        self.t_exch, nt = exchange_times(self.t_evt, self.t_loc, exchange_feed, clock)
        self.clamped = {"books15": nb, "trade": nt}  # rows whose feed latency was raised to the floor

    @property
    def t_side(self) -> list[str]:
        if self._t_side is None:
            self._t_side = self._trades_side.to_pylist()
        return self._t_side

    @property
    def t_id(self) -> list[str]:
        if self._t_id is None:
            self._t_id = self._trades_id.to_pylist()
        return self._t_id

    def t_side_codes(self) -> np.ndarray:
        """Aggressor side per trade: 0 buy, 1 sell, -1 anything else (the kernel's codes)."""
        return side_codes(self._trades_side)

    def walk_streams(self, label_due: np.ndarray) -> list[WalkStream]:
        """The walk's streams for :class:`replay.walk.StreamedWalk`: :meth:`order`'s entries (kinds 0, 1, 2
        and 4; no kind 3) without building them all."""
        nb = len(self.b_seq)
        rank = np.empty(nb, dtype=np.int64)
        rank[self.engine_book_order()] = np.arange(nb)
        return [
            WalkStream(self.b_exch, PRIO_EXCH_BOOK, self.b_seq, 0),
            WalkStream(self.t_exch, PRIO_EXCH_TRADE, self.t_seq, 1),
            WalkStream(self.b_loc, PRIO_LOCAL_BOOK, self.b_seq, 2),
            WalkStream(label_due, PRIO_LABEL, rank, 4),
        ]

    def engine_book_order(self) -> np.ndarray:
        """Book rows in the order the engine receives them (the walk's kind-2 entries)."""
        return np.lexsort((self.b_seq, self.b_loc))

    def order(
        self, label_due: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The merged walk: (ts, priority, kind, row), sorted by (ts, priority, stream seq).

        kind 0/1 = book/trade at the exchange, 2/3 = book/trade at the engine. With ``label_due``
        (per book row, when its Laya label becomes visible), kind 4 = that label at priority
        ``PRIO_LABEL``; labels due at the same time keep the order the engine received their books
        in, as timers scheduled by ``Engine.on_book`` would. There are no kind-3 entries: the engine
        takes no public trades (``Engine.on_trade``), and timers run in the same order without them.
        """
        nb, nt = len(self.b_seq), len(self.t_seq)
        parts = [
            (self.b_exch, PRIO_EXCH_BOOK, self.b_seq, 0, nb),
            (self.t_exch, PRIO_EXCH_TRADE, self.t_seq, 1, nt),
            (self.b_loc, PRIO_LOCAL_BOOK, self.b_seq, 2, nb),
        ]
        if label_due is not None:
            rank = np.empty(nb, dtype=np.int64)
            rank[self.engine_book_order()] = np.arange(nb)
            parts.append((label_due, PRIO_LABEL, rank, 4, nb))
        ts = np.concatenate([p[0] for p in parts])
        prio = np.concatenate([np.full(p[4], p[1], dtype=np.int8) for p in parts])
        seq = np.concatenate([p[2] for p in parts])
        kind = np.concatenate([np.full(p[4], p[3], dtype=np.int8) for p in parts])
        row = np.concatenate([np.arange(p[4]) for p in parts])
        o = np.lexsort((seq, prio, ts))
        return ts[o], prio[o], kind[o], row[o]

    _CHUNK_BITS = 14  # 16 384 books per chunk

    def _chunk(self, i: int) -> tuple[np.ndarray, list[int], list[int], list[int], list[int]]:
        """Chunk of book ``i``: its levels as one (rows x 60) array (bid_px, bid_sz, ask_px, ask_sz)
        and its times and seqs as Python ints (one conversion per chunk instead of four per row)."""
        c = i >> self._CHUNK_BITS
        chunk = self._chunks.get(c)
        if chunk is None:
            if len(self._chunks) >= 4:  # the walk moves forward: drop the oldest chunk
                del self._chunks[min(self._chunks)]
            size = 1 << self._CHUNK_BITS
            part = self._books.slice(c * size, size)
            rows = slice(c * size, (c + 1) * size)
            chunk = self._chunks[c] = (
                np.column_stack([_col(part, name) for name in part.column_names]),
                self.b_evt[rows].tolist(),
                self.b_loc[rows].tolist(),
                self.b_seq[rows].tolist(),
                self.b_exch_seq[rows].tolist(),
            )
        return chunk

    def levels(self, r0: int, r1: int) -> np.ndarray:
        """Book rows r0..r1-1 as one (rows x 60) float64 array: bid_px, bid_sz, ask_px, ask_sz."""
        if self.streamed is not None:
            return self.streamed.levels(r0, r1)
        assert self._books is not None
        part = self._books.slice(r0, r1 - r0)
        return np.column_stack([_col(part, name) for name in part.column_names])

    def book(self, i: int) -> BookSnapshot:
        levels, evt, loc, seq, exch_seq = self._chunk(i)
        j = i & ((1 << self._CHUNK_BITS) - 1)
        r = levels[j].tolist()  # one row of 60 levels as Python floats, cut into the four sides
        return _make_book(
            evt[j],
            loc[j],
            seq[j],
            self.symbol,
            exch_seq[j],
            tuple(r[0:15]),
            tuple(r[15:30]),
            tuple(r[30:45]),
            tuple(r[45:60]),
        )

    def trade(self, i: int) -> Trade:
        c = i >> self._CHUNK_BITS
        if c != self._trade_chunk_no:  # one list conversion per chunk instead of five per trade
            rows = slice(c << self._CHUNK_BITS, (c + 1) << self._CHUNK_BITS)
            self._trade_chunk_no = c
            self._trade_chunk = tuple(
                a[rows].tolist() for a in (self.t_evt, self.t_loc, self.t_seq, self.t_px, self.t_sz)
            )
        evt, loc, seq, px, sz = self._trade_chunk
        j = i & ((1 << self._CHUNK_BITS) - 1)
        return _make_trade(evt[j], loc[j], seq[j], self.symbol, self.t_id[i], px[j], sz[j], self.t_side[i])


# BookSnapshot / Trade from positional fields without the frozen dataclass __init__ (one per row).
_make_book = frozen_maker(BookSnapshot)
_make_trade = frozen_maker(Trade)


def _lag_model(cfg: ReplayConfig) -> LatencyModel:
    model = _unscaled_lag_model(cfg)
    return model if cfg.scale_kev == 1.0 else ScaledLatency(model, cfg.scale_kev)


def _unscaled_lag_model(cfg: ReplayConfig) -> LatencyModel:
    rng = _rng(cfg.seed, 1)
    if cfg.kev_lag_fit:
        path = Path(cfg.kev_lag_fit)
        try:
            fit = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as e:
            raise DualhubError(f"cannot read Kev lag fit {path}: {e}") from None
        try:
            return EmpiricalLag.from_fit(fit, rng=rng)
        except ValueError as e:
            raise DualhubError(f"{path}: {e}") from None
    return LognormalLatency(p5_ms=cfg.kev_lag_p5_ms, p95_ms=cfg.kev_lag_p95_ms, rng=rng)


def _load_cassette(spec: str) -> Cassette:
    path = Path(spec)
    try:
        return Cassette.from_run(path) if path.is_dir() else Cassette.read(path)
    except OSError as e:
        raise DualhubError(f"cannot read Kev cassette {path}: {e}") from None


def _kev_backend(cfg: ReplayConfig, clock: ReplayClock) -> tuple[Any, SimKevBackend]:
    """The advisor for the configured Kev mode and the replay backend that delivers its replies."""
    lag = _lag_model(cfg)
    rules = RuleKev()
    llama_cfg = LlamaConfig.for_engine(cfg.kev_url, cfg.kev_timeout_ms) if cfg.kev_url else None
    measure = cfg.kev_lag_source == "measured"
    if cfg.kev_mode == "sim":
        return rules, SimKevBackend(rules, lag, clock)
    if cfg.kev_mode == "llm":
        assert llama_cfg is not None
        llm = LlamaAdvisor(llama_cfg)
        # Cache by key: a request seen before in this run is answered without asking the server again
        # (measured: at the lag its first call took).
        cached = CassetteAdvisor(
            Cassette(), key_fn=llama_cfg.key, miss_policy="live", fallback=llm, record_misses=True
        )
        cached.name = llm.name
        if not measure:
            return cached, SimKevBackend(cached, lag, clock)
        return cached, SimKevBackend(
            cached, lag, clock, use_recorded_lag=True, recorded_lag_scale=cfg.scale_kev, measure=True
        )
    cassette = _load_cassette(cfg.kev_cassette)
    recorded_by = {answered_by(e.advisor) for entries in cassette.entries.values() for e in entries}
    if recorded_by <= {rules.name}:
        key_fn = rules.key
    elif recorded_by <= {"llm"}:
        key_fn = (llama_cfg or LlamaConfig(base_url="http://127.0.0.1:1")).key
    elif recorded_by <= {RulePairsKev.name}:  # a portfolio hub's answers (v2 contexts)
        key_fn = RulePairsKev(entry_z=cfg.pair_entry_z, exit_z=cfg.pair_exit_z).key
    else:
        raise DualhubError(f"cassette mixes advisors {sorted(recorded_by)}; cannot tell how to key requests")
    fallback: Any = None
    if cfg.kev_miss_policy == "sim":
        fallback = rules
    elif cfg.kev_miss_policy == "live":
        assert llama_cfg is not None
        fallback = LlamaAdvisor(llama_cfg)
    advisor = CassetteAdvisor(
        cassette,
        key_fn=key_fn,
        miss_policy=cfg.kev_miss_policy,  # type: ignore[arg-type]
        fallback=fallback,
    )
    return advisor, SimKevBackend(
        advisor, lag, clock, use_recorded_lag=True, recorded_lag_scale=cfg.scale_kev, measure=measure
    )


# Every label is scheduled ahead as a walk entry; the clock takes no timer in its past.
_NEGATIVE_LAYA = "a Laya latency drawn below zero (a label would be due before its book arrived)"

_ADVISOR_COUNTS = ("hits", "misses", "fallbacks", "live_calls")  # a cassette's, where the advisor is one


def _kev_lag_info(cfg: ReplayConfig) -> str:
    """How this run's Kev lags were made, for the manifest (``dualhub kev fit-lag`` reads it)."""
    if cfg.kev_mode == "cassette":
        lag = "recorded (cassette)"
        if cfg.kev_miss_policy == "live":
            lag += f"; live misses {cfg.kev_lag_source}"
    elif cfg.kev_mode == "llm" and cfg.kev_lag_source == "measured":
        lag = "measured"
    else:
        lag = "model " + (f"empirical {Path(cfg.kev_lag_fit).name}" if cfg.kev_lag_fit else "lognormal")
    return lag if cfg.scale_kev == 1.0 else f"{lag} x{cfg.scale_kev:g}"


def _label_due(tape: _Tape, model: LatencyModel) -> np.ndarray | None:
    """When each book's Laya label becomes visible: ts_recv + a latency drawn in the order the engine
    receives the books, as ``Engine.on_book`` would draw it. Nothing else draws from the Laya model,
    so a model that cannot be drawn in a batch (recorded latencies, keyed by ts_recv) is drawn here one
    book at a time, in that order: the same draws. None when a draw is negative (then the engine
    schedules each label as it goes and the clock refuses the one in the past)."""
    order = tape.engine_book_order()
    drawn = sample_each(model, tape.b_loc[order])
    if len(drawn) and int(drawn.min()) < 0:
        return None
    due = np.empty_like(tape.b_loc)
    due[order] = tape.b_loc[order] + drawn
    return due


def _walk(*cols: np.ndarray, bar: Any = None, chunk: int = 65_536) -> Iterator[Iterator[tuple[int, ...]]]:
    """The merge order a chunk at a time (flat memory), each chunk's rows as tuples of Python ints."""
    for start in range(0, len(cols[0]), chunk):
        if bar is not None:
            bar.update(start)
        yield zip(*(c[start : start + chunk].tolist() for c in cols), strict=True)


def _sim_exchange(
    cfg: ReplayConfig,
    clock: ReplayClock,
    latency: Callable[[str, np.random.Generator, float, str], LatencyModel],
    rngs: tuple[np.random.Generator, np.random.Generator, np.random.Generator],
    contract: ContractConfig,
) -> SimExchange:
    """The simulated exchange of a replay (of one instrument of a portfolio, whose contract is
    ``contract``), its order entry, response and cancel latencies drawn from the streams given."""
    names = ("order entry", "latency_order_response", "latency_cancel")
    specs = (cfg.latency_order_entry, cfg.latency_order_response, cfg.latency_cancel)
    models = tuple(
        latency(spec, rng, cfg.scale_order, n) for spec, rng, n in zip(specs, rngs, names, strict=True)
    )
    return SimExchange.simulated(clock, cfg.fill_model, models, contract)  # type: ignore[arg-type]


def _for_symbol(table: pa.Table, symbol: str) -> pa.Table:
    mask = pc.equal(table.column("symbol"), symbol)
    if pc.all(mask).as_py() is not False:  # one-symbol session: no copy (a 1M-book filter is ~500 MB)
        return table
    return table.filter(mask)


class _Quarantine:
    """Session rows kept from the engine (``engine.validate``): their ``input_quarantine`` events and
    their counts by stream and reason, for the run's log and manifest."""

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []
        self.counts: dict[str, dict[str, int]] = {}

    def check(self, root: Path, symbol: str, books: pa.Table, trades: pa.Table) -> tuple[pa.Table, pa.Table]:
        """One symbol's whole tables without their invalid rows; a session mostly invalid is refused."""
        seq = _col(books, "seq", "int64")
        if len(seq) > 1 and not bool(np.all(np.diff(seq) > 0)):
            raise SeqOrderError(f"{root}: book seqs must be strictly increasing within a session stream")
        out = []
        for stream, table, codes in (
            ("books15", books, validate.book_table_codes(books)),
            ("trade", trades, validate.trade_table_codes(trades)),
        ):
            bad = int(np.count_nonzero(codes))
            if bad:
                found = validate.counts(codes)
                if 2 * bad > table.num_rows:
                    why = ", ".join(f"{k} {v}" for k, v in found.items())
                    raise SessionError(
                        f"{root}: {bad} of {table.num_rows} {stream} rows for {symbol} are invalid ({why}); "
                        "refusing a session that is mostly bad data"
                    )
                mine = self.counts.setdefault(stream, {})  # a portfolio checks several symbols
                for k, v in found.items():
                    mine[k] = mine.get(k, 0) + v
                first = sum(t.num_rows for t in self.tables)
                self.tables.append(validate.quarantine_table(stream, table, codes, first))
                table = table.filter(pa.array(codes == 0))
            out.append(table)
        return out[0], out[1]

    def write(self, events_dir: Path) -> dict[str, dict[str, Any]]:
        """``input_quarantine.parquet`` (empty when nothing was kept out, as every stream's file is)."""
        schema = STREAMS["input_quarantine"].schema
        table = pa.concat_tables(self.tables) if self.tables else schema.empty_table()
        path = events_dir / "input_quarantine.parquet"
        atomic_write_parquet(table, path)
        return {"events/input_quarantine.parquet": {"rows": table.num_rows, "sha256": sha256_file(path)}}


def _check_streamable(books: pa.Table, trades: pa.Table) -> None:
    """Arrival times and trades of a run whose levels stream: any invalid row means whole tables."""
    if validate.time_codes(_col(books, "ts_recv", "int64")).any():
        raise InvalidRows("books by arrival is not in (ts, seq) order: a books15 row is time_backwards")
    codes = validate.trade_table_codes(trades)
    if codes.any():
        raise InvalidRows(f"a trade row is invalid ({validate.REASONS[int(codes[codes != 0][0])]})")


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


def _load_laya(cfg: ReplayConfig) -> Laya:
    """Laya refuses a model trained on other features than the replay computes (``laya_features``;
    ``"auto"`` takes the model's own)."""
    return Laya(
        LayaConfig(
            model_path=Path(cfg.model_path), provider=cfg.laya_provider, feature_version=cfg.laya_features
        )
    )


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


def _finish(
    tmp: Path | None,
    run_dir: Path,
    log: EventLog,
    session: Any,
    cfg: ReplayConfig,
    laya: Laya,
    n_books: int,
    n_trades: int,
    advisor: Any,
    t0: float,
    path: str,
    quarantine: _Quarantine,
    tape: _Tape | StreamedTape,
    kev: SimKevBackend,
) -> RunResult:
    """Write the event log's last rows, the manifest and runtime.json; rename the run into place. A
    metrics-only run (``tmp`` None) writes nothing: its summary is computed from the same manifest."""
    wall = time.perf_counter() - t0
    advisor_info = {
        "mode": cfg.kev_mode,
        "name": advisor.name,
        "deterministic": bool(getattr(advisor, "deterministic", True)),
        **{k: getattr(advisor, k) for k in _ADVISOR_COUNTS if hasattr(advisor, k)},
        "lag": _kev_lag_info(cfg),
    }
    files = log.write()
    if tmp is not None:
        files.update(quarantine.write(tmp / "events"))
        if cfg.kev_mode == "llm" and cfg.kev_lag_source == "measured":  # every answer's time, late ones too
            lat = kev.recorded.write(tmp)
            files[lat.name] = {"rows": len(kev.recorded), "sha256": sha256_file(lat)}
        advisor_info["health"] = run_health(tmp / "events", cfg.kev_timeout_ms, kev.recorded.dur)
    info = laya.describe()
    in_sample = _in_sample(laya, session)
    feed = _feed_info(cfg, session.manifest, tape.clamped)
    manifest = {
        "run_schema_version": RUN_SCHEMA_VERSION,
        "digest": log.digest,
        "decision_digest": log.decision_digest,  # the digest without wall-time columns
        "session": {
            "path": str(session.root.resolve()),
            "digest": session.digest(),
            "files": session.manifest["files"],
        },
        "inputs": {"books15": n_books, "trade": n_trades},
        "model": {
            "file": Path(cfg.model_path).name,
            "sha256": info["model_sha256"],
            "feature_version": info["feature_version"],
        },
        "in_sample": in_sample,
        "feed": feed,
        "seeds": {"replay": cfg.seed, "kev_lag": [cfg.seed, 1]},
        "config": cfg.to_json(),
        "config_sha256": cfg.sha256(),
        "advisor": advisor_info,
        "counts": log.counts(),
        "quarantine": quarantine.counts,
        "files": files,
    }
    summary = None
    if tmp is None:  # metrics only: nothing is written
        assert isinstance(log, MetricsLog)
        wall, summary = time.perf_counter() - t0, log.tally.summary(manifest)
    else:
        write_json(tmp / "manifest.json", manifest)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(run_dir)
        # The provider and the engine path are facts about this run's machine and code path, not about
        # its inputs (both paths give the same events): kept beside the manifest.
        write_json(
            run_dir / "runtime.json",
            {
                **{k: info.get(k) for k in ("requested_providers", "active_provider", "fallback_reason")},
                **engine_identity(),
                "engine_path": path,  # the compiled loop (how it read the books), or per event
                "risk_rules": list(cfg.risk.rules),  # the gateway's rules, in the order they ran
            },
        )
    return RunResult(
        run_dir,
        log.digest,
        log.counts(),
        n_books,
        n_trades,
        wall,
        info,
        advisor_info,
        path,
        quarantine.counts,
        log.decision_digest,
        in_sample,
        feed,
        _warnings(in_sample, feed, session.manifest, Path(cfg.model_path).name),
        summary=summary,
    )


def check_symbol(root: Path, manifest: dict[str, Any], symbol: str) -> None:
    """A replay runs one symbol: one the session holds (a session's manifest lists its symbols)."""
    symbols = manifest.get("symbols") or []
    if symbols and symbol not in symbols:
        raise DualhubError(f"{root} has no books15 rows for {symbol}; its symbols: {', '.join(symbols)}")


def session_contract(manifest: dict[str, Any], symbol: str) -> ContractConfig | None:
    """The contract the session gives ``symbol``: its manifest's spec (``contracts``: written by the
    recorder from the exchange, by an importer from the market's published spec or the data's grids),
    else a multi-symbol simulator session's ``instruments`` (each symbol quotes on its own tick and size
    step); None when the session does not say."""
    spec = (manifest.get("contracts") or {}).get(symbol)
    if isinstance(spec, dict):
        return contract_of(symbol, spec)
    inst = ((manifest.get("simulator") or {}).get("instruments") or {}).get(symbol)
    if not inst:
        return None
    step = float(inst["size_step"])
    return ContractConfig(symbol=symbol, tick=float(inst["tick"]), size_step=step, min_qty=step)


def with_session_contract(session_dir: Path | str, cfg: ReplayConfig) -> ReplayConfig:
    """``cfg`` trading the session's own spec of its symbol where it left the contract at the default
    (as ``dualhub replay`` does): a program replaying an imported session trades that market too."""
    if cfg.symbols or cfg.contract_source or cfg.contract != ContractConfig():
        return cfg
    try:
        manifest = open_session(session_dir).manifest
    except SessionError:  # not a session: run_replay says so
        return cfg
    contract = session_contract(manifest, cfg.symbol)
    source = session_spec_source(manifest, cfg.symbol)
    if contract is None or not source:
        return cfg
    return dataclasses.replace(cfg, contract=contract, contract_source=source)


def session_spec_source(manifest: dict[str, Any], symbol: str) -> str:
    """``session:<spec_source>`` for a symbol whose spec the session's manifest gives, else "" (the
    default contract, or a simulator's instrument: configs and run names as they were)."""
    spec = (manifest.get("contracts") or {}).get(symbol)
    return f"session:{spec.get('spec_source', 'unsaid')}" if isinstance(spec, dict) else ""


def check_contract_units(session: Any, cfg: ReplayConfig) -> None:
    """Before a run starts: the core's integers hold each replayed instrument (its highest price in
    units of its tick's decimals, its largest order and position in lots, an order's notional), or one
    error line naming the limit and the instrument. The prices are the top of the book's that the
    replay's door lets through (``engine.validate``): quotes sit there and a taker fill walks from
    there; a trade print never sets a fill's price, and a row the door keeps out is never traded."""
    import pyarrow.parquet as pq

    if "books15" not in session.streams:  # the run refuses it, in its own words
        return
    try:
        books = pq.read_table(
            [str(f) for f in session.files("books15")], columns=["symbol", "bid_px_0", "ask_px_0"]
        )
    except (pa.ArrowException, OSError):
        # a damaged or missing part: the run checks every file against the manifest and refuses it in
        # its own words (tampered, truncated), which a parse error here would pre-empt
        return
    for sym in cfg.symbols or (cfg.symbol,):
        o = cfg.instruments.get(sym, {})
        base = cfg.contract if not cfg.symbols else (session_contract(session.manifest, sym) or cfg.contract)
        c = dataclasses.replace(
            base, symbol=sym, **{k: o[k] for k in ("tick", "size_step", "min_qty") if k in o}
        )
        mine = books.filter(pc.equal(books.column("symbol"), sym))
        px = np.concatenate(
            [
                mine.column(n).to_numpy(zero_copy_only=False).astype(np.float64)
                for n in ("bid_px_0", "ask_px_0")
            ]
        )
        px = px[(px >= validate.DOOR_MIN_PX) & (px <= validate.DOOR_MAX_PX)]
        check_units(
            c,
            float(px.max()) if len(px) else 0.0,
            o.get("max_position", cfg.risk.max_position),
            o.get("max_order_qty", cfg.risk.max_order_qty),
        )
        if cfg.contract_source and not cfg.symbols:
            _check_price_decimals(c, px)


def _check_price_decimals(c: ContractConfig, px: np.ndarray) -> None:
    """A contract named for the data (the session's, or a flag's) counts its book's prices in the
    tick's decimals (a taker fill is at a book price), or one error line before the run: else the
    core stops at the first such fill, minutes in."""
    dec = tick_parts(c.tick)[1]
    p = 10.0**dec
    off = px[np.rint(px * p) / p != px]
    if len(off):
        raise DualhubError(
            f"{c.symbol}: the book's prices have more decimals than the tick {c.tick!r} ({len(off)} of "
            f"{len(px)}, e.g. {float(off[0])!r}): the core counts fill prices in units of 1e-{dec}; give the "
            f"data's tick (--contract tick=T)"
        )


def _in_sample(laya: Laya, session: Any) -> dict[str, Any]:
    """Whether the model was trained on this session: by session digest (``dualhub train``), or by
    simulator seed, length and symbol (``replay.make_default_model``); a multi-symbol simulator
    session (``symbols``, not ``symbol``) counts when the training symbol is one of its symbols."""
    trained = training_sessions(laya.metadata)
    digest, sim = session.digest(), session.manifest.get("simulator") or {}
    sim_symbols = sim.get("symbols") or [sim.get("symbol")]

    def same(e: dict[str, Any]) -> bool:
        if "simulator_seed" in e:
            return (
                bool(sim)
                and (e["simulator_seed"], e["minutes"]) == (sim.get("seed"), sim.get("minutes"))
                and e["symbol"] in sim_symbols
            )
        return e.get("session_digest") == digest

    return {"in_sample": any(same(e) for e in trained), "training_sessions": trained}


def _feed_info(cfg: ReplayConfig, manifest: dict[str, Any], clamped: dict[str, int]) -> dict[str, Any]:
    """The run manifest's ``feed``: how exchange time and local time were put together."""
    clock = FeedClock.of_session(manifest)
    return {
        "exchange_feed": cfg.exchange_feed,
        "latency": cfg.latency_feed,
        "scale": cfg.scale_feed,
        "clock_offset_ns": clock.offset_ns,
        "clock_offset_source": "session manifest 'clock'" if "clock" in manifest else "none: one clock",
        "min_latency_ns": clock.floor_ns,
        "clamped": clamped,
        "rule": "the exchange sees a row when the engine does (ts_recv, as a paper exchange)"
        if cfg.exchange_feed == "local"
        else "the exchange sees a row at ts_event + clock_offset_ns (on the local clock), the engine at "
        + ("ts_recv" if cfg.latency_feed == "recorded" else "that time + the modelled latency")
        + "; a feed latency below min_latency_ns is raised to it (clamped rows)",
    }


def _warnings(
    in_sample: dict[str, Any], feed: dict[str, Any], manifest: dict[str, Any], model: str
) -> tuple[str, ...]:
    out = []
    if in_sample["in_sample"]:
        out.append(
            f"IN-SAMPLE run: model {model} was trained on this session; its results say nothing "
            "about how it does on data it has not seen"
        )
    off = feed["clock_offset_ns"]
    if abs(off) > CLOCK_WARN_NS:
        n = sum(feed["clamped"].values())
        out.append(
            f"session clocks disagree: local - exchange = {off / 1e6:+.1f} ms; the exchange sees market "
            f"data at its event time put on the local clock, {feed['min_latency_ns'] / 1e6:g} ms or more "
            f"before the engine ({n} rows raised to that floor)"
        )
    elif "clock" not in manifest:
        median = ((manifest.get("import") or {}).get("local_minus_exchange_ms") or {}).get("median")
        if isinstance(median, int | float) and abs(median) * 1e6 > CLOCK_WARN_NS:
            out.append(
                f"session clocks disagree (local - exchange median {median:+.1f} ms at import) but the "
                "session has no clock estimate: the exchange sees market data when the engine does; "
                "re-import it to replay with a feed latency"
            )
    return tuple(out)


def _run_dir(session_dir: Path | str, cfg: ReplayConfig, out_dir: Path | str | None) -> Path:
    """``out_dir``, or ``SESSION/runs/run-<hash>`` of the config and the model's content (a model
    retrained into the same file is another run)."""
    if out_dir is not None:
        return Path(out_dir)
    try:
        model = sha256_file(Path(cfg.model_path))
    except OSError:  # Laya says what is wrong with it, before anything is written
        model = ""
    key = hashlib.sha256(f"{cfg.sha256()}\t{model}".encode()).hexdigest()
    return Path(session_dir) / "runs" / f"run-{key[:12]}"


def _tmp_dir(run_dir: Path) -> Path:
    return run_dir.with_name(run_dir.name + ".tmp")


def _is_run(path: Path) -> bool:
    try:
        return "run_schema_version" in orjson.loads((path / "manifest.json").read_bytes())
    except (OSError, orjson.JSONDecodeError, TypeError):
        return False


def _check_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Refuse a run directory that cannot be written or must not be replaced, before any work."""
    check_output_path(run_dir, directory=True)
    if run_dir.exists():
        if not overwrite:
            raise DualhubError(f"{run_dir} exists; pass --overwrite (or another --out) to replace it")
        if any(run_dir.iterdir()) and not _is_run(run_dir):  # --overwrite deletes it: runs only
            raise DualhubError(f"{run_dir} is not a run directory; --overwrite replaces only a previous run")


def _start_run_dir(run_dir: Path, overwrite: bool) -> Path:
    """The run is written into ``<run>.tmp`` and renamed at the end: a half-written run never looks
    finished."""
    _check_run_dir(run_dir, overwrite)
    tmp = _tmp_dir(run_dir)
    if tmp.is_symlink() or tmp.is_file():
        tmp.unlink()
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "events").mkdir(parents=True)
    return tmp


def _progress(enabled: bool, total: int) -> Any:
    """A progress bar over the walk's ``total`` entries (None when not ``enabled``): ``update(n)`` per
    walk chunk, ``update(n, kev)`` per Kev answer (the walk position then, and the answers so far)."""
    import sys

    if not enabled or not sys.stdout.isatty():  # piped, a bar draws nothing but a blank line
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    class _Bar:
        def __init__(self) -> None:
            self.p = Progress(
                "[bold]replay",
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[kev]}"),
                TimeRemainingColumn(),
                transient=True,
            )
            self.p.start()
            self.task = self.p.add_task("replay", total=total, kev="")

        def update(self, n: int, kev: int | None = None) -> None:
            if kev is None:
                self.p.update(self.task, completed=n)
            else:
                self.p.update(self.task, completed=n, kev=f"Kev {kev}")

        def close(self) -> None:
            self.p.update(self.task, completed=total)
            self.p.stop()

    return _Bar()
