"""The risk gateway's command-line flags, shared by ``dualhub replay`` and ``dualhub live`` (and the
sweep's ``portfolio.KEY`` grid parameters): ``--risk-rules`` and ``--portfolio``, read into the
:class:`~engine.risk_limits.RiskLimits` of a run's config. The rules never read argparse.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import Final

from engine.errors import DualhubError
from engine.risk_limits import DEFAULT_RULES, MANDATORY_RULES, RiskLimits

# ``--portfolio`` keys and the RiskLimits field each sets (sweep grids spell them ``portfolio.KEY``)
PORTFOLIO_KEYS: Final = {
    "net_delta_usd": "portfolio_max_net_delta_usd",
    "gross_usd": "portfolio_max_gross_usd",
    "loss_stop_usd": "portfolio_loss_stop_usd",
}


def portfolio_limits(spec: str) -> dict[str, float]:
    """``net_delta_usd=3000,gross_usd=9000,loss_stop_usd=150`` as RiskLimits fields, or a DualhubError
    (one line) naming what is wrong: an unknown or repeated key, or a value that is not a finite number
    > 0 (1e400 reads as infinity: refused, as an unbound limit is written by leaving the key out)."""
    out: dict[str, float] = {}
    for item in spec.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or not key:
            raise DualhubError(
                f"--portfolio {item.strip()!r}: expected KEY=VALUE (keys: {', '.join(PORTFOLIO_KEYS)})"
            )
        if key not in PORTFOLIO_KEYS:
            raise DualhubError(f"--portfolio: unknown key {key!r} (keys: {', '.join(PORTFOLIO_KEYS)})")
        if PORTFOLIO_KEYS[key] in out:
            raise DualhubError(f"--portfolio: {key} given twice")
        try:
            v = float(value)
        except ValueError:
            raise DualhubError(f"--portfolio: {key}={value!r} is not a number") from None
        if not (math.isfinite(v) and v > 0):
            raise DualhubError(f"--portfolio: {key}={value} must be a finite number > 0")
        out[PORTFOLIO_KEYS[key]] = v
    return out


def add_risk_args(p: argparse.ArgumentParser) -> None:
    """``--risk-rules NAME,...`` and ``--portfolio KEY=V,...`` (``dualhub replay`` and ``dualhub live``)."""
    p.add_argument(
        "--risk-rules",
        default="",
        metavar="NAMES",
        help="the risk rules to run, in order, comma-separated (default: "
        + ",".join(DEFAULT_RULES)
        + "); never without "
        + ", ".join(MANDATORY_RULES),
    )
    p.add_argument(
        "--portfolio",
        default="",
        metavar="KEY=V,...",
        help="the portfolio's risk limits over every instrument the run trades, in USD: net_delta_usd "
        "(|sum of position x mid|), gross_usd (sum of |position| x mid), loss_stop_usd (the summed PnL's "
        "stop); each a finite number > 0, unbound when left out. Written into the run's config",
    )


def risk_fields(args: argparse.Namespace, base: RiskLimits | None = None) -> dict[str, RiskLimits]:
    """The config field of the flags: ``{"risk": ...}`` over ``base``, or nothing when neither is given."""
    rules = getattr(args, "risk_rules", "")
    portfolio = getattr(args, "portfolio", "")
    if not rules and not portfolio:
        return {}
    limits = base or RiskLimits()
    if rules:
        limits = replace(limits, rules=rules)
    if portfolio:
        limits = replace(limits, **portfolio_limits(portfolio))
    return {"risk": limits}
