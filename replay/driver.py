"""Replay driver: a recorded session through the same engine that trades live, on a virtual clock.

Market streams are merged in the stable total order ``(ts_recv, stream priority, seq)``; timers on
the replay clock (Laya labels, Kev replies, exchange reports) interleave by the same kind of key.
Nothing here reads the wall clock except to report how long the run took.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from engine.clock import ReplayClock
from engine.contract import ContractConfig
from engine.core import Engine, EngineConfig
from engine.errors import DualhubError
from engine.eventlog import EventLog
from engine.events import STREAMS, BookSnapshot, Nanos, Trade, table_to_events
from engine.fills import FILL_MODELS
from engine.kev.cassette import Cassette, CassetteAdvisor
from engine.kev.lag import EmpiricalLag
from engine.kev.llama import LlamaAdvisor, LlamaConfig
from engine.kev.rules import RuleKev
from engine.kev.sim import SimKevBackend
from engine.latency import ConstantLatency, LatencyModel, LognormalLatency
from engine.laya.features import FEATURE_VERSION, features_v0, features_v0_batch
from engine.laya.model import Laya, LayaConfig
from engine.risk import RiskLimits
from engine.store import SessionError, open_session, write_json
from engine.strategy import QuoteConfig
from replay.sim_exchange import SimExchange

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "data" / "models" / "laya-v0.onnx"
RUN_SCHEMA_VERSION = 1
KEV_MODES = ("sim", "cassette", "llm")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayConfig:
    """Everything that determines a replay's output. Its sha256 is part of the run manifest."""

    seed: int = 1
    symbol: str = "BTCUSDT"
    model_path: Path = DEFAULT_MODEL
    laya_provider: str = "auto"
    laya_mode: str = "batch"  # "batch": features+inference over the whole session; "tick": per snapshot
    laya_latency_us: int = 200
    kev_lag_p5_ms: float = 200.0
    kev_lag_p95_ms: float = 350.0
    kev_queue_max: int = 2
    kev_stale_after_ms: int = 1000
    kev_advice_ttl_ms: int = 5000
    kev_min_interval_ms: int = 0  # spacing of Kev requests; 0 = every non-HOLD label is offered
    kev_mode: str = "sim"  # "sim": rule advisor + lag model; "cassette": recorded replies and lags;
    #                        "llm": a running llama-server, cached by key, lag from the model
    kev_cassette: str = ""  # cassette.parquet or a run directory (cassette mode)
    kev_miss_policy: str = "fail"  # cassette miss: "fail", "sim" (rules + lag model) or "live" (llm)
    kev_url: str = ""  # llama-server base URL (llm mode, and live misses)
    kev_lag_fit: str = ""  # lag.json from `dualhub kev fit-lag`: measured lag instead of lognormal
    order_entry_latency_ms: float = 5.0
    order_response_latency_ms: float = 5.0
    fill_model: str = "touch"
    risk: RiskLimits = field(default_factory=RiskLimits)
    quotes: QuoteConfig = field(default_factory=QuoteConfig)
    contract: ContractConfig = field(default_factory=ContractConfig)

    def __post_init__(self) -> None:
        if self.laya_mode not in ("batch", "tick"):
            raise DualhubError(f"laya_mode must be 'batch' or 'tick', not {self.laya_mode!r}")
        if self.fill_model not in FILL_MODELS:
            raise DualhubError(f"unknown fill model {self.fill_model!r}; known: {', '.join(FILL_MODELS)}")
        if self.kev_mode not in KEV_MODES:
            raise DualhubError(f"unknown Kev mode {self.kev_mode!r}; known: {', '.join(KEV_MODES)}")
        if self.kev_mode == "cassette" and not self.kev_cassette:
            raise DualhubError("Kev cassette mode needs a cassette (--kev-cassette FILE_OR_RUN)")
        if (self.kev_mode == "llm" or self.kev_miss_policy == "live") and not self.kev_url:
            raise DualhubError("Kev llm mode and the live miss policy need a llama-server URL (--kev-url)")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["model_path"] = Path(self.model_path).name  # identity is the model's sha256, not where it lives
        return orjson.loads(orjson.dumps(d, default=str))

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

    @property
    def snapshots_per_s(self) -> float:
        return self.books / self.wall_s if self.wall_s > 0 else float("inf")


