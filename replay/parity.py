"""The replay config that reproduces a live run: same engine settings, the run's Kev cassette, the
delays it observed (``recorded:KIND@RUN`` latency specs), market data seen by the paper exchange at
receipt (``exchange_feed="local"``) and Laya per tick, as live mode runs it.

With it, ``run_replay(session, replay_config_for(run))`` makes the decisions the live run made, and
``dualhub diff RUN REPLAY`` finds no divergence (``tests/live/test_live.py`` checks it).

``dualhub parity LIVE_SESSION`` (:func:`check_parity`) does both for every run of a live session and
compares the streams of :data:`replay.diff.COMPARABLE_STREAMS` (labels, Kev, decisions) with
:func:`replay.diff.diff_runs`. A paper run is reproduced whole: its fills came from the same fill
model, on the same books, after the recorded delays. A real-orders run (``--live``) is not: the
venue's acks, rejects and fills came from the real venue, and the replay's simulated exchange answers
differently. What the engine decided before the first execution report (in either run) depended on
nothing the venue said, so that is the part compared; a difference after it is expected and reported
as such, never as a pass of the whole run. Laya's labels depend on market data and the recorded
compute times only, so they are compared over the whole run too.

A run ``dualhub recover`` rebuilt after a ``kill -9`` (manifest ``recovered``) holds what its journal
made durable, up to ``durable_until_ns``; the session goes on past it and so does its replay, answering
Kev requests past the cassette with the rules (``kev_miss_policy="sim"``): what is compared ends there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.contract import ContractConfig
from engine.errors import DualhubError
from engine.risk import RiskLimits
from engine.strategy import QuoteConfig
from replay.config import ReplayConfig
from replay.diff import COMPARABLE_STREAMS, DiffResult, diff_runs
from replay.driver import run_replay

# order events that are the venue's answers (the engine's own are "new" and "cancel"); fills too
REPORT_KINDS: Final = ("ack", "reject", "done", "cancel_ack")
NOT_REPRODUCED: Final = (
    "real orders (--live): the venue's acks, rejects and fills came from the real venue and cannot be "
    "reproduced; compared: what the engine decided before the first execution report"
)


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
        # an unbound limit (infinite) is written null in JSON
        "risk": RiskLimits(**{k: math.inf if v is None else v for k, v in ec["risk"].items()}),
        "quotes": QuoteConfig(**ec["quotes"]),
        "strategy": ec.get("strategy", "baseline"),
        "strategy_params": ec.get("strategy_params", {}),
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
    for k in ("kev_hub", "pair_entry_z", "pair_exit_z", "pair_half_life_ms", "leg_timeout_ms", "leg_hedge"):
        if cfg.get("kev_hub") and k in cfg:
            fields[k] = cfg[k]
    if len(m.get("symbols") or []) > 1:  # a portfolio: every instrument on the contract and sizes it had
        fields["symbols"] = tuple(m["symbols"])
        fields["symbol"] = m["symbols"][0]
        fields["instruments"] = {
            sym: {
                **{k: e["contract"][k] for k in ("tick", "size_step", "min_qty")},
                "quote_qty": e["quotes"]["quote_qty"],
                **{k: e["risk"][k] for k in ("max_position", "max_order_qty")},
            }
            for sym, e in m["engine_configs"].items()
        }
    if m.get("recovered"):  # requests in flight at the kill, and the replay's past the end, have no answer
        fields["kev_miss_policy"] = "sim"
    fields.update(overrides)
    return ReplayConfig(**fields)


def live_runs(path: Path | str) -> list[Path]:
    """The live runs of a session directory (``runs/live-<SYMBOL>``), or ``path`` itself if it is one."""
    p = Path(path)
    if not p.is_dir():
        raise DualhubError(f"{p} is not a directory")
    if _kind(p) == "live":
        return [p]
    runs = sorted(r for r in (p / "runs").glob("live-*") if r.is_dir() and not r.name.endswith(".tmp"))
    if not runs:
        raise DualhubError(f"{p} is not a live session: no runs/live-<SYMBOL> written by `dualhub live`")
    for r in runs:
        if _kind(r) != "live":
            raise DualhubError(f"{r} is not a finished live run (no manifest.json of kind live)")
    return runs


def _kind(run: Path) -> str | None:
    try:
        m = orjson.loads((run / "manifest.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return m.get("kind") if isinstance(m, dict) else None


def first_report_ns(run: Path) -> int | None:
    """When the engine of ``run`` first heard from its exchange (an order report or a fill)."""
    times = []
    orders = pq.read_table(run / "events" / "order.parquet", columns=["ts_recv", "kind"])
    hit = orders.filter(pc.is_in(orders.column("kind"), pa.array(REPORT_KINDS)))
    fills = pq.read_table(run / "events" / "fill.parquet", columns=["ts_recv"])
    for t in (hit, fills):
        if t.num_rows:
            times.append(pc.min(t.column("ts_recv")).as_py())
    return min(times) if times else None


@dataclass(frozen=True)
class Parity:
    """One live run against its replay. ``window_end_ns``: events from this time on are not compared
    (real orders: the first execution report); None for a paper run (compared whole)."""

    live_run: Path
    replay_run: Path
    mode: str
    diff: DiffResult
    window_end_ns: int | None
    compared: int  # events of the compared streams in the live run, inside the window
    total: int  # ... in the whole live run
    kev: dict[str, Any]
    labels: DiffResult | None = None  # real orders: the labels over the whole run
    # a run recovered from its journal: nothing from this time on is compared (it was never durable)
    durable_end_ns: int | None = None

    @property
    def window_diverged(self) -> bool:
        d = self.diff.divergence
        return d is not None and (self.window_end_ns is None or d.ts_recv < self.window_end_ns)

    @property
    def diverged(self) -> bool:
        """A divergence inside what can be reproduced."""
        lab = self.labels.divergence if self.labels is not None else None
        end = self.durable_end_ns
        return self.window_diverged or (lab is not None and (end is None or lab.ts_recv < end))


def check_parity(
    run: Path,
    out_dir: Path | None = None,
    *,
    streams: tuple[str, ...] = COMPARABLE_STREAMS,
    context: int = 5,
) -> Parity:
    """Replay the live ``run`` as it happened (:func:`replay_config_for`) into ``out_dir`` (default
    ``<session>/runs/parity-<SYMBOL>``, replaced if it is a previous run) and compare."""
    run = Path(run).resolve()
    m = orjson.loads((run / "manifest.json").read_bytes())
    session = run.parent.parent
    if not (session / "manifest.json").is_file():
        raise DualhubError(f"{run}: its session {session} has no manifest.json (an unfinished live run?)")
    events = (f"events/{x}.parquet" for x in (*streams, "order", "fill"))
    need = dict.fromkeys(("latency_recorded.parquet", "kev_cassette.parquet", *events))
    missing = [f for f in need if not (run / f).is_file()]
    if missing:
        raise DualhubError(f"{run} lacks {', '.join(missing)}: cannot replay it as it happened")
    out = Path(out_dir) if out_dir is not None else session / "runs"
    name = m.get("symbol") or "portfolio"
    rr = run_replay(session, replay_config_for(run), out_dir=out / f"parity-{name}", overwrite=True)
    d = diff_runs(run, rr.run_dir, streams=streams, context=context)
    mode = str(m.get("config", {}).get("mode", "paper"))
    window, labels = None, None
    recovered = m.get("recovered") or {}
    durable_end = int(recovered["durable_until_ns"]) + 1 if recovered else None
    if mode == "live":
        ends = [t for t in (first_report_ns(run), first_report_ns(rr.run_dir)) if t is not None]
        window = min(ends) if ends else None
        labels = diff_runs(run, rr.run_dir, streams=("label",), context=context)
    if durable_end is not None:
        window = durable_end if window is None else min(window, durable_end)
    times = [
        pq.read_table(run / "events" / f"{s}.parquet", columns=["ts_recv"]).column("ts_recv") for s in streams
    ]
    total = sum(len(t) for t in times)
    compared = total if window is None else sum(pc.sum(pc.less(t, window)).as_py() or 0 for t in times)
    return Parity(run, rr.run_dir, mode, d, window, compared, total, dict(rr.kev), labels, durable_end)
