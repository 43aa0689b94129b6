"""What-if sweeps: the same tapes replayed over a grid of configs, one results row per run.

``--scale-latency kev=2,laya=1,order=0.5,feed=1`` (:func:`parse_scale_latency`, :func:`apply_scales`)
multiplies the modelled latencies of one replay. ``dualhub sweep GRID.toml --sessions GLOB`` runs a
grid::

    [base]                      # applied to every run (ReplayConfig fields; dotted names reach into
    seed = 1                    # risk.*, quotes.*, contract.*)
    [grid]                      # axes: the cartesian product, axes sorted by name, values in listed order
    scale_kev = [0.5, 1, 2]
    fill_model = ["touch", "through"]
    "risk.max_position" = [0.02, 0.05]
    scale_latency = ["kev=1", "kev=2,order=0.5"]   # the --scale-latency spec works as a key too
    strategy = ["baseline", "imbalance_lean"]     # --strategy
    "strategy_params.offset_ticks" = [0, 1, 2]    # --strategy-param offset_ticks=N

A strategy parameter is checked against the strategy of every grid point it meets (its name, its
range: ``engine.strategies.registry``) when the grid is read: a wrong one stops the sweep before
anything runs.

Every (session, parameter set) is one call of :func:`run_one`, a top-level function of plain
arguments that returns a plain row dict (no globals, nothing shared between calls), so it can be
shipped to worker processes or Ray tasks unchanged. A run that raises becomes a row with ``error``
set. Rows go to a Parquet table (rewritten atomically after every run, so an interrupted sweep keeps
what it finished); ``--resume`` skips every (session digest, param hash, code version) that already
has a row without an error. Each run's event log lands in ``<results dir>/runs/<key>``.

``dualhub sweep`` runs each call as a Ray task (:mod:`replay.ray_sweep`, docs/SCALE.md); :func:`sweep`
here is the serial path (``--serial``).

The parts live by job: the grid and its parameters in ``replay/sweep_grid.py``, one run and its row in
``replay/sweep_run.py``, the results table, notes and ranking in ``replay/sweep_results.py``; their
public names are read as this module's too.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from engine.errors import DualhubError
from engine.store import atomic_write_parquet, open_session
from replay.sweep_grid import (  # noqa: F401 - read as replay.sweep's too
    PARAM_PREFIX,
    SCALE_KEYS,
    SCALE_LATENCY_KEY,
    STRATEGY_PARAMS,
    Grid,
    apply_scales,
    build_config,
    check_param_name,
    check_points,
    check_strategy_params,
    load_grid,
    param_column,
    param_hash,
    param_json,
    params_config,
    parse_grid,
    parse_scale_latency,
)
from replay.sweep_results import (  # noqa: F401 - read as replay.sweep's too
    DEFAULT_RANK,
    LOSS_STOP_DOMINATES,
    LOWER_IS_BETTER,
    best_rows,
    best_table,
    cache_note,
    check_metric,
    loss_stop_note,
    read_results,
    results_table,
)
from replay.sweep_run import (  # noqa: F401 - read as replay.sweep's too
    CODE_ROOTS,
    LABEL_COLUMNS,
    RESULT_SCHEMA,
    code_sources,
    code_version,
    replay_command,
    run_key,
    run_one,
    run_stats,
)

# ---------------------------------------------------------------------------------------------------
# sweep


def find_sessions(patterns: Iterable[str]) -> list[Path]:
    found: dict[Path, None] = {}
    for pattern in patterns:
        for p in sorted(glob.glob(os.path.expanduser(pattern))):
            if (Path(p) / "manifest.json").is_file():
                found[Path(p)] = None
    if not found:
        raise DualhubError(f"no session directory (with manifest.json) matches {', '.join(patterns)}")
    return list(found)


def _session_digest(session: Path | str) -> str:
    try:
        return open_session(session).digest()
    except DualhubError:
        return ""  # unreadable: its runs fail in run_one and become error rows


@dataclass(frozen=True)
class SweepSummary:
    out: Path | str  # a path, or a filesystem URL (Ray sweeps)
    ran: int
    skipped: int
    failed: int
    rows: int
    notes: tuple[str, ...] = ()  # lines for the user (e.g. :func:`loss_stop_note`)


def parse_keep_logs(spec: str) -> int | None:
    """``--keep-logs``: ``all`` (None: every run), ``best:K`` (K), ``none`` (0)."""
    if spec == "all":
        return None
    if spec == "none":
        return 0
    head, _, k = spec.partition(":")
    if head == "best" and k.isdigit() and int(k) > 0:
        return int(k)
    raise DualhubError(f"--keep-logs {spec!r}: expected all, none or best:K (K >= 1)")


def sweep(
    grid: Grid,
    sessions: Sequence[Path | str],
    out: Path | str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    runner: Callable[..., dict[str, Any]] = run_one,
    keep_logs: str = "none",
    rank_by: str = DEFAULT_RANK,
    market_cache: bool = True,
) -> SweepSummary:
    """Run every (session, grid point) serially in this process; write the results table.

    ``keep_logs``: ``none`` (every run keeps its digest and summary row only), ``all`` (every run writes
    its event log), ``best:K`` (the K best runs by ``rank_by`` are replayed again with their logs
    written, once the sweep is done: the same digest, or the row says it was not)."""
    keep_k = parse_keep_logs(keep_logs)
    check_metric(rank_by)
    out = Path(out)
    if out.exists() and not (resume or overwrite):
        raise DualhubError(f"{out} exists; pass --resume to continue that sweep or --overwrite to replace it")
    version = code_version()
    rows = read_results(out) if out.exists() and resume else []
    index = {(r["session_digest"], r["param_hash"], r["code_version"]): i for i, r in enumerate(rows)}
    done = {k for k, i in index.items() if not rows[i]["error"]}
    runs_dir = out.parent / "runs"
    points = grid.points()
    jobs = [(s, p) for s in sessions for p in points]
    digests = {s: _session_digest(s) for s in sessions}

    ran = skipped = failed = 0
    cache_states: list[str] = []
    bar = _Progress(len(jobs)) if progress else None
    try:
        for session, params in jobs:
            key = (digests[session], param_hash(params), version)
            if key in done:
                skipped += 1
                if bar:
                    bar.advance(f"skip {Path(session).name}")
                continue
            if bar:
                bar.describe(f"{Path(session).name} {param_json({k: params[k] for k in grid.axes})}")
            row = runner(
                str(session),
                params,
                runs_dir=str(runs_dir),
                version=version,
                keep_log=keep_k is None,
                market_cache=market_cache,
            )
            ran += 1
            cache_states.append(row.get("market_cache") or "")
            if row["error"]:
                failed += 1
                if bar:
                    bar.note(f"[red]failed[/] {Path(session).name} {row['params']}: {row['error']}")
            k = (row["session_digest"] or key[0], row["param_hash"], row["code_version"])
            if k in index:
                rows[index[k]] = row
            else:
                index[k] = len(rows)
                rows.append(row)
            atomic_write_parquet(results_table(rows), out)  # after every run: an interrupt keeps them
            if bar:
                bar.advance()
    finally:
        if bar:
            bar.close()
    if keep_k:
        kept = _keep_best(rows, keep_k, rank_by, runner, str(runs_dir), version, market_cache)
        atomic_write_parquet(results_table(rows), out)
    if not out.exists():  # everything skipped and nothing to rewrite, or an empty grid
        atomic_write_parquet(results_table(rows), out)
    notes = tuple(n for n in (loss_stop_note(rows), cache_note(cache_states)) if n)
    if keep_k:
        notes += (f"event logs kept for the {kept} best run(s) by {rank_by} (--keep-logs best:{keep_k})",)
    return SweepSummary(out=out, ran=ran, skipped=skipped, failed=failed, rows=len(rows), notes=notes)


def _keep_best(
    rows: list[dict[str, Any]],
    k: int,
    rank_by: str,
    runner: Callable[..., dict[str, Any]],
    runs_dir: str,
    version: str,
    market_cache: bool,
) -> int:
    """Replay the ``k`` best rows again with their event logs written, in place in ``rows``. A replay is
    deterministic: the kept log's digest must be the row's; where it is not, the row says so."""
    kept = 0
    for best in best_rows(rows, rank_by, k):
        if best.get("log_kept"):
            kept += 1
            continue
        i = rows.index(best)  # type: ignore[arg-type]
        params = orjson.loads(best["params"])
        row = runner(
            best["session"],
            params,
            runs_dir=runs_dir,
            version=version,
            keep_log=True,
            market_cache=market_cache,
        )
        if not row["error"] and row["digest"] != best["digest"]:
            row["error"] = (
                f"the kept log's digest {row['digest']} is not the metrics-only run's {best['digest']}"
            )
        rows[i] = row
        kept += not row["error"]
    return kept


class _Progress:
    def __init__(self, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(
            "[bold]sweep",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
        )
        self.p.start()
        self.task = self.p.add_task("", total=total)

    def describe(self, text: str) -> None:
        self.p.update(self.task, description=text)

    def advance(self, text: str | None = None) -> None:
        if text:
            self.p.update(self.task, description=text)
        self.p.update(self.task, advance=1)

    def note(self, text: str) -> None:
        self.p.console.print(text)

    def close(self) -> None:
        self.p.update(self.task, description="")
        self.p.stop()
