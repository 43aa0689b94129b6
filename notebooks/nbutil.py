"""Shared by the notebooks: where the repository is, parameters from the environment, and a run to read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the repository this file is in


def path_param(name: str, default: str, start: Path) -> Path | None:
    """The path in the environment variable ``name`` (else ``default``; None when both are empty). A
    relative path is looked up from ``start`` (where the notebook started), the shell's $PWD, then the
    repository root, so `DUALHUB_SESSION=data/sessions/demo` works wherever jupyter runs."""
    raw = os.environ.get(name) or default
    if not raw:
        return None
    p = Path(raw).expanduser()
    places = [p] if p.is_absolute() else [start / p, Path(os.environ.get("PWD", start)) / p, ROOT / p]
    for c in places:
        if c.exists():
            return c.resolve()
    where = ", ".join(dict.fromkeys(str(c.parent.resolve()) for c in places))
    how = f"{name}={raw!r}" if os.environ.get(name) else f"{name} is not set and the default {raw!r}"
    raise FileNotFoundError(
        f"{how} does not exist (looked in {where}). Set {name} to an existing directory, "
        "e.g. a session from `dualhub simulate --out data/sessions/demo` or `dualhub demo`."
    )


def run_of(session: Path | None, run: Path | None) -> Path:
    """``run``; else the newest finished run of ``session``; else a fresh replay of it (into SESSION/runs).
    An in-sample run (the model was trained on its session) is flagged in the notebook's output."""
    if run is None:
        if session is None:
            raise FileNotFoundError(
                "set DUALHUB_RUN (a run directory) or DUALHUB_SESSION (a session directory)"
            )
        runs = sorted((session / "runs").glob("run-*/manifest.json"), key=lambda p: p.stat().st_mtime)
        if runs:
            run = runs[-1].parent
        else:
            from replay.config import ReplayConfig
            from replay.driver import run_replay

            run = run_replay(session, ReplayConfig(laya_provider="cpu")).run_dir
    manifest = json.loads((run / "manifest.json").read_text()) if (run / "manifest.json").is_file() else {}
    if (manifest.get("in_sample") or {}).get("in_sample"):
        print(f"WARNING: IN-SAMPLE run {run}: the model was trained on this session; its numbers say little")
    return run


def real_data(rel: str) -> Path:
    """A file of the shared real-data set, ``../shared/data/real/<rel>`` from the repository root."""
    p = ROOT.parent / "shared" / "data" / "real" / rel
    if not p.is_file():
        raise FileNotFoundError(
            f"the real data file {p} is not there: this notebook replays the Binance USD-M recording "
            "kept beside the repository (../shared/data/real, see its SOURCES.md); it is not in the repo"
        )
    return p


def run_summary(run_dir: Path) -> dict[str, Any]:
    """Headline numbers of a run, read through its views (analysis/views.sql)."""
    from analysis.report import connect

    con = connect(run_dir)
    try:
        one = lambda sql: con.execute(sql).fetchall()[0]  # noqa: E731
        fills, maker, fees = one(
            "SELECT count(*), avg(CASE WHEN liquidity = 'maker' THEN 1 ELSE 0 END), sum(fee) FROM fill"
        )
        pnl, position = one(
            "SELECT coalesce(last(pnl ORDER BY ts_recv, seq), 0),"
            " coalesce(last(position ORDER BY ts_recv, seq), 0) FROM fills_pnl"
        )
        decisions, unfilled = one("SELECT decisions, unfilled FROM decision_counts WHERE driver = 'all'")
        kev_ok, kev_failed, kev_lag = one(
            "SELECT count(*) FILTER (WHERE ok), count(*) FILTER (WHERE NOT ok), median(lag_ns) / 1e6"
            " FROM kev_response"
        )
        (dropped,) = one("SELECT count(*) FROM kev_queue WHERE kind LIKE 'dropped%'")
        (stopped,) = one("SELECT count(*) > 0 FROM risk WHERE reason = 'loss_stop'")
    finally:
        con.close()
    return {
        "fills": int(fills),
        "maker_share": float(maker or 0.0),
        "fees_usdt": float(fees or 0.0),
        "pnl_usdt": float(pnl),  # marked at the mid at the last fill (float; the report's pnl is exact)
        "position": float(position),
        "decisions": int(decisions),
        "unfilled": int(unfilled),
        "kev_ok": int(kev_ok),
        "kev_failed": int(kev_failed),
        "kev_lag_p50_ms": float(kev_lag or 0.0),
        "kev_dropped": int(dropped),
        "loss_stop": bool(stopped),  # the risk gateway's loss stop refused orders: quoting halted
    }
