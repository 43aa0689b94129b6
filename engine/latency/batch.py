"""Many latency samples at once, identical to the same number of ``sample_ns`` calls in a row.

The replay knows up front how many Laya labels it will schedule and in which order, so it can draw
their latencies in one go where the model allows it: constant, lognormal and empirical models (and
``ScaledLatency`` around them) draw from their own generator element by element, so a vector draw
returns exactly the sequence of scalar draws (``tests/replay/test_replay_fast.py`` checks it). Any other
model (recorded latencies, anything unknown) answers None and the caller samples one at a time.

A recorded model answers by key (the time passed to ``sample_ns``), which only the draw knows:
:func:`recorded_table` hands its table over whole, for a loop that looks each draw up as
:class:`engine.latency.recorded.RecordedLatency` does.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from engine.latency.models import (
    ConstantLatency,
    EmpiricalLatency,
    LatencyModel,
    LognormalLatency,
    ScaledLatency,
)
from engine.latency.recorded import RecordedLatency


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


def sample_each(model: LatencyModel, ts_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``[model.sample_ns(t) for t in ts_ns]`` as an int64 array: :func:`sample_many` where the model
    allows it, else one call per time, in order (a recorded model answers by the time)."""
    drawn = sample_many(model, ts_ns)
    if drawn is None:
        sample = model.sample_ns
        drawn = np.fromiter((sample(t) for t in ts_ns.tolist()), np.int64, len(ts_ns))
    return drawn


class RecordedTable(NamedTuple):
    """What a recorded model has left to answer: ``keys`` ascending, ``counts[i]`` durations for
    ``keys[i]``, ``dur_ns`` grouped by key (each key's in the order ``sample_ns`` hands them out) and
    ``fallback_ns`` for any other key, every value as the model answers it (scaled included)."""

    keys: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    dur_ns: npt.NDArray[np.int64]
    fallback_ns: int


def recorded_table(model: LatencyModel) -> RecordedTable | None:
    """The table of a :class:`RecordedLatency` (or a ``ScaledLatency`` around one), None for any other
    model. Looking a key up in it gives ``model.sample_ns(key)``, call after call."""
    kind = type(model)
    if kind is ScaledLatency:
        s: ScaledLatency = model  # type: ignore[assignment]
        t = recorded_table(s.inner)
        if t is None:
            return None
        # ScaledLatency.sample_ns: int(round(inner * factor)); rint rounds half to even like round().
        scaled = np.rint(np.append(t.dur_ns, t.fallback_ns) * s.factor).astype(np.int64)
        return t._replace(dur_ns=scaled[:-1], fallback_ns=int(scaled[-1]))
    if kind is not RecordedLatency:
        return None
    r: RecordedLatency = model  # type: ignore[assignment]
    by_ts = {t: q for t, q in r._by_ts.items() if q}
    keys = np.array(sorted(by_ts), dtype=np.int64)
    counts = np.array([len(by_ts[t]) for t in keys.tolist()], dtype=np.int64)
    dur = np.array([d for t in keys.tolist() for d in by_ts[t]], dtype=np.int64)
    return RecordedTable(keys, counts, dur, r.fallback_ns)
