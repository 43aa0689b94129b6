"""The engine's settings: what a replay, a paper run and a live run share, validated in one place.

``ReplayConfig`` (replay/driver.py) and ``LiveConfig`` (live/config.py) are these settings plus their
own I/O (where the data comes from, how the run is kept). ``engine/assemble.py`` builds the engine from
them, the same way for every driver: a setting read differently by replay and live is a bug this
type exists to prevent (live once sized a second instrument differently).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.bounds import LEG_HEDGES, check_engine_settings
from engine.errors import DualhubError
from engine.instruments import checked_instruments
from engine.kev.queue import POLICIES
from engine.latency.models import LatencyModel
from engine.latency.spec import parse_latency
from engine.risk import RiskLimits
from engine.strategies import plugin
from engine.strategies.registry import resolve as resolve_strategy
from engine.strategy import QuoteConfig

KEV_HUBS = ("", "pairs", "llm")
ORDER_LATENCIES = ("latency_order_entry", "latency_order_response", "latency_cancel")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    """The decisions' settings (strategy, risk, Kev's queue and timers, the portfolio's hub and legs)
    and the order latencies the simulated venue draws. Subclasses call :meth:`check` from their own
    ``__post_init__`` (a slotted dataclass's subclass cannot reach it through ``super()``)."""

    seed: int = 1
    # several instruments traded as one portfolio; a single instrument is named by the subclass
    symbols: tuple[str, ...] = ()
    # Kev as the portfolio's hub: "" (each instrument asks Kev on its own), "pairs" (the pairs rule,
    # engine/kev/pairs.py, answers for the portfolio) or "llm" (the same question to llama-server)
    kev_hub: str = ""
    # per-instrument settings over these (engine.instruments.INSTRUMENT_FIELDS), {symbol: {field: value}}
    instruments: dict[str, dict[str, float]] = field(default_factory=dict)
    pair_entry_z: float = 2.0
    pair_exit_z: float = 0.5
    pair_half_life_ms: int = 60_000
    # a hub command's legs: one that lags this long after another filled is hedged (engine/legs.py),
    # "cross" (a market order) or "reprice" (a limit order at the far touch, sent again each timeout)
    leg_timeout_ms: int = 1_000
    leg_hedge: str = "cross"
    # Latency models of the simulated venue (replay, paper): "const:5ms", "lognormal:p5=2ms,p95=8ms",
    # "empirical:PATH" (engine.latency.models), or a live run's recorded ones ("recorded:KIND@RUN", replay)
    latency_order_entry: str = "const:5ms"  # local send -> exchange accepts
    latency_order_response: str = "const:5ms"  # exchange -> local (acks, fills, rejects)
    latency_cancel: str = "const:5ms"  # local cancel -> exchange
    kev_queue_max: int = 2
    kev_stale_after_ms: int = 1000
    kev_advice_ttl_ms: int = 5000
    kev_min_interval_ms: int = 0  # spacing of Kev requests; 0 = every non-HOLD label is offered
    kev_queue_policy: str = "drop_oldest"  # "drop_oldest", "fifo" (refuse new when full), "conflate"
    kev_max_in_flight: int = 1  # Kev requests in flight at once (llama-server slots)
    kev_timeout_ms: int = 2000  # no reply by then: "no advice", the slot is freed
    kev_url: str = ""  # llama-server base URL; "" = the rule advisor
    risk: RiskLimits = field(default_factory=RiskLimits)
    quotes: QuoteConfig = field(default_factory=QuoteConfig)
    # how the engine quotes (engine/strategies, docs/STRATEGY.md) and that strategy's parameters
    strategy: str = "baseline"
    strategy_params: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        EngineSettings.check(self)

    def check(self) -> None:
        """Every rule on these settings, each failure one DualhubError naming the setting; normalises
        the symbols (a tuple), the instruments and the strategy's name."""
        object.__setattr__(self, "symbols", tuple(self.symbols))
        if len(set(self.symbols)) != len(self.symbols):
            raise DualhubError(f"a symbol is given twice in {','.join(self.symbols)}")
        object.__setattr__(self, "instruments", checked_instruments(self.instruments))
        if self.kev_hub not in KEV_HUBS:
            raise DualhubError(f"kev_hub must be one of {KEV_HUBS}, not {self.kev_hub!r}")
        if self.kev_hub and len(self.symbols) < 2:
            raise DualhubError("Kev as the portfolio hub needs a portfolio: give two symbols or more")
        if not (0 <= self.pair_exit_z < self.pair_entry_z and self.pair_half_life_ms > 0):
            raise DualhubError("pairs: need 0 <= pair_exit_z < pair_entry_z and pair_half_life_ms > 0")
        check_engine_settings(self)
        if self.kev_queue_policy not in POLICIES:
            raise DualhubError(
                f"unknown Kev queue policy {self.kev_queue_policy!r}; known: {', '.join(POLICIES)}"
            )
        rng = np.random.default_rng(0)
        for name in ORDER_LATENCIES:
            check_latency(getattr(self, name), rng, name)
        object.__setattr__(self, "strategy", plugin.canonical(self.strategy))
        resolve_strategy(self.strategy, self.strategy_params, self.quotes)


def check_latency(spec: str, rng: np.random.Generator, name: str) -> LatencyModel:
    """The model a latency spec names (a recorded one's table is read), or one line naming the setting."""
    try:
        return parse_latency(spec, rng)
    except ValueError as e:
        raise DualhubError(f"{name}: {e}") from None


__all__ = ["KEV_HUBS", "LEG_HEDGES", "ORDER_LATENCIES", "EngineSettings", "check_latency"]
