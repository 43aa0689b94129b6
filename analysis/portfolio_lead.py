"""What the report of a run trading several instruments leads with: the portfolio, then each leg.

One row for the portfolio and one per leg (views.sql ``scope_performance``): PnL, max drawdown,
Sharpe of the PnL sampled every ``sample_ns`` (the sampling is stated), net delta and gross exposure
time-weighted over the run and at their largest. The header gives the portfolio's limits as the
run's config has them and, for each loss stop (every leg's own and the portfolio's: views.sql
``loss_stops``), whether it was hit, when, and what it cost. docs/ANALYSIS.md ("Portfolio") defines
every number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import duckdb

from analysis.report import Section

# --portfolio keys (engine/risk_args.py PORTFOLIO_KEYS) and the RiskLimits fields the run's config holds
LIMIT_FIELDS: Final = (
    ("net_delta_usd", "portfolio_max_net_delta_usd"),
    ("gross_usd", "portfolio_max_gross_usd"),
    ("loss_stop_usd", "portfolio_loss_stop_usd"),
)


@dataclass
class Lead:
    sample_ns: int
    span_ns: int
    risk: dict[str, Any]  # the run's config.risk
    scopes: list[dict[str, Any]]  # scope_performance rows, the portfolio first
    stops: list[dict[str, Any]]  # loss_stops rows, the portfolio first


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    rel = con.sql(sql)
    return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]


def compute(con: duckdb.DuckDBPyConnection, manifest: dict[str, Any], sample_ns: int) -> Lead:
    """The lead over ``con`` (:func:`analysis.report.connect`'s views of a portfolio run)."""
    con.execute(f"SET VARIABLE sample_ns = {int(sample_ns)}")
    span = con.sql("SELECT span_ns FROM portfolio_span").fetchall()[0][0]
    return Lead(
        sample_ns=int(sample_ns),
        span_ns=int(span or 0),
        risk=dict(manifest.get("config", {}).get("risk") or {}),
        scopes=_rows(con, "FROM scope_performance"),
        stops=_rows(con, "FROM loss_stops"),
    )


def _r(x: Any, nd: int = 4) -> Any:
    if x is None:
        return None
    x = float(x)
    return round(x, nd) if math.isfinite(x) else None


def _usd(x: Any) -> str:
    return "unbound" if x is None else f"{float(x):g}"


def _sampling(ns: int) -> str:
    s = ns / 1e9
    return f"{s / 60:g}-minute" if s >= 60 and s % 60 == 0 else f"{s:g} s"


def limits_line(lead: Lead) -> str:
    """The portfolio's limits from the run's config (a limit the config leaves out is unbound), and
    the per-instrument limits every leg has."""
    r = lead.risk
    pf = ", ".join(f"{key}={_usd(r.get(name))}" for key, name in LIMIT_FIELDS)
    leg = (
        f"loss stop {_usd(r.get('daily_loss_stop_usd'))}, net delta {_usd(r.get('max_net_delta_usd'))}, "
        f"max position {r.get('max_position', '')}"
    )
    return f"portfolio limits (USD, config risk.portfolio_*): {pf}; each leg's own: {leg}"


def stop_line(s: dict[str, Any]) -> str:
    """One loss stop: not hit, or hit when, and its cost (``after_stop``: the scope's PnL at the end
    minus at the stop; the unwinding fills' fees and slippage against the mid beside it)."""
    who = "portfolio loss stop" if s["scope"] == "portfolio" else f"{s['scope']} loss stop"
    lim = f"{_usd(s['limit_usd'])} USD" if s["limit_usd"] is not None else "unbound"
    if not s["hit"]:
        end = _r(s["pnl_end"], 2)
        return f"{who} ({lim}): not hit (PnL at the end {end} USDT)"
    after = float(s["after_stop"] or 0.0)
    cost = f"cost {-after:.2f} USDT" if after < 0 else f"gained {after:.2f} USDT"
    return (
        f"LOSS STOP hit: {who} ({lim}) at t={s['stop_s']:.1f} s (its first refusal; {s['refusals']} in all): "
        f"PnL {s['pnl_at_stop']:.2f} then, {s['pnl_end']:.2f} at the end: {cost} after the stop (PnL at the "
        f"end - at the stop); {s['fills_after']} fills from then on paid {s['fees_after']:.2f} fees and "
        f"{s['slippage_after']:.2f} slippage against the mid"
    )


def header_lines(lead: Lead) -> list[str]:
    return [limits_line(lead), *(stop_line(s) for s in lead.stops)]


def sections(lead: Lead) -> list[Section]:
    """The lead table (the portfolio, then one row per leg) and the loss stops' table."""
    samp = _sampling(lead.sample_ns)
    note = ""
    if 0 < lead.span_ns < 86_400e9:
        note = f"; from a {lead.span_ns / 6e10:.0f}-minute run the annualised figure says little"
    cols = [
        "scope", "pnl_usdt", "max_drawdown_usdt", f"sharpe_{samp.replace(' ', '')}", "sharpe_annualised",
        "net_delta_twa", "abs_net_delta_twa", "abs_net_delta_max", "gross_twa", "gross_max", "fills",
        "fees_usdt",
    ]  # fmt: skip
    rows = [
        (
            s["scope"],
            _r(s["pnl"]),
            _r(s["max_drawdown"]),
            _r(s["sharpe_per_sample"]),
            _r(s["sharpe_annualised"], 2),
            _r(s["net_delta_twa"], 2),
            _r(s["abs_net_delta_twa"], 2),
            _r(s["net_abs_max"], 2),
            _r(s["gross_twa"], 2),
            _r(s["gross_max"], 2),
            s["fills"],
            _r(s["fees"]),
        )  # fmt: skip
        for s in lead.scopes
    ]
    lead_table = Section(
        "portfolio_lead",
        f"The portfolio, then each leg (USDT; PnL marked to mid after fees; Sharpe from {samp} marks of that "
        f"PnL, per sample and annualised x sqrt(samples in 365 days){note}; net delta and gross exposure "
        "time-weighted over the run (twa) and at their largest)",
        cols,
        rows,
    )
    stops = Section(
        "loss_stops",
        "Loss stops: each leg's own and the portfolio's (hit: the rule refused an order; at_s: the first "
        "refusal; after_stop = PnL at the end - at the stop, its cost when negative; fees_after and "
        "slippage_after: what the fills from the stop on paid)",
        [
            "scope",
            "rule",
            "limit_usd",
            "hit",
            "at_s",
            "refusals",
            "pnl_at_stop",
            "pnl_end",
            "after_stop",
            "fills_after",
            "fees_after",
            "slippage_after",
        ],  # fmt: skip
        [
            (
                s["scope"],
                s["rule"],
                s["limit_usd"],
                s["hit"],
                _r(s["stop_s"], 3),
                s["refusals"],
                _r(s["pnl_at_stop"]),
                _r(s["pnl_end"]),
                _r(s["after_stop"]),
                s["fills_after"],
                _r(s["fees_after"]),
                _r(s["slippage_after"]),
            )  # fmt: skip
            for s in lead.stops
        ],
    )
    return [lead_table, stops]
