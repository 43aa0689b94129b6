"""Kev's health told truthfully: a server that never answered is "no answer yet", not "came later",
and a recommended timeout comes only from answers that arrived."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from engine.kev.cassette import Cassette, CassetteEntry
from engine.kev.health import answer_times_ns, run_health


def _events(tmp_path, n: int, late: int, timeouts: int | None = None):
    """A run's Kev files: ``n`` requests, ``timeouts`` of them (all by default) timed out and the rest
    refused by the circuit breaker, ``late`` late replies after them."""
    ev = tmp_path / "events"
    ev.mkdir()
    t = n if timeouts is None else timeouts
    failure = ["timeout"] * t + ["breaker_open"] * (n - t)
    pq.write_table(pa.table({"ok": [False] * n, "failure": failure}), ev / "kev_response.parquet")
    kinds = ["take"] * n + ["late_reply"] * late
    pq.write_table(pa.table({"kind": kinds}), ev / "kev_queue.parquet")
    return ev


def _cassette(*entries: tuple[str, int]) -> Cassette:
    c = Cassette()
    for i, (error, lag) in enumerate(entries):
        c.add(CassetteEntry(key=f"k{i}", raw="" if error else "{}", error=error, lag_ns=lag))
    return c


def test_a_server_that_never_answers_is_no_answer_yet_and_recommends_nothing(tmp_path):
    """Against a port that accepts and never replies, the client's own 5 s timeouts came back as late
    replies: live said "7 answers came later", p50 5004 ms, and recommended --kev-timeout-ms 15800."""
    cas = _cassette(*[("ReadTimeout: the client's own 5 s timeout", 5_004_000_000)] * 7)
    answers = answer_times_ns(cas)
    assert answers == []
    assert answer_times_ns(cas, include_errors=True) == [5_004_000_000] * 7
    h = run_health(_events(tmp_path, 7, 7), 2000, answers, answers_only=True)
    assert (h["timeouts"], h["late_replies"], h["late_answers"]) == (7, 7, 0)
    assert "came later" not in h["warning"] and "recommended" not in h["warning"]
    assert "answer_ms" not in h and "recommended_timeout_ms" not in h
    assert h["warning"] == (
        "Kev: none of 7 requests was answered (7 timed out after 2000 ms with no answer yet, the rest"
        " failed); the engine ran without advice. The server never answered: is it up and serving at"
        " --kev-url? (`dualhub kev bench`)"
    )
    # most requests refused by the circuit breaker (failures, not timeouts): still a warning
    ev = tmp_path / "b"
    ev.mkdir()
    h = run_health(_events(ev, 57, 8, timeouts=8), 2000, [], answers_only=True)
    assert h["warning"].startswith("Kev: none of 57 requests was answered (8 timed out after 2000 ms")


def test_late_answers_are_counted_from_the_answers_and_recommend_a_timeout(tmp_path):
    cas = _cassette(("", 2_500_000_000), ("", 3_000_000_000), ("HTTP 500", 10_000_000_000), ("", 1_000_000_000))
    answers = answer_times_ns(cas)
    assert sorted(answers) == [1_000_000_000, 2_500_000_000, 3_000_000_000]
    h = run_health(_events(tmp_path, 3, 3), 2000, answers, answers_only=True)
    assert h["late_answers"] == 2 and h["recommended_timeout_ms"] == 4500  # p99 ~2.99 s x 1.5
    assert "(2 answers came later and were discarded) (1 with no answer yet)" in h["warning"]
    assert "recommended --kev-timeout-ms 4500" in h["warning"]
    # a replay's lag draws are all answers: its late replies are late answers
    h = run_health(tmp_path / "events", 2000, [2_500_000_000] * 3)
    assert h["late_answers"] == 3 and "(3 answers came later and were discarded);" in h["warning"]
