"""Many latency samples at once, identical to the same number of ``sample_ns`` calls in a row.

The replay knows up front how many Laya labels it will schedule and in which order, so it can draw
their latencies in one go where the model allows it: constant, lognormal and empirical models (and
``ScaledLatency`` around them) draw from their own generator element by element, so a vector draw
returns exactly the sequence of scalar draws (``tests/test_replay_fast.py`` checks it). Any other
model (recorded latencies, anything unknown) answers None and the caller samples one at a time.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from venue.latency import ConstantLatency, EmpiricalLatency, LatencyModel, LognormalLatency, ScaledLatency


def sample_many(model: LatencyModel, ts_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | None:
    """``[model.sample_ns(t) for t in ts_ns]`` as an int64 array (same draws, same order), or None when
    the model cannot be sampled in a batch. Models here ignore ``ts``; only the count matters."""
    n = len(ts_ns)
    kind = type(model)  # exact types: a subclass may sample differently
    if kind is ConstantLatency:
        return np.full(n, model.latency_ns, dtype=np.int64)  # type: ignore[attr-defined]
    if kind is LognormalLatency:
        m: LognormalLatency = model  # type: ignore[assignment]
        # sample_ns: int(round(lognormal(mu, sigma) * 1e6)); rint rounds half to even like round().
        return np.rint(m._rng.lognormal(m.mu, m.sigma, size=n) * 1e6).astype(np.int64)
    if kind is EmpiricalLatency:
        return model.sample_many(n)  # type: ignore[attr-defined]
    if kind is ScaledLatency:
        s: ScaledLatency = model  # type: ignore[assignment]
        inner = sample_many(s.inner, ts_ns)
        return None if inner is None else np.rint(inner * s.factor).astype(np.int64)
    return None
