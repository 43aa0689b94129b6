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


def answer_times_ns(cassette: Cassette) -> list[int]:
    """Every answer's recorded lag, late ones included, but not a request the run's stop cut off
    (live mode records it as ``no answer: ...``: it never answered)."""
    return [e.lag_ns for es in cassette.entries.values() for e in es if not e.error.startswith("no answer")]


def run_health(events_dir: Path, timeout_ms: int, answers_ns: npt.ArrayLike = ()) -> dict[str, Any]:
    """Kev's outcome in a written event log: requests, answers in time, timeouts (the engine's and the
    client's), late answers, and ``warning`` ("" unless most requests timed out). ``answers_ns``: every
    answer's measured time where the run knows them (late ones included), for a recommended timeout."""
    resp = pq.read_table(events_dir / "kev_response.parquet", columns=["ok", "failure"])
    queue = pq.read_table(events_dir / "kev_queue.parquet", columns=["kind"])
    requests = resp.num_rows
    timeouts = int(pc.sum(pc.equal(resp.column("failure"), "timeout")).as_py() or 0)
    late = int(pc.sum(pc.equal(queue.column("kind"), "late_reply")).as_py() or 0)
    answers = np.asarray(answers_ns, dtype=np.int64)
    out: dict[str, Any] = {
        "requests": requests,
        "answered": int(pc.sum(resp.column("ok")).as_py() or 0),
        "timeouts": timeouts,
        "late_replies": late,
        "timeout_ms": int(timeout_ms),
    }
    if answers.size:
        out["answer_ms"] = {f"p{p}": round(float(np.percentile(answers, p)) / 1e6, 1) for p in (50, 99)}
        out["recommended_timeout_ms"] = recommend_timeout_ms(answers)
    out["warning"] = _warning(out) if requests and 2 * timeouts > requests else ""
    return out


def _warning(h: dict[str, Any]) -> str:
    text = (
        f"Kev: {h['timeouts']} of {h['requests']} requests timed out after {h['timeout_ms']} ms"
        f" ({h['late_replies']} answers came later and were discarded); the engine ran without advice"
    )
    if "answer_ms" in h:
        a = h["answer_ms"]
        text += (
            f". Measured answer times p50 {a['p50']:.0f} ms, p99 {a['p99']:.0f} ms: "
            f"recommended --kev-timeout-ms {h['recommended_timeout_ms']}"
        )
    else:
        text += ". Raise --kev-timeout-ms above the server's latency (`dualhub kev bench` recommends one)"
    return text