def _rng(seed: int, component: int) -> np.random.Generator:
    """One independent stream per component, so adding a component never shifts another's draws."""
    return np.random.default_rng([seed, component])


class _BatchLabeler:
    """Labels for a whole session computed up front (features and inference over all rows at once)."""

    def __init__(self, seqs: list[int], labels: np.ndarray, probs: np.ndarray) -> None:
        # Book seqs are per stream across symbols, so one symbol's seqs can skip: look rows up by seq.
        self.row = {s: i for i, s in enumerate(seqs)}
        self.labels, self.probs = labels, probs

    def __call__(self, book: BookSnapshot) -> tuple[int, np.ndarray]:
        i = self.row[book.seq]
        return int(self.labels[i]), self.probs[i]


def _tick_labeler(laya: Laya) -> Callable[[BookSnapshot], tuple[int, np.ndarray]]:
    def label(book: BookSnapshot) -> tuple[int, np.ndarray]:
        return laya.predict(features_v0(book))

    return label


def _merged(books: list[BookSnapshot], trades: list[Trade]) -> Iterator[tuple[tuple[Nanos, int, int], Any]]:
    """Both market streams in ``(ts_recv, stream priority, seq)`` order; keys are unique, so stable."""
    pb, pt = STREAMS["books15"].priority, STREAMS["trade"].priority
    b = sorted(((e.ts_recv, pb, e.seq), e) for e in books)
    t = sorted(((e.ts_recv, pt, e.seq), e) for e in trades)
    return heapq.merge(b, t, key=itemgetter(0))


def _lag_model(cfg: ReplayConfig) -> LatencyModel:
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
    llama_cfg = LlamaConfig(base_url=cfg.kev_url) if cfg.kev_url else None
    if cfg.kev_mode == "sim":
        return rules, SimKevBackend(rules, lag, clock)
    if cfg.kev_mode == "llm":
        assert llama_cfg is not None
        llm = LlamaAdvisor(llama_cfg)
        # Cache by key: a request seen before in this run is answered without asking the server again.
        cached = CassetteAdvisor(
            Cassette(), key_fn=llama_cfg.key, miss_policy="live", fallback=llm, record_misses=True
        )
        cached.name = llm.name
        return cached, SimKevBackend(cached, lag, clock)
    cassette = _load_cassette(cfg.kev_cassette)
    recorded_by = {e.advisor for entries in cassette.entries.values() for e in entries}
    if recorded_by <= {rules.name}:
        key_fn = rules.key
    elif recorded_by <= {"llm"}:
        key_fn = (llama_cfg or LlamaConfig(base_url="http://127.0.0.1:1")).key
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
    return advisor, SimKevBackend(advisor, lag, clock, use_recorded_lag=True)


