"""Batch draws of latency models: the same values, in the same order, as one ``sample_ns`` call at a time."""

import numpy as np
import pytest

from engine.latency.batch import sample_many
from engine.latency.models import ConstantLatency, EmpiricalLatency, ScaledLatency
from engine.latency.spec import parse_latency


@pytest.mark.parametrize(
    "spec", ["const:200us", "lognormal:p5=100us,p95=2ms", "lognormal:p5=1ms,p95=3ms", "scaled"]
)
def test_batch_latency_draws_equal_one_at_a_time(spec):
    def model(seed: int):
        rng = np.random.default_rng([seed, 3])
        if spec == "scaled":
            return ScaledLatency(parse_latency("lognormal:p5=100us,p95=2ms", rng), 2.5)
        return parse_latency(spec, rng)

    ts = np.arange(5_000, dtype=np.int64)
    one = model(7)
    one_by_one = [one.sample_ns(int(t)) for t in ts]
    assert sample_many(model(7), ts).tolist() == one_by_one


def test_batch_latency_empirical_and_unknown_models():
    a = EmpiricalLatency([1_000, 5_000, 90_000], rng=np.random.default_rng(1))
    b = EmpiricalLatency([1_000, 5_000, 90_000], rng=np.random.default_rng(1))
    ts = np.zeros(500, dtype=np.int64)
    assert sample_many(a, ts).tolist() == [b.sample_ns(0) for _ in ts]
    assert sample_many(ConstantLatency(5), ts[:3]).tolist() == [5, 5, 5]

    class Recorded:  # any other model (recorded latencies) is sampled one at a time by the engine
        def sample_ns(self, ts_ns: int) -> int:
            return 1

    assert sample_many(Recorded(), ts) is None
