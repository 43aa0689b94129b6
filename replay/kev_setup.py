"""Kev for a replay: the advisor of the configured mode (rules, a cassette, llama-server) and the
backend that delivers its replies on the virtual clock after their lag (model, recorded or measured)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from engine.clock import ReplayClock
from engine.errors import DualhubError
from engine.kev.cassette import Cassette, CassetteAdvisor, answered_by
from engine.kev.lag import EmpiricalLag
from engine.kev.llama import LlamaAdvisor, LlamaConfig
from engine.kev.pairs import RulePairsKev
from engine.kev.rules import RuleKev
from engine.kev.sim import SimKevBackend
from engine.latency.models import LatencyModel, LognormalLatency, ScaledLatency
from replay.config import ReplayConfig, _rng


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