def run_replay(
    session_dir: Path | str,
    config: ReplayConfig | None = None,
    *,
    out_dir: Path | str | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> RunResult:
    """Replay ``session_dir`` and write the run (events + manifest) to ``out_dir``."""
    cfg = config or ReplayConfig()
    t0 = time.perf_counter()
    session = open_session(session_dir)
    session.verify()
    if "books15" not in session.manifest["streams"]:
        raise SessionError(f"{session.root} has no books15 stream to replay")
    book_table = session.read_table("books15")
    book_table = book_table.filter(book_table.column("symbol").to_numpy(zero_copy_only=False) == cfg.symbol)
    if book_table.num_rows == 0:
        raise DualhubError(f"{session.root} has no books15 rows for {cfg.symbol}")
    books = table_to_events(book_table, "books15")
    trades = (
        [t for t in session.read_events("trade") if t.symbol == cfg.symbol]
        if "trade" in session.streams
        else []
    )

    laya = Laya(LayaConfig(model_path=Path(cfg.model_path), provider=cfg.laya_provider))
    if laya.feature_version != FEATURE_VERSION:
        raise DualhubError(
            f"model {cfg.model_path} uses features {laya.feature_version}, "
            f"this engine computes {FEATURE_VERSION}"
        )
    if cfg.laya_mode == "batch":
        labels, probs = laya.predict_batch(features_v0_batch(book_table))
        labeler: Callable[[BookSnapshot], tuple[int, np.ndarray]] = _BatchLabeler(
            [b.seq for b in books], labels, probs
        )
    else:
        labeler = _tick_labeler(laya)

    clock = ReplayClock(start_ns=min(books[0].ts_recv, trades[0].ts_recv if trades else books[0].ts_recv))
    log = EventLog()
    advisor, kev = _kev_backend(cfg, clock)
    exchange = SimExchange(
        clock,
        fill_model=FILL_MODELS[cfg.fill_model](),
        entry_latency=ConstantLatency(int(cfg.order_entry_latency_ms * 1e6)),
        response_latency=ConstantLatency(int(cfg.order_response_latency_ms * 1e6)),
    )
    engine = Engine(
        EngineConfig(
            symbol=cfg.symbol,
            contract=cfg.contract,
            risk=cfg.risk,
            quotes=cfg.quotes,
            laya_latency_ns=cfg.laya_latency_us * 1000,
            kev_queue_max=cfg.kev_queue_max,
            kev_stale_after_ns=cfg.kev_stale_after_ms * 1_000_000,
            kev_advice_ttl_ns=cfg.kev_advice_ttl_ms * 1_000_000,
            kev_min_interval_ns=cfg.kev_min_interval_ms * 1_000_000,
        ),
        clock=clock,
        log=log,
        labeler=labeler,
        kev=kev,
        execution=exchange,
        advisor_name=advisor.name,
    )
    exchange.engine = engine

    bar = _progress(progress, len(books) + len(trades))
    try:
        for i, (key, ev) in enumerate(_merged(books, trades)):
            while (tk := clock.next_key()) is not None and tuple(tk) < key:
                _, fire = clock.pop_next()
                fire()
            clock.advance_to(ev.ts_recv)
            if isinstance(ev, BookSnapshot):
                exchange.on_book(ev)
                engine.on_book(ev)
            else:
                exchange.on_trade(ev)
                engine.on_trade(ev)
            if bar is not None and i % 2000 == 0:
                bar.update(i)
        while clock.next_key() is not None:
            _, fire = clock.pop_next()
            fire()
    finally:
        kev.close()
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - t0

    run_dir = Path(out_dir) if out_dir is not None else session.root / "runs" / f"run-{cfg.sha256()[:12]}"
    advisor_info = {
        "mode": cfg.kev_mode,
        "name": advisor.name,
        "deterministic": bool(getattr(advisor, "deterministic", True)),
        **{k: getattr(advisor, k) for k in ("hits", "misses", "live_calls") if hasattr(advisor, k)},
    }
    _write_run(run_dir, overwrite, log, session, cfg, laya, len(books), len(trades), advisor_info)
    return RunResult(
        run_dir, log.digest, log.counts(), len(books), len(trades), wall, laya.describe(), advisor_info
    )


def _write_run(
    run_dir: Path,
    overwrite: bool,
    log: EventLog,
    session: Any,
    cfg: ReplayConfig,
    laya: Laya,
    n_books: int,
    n_trades: int,
    advisor_info: dict[str, Any],
) -> None:
    """Write into ``<run>.tmp`` and rename, so a half-written run never looks finished."""
    if run_dir.exists() and not overwrite:
        raise DualhubError(f"{run_dir} exists; pass --overwrite (or another --out) to replace it")
    tmp = run_dir.with_name(run_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "events").mkdir(parents=True)
    files = log.write(tmp / "events")
    info = laya.describe()
    manifest = {
        "run_schema_version": RUN_SCHEMA_VERSION,
        "digest": log.digest,
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
        "seeds": {"replay": cfg.seed, "kev_lag": [cfg.seed, 1]},
        "config": cfg.to_json(),
        "config_sha256": cfg.sha256(),
        "advisor": advisor_info,
        "counts": log.counts(),
        "files": files,
    }
    write_json(tmp / "manifest.json", manifest)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(run_dir)
    # The provider is a fact about this machine, not about the run's inputs: kept beside the manifest.
    write_json(
        run_dir / "runtime.json",
        {k: info.get(k) for k in ("requested_providers", "active_provider", "fallback_reason")},
    )


def _progress(enabled: bool, total: int) -> Any:
    if not enabled:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    class _Bar:
        def __init__(self) -> None:
            self.p = Progress(
                "[bold]replay", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True
            )
            self.p.start()
            self.task = self.p.add_task("replay", total=total)

        def update(self, n: int) -> None:
            self.p.update(self.task, completed=n)

        def close(self) -> None:
            self.p.update(self.task, completed=total)
            self.p.stop()

    return _Bar()
