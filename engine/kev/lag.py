"""Kev lag from measurement: an empirical distribution fitted from recorded responses.

The engine logs, per Kev request, ``kev_request.queue_wait_ns`` (label to pick-up: time in the Kev
queue) and ``kev_response.lag_ns`` (pick-up to answer: the service time of the model server, see
``engine/core.py``). :func:`fit_lag` keeps the two apart and also reports their sum, the total
label-to-answer delay. Replay simulates the queue itself, so it samples only the service time, from
:class:`EmpiricalLag` (a :class:`engine.latency.LatencyModel`).

Recordings whose ``lag_ns`` already includes the queue wait are fitted with
``lag_includes_queue=True`` (service = lag - queue wait).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from engine.events import Nanos

# The fitted distribution is stored as this many evenly spaced quantiles (q = 0, 0.01, ..., 1).
QUANTILE_POINTS: Final = 101
PERCENTILES: Final = (50, 90, 95, 99)


def _as_ns_array(values: npt.ArrayLike, name: str) -> npt.NDArray[np.float64]:
    a = np.asarray(values, dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError(f"{name}: no samples")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: non-finite samples")
    return a


def summarize_ns(values: npt.ArrayLike) -> dict[str, Any]:
    """n, min, mean, p50/p90/p95/p99, max (int ns) and the quantile grid ``quantiles_ns``."""
    a = _as_ns_array(values, "values")
    grid = np.quantile(a, np.linspace(0.0, 1.0, QUANTILE_POINTS), method="linear")
    out: dict[str, Any] = {"n": int(a.size), "min": int(a.min()), "mean": int(round(float(a.mean())))}
    for p in PERCENTILES:
        out[f"p{p}"] = int(round(float(np.percentile(a, p, method="linear"))))
    out["max"] = int(a.max())
    out["quantiles_ns"] = [int(round(float(v))) for v in grid]
    return out


class EmpiricalLag:
    """A lag distribution given by samples (or a quantile grid); sampling is inverse-CDF with linear
    interpolation between order statistics, driven by the ``rng`` passed in. Never negative.

    Implements :class:`engine.latency.LatencyModel` (:meth:`sample_ns`), so the replay's Kev backend
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
    ) -> EmpiricalLag:
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
        """:class:`engine.latency.LatencyModel`: the lag of an answer to a request picked up at ``ts_ns``."""
        return self.sample()


def fit_lag(
    lag_ns: npt.ArrayLike, queue_wait_ns: npt.ArrayLike, *, lag_includes_queue: bool = False
) -> dict[str, Any]:
    """Separate queueing from service time, per response.

    By default ``lag_ns`` is measured from pick-up (the engine's convention), so service = lag and the
    total delay = queue wait + lag; with ``lag_includes_queue`` service = lag - queue wait and the
    total = lag. Returns summaries (n, min, mean, p50/p90/p95/p99, max, 101-point quantile grid; all
    ns) of ``service_ns``, ``queue_wait_ns`` and ``total_ns``, the share of the total spent queueing,
    and how many rows had a queue wait longer than their lag (only possible with
    ``lag_includes_queue``; clipped to a service time of 0, a recording inconsistency).
    """
    lag = _as_ns_array(lag_ns, "lag_ns")
    wait = _as_ns_array(queue_wait_ns, "queue_wait_ns")
    if lag.shape != wait.shape:
        raise ValueError(f"lag_ns has {lag.size} rows, queue_wait_ns {wait.size}")
    if np.any(lag < 0) or np.any(wait < 0):
        raise ValueError("negative lag or queue wait")
    if lag_includes_queue:
        raw_service = lag - wait
        total = lag
    else:
        raw_service = lag
        total = lag + wait
    negative = int(np.count_nonzero(raw_service < 0))
    service = np.clip(raw_service, 0.0, None)
    total_sum = float(total.sum())
    return {
        "n": int(lag.size),
        "lag_includes_queue": lag_includes_queue,
        "service_ns": summarize_ns(service),
        "queue_wait_ns": summarize_ns(wait),
        "total_ns": summarize_ns(total),
        "queue_share": float(wait.sum() / total_sum) if total_sum > 0 else 0.0,
        "negative_service": negative,
    }
