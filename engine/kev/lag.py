"""Kev lag from measurement: an empirical distribution fitted from recorded responses.

The engine logs, per Kev request, ``kev_request.queue_wait_ns`` (label to pick-up: time in the Kev
queue) and ``kev_response.lag_ns`` (pick-up to answer: the service time of the model server, see
``engine/core.py``). :func:`fit_lag` keeps the two apart and also reports their sum, the total
label-to-answer delay. Replay simulates the queue itself, so it samples only the service time, from
:class:`EmpiricalLag` (a :class:`engine.latency.models.LatencyModel`).

Recordings whose ``lag_ns`` already includes the queue wait are fitted with
``lag_includes_queue=True`` (service = lag - queue wait).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

from engine.latency.models import EmpiricalLatency, _as_ns_array

# The Kev lag model is the generic empirical latency model; the old name stays for callers.
EmpiricalLag = EmpiricalLatency

# The fitted distribution is stored as this many evenly spaced quantiles (q = 0, 0.01, ..., 1).
QUANTILE_POINTS: Final = 101
PERCENTILES: Final = (50, 90, 95, 99)


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
