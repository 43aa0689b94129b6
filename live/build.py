"""How a live run is put together before its feed starts: the keys checked at the venue, the contracts
read, every instrument's engine config resolved as replay resolves a session's, and the engines built on
the live clock (Laya's tick path, Kev, the paper exchange or the gateway, one run and its write-ahead
journal per symbol or one for a portfolio).
"""

from __future__ import annotations

import gc
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from engine import assemble
from engine.assemble import Wiring, build_engine
from engine.contract import ContractConfig
from engine.errors import DualhubError
from engine.instruments import SIZE_FIELDS
from engine.kev.cassette import RecordingAdvisor
from engine.kev.pairs import RulePairsKev
from engine.kev.rules import RuleKev
from engine.latency.recorded import RecordingLatency
from engine.latency.spec import parse_latency
from engine.laya.model import Laya, LayaConfig
from engine.validate import WireLimits
from live.config import PORTFOLIO_RUN
from live.finish import wal_header
from live.gateway import BitgetGateway, GatewayExecution, GatewayTransportError, ticker_mids
from live.kev_backend import LiveKevBackend
from live.reconcile import Reconciler
from live.state import RunState
from live.symbol import SymbolRun
from live.tick import TickLaya
from live.wal import WAL_FILE, JournaledLog, JournaledSink, LiveWal
from venue.exchange import SimExchange
from wire.bitget.bitget_v2 import INST_TYPE, wire_guard
from wire.bitget.bitget_v2_rest import BitgetError, ContractSpec

log = logging.getLogger("live.runner")  # the run's one logger name (live/feed.py says why)


async def read_contracts(r: RunState) -> dict[str, ContractSpec]:
    cfg = r.cfg
    if cfg.mode == "paper" and cfg.contract_defaults:
        return {}
    gw = r.gateway or BitgetGateway(r.rest_url, timeout_s=3.0)
    try:
        specs = {s.symbol: s for s in await gw.contracts()}
    except (BitgetError, GatewayTransportError) as e:
        if cfg.mode == "live":
            raise DualhubError(f"cannot read contracts from {r.rest_url}: {e}") from None
        log.warning("contracts unavailable (%s): using the engine's defaults", e)
        r.errors.append(f"contracts: {e}")
        return {}
    finally:
        if gw is not r.gateway:
            await gw.aclose()
    missing = [s for s in cfg.symbols if s not in specs]
    if missing:
        raise DualhubError(f"{r.rest_url} lists no contract for {missing}")
    bad = [s for s in cfg.symbols if not specs[s].tradable]
    if bad and cfg.mode == "live":
        raise DualhubError(f"not tradable now: {[(s, specs[s].status) for s in bad]}")
    r.contract_source = "exchange"
    return {s: specs[s] for s in cfg.symbols}


async def resolve(r: RunState, specs: dict[str, ContractSpec]) -> None:
    """Every instrument's engine config, resolved as replay resolves a session's: a portfolio's sizes
    scaled from the first instrument's at the tickers' mids (asked only where a size is not named),
    or one error line naming the instrument and the --instrument way out."""
    cfg = r.cfg
    scaled = [s for s in cfg.symbols[1:] if any(k not in cfg.instruments.get(s, {}) for k in SIZE_FIELDS)]
    if scaled:
        r.ref_mids, unread = await ticker_mids(r.rest_url, [cfg.symbols[0], *scaled], r.gateway)
        for sym, why in unread.items():
            log.warning("%s: no ticker from %s (%s)", sym, r.rest_url, why)
            r.errors.append(f"ticker {sym}: {why}")
    resolve_configs(r, specs)


def resolve_configs(r: RunState, specs: dict[str, ContractSpec]) -> None:
    """The engine configs at the reference mids read so far (engine.assemble.instrument_configs)."""
    cfg = r.cfg
    contracts = {s: specs[s].config() if s in specs else ContractConfig(symbol=s) for s in cfg.symbols}
    configs = assemble.instrument_configs(cfg, cfg.symbols, contracts, r.ref_mids)
    r.engine_configs = {e.symbol: e for e in configs}


async def setup_gateway(r: RunState) -> None:
    assert r._creds is not None
    r.gateway = gw = BitgetGateway(r.rest_url, r._creds)
    try:
        await gw.sync_time()
        positions = await gw.positions()  # the first signed call: are the keys good?
    except BitgetError as e:
        raise DualhubError(f"the exchange refused us at startup: {r._redact(str(e))}") from None
    except GatewayTransportError as e:
        raise DualhubError(f"exchange unreachable: {e}") from None
    held = [(p.symbol, p.signed_size) for p in positions if p.symbol in r.cfg.symbols and p.total]
    if held:
        raise DualhubError(f"open positions {held}: the engine starts flat; close them first")


