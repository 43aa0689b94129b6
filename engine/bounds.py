"""Range checks for the numbers a user gives (CLI options, configs, sweep grids).

Each failure is one DualhubError naming the setting, raised before any work. Without them a bad
value fails deep in a run as a numpy, numba or int64 error with a traceback (a negative seed in
``default_rng``, an infinite timeout turned into nanoseconds) or, worse, is accepted silently (a
negative request interval, a NaN duration).
"""

from __future__ import annotations

import math
import numbers

from engine.errors import DualhubError

SEED_MAX = 2**63 - 1  # numpy takes any non-negative seed; the manifests and their int64 columns don't
MS_MAX = 10**12  # ~31 years: a setting in ms converted to ns still fits an int64
S_MAX = MS_MAX / 1000
COUNT_MAX = 2**31 - 1


def check_seed(value: object, name: str = "seed") -> None:
    if not _integer(value) or not 0 <= value <= SEED_MAX:  # type: ignore[operator]
        raise DualhubError(f"{name} must be an integer from 0 to 2**63 - 1, got {value!r}")


def check_count(value: object, name: str, low: int = 1, high: int = COUNT_MAX) -> None:
    if not _integer(value) or not low <= value <= high:  # type: ignore[operator]
        raise DualhubError(f"{name} must be an integer from {low} to {high}, got {value!r}")


def check_ms(value: object, name: str, *, zero: bool = False) -> None:
    """A duration in milliseconds: finite, > 0 (>= 0 with ``zero``), at most :data:`MS_MAX`."""
    _check_span(value, name, zero, MS_MAX, "ms")


def check_seconds(value: object, name: str, *, zero: bool = False) -> None:
    """A duration in seconds: finite, > 0 (>= 0 with ``zero``), at most :data:`S_MAX`."""
    _check_span(value, name, zero, S_MAX, "s")


def _check_span(value: object, name: str, zero: bool, high: float, unit: str) -> None:
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= 0 if zero else value > 0)
        and value <= high
    )
    if not ok:
        low = ">= 0" if zero else "> 0"
        raise DualhubError(f"{name} must be a finite number {low} and at most {high:g} {unit}, got {value!r}")


def _integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
