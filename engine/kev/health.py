"""Is Kev keeping up? Timeouts and late answers of a run, and a timeout recommended from measured latency.

The engine gives up on a Kev request after its timeout (``--kev-timeout-ms``); an answer after that is
discarded (a ``late_reply`` note). A timeout below the model server's latency discards every answer
while the run looks healthy, so replay and live end with :func:`run_health` in the run manifest and
its ``warning`` on the console when most requests timed out. :func:`recommend_timeout_ms` is the one
rule ``dualhub kev bench``, ``dualhub doctor`` and that warning share.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.kev.cassette import Cassette

# p99 of the measured answer times x this, rounded up to the step: room for the slow tail without
# waiting on a server that has really stalled.
RECOMMEND_FACTOR: Final = 1.5
RECOMMEND_STEP_MS: Final = 100


def recommend_timeout_ms(latencies_ns: npt.ArrayLike) -> int | None:
    """``--kev-timeout-ms`` for these measured answer times (ns): p99 x 1.5, rounded up to 100 ms; None
    without any."""
    a = np.asarray(latencies_ns, dtype=np.float64)
    if a.size == 0:
        return None
    ms = float(np.percentile(a, 99)) * RECOMMEND_FACTOR / 1e6
    return max(RECOMMEND_STEP_MS, math.ceil(ms / RECOMMEND_STEP_MS) * RECOMMEND_STEP_MS)


def answer_times_ns(cassette: Cassette, *, include_errors: bool = False) -> list[int]:
    """Every answer's recorded lag, late ones included; not an error reply (a client's own timeout, a
    refused connection: the server gave no answer) unless ``include_errors``, and never a request the
    run's stop cut off (live mode records it as ``no answer: ...``: it never answered)."""
    return [
        e.lag_ns
        for es in cassette.entries.values()
        for e in es
        if not e.error.startswith("no answer") and (include_errors or not e.error)
    ]


def run_health(
    events_dir: Path, timeout_ms: int, answers_ns: npt.ArrayLike = (), *, answers_only: bool = False
) -> dict[str, Any]:
    """Kev's outcome in a written event log: requests, answers in time, timeouts (the engine's and the
    client's), late replies, and ``warning`` ("" unless most requests timed out). ``answers_ns``: every
    answer's measured time where the run knows them (late ones included), for a recommended timeout;
    ``answers_only``: they are the server's answers alone (errors left out: live mode's cassette), so
    the late replies that were answers are counted from them and the rest said to be no answer."""
    resp = pq.read_table(events_dir / "kev_response.parquet", columns=["ok", "failure"])
    queue = pq.read_table(events_dir / "kev_queue.parquet", columns=["kind"])
    requests = resp.num_rows
    timeouts = int(pc.sum(pc.equal(resp.column("failure"), "timeout")).as_py() or 0)
    late = int(pc.sum(pc.equal(queue.column("kind"), "late_reply")).as_py() or 0)
    answers = np.asarray(answers_ns, dtype=np.int64)
    late_answers = int(np.count_nonzero(answers > int(timeout_ms) * 1_000_000)) if answers_only else late
    out: dict[str, Any] = {
        "requests": requests,
        "answered": int(pc.sum(resp.column("ok")).as_py() or 0),
        "timeouts": timeouts,
        "late_replies": late,
        "late_answers": min(late_answers, timeouts),
        "timeout_ms": int(timeout_ms),
    }
    if answers.size:
        out["answer_ms"] = {f"p{p}": round(float(np.percentile(answers, p)) / 1e6, 1) for p in (50, 99)}
        out["recommended_timeout_ms"] = recommend_timeout_ms(answers)
    never = out["answered"] == 0 and out["late_answers"] == 0 and "answer_ms" not in out
    out["warning"] = _warning(out) if requests and (2 * timeouts > requests or never) else ""
    return out


def _warning(h: dict[str, Any]) -> str:
    if h["answered"] == 0 and h["late_answers"] == 0 and "answer_ms" not in h:
        return (
            f"Kev: none of {h['requests']} requests was answered ({h['timeouts']} timed out after"
            f" {h['timeout_ms']} ms with no answer yet, the rest failed); the engine ran without advice."
            " The server never answered: is it up and serving at --kev-url? (`dualhub kev bench`)"
        )
    text = f"Kev: {h['timeouts']} of {h['requests']} requests timed out after {h['timeout_ms']} ms"
    if h["late_answers"]:
        text += f" ({h['late_answers']} answers came later and were discarded)"
    if h["late_answers"] < h["timeouts"]:
        text += f" ({h['timeouts'] - h['late_answers']} with no answer yet)"
    text += "; the engine ran without advice"
    if "answer_ms" in h:
        a = h["answer_ms"]
        text += (
            f". Measured answer times p50 {a['p50']:.0f} ms, p99 {a['p99']:.0f} ms: "
            f"recommended --kev-timeout-ms {h['recommended_timeout_ms']}"
        )
    else:
        text += ". Raise --kev-timeout-ms above the server's latency (`dualhub kev bench` recommends one)"
    return text
