"""Range checks for the numbers a user gives (CLI options, configs, sweep grids).

Each failure is one DualhubError naming the setting, raised before any work. Without them a bad
value fails deep in a run as a numpy, numba or int64 error with a traceback (a negative seed in
``default_rng``, an infinite timeout turned into nanoseconds) or, worse, is accepted silently (a
negative request interval, a NaN duration).
"""

from __future__ import annotations

import argparse
import math
import numbers
from typing import Any

from engine.errors import DualhubError

SEED_MAX = 2**63 - 1  # numpy takes any non-negative seed; the manifests and their int64 columns don't
MS_MAX = 10**12  # ~31 years: a setting in ms converted to ns still fits an int64
S_MAX = MS_MAX / 1000
COUNT_MAX = 2**31 - 1
LEG_HEDGES = ("cross", "reprice")  # how a lagging leg of a hub's command is hedged (engine/legs.py)


def check_seed(value: object, name: str = "seed") -> None:
    if not _integer(value) or not 0 <= value <= SEED_MAX:  # type: ignore[operator]
        raise DualhubError(f"{name} must be an integer from 0 to 2**63 - 1, got {value!r}")


def check_count(value: object, name: str, low: int = 1, high: int = COUNT_MAX) -> None:
    if not _integer(value) or not low <= value <= high:  # type: ignore[operator]
        raise DualhubError(f"{name} must be an integer from {low} to {high}, got {value!r}")


def check_ms(value: object, name: str, *, zero: bool = False) -> None:
    """A duration in milliseconds: finite, > 0 (>= 0 with ``zero``), at most :data:`MS_MAX`."""
    check_number(value, name, zero=zero, high=MS_MAX, unit=" ms")


def check_seconds(value: object, name: str, *, zero: bool = False) -> None:
    """A duration in seconds: finite, > 0 (>= 0 with ``zero``), at most :data:`S_MAX`."""
    check_number(value, name, zero=zero, high=S_MAX, unit=" s")


def check_number(
    value: object, name: str, *, zero: bool = False, high: float = math.inf, unit: str = ""
) -> None:
    """A finite number > 0 (>= 0 with ``zero``), at most ``high``."""
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= 0 if zero else value > 0)
        and value <= high
    )
    if not ok:
        bound = ">= 0" if zero else "> 0"
        if high < math.inf:
            bound += f" and at most {high:g}{unit}"
        raise DualhubError(f"{name} must be a finite number {bound}, got {value!r}")


def check_port(value: object, name: str = "--port", *, high: int = 65535) -> None:
    """A TCP port to listen on (0: any free one)."""
    check_count(value, name, low=0, high=high)


def check_engine_settings(cfg: Any) -> None:
    """What a replay's and a live run's configs share: the seed, Kev's queue and timers, the pairs'
    half-life, a hub command's leg timeout and how a lagging leg is hedged (``ReplayConfig`` and
    ``LiveConfig`` name them alike)."""
    check_seed(cfg.seed)
    for name in ("kev_timeout_ms", "kev_stale_after_ms", "kev_advice_ttl_ms", "pair_half_life_ms", "leg_timeout_ms"):
        check_ms(getattr(cfg, name), name)
    if cfg.leg_hedge not in LEG_HEDGES:
        raise DualhubError(f"leg_hedge must be one of {', '.join(LEG_HEDGES)}, got {cfg.leg_hedge!r}")
    check_ms(cfg.kev_min_interval_ms, "kev_min_interval_ms", zero=True)
    check_count(cfg.kev_queue_max, "kev_queue_max")
    check_count(cfg.kev_max_in_flight, "kev_max_in_flight")


def _integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def add_leg_args(p: argparse.ArgumentParser) -> None:
    """``--leg-timeout-ms`` and ``--leg-hedge`` (``dualhub replay`` and ``dualhub live``; sweep grids:
    ``leg_timeout_ms``, ``leg_hedge``)."""
    p.add_argument(
        "--leg-timeout-ms",
        type=int,
        help="with --kev-hub: a leg of a hub command that has not filled this long after another leg did "
        "is hedged (default 1000)",
    )
    p.add_argument(
        "--leg-hedge",
        choices=LEG_HEDGES,
        help="how a lagging leg is hedged: cross (a market order, the default) or reprice (a limit order "
        "at the far touch, sent again at each timeout)",
    )


def leg_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields ``add_leg_args`` flags set (none given: the config's defaults), validated."""
    out: dict[str, Any] = {}
    if getattr(args, "leg_timeout_ms", None) is not None:
        check_ms(args.leg_timeout_ms, "--leg-timeout-ms")
        out["leg_timeout_ms"] = args.leg_timeout_ms
    if getattr(args, "leg_hedge", None) is not None:
        out["leg_hedge"] = args.leg_hedge
    return out
