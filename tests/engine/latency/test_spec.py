"""Latency spec strings: each kind parses to its model, durations to integer ns, bad specs refused
(and by the replay's settings)."""

import numpy as np
import pytest

from engine.errors import DualhubError
from engine.latency.models import ConstantLatency, EmpiricalLatency, ScaledLatency
from engine.latency.spec import parse_duration_ns, parse_latency
from replay.config import ReplayConfig


def test_latency_specs():
    rng = np.random.default_rng(0)
    assert parse_duration_ns("200us") == 200_000 and parse_duration_ns("1.5s") == 1_500_000_000
    assert parse_latency("const:5ms", rng).sample_ns(0) == 5_000_000
    ln = parse_latency("lognormal:p5=2ms,p95=8ms", rng)
    x = np.array([ln.sample_ns(0) for _ in range(4000)])
    assert 1.8e6 < np.percentile(x, 5) < 2.2e6 and 7.3e6 < np.percentile(x, 95) < 8.7e6
    assert ScaledLatency(ConstantLatency(10), 2.5).sample_ns(0) == 25
    emp = EmpiricalLatency([1, 2, 3, 100], rng=rng)
    assert all(1 <= emp.sample_ns(0) <= 100 for _ in range(100))
    for bad in ("const:-5ms", "const:5", "gauss:1ms", "lognormal:p5=9ms,p95=1ms", "empirical:/nope.json"):
        with pytest.raises(ValueError):
            parse_latency(bad, rng)
    with pytest.raises(DualhubError, match="latency_cancel"):
        ReplayConfig(latency_cancel="fast")
    with pytest.raises(DualhubError, match="scale_kev"):
        ReplayConfig(scale_kev=-1)
