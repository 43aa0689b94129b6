"""The composition root: the one place the engine is put together from :class:`EngineSettings`, for a
replay (on the compiled loop or driven per event), a paper run and a live run.

The drivers bring only their I/O: the clock (virtual or real), the event log, Kev's backend (the
replay's simulated one, live's llama-server client) and each instrument's execution client (the
simulated venue, or Bitget). What the engine is (each instrument's settings, sizes, contract, the
portfolio it trades in and how Kev's hub commands go out) is decided here, so replay and live cannot
come to differ on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.clock import Clock
from engine.contract import ContractConfig
from engine.core import Engine, EngineConfig, ExecutionClient, KevBackend, Labeler
from engine.eventlog import EventLog
from engine.instruments import Portfolio, resolve_instruments
from engine.latency.models import LatencyModel
from engine.settings import EngineSettings

MS = 1_000_000


def engine_config(settings: EngineSettings, *, symbol: str, contract: ContractConfig) -> EngineConfig:
    """The core's config of one instrument from the settings (times in ms become ns)."""
    return EngineConfig(
        symbol=symbol,
        contract=contract,
        risk=settings.risk,
        quotes=settings.quotes,
        strategy=settings.strategy,
        strategy_params=dict(settings.strategy_params),
        kev_queue_max=settings.kev_queue_max,
        kev_queue_policy=settings.kev_queue_policy,
        kev_max_in_flight=settings.kev_max_in_flight,
        kev_timeout_ns=settings.kev_timeout_ms * MS,
        kev_stale_after_ns=settings.kev_stale_after_ms * MS,
        kev_advice_ttl_ns=settings.kev_advice_ttl_ms * MS,
        kev_min_interval_ns=settings.kev_min_interval_ms * MS,
    )


def instrument_configs(
    settings: EngineSettings,
    symbols: Sequence[str],
    contracts: Mapping[str, ContractConfig],
    ref_mids: Mapping[str, float | None],
) -> list[EngineConfig]:
    """Each instrument's config: the settings on its contract, sizes scaled from the first instrument's
    to the same notional at the reference mids (a replay's first books, live's tickers), then the
    settings named for it (``settings.instruments``). One instrument: the settings on its contract,
    with what is named for it."""
    base = engine_config(settings, symbol=symbols[0], contract=contracts[symbols[0]])
    return resolve_instruments(base, symbols, contracts, ref_mids, settings.instruments)


def portfolio(
    settings: EngineSettings, symbols: Sequence[str], pairs: tuple[tuple[str, str], ...]
) -> Portfolio:
    """The portfolio the instruments trade in: its risk view, and with Kev as the hub the ``pairs``
    (leader, follower) it fits and how a hub command's legs go out."""
    return Portfolio(
        list(symbols),
        pairs=pairs if settings.kev_hub else (),
        hub=bool(settings.kev_hub),
        pair_half_life_ns=settings.pair_half_life_ms * MS,
        leg_timeout_ns=settings.leg_timeout_ms * MS,
        leg_hedge=settings.leg_hedge,
    )


def lead_pairs(symbols: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The hub's pairs when nothing names them: the first symbol leads each of the others."""
    return tuple((symbols[0], s) for s in symbols[1:])


@dataclass(slots=True, kw_only=True)
class Wiring:
    """What a driver connects every instrument's engine to: its clock, event log, Kev (backend and the
    advisor's name for the log), the portfolio they trade in (None: one instrument alone) and whether
    the compiled entries load now (live: its first frame must not wait) or on first use (replay)."""

    clock: Clock
    log: EventLog
    kev: KevBackend
    advisor_name: str
    portfolio: Portfolio | None = None
    warm: bool = True


def build_engine(
    config: EngineConfig,
    wiring: Wiring,
    execution: ExecutionClient,
    labeler: Labeler,
    laya_latency: LatencyModel | None = None,
) -> Engine:
    """One instrument's engine on ``wiring``, sending to ``execution`` (the simulated venue also learns
    which engine it reports to)."""
    engine = Engine(
        config,
        clock=wiring.clock,
        log=wiring.log,
        labeler=labeler,
        kev=wiring.kev,
        execution=execution,
        advisor_name=wiring.advisor_name,
        laya_latency=laya_latency,
        portfolio=wiring.portfolio,
        warm=wiring.warm,
    )
    if hasattr(execution, "engine"):  # the simulated venue reports fills to the engine it serves
        execution.engine = engine  # type: ignore[attr-defined]
    return engine


__all__: list[Any] = [
    "Wiring",
    "build_engine",
    "engine_config",
    "instrument_configs",
    "lead_pairs",
    "portfolio",
]
