"""One sweep run, one results row: :func:`run_one` (a top-level function of plain arguments, so worker
processes and Ray tasks call it unchanged), the row's columns (:data:`RESULT_SCHEMA`), its key, and the
code version every key carries (:func:`code_version`: a hash over what a replay's result depends on)."""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import resource
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa

from engine.events import Label
from engine.store import open_session
from replay.driver import run_replay
from replay.run_metrics import LATENCY_SPANS, Tally
from replay.sweep_grid import build_config, param_column, param_hash, param_json

CODE_ROOTS: Final = ("replay.sweep",)  # the code version covers these and what they import, transitively
_PACKAGES: Final = ("engine", "wire", "venue", "analysis", "replay")


def _module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _imported(tree: ast.AST) -> Iterator[str]:
    """Every module an ``import``/``from`` statement anywhere in ``tree`` may load (lazy ones too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)  # `from engine import store`


def code_sources(root: Path | None = None) -> list[Path]:
    """The files a replay's result depends on: the modules of ``engine``/``venue``/``replay`` that
    :data:`CODE_ROOTS` import (transitively, by reading their ``import`` statements, so a module
    nobody on the replay path imports, e.g. live trading, is not part of it), with their packages'
    ``__init__``, the report's SQL and the bundled default Laya model."""
    root = root or Path(__file__).resolve().parent.parent
    files: set[Path] = set()
    todo = list(CODE_ROOTS)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] not in _PACKAGES:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent packages run on import
        path = _module_file(root, name)
        if path is None or path in files:
            continue
        files.add(path)
        todo.extend(_imported(ast.parse(path.read_bytes(), str(path))))
    files.update(root.glob("analysis/*.sql"))
    files.update(root.glob("data/models/*.onnx"))
    return sorted(files)


