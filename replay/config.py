"""A replay's settings (:class:`ReplayConfig`: the engine's, engine/settings.py, and where the data,
labels, latencies and Kev's answers come from), its result (:class:`RunResult`), its random streams, and
the checks of the session it is applied to (the symbol, the contract and its units)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engine import validate
from engine.bounds import check_ms
from engine.clock import ReplayClock
from engine.contract import ContractConfig, check_units, contract_of, tick_parts
from engine.errors import DualhubError
from engine.latency.models import LatencyModel
from engine.laya.model import DEFAULT_MODEL, FEATURE_SIZES
from engine.risk import DEFAULT_RULES
from engine.settings import EngineSettings, check_latency
from engine.store import (
    SessionError,
    open_session,
)
from engine.strategies import plugin
from venue.exchange import SimExchange
from venue.fills import check_fill_model

KEV_MODES = ("sim", "cassette", "llm")


KEV_LAG_SOURCES = ("measured", "model")


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
