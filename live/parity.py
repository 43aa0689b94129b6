"""The replay config that reproduces a live run: same engine settings, the run's Kev cassette, the
delays it observed (``recorded:KIND@RUN`` latency specs), market data seen by the paper exchange at
receipt (``exchange_feed="local"``) and Laya per tick, as live mode runs it.

With it, ``run_replay(session, replay_config_for(run))`` makes the decisions the live run made, and
``dualhub diff RUN REPLAY`` finds no divergence (``tests/test_live.py`` checks it).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from engine.contract import ContractConfig
from engine.errors import DualhubError
from engine.risk import RiskLimits
from engine.strategy import QuoteConfig
from replay.driver import ReplayConfig


def replay_config_for(run_dir: Path | str, **overrides: Any) -> ReplayConfig:
    run = Path(run_dir).resolve()
    try:
        m = orjson.loads((run / "manifest.json").read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise DualhubError(f"{run} is not a finished live run: {e}") from None
    if m.get("kind") != "live":
        raise DualhubError(f"{run} is not a live run (kind={m.get('kind')!r})")
    cfg, ec = m["config"], m["engine_config"]
    c = ec["contract"]
    contract = ContractConfig(
        symbol=c["symbol"],
        tick=c["tick"],
        size_step=c["size_step"],
        min_qty=c["min_qty"],
        maker_fee_rate=Decimal(c["maker_fee_rate"]),
        taker_fee_rate=Decimal(c["taker_fee_rate"]),
    )
    fields: dict[str, Any] = {
        "symbol": m["symbol"],
        "model_path": Path(m["model"]["path"]),
        "laya_provider": cfg["laya_provider"],
        "laya_mode": "tick",
        "laya_features": m["model"]["feature_version"],
        "latency_laya": f"recorded:laya@{run}",
        "latency_order_entry": f"recorded:order_entry@{run}",
        "latency_order_response": f"recorded:order_response@{run}",
        "latency_cancel": f"recorded:cancel@{run}",
        "latency_feed": "recorded",
        "exchange_feed": "local",
        "kev_mode": "cassette",
        # the run's cassette: every answer with the lag the engine saw, late ones included
        "kev_cassette": str(run / "kev_cassette.parquet"),
        "kev_miss_policy": "fail",
        "fill_model": cfg["fill_model"],
        "risk": RiskLimits(**ec["risk"]),
        "quotes": QuoteConfig(**ec["quotes"]),
        "contract": contract,
        **{
            k: cfg[k]
            for k in (
                "kev_queue_max",
                "kev_stale_after_ms",
                "kev_advice_ttl_ms",
                "kev_min_interval_ms",
                "kev_queue_policy",
                "kev_max_in_flight",
                "kev_timeout_ms",
            )
        },
    }
    if cfg.get("kev_url"):
        fields["kev_url"] = cfg["kev_url"]
    fields.update(overrides)
    return ReplayConfig(**fields)
