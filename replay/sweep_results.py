"""A sweep's results: the rows as a typed Parquet table (a column per parameter), the notes a sweep
prints under them (the loss stop, the market cache) and the ranking by a metric (``--best``,
``--keep-logs best:K``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import DualhubError
from replay.run_metrics import LATENCY_SPANS
from replay.sweep_grid import PARAM_PREFIX
from replay.sweep_run import RESULT_SCHEMA

# ---------------------------------------------------------------------------------------------------
# results table


def _column_type(values: Sequence[Any]) -> pa.DataType:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.bool_()
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.int64()
    if present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return pa.float64()
    return pa.string()


def _cell(v: Any, typ: pa.DataType) -> Any:
    if v is None or typ != pa.string() or isinstance(v, str):
        return float(v) if typ == pa.float64() and v is not None else v
    return orjson.dumps(v, default=str).decode()


def results_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Fixed columns (:data:`RESULT_SCHEMA`) plus one typed column per parameter (``p_...``)."""
    pcols = sorted({k for r in rows for k in r if k.startswith(PARAM_PREFIX)})
    fields = list(RESULT_SCHEMA)
    pos = RESULT_SCHEMA.get_field_index("params") + 1
    arrays = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in fields}
    for c in pcols:
        values = [r.get(c) for r in rows]
        typ = _column_type(values)
        arrays[c] = pa.array([_cell(v, typ) for v in values], typ)
    names = [f.name for f in fields[:pos]] + pcols + [f.name for f in fields[pos:]]
    return pa.table({n: arrays[n] for n in names})


def read_results(path: Path) -> list[dict[str, Any]]:
    try:
        return pq.read_table(path).to_pylist()
    except (OSError, pa.ArrowInvalid) as e:
        raise DualhubError(f"cannot read results {path}: {e}") from None


LOSS_STOP_DOMINATES: Final = 0.5  # stopped with more than half the run left, in at least half the runs


def loss_stop_note(rows: Sequence[Mapping[str, Any]]) -> str:
    """A line on how the loss stop shaped the sweep ("" when it never hit): a comparison where most runs
    stopped in their first half compares where the stop hit, not the parameters."""
    done = [r for r in rows if not r.get("error")]
    fracs = [r["loss_stop_at_frac"] for r in done if r.get("loss_stop_at_frac") is not None]
    if not fracs:
        return ""
    early = sum(f > LOSS_STOP_DOMINATES for f in fracs)
    line = (
        f"loss stop hit in {len(fracs)} of {len(done)} runs, {early} of them in their first half "
        f"(median {100 * sorted(fracs)[len(fracs) // 2]:.0f}% of the run after the stop)"
    )
    if early >= LOSS_STOP_DOMINATES * len(done):
        line += (
            "; THE LOSS STOP DOMINATED: these runs compare where the stop hit, not the parameters "
            "(raise risk.daily_loss_stop_usd to compare them whole)"
        )
    return line


def cache_note(states: Iterable[str]) -> str:
    """How the runs used the market cache ("" when none asked for it): built and reused counts."""
    states = [s for s in states if s]
    if not states:
        return ""
    built, reused = states.count("built"), states.count("reused")
    line = f"market cache: {built} built, {reused} reused"
    return line + (f", {len(states) - built - reused} without it" if len(states) > built + reused else "")


LOWER_IS_BETTER: Final = frozenset(
    {
        "risk_rejections",
        "kev_drops",
        "wall_s",
        "peak_rss_mb",
        *(f"{s}_p{q}_ms" for s in LATENCY_SPANS for q in (50, 99)),
    }
)
DEFAULT_RANK: Final = "sharpe"


def check_metric(name: str) -> None:
    numeric = {f.name for f in RESULT_SCHEMA if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)}
    numeric |= {f.name for f in RESULT_SCHEMA if pa.types.is_decimal(f.type)}
    if name not in numeric:
        raise DualhubError(f"unknown metric {name!r}; e.g. sharpe, pnl_usdt, max_drawdown_usdt, fills")


def _rank_value(row: Mapping[str, Any], metric: str) -> float:
    v = row.get(metric)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return -math.inf
    return -float(v) if metric in LOWER_IS_BETTER else float(v)


def best_rows(rows: Sequence[Mapping[str, Any]], metric: str, k: int) -> list[Mapping[str, Any]]:
    """The ``k`` finished runs best by ``metric`` (highest first; lowest for :data:`LOWER_IS_BETTER`)."""
    done = [r for r in rows if not r.get("error")]
    return sorted(done, key=lambda r: (-_rank_value(r, metric), r["param_hash"]))[:k]


def best_table(rows: Sequence[Mapping[str, Any]], metric: str, n: int = 10) -> tuple[list[str], list[tuple]]:
    """``--best METRIC``: the swept parameter sets (seeds and sessions pooled) by their mean ``metric``,
    best first, with its spread over the pooled runs and the other headline metrics' means."""
    check_metric(metric)
    done = [r for r in rows if not r.get("error")]
    swept_cols = sorted(
        c
        for c in {k for r in done for k in r if k.startswith(PARAM_PREFIX) and k != "p_seed"}
        if len({repr(r.get(c)) for r in done}) > 1
    )
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in done:
        groups.setdefault(tuple(repr(r.get(c)) for c in swept_cols), []).append(r)
    shown = [m for m in ("pnl_usdt", "sharpe", "max_drawdown_usdt", "fills") if m != metric]

    def mean(rs: Sequence[Mapping[str, Any]], m: str) -> float | None:
        vals = [float(r[m]) for r in rs if r.get(m) is not None]
        return sum(vals) / len(vals) if vals else None

    table = []
    for rs in groups.values():
        vals = [float(r[metric]) for r in rs if r.get(metric) is not None]
        mu = sum(vals) / len(vals) if vals else None
        sd = (
            math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1))
            if mu is not None and len(vals) > 1
            else None
        )
        table.append((rs, mu, sd))
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    table.sort(key=lambda t: (t[1] is None, -sign * (t[1] or 0.0)))
    columns = ["rank", *(c[len(PARAM_PREFIX) :] for c in swept_cols), "runs", metric, "sd", *shown]
    out = []
    for i, (rs, mu, sd) in enumerate(table[:n]):
        out.append(
            (
                i + 1,
                *(rs[0].get(c) for c in swept_cols),
                len(rs),
                _fmt(mu),
                _fmt(sd),
                *(_fmt(mean(rs, m)) for m in shown),
            )
        )
    return columns, out


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"
