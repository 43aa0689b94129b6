"""The core's config of one instrument (:class:`EngineConfig`, times in ns; ``engine/assemble.py``
makes it from the settings) and its money as exact Decimals (:class:`PortfolioView`): what the engine,
its state and a portfolio of instruments all read, kept apart from the engine so none of them imports
another to name it."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from engine.contract import ContractConfig
from engine.events import Nanos
from engine.portfolio import dec
from engine.risk import RiskLimits
from engine.strategy import QuoteConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    symbol: str = "BTCUSDT"
    contract: ContractConfig = field(default_factory=ContractConfig)
    risk: RiskLimits = field(default_factory=RiskLimits)
    quotes: QuoteConfig = field(default_factory=QuoteConfig)
    strategy: str = "baseline"  # engine.strategies.registry.STRATEGIES
    strategy_params: dict[str, float] = field(default_factory=dict)  # over the strategy's defaults
    laya_latency_ns: Nanos = 200_000
    kev_queue_max: int = 2
    kev_stale_after_ns: Nanos = 1_000_000_000
    kev_advice_ttl_ns: Nanos = 5_000_000_000
    kev_min_interval_ns: Nanos = 0  # 0: every non-HOLD label is offered to Kev
    kev_queue_policy: str = "drop_oldest"
    kev_max_in_flight: int = 1  # Kev requests in flight at once (llama-server slots)
    kev_timeout_ns: Nanos = 2_000_000_000  # no reply by then: "no advice", the slot is freed


@dataclass(frozen=True, slots=True)
class PortfolioView:
    """The engine's money as the core keeps it (integers of 1e-12), as exact Decimals."""

    position: Decimal
    cash: Decimal
    fees: Decimal

    def pnl(self, mark: float) -> Decimal:
        """Cash plus the position marked at ``mark`` (mid), net of fees."""
        return self.cash + self.position * dec(mark)
