"""Latency specs: the strings that name a latency model (``const:5ms``, ``lognormal:p5=2ms,p95=8ms``,
``empirical:PATH``, ``recorded:KIND@RUN_DIR``) and durations (``5ms``), for the replay's and live mode's
settings. Apart from the models (:mod:`engine.latency.models`) so that the recorded models
(:mod:`engine.latency.recorded`), which are models too, sit between the two without an import loop."""

from __future__ import annotations

import math

import numpy as np

from engine.events import Nanos
from engine.latency.models import ConstantLatency, EmpiricalLatency, LatencyModel, LognormalLatency

_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def parse_duration_ns(text: str) -> Nanos:
    """``"5ms"``, ``"200us"``, ``"1.5s"``, ``"700ns"`` -> integer nanoseconds."""
    t = text.strip()
    for unit in ("ns", "us", "ms", "s"):
        if t.endswith(unit):
            try:
                v = float(t[: -len(unit)])
            except ValueError:
                break
            if v < 0 or not math.isfinite(v):
                break
            return int(round(v * _UNITS[unit]))
    raise ValueError(f"bad duration {text!r}: use a number with ns, us, ms or s (e.g. 5ms)")


def parse_latency(spec: str, rng: np.random.Generator) -> LatencyModel:
    """A latency model from a spec string.

    - ``const:5ms``
    - ``lognormal:p5=2ms,p95=8ms``
    - ``empirical:PATH`` (a JSON list of samples in ns, or a fit with ``quantiles_ns``)
    - ``recorded:KIND@RUN_DIR`` (the delays a live run observed, replayed by key in order of occurrence;
      KIND is laya, order_entry, order_response, cancel or kev: see :mod:`engine.latency.recorded`)
    """
    kind, _, arg = spec.partition(":")
    try:
        if kind == "const":
            return ConstantLatency(parse_duration_ns(arg))
        if kind == "lognormal":
            kv = dict(part.split("=", 1) for part in arg.split(","))
            return LognormalLatency(
                p5_ms=parse_duration_ns(kv["p5"]) / 1e6, p95_ms=parse_duration_ns(kv["p95"]) / 1e6, rng=rng
            )
        if kind == "empirical":
            import orjson

            with open(arg, "rb") as f:
                data = orjson.loads(f.read())
            if isinstance(data, list):
                return EmpiricalLatency(data, rng=rng)
            return EmpiricalLatency.from_fit(data, rng=rng)
        if kind == "recorded":
            from engine.latency.recorded import parse_recorded

            return parse_recorded(arg)
    except (KeyError, ValueError, OSError) as e:
        raise ValueError(f"bad latency spec {spec!r}: {e}") from None
    raise ValueError(f"bad latency spec {spec!r}: kind must be const, lognormal, empirical or recorded")