@functools.cache
def code_version() -> str:
    """``<dualhub version>+<12 hex>``: the package version and a sha256 over :func:`code_sources`
    (relative path and content). Part of every run's key, so results of other code are never
    reused by ``--resume``; cached per process, because a process keeps running the code it loaded."""
    try:
        version = metadata.version("dualhub")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in code_sources(root):
        h.update(f"{path.relative_to(root).as_posix()}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return f"{version}+{h.hexdigest()[:12]}"


# ---------------------------------------------------------------------------------------------------
# one run -> one row

LABEL_COLUMNS: Final = {lab.name: f"labels_{lab.name.lower()}" for lab in Label}
RESULT_SCHEMA: Final = pa.schema(
    [
        ("session", pa.string()),
        ("session_digest", pa.string()),
        ("code_version", pa.string()),
        ("param_hash", pa.string()),
        ("params", pa.string()),
        ("run_dir", pa.string()),
        ("digest", pa.string()),
        ("config_sha256", pa.string()),
        ("books", pa.int64()),
        ("trades", pa.int64()),
        ("orders", pa.int64()),
        ("fills", pa.int64()),
        *((c, pa.int64()) for c in LABEL_COLUMNS.values()),
        ("kev_requests", pa.int64()),
        ("kev_responses", pa.int64()),
        ("kev_drops", pa.int64()),
        ("risk_rejections", pa.int64()),
        ("refusals", pa.string()),  # JSON {rule: refusals}
        ("position", pa.float64()),
        ("fees_usdt", pa.decimal128(18, 4)),
        ("pnl_usdt", pa.decimal128(18, 4)),
        # the PnL split at the last book (views.sql pnl_attribution, float USDT): they add up to the PnL
        ("spread_capture_usdt", pa.float64()),
        ("inventory_usdt", pa.float64()),
        ("fees_paid_usdt", pa.float64()),
        ("turnover_usdt", pa.float64()),
        ("sharpe", pa.float64()),  # annualised, equity sampled every second (views.sql performance)
        ("max_drawdown_usdt", pa.float64()),
        ("loss_stop_at_frac", pa.float64()),  # share of the run after the loss stop hit; NULL: never hit
        *((f"{span}_p{q}_ms", pa.float64()) for span in LATENCY_SPANS for q in (50, 99)),
        ("log_kept", pa.bool_()),  # whether run_dir holds the run's event log (--keep-logs)
        ("market_cache", pa.string()),  # replay.market_cache: reused, built, off (why)
        ("replay_command", pa.string()),  # `dualhub replay` of this row: the same digest
        ("wall_s", pa.float64()),
        ("peak_rss_mb", pa.float64()),
        ("peak_rss_scope", pa.string()),  # "process": peak so far of the process; "task": of this run
        ("worker", pa.string()),  # host:pid that ran it
        ("error", pa.string()),
    ]
)


def _stats(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A results row's metric columns from a run's summary (``replay.run_metrics``)."""
    out = {k: v for k, v in summary.items() if k in RESULT_SCHEMA.names}
    labels = summary.get("label_counts", {})
    out.update({col: int(labels.get(name, 0)) for name, col in LABEL_COLUMNS.items()})
    return out


def run_stats(run_dir: Path | str) -> dict[str, Any]:
    """Counts, PnL and its split, Sharpe, drawdown and latency percentiles of a written run: its event
    log read back through the summary a metrics-only run computes as it goes (``replay.run_metrics``)."""
    from analysis.report import verify_run

    run = Path(run_dir)
    verify_run(run)
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    return _stats(Tally.of_run(run).summary(manifest))


def _peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def run_key(session_digest: str, phash: str) -> str:
    return f"{session_digest[:16]}-{phash[:16]}"


def replay_command(session: str, params: Mapping[str, Any], out: str = "") -> str:
    """The ``dualhub replay`` command line of a sweep row: its session and parameters (``--params``)."""
    import shlex

    cmd = ["dualhub", "replay", session, "--params", param_json(params)]
    return shlex.join([*cmd, "--out", out] if out else cmd)


def run_one(
    session: str,
    params: Mapping[str, Any],
    *,
    runs_dir: str,
    version: str = "",
    keep_log: bool = True,
    market_cache: bool = True,
) -> dict[str, Any]:
    """Replay ``session`` with ``params``; return its results row.

    ``keep_log``: the run's event log goes to ``runs_dir/<key>``; else only its digest and summary are
    kept (a portfolio's runs always write theirs). ``market_cache``: the session's market cache is read,
    or built by this run (``replay.market_cache``). Never raises for a failed run (an ``Exception``
    becomes the row's ``error``). ``peak_rss_mb`` is the process's peak resident set so far (in a serial
    sweep: the largest run up to this one).
    """
    from engine.optional import quiet_cuda_fallback

    quiet_cuda_fallback()  # a Ray worker is a process of its own: the console command's filter is not in it
    t0 = time.perf_counter()
    row: dict[str, Any] = {c: None for c in RESULT_SCHEMA.names}
    row.update(
        session=str(Path(session).resolve()),
        session_digest="",
        code_version=version or code_version(),
        param_hash=param_hash(params),
        params=param_json(params),
        error="",
    )
    row.update({param_column(k): v for k, v in params.items()})
    try:
        row["session_digest"] = open_session(session).digest()
        cfg = build_config(params)
        row["config_sha256"] = cfg.sha256()
        run_dir = Path(runs_dir) / run_key(row["session_digest"], row["param_hash"])
        keep = keep_log or bool(cfg.symbols)
        res = run_replay(
            session, cfg, out_dir=run_dir, overwrite=True, market_cache=market_cache, metrics_only=not keep
        )
        row.update(
            run_dir=str(res.run_dir) if keep else "",
            log_kept=keep,
            market_cache=res.market_cache,
            replay_command=replay_command(row["session"], params, str(run_dir)),
            digest=res.digest,
            books=res.books,
            trades=res.trades,
            fills=res.counts.get("fill", 0),
        )
        row.update(run_stats(res.run_dir) if keep else _stats(res.summary))
    except Exception as e:  # a failed run is a result, not a crashed sweep
        row["error"] = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    row["wall_s"] = time.perf_counter() - t0
    row["peak_rss_mb"] = _peak_rss_mb()
    row["peak_rss_scope"] = "process"
    row["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    return row
