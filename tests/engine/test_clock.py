import pytest

from engine.clock import ClockError, RealtimeClock, ReplayClock


def test_replay_clock_refuses_to_go_back():
    c = ReplayClock(100)
    c.advance_to(150)
    with pytest.raises(ClockError, match="ts_ns=120 < now_ns=150"):
        c.advance_to(120)


def test_timer_in_the_past_is_an_error():
    c = ReplayClock(100)
    with pytest.raises(ClockError):
        c.schedule(99, 0, "late")


def test_timers_fire_in_time_then_priority_then_insertion_order():
    c = ReplayClock(0)
    c.schedule(20, 5, "t20-p5")
    c.schedule(10, 9, "t10-p9-first")
    c.schedule(10, 1, "t10-p1")
    c.schedule(10, 9, "t10-p9-second")
    order = []
    while c.next_key() is not None:
        _, payload = c.pop_next()
        order.append((c.now_ns(), payload))
    assert order == [(10, "t10-p1"), (10, "t10-p9-first"), (10, "t10-p9-second"), (20, "t20-p5")]


def test_pop_due_stops_at_the_bound():
    c = ReplayClock(0)
    for t in (5, 10, 15):
        c.schedule(t, 40, t)
    due = c.pop_due((10, 40, 1 << 62))
    assert [p for _, p in due] == [5, 10]
    assert c.now_ns() == 10
    assert c.pending == 1


def test_replay_clock_never_reads_wall_clock(monkeypatch):
    import time

    def boom(*a, **k):
        raise AssertionError("wall clock read")

    monkeypatch.setattr(time, "time_ns", boom)
    monkeypatch.setattr(time, "time", boom)
    c = ReplayClock(1)
    c.schedule(3, 0, "x")
    c.pop_next()
    assert c.now_ns() == 3


def test_realtime_clock_is_monotonic_and_fires_due_timers(monkeypatch):
    import time

    now = [1_000]
    monkeypatch.setattr(time, "time_ns", lambda: now[0])
    c = RealtimeClock()
    assert c.now_ns() == 1_000
    now[0] = 900  # the wall clock steps back (NTP)
    assert c.now_ns() == 1_000
    c.schedule(1_500, 0, "later")
    assert c.pop_due() == []
    now[0] = 1_600
    assert [p for _, p in c.pop_due()] == ["later"]
