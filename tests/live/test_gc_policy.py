"""IdleGC: the cyclic collector off while trading, CPython's thresholds applied where the runner says."""

from __future__ import annotations

import gc

from live.gc_policy import IdleGC


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_collects_only_when_due_and_restores_the_collector():
    assert gc.isenabled()
    policy = IdleGC()
    policy.start()
    try:
        assert not gc.isenabled()
        gc.collect()
        policy.collect_if_due()  # nothing allocated since: nothing to do
        assert policy.collections == [0, 0, 0]
        t0 = gc.get_threshold()[0]
        garbage = [_Cycle() for _ in range(t0 + 10)]
        del garbage
        assert gc.get_count()[0] >= t0  # automatic collection is off: the count just grows
        policy.collect_if_due()
        assert sum(policy.collections) == 1 and gc.get_count()[0] < t0
    finally:
        policy.stop()
    assert gc.isenabled()


def test_stop_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        policy = IdleGC()
        policy.start()
        policy.stop()
        assert not gc.isenabled()
    finally:
        gc.enable()
