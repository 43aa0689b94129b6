"""Latency models: time in, nanoseconds out. Each model gets its own seeded RNG."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

import numpy as np

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