def build(r: RunState, specs: dict[str, ContractSpec]) -> None:
    cfg = r.cfg
    if not r.engine_configs:  # built without _resolve (tests, benches): no ticker asked
        resolve_configs(r, specs)
    laya = Laya(LayaConfig(model_path=Path(cfg.model_path), provider=cfg.laya_provider))
    r.laya = laya
    # decoder + labeler + Laya latency in one: books15 frames are labelled before their event exists
    # with the recorder's wire checks (limits as the session's record says: the normaliser's)
    guard = wire_guard(WireLimits.from_json(r._asked.get("wire_limits")), inst_type=INST_TYPE)
    r.tick = tick = TickLaya(laya, r.clock.wall_ns, guard)

    inner = r._inner_advisor
    if inner is None:
        if cfg.kev_url:
            from engine.kev.llama import LlamaAdvisor, LlamaConfig
            from engine.kev.process import ProcessAdvisor

            kev_cfg = LlamaConfig.for_engine(cfg.kev_url, cfg.kev_timeout_ms)
            inner = ProcessAdvisor.llama(kev_cfg) if cfg.kev_process else LlamaAdvisor(kev_cfg)
        elif cfg.kev_hub == "pairs":
            inner = RulePairsKev(entry_z=cfg.pair_entry_z, exit_z=cfg.pair_exit_z)
        else:
            inner = RuleKev()
    r._advisor_inner = inner
    run_tag = f"dh{r.started_ns // 1_000_000 % 10**10:010d}-"
    if cfg.mode == "live":
        assert r.gateway is not None
        r.execution = GatewayExecution(
            r.gateway,
            specs,
            run_tag=run_tag,
            inject=lambda prio, fn: r.inject(prio, fn),
            now_ns=r.clock.now_ns,
            record=r._record_exec,
            on_reconcile=r._on_reconcile,
            on_kill=r.request_kill,
            on_task_done=r._task_ended,
        )
        r.reconciler = Reconciler(r.execution, r.errors, r.request_kill)
    rng_root = int(cfg.seed)
    # several symbols: one engine over them (engine/instruments.py), one run, one log, one Kev
    portfolio = (
        assemble.portfolio(cfg, cfg.symbols, assemble.lead_pairs(cfg.symbols)) if cfg.portfolio else None
    )
    shared: tuple[Any, ...] | None = None
    contracts = {s: specs[s].config() if s in specs else ContractConfig(symbol=s) for s in cfg.symbols}
    for i, symbol in enumerate(cfg.symbols):
        contract = contracts[symbol]
        if shared is None:
            run_dir = r.root / "runs" / (PORTFOLIO_RUN if portfolio else f"live-{symbol}")
            tmp = run_dir.with_name(run_dir.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            r._tmp_runs.append(tmp)
            (tmp / "events").mkdir(parents=True)
            advisor = RecordingAdvisor(inner)
            # the journal first: from the first event on, a kill -9 leaves a run `recover` rebuilds
            wal = LiveWal(
                tmp / WAL_FILE,
                wal_header(r, run_dir, symbol, contracts, advisor.name, run_tag),
                fsync_ms=cfg.wal_fsync_ms,
            )
            r._wals.append(wal)
            sink = JournaledSink(wal)
            evlog = JournaledLog(tmp / "events", wal)
            kev = LiveKevBackend(advisor, r, sink)
            kev.wal = wal
            lists: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
            if portfolio is not None:
                shared = (run_dir, tmp, sink, evlog, advisor, kev, lists, wal)
        else:
            run_dir, tmp, sink, evlog, advisor, kev, lists, wal = shared
        paper = None
        execution: Any = r.execution
        if cfg.mode == "paper":
            # One stream per order latency model, components 4, 5, 6 as replay's: for the first
            # symbol the streams are replay's own (a seed sequence pads its entropy with zeros), so
            # a replay with the run's seed and models draws what the paper venue drew.
            entry, response, cancel = (np.random.default_rng([rng_root, c, i]) for c in (4, 5, 6))
            models = (
                RecordingLatency(parse_latency(cfg.latency_order_entry, entry), "order_entry", sink),
                RecordingLatency(parse_latency(cfg.latency_order_response, response), "order_response", sink),
                RecordingLatency(parse_latency(cfg.latency_cancel, cancel), "cancel", sink),
            )
            # schedule/now_ns: the live clock fits the replay clock's place
            paper = SimExchange.simulated(r.clock, cfg.fill_model, models, contract)  # type: ignore[arg-type]
            execution = paper
        wiring = Wiring(clock=r.clock, log=evlog, kev=kev, advisor_name=advisor.name, portfolio=portfolio)
        engine = build_engine(
            r.engine_configs[symbol], wiring, execution, tick, RecordingLatency(tick, "laya", sink)
        )
        if r.execution is not None:
            r.execution.engines[symbol] = engine
        r.syms[symbol] = SymbolRun(
            symbol, contract, run_dir, tmp, evlog, sink, advisor, kev, engine, paper, *lists, wal=wal
        )
        if i == 0 or portfolio is None:  # a portfolio's engines share one core buffer and streams
            evlog.watch(engine.core.streams)
            r._wal_heads.append((engine, evlog, wal))
    r.portfolio = portfolio
    # Everything built so far (models, sessions, modules) lives for the whole run: move it out of
    # the cyclic collector's reach, so a full collection during trading scans only what the run
    # allocates instead of stalling the loop mid-trade (it showed in the order latency's p99).
    gc.freeze()
    if r._gc is not None:
        r._gc.start()
