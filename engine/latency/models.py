"""Latency models: time in, nanoseconds out. Each model gets its own seeded RNG."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from engine.events import Nanos

_Z95 = NormalDist().inv_cdf(0.95)


class LatencyModel(Protocol):
    def sample_ns(self, ts_ns: Nanos) -> Nanos: ...


@dataclass(frozen=True, slots=True)
class ConstantLatency:
    latency_ns: Nanos

    def __post_init__(self) -> None:
        if self.latency_ns < 0:
            raise ValueError(f"latency must be >= 0, got {self.latency_ns} ns")

    def sample_ns(self, ts_ns: Nanos) -> Nanos:
        return self.latency_ns


class LognormalLatency:
    """Lognormal latency pinned by two percentiles: p5 and p95 in milliseconds.

    With ``p5_ms=200`` and ``p95_ms=350`` (Kev's default) the median is sqrt(200*350) = 264.6 ms.
    """

    def __init__(self, *, p5_ms: float, p95_ms: float, rng: np.random.Generator) -> None:
        if not 0 < p5_ms < p95_ms:
            raise ValueError(f"need 0 < p5_ms < p95_ms, got {p5_ms}, {p95_ms}")
        self.p5_ms, self.p95_ms = p5_ms, p95_ms
        self.mu = (math.log(p5_ms) + math.log(p95_ms)) / 2.0
        self.sigma = (math.log(p95_ms) - math.log(p5_ms)) / (2.0 * _Z95)
        self._rng = rng

    def sample_ns(self, ts_ns: Nanos) -> Nanos:
        return int(round(self._rng.lognormal(self.mu, self.sigma) * 1e6))


def _as_ns_array(values: npt.ArrayLike, name: str) -> npt.NDArray[np.float64]:
    a = np.asarray(values, dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError(f"{name}: no samples")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: non-finite samples")
    return a


class EmpiricalLatency:
    """A latency distribution given by recorded samples (or a quantile grid); sampling is inverse-CDF
    with linear interpolation between order statistics, driven by the ``rng`` passed in. Never negative.

    Implements :class:`engine.latency.models.LatencyModel` (:meth:`sample_ns`), so the replay's Kev backend
    can use it in place of the lognormal default.
    """

    def __init__(self, samples_ns: npt.ArrayLike, *, rng: np.random.Generator) -> None:
        a = _as_ns_array(samples_ns, "samples_ns")
        if np.any(a < 0):
            raise ValueError(f"samples_ns: negative lag {a.min()}")
        self._sorted = np.sort(a)
        self._q = np.linspace(0.0, 1.0, self._sorted.size) if self._sorted.size > 1 else np.zeros(1)
        self._rng = rng

    @classmethod
    def from_fit(
        cls, fit: Mapping[str, Any], *, rng: np.random.Generator, component: str = "service_ns"
    ) -> EmpiricalLatency:
        """From :func:`fit_lag`'s output (or ``dualhub kev fit-lag``'s JSON, which nests it under ``fit``)."""
        body = fit.get("fit", fit)
        try:
            grid = body[component]["quantiles_ns"]
        except (KeyError, TypeError):
            raise ValueError(f"no {component}.quantiles_ns in the lag fit") from None
        return cls(grid, rng=rng)

    @property
    def n(self) -> int:
        return int(self._sorted.size)

    def quantile(self, q: float) -> Nanos:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q={q} outside [0, 1]")
        if self._sorted.size == 1:
            return int(round(float(self._sorted[0])))
        return int(round(float(np.interp(q, self._q, self._sorted))))

    def sample(self) -> Nanos:
        return self.quantile(float(self._rng.random()))

    def sample_many(self, n: int) -> npt.NDArray[np.int64]:
        """``n`` samples at once; the same values as ``n`` calls of :meth:`sample` on the same rng."""
        u = self._rng.random(n)
        if self._sorted.size == 1:
            return np.full(n, int(round(float(self._sorted[0]))), dtype=np.int64)
        return np.rint(np.interp(u, self._q, self._sorted)).astype(np.int64)

    def sample_ns(self, ts_ns: Nanos) -> Nanos:
        """:class:`LatencyModel`: the lag of an answer to a request picked up at ``ts_ns``."""
        return self.sample()


class ScaledLatency:
    """Another model's latency times ``factor``: the what-if knob (``--scale-latency kev=2``)."""

    def __init__(self, inner: LatencyModel, factor: float) -> None:
        if not (factor >= 0 and math.isfinite(factor)):
            raise ValueError(f"latency scale must be a finite number >= 0, got {factor}")
        self.inner, self.factor = inner, factor

    def sample_ns(self, ts_ns: Nanos) -> Nanos:
        return int(round(self.inner.sample_ns(ts_ns) * self.factor))
