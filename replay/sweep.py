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
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import glob
import hashlib
import itertools
import math
import os
import resource
import socket
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from importlib import metadata
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import DualhubError
from engine.events import Label
from engine.risk_args import PORTFOLIO_KEYS
from engine.store import atomic_write_parquet, open_session
from engine.strategies.registry import parse_params, resolve
from replay.driver import ReplayConfig, run_replay
from replay.run_metrics import LATENCY_SPANS, Tally

SCALE_KEYS: Final = ("kev", "laya", "order", "feed")
SCALE_LATENCY_KEY: Final = "scale_latency"  # grid/base key taking a --scale-latency spec
STRATEGY_PARAMS: Final = "strategy_params"  # group of the strategy's parameters: strategy_params.NAME
PARAM_PREFIX: Final = "p_"  # results column of parameter "risk.max_position": "p_risk_max_position"

# ---------------------------------------------------------------------------------------------------
# --scale-latency


def parse_scale_latency(spec: str) -> dict[str, float]:
    """``"kev=2,laya=1,order=0.5,feed=1"`` -> ``{"kev": 2.0, ...}``; keys from :data:`SCALE_KEYS`.

    Multipliers must be finite and >= 0 (0 models an instantaneous component). Keys left out keep
    the config's value.
    """
    out: dict[str, float] = {}
    if not spec.strip():
        raise DualhubError(
            f"empty latency scale spec; expected e.g. 'kev=2,order=0.5' ({', '.join(SCALE_KEYS)})"
        )
    for part in spec.split(","):
        key, sep, value = (x.strip() for x in part.partition("="))
        if not sep or not key:
            raise DualhubError(f"latency scale {part.strip()!r} is not KEY=NUMBER (e.g. kev=2)")
        if key not in SCALE_KEYS:
            raise DualhubError(f"unknown latency {key!r} in {spec!r}; known: {', '.join(SCALE_KEYS)}")
        if key in out:
            raise DualhubError(f"latency {key!r} given twice in {spec!r}")
        try:
            x = float(value)
        except ValueError:
            raise DualhubError(f"latency scale {key}={value!r} is not a number") from None
        if not math.isfinite(x) or x < 0:
            raise DualhubError(f"latency scale {key}={value} must be a finite number >= 0")
        out[key] = x
    return out


def apply_scales(cfg: ReplayConfig, scales: Mapping[str, float]) -> ReplayConfig:
    """``cfg`` with ``scale_<key>`` set from ``scales`` (as returned by :func:`parse_scale_latency`)."""
    unknown = sorted(set(scales) - set(SCALE_KEYS))
    if unknown:
        raise DualhubError(f"unknown latency {unknown}; known: {', '.join(SCALE_KEYS)}")
    return dataclasses.replace(cfg, **{f"scale_{k}": float(v) for k, v in scales.items()})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------
# parameters -> ReplayConfig


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _nested() -> dict[str, type]:
    """ReplayConfig fields that are dataclasses themselves (``risk``, ``quotes``, ``contract``)."""
    out = {}
    for name, f in _fields(ReplayConfig).items():
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            value = f.default_factory()  # type: ignore[misc]
            if dataclasses.is_dataclass(value):
                out[name] = type(value)
    return out


def _alias(name: str) -> str:
    """``portfolio.KEY`` (the keys of ``--portfolio``) as the RiskLimits field it sets."""
    head, dot, leaf = name.partition(".")
    if head == "portfolio" and dot:
        if leaf not in PORTFOLIO_KEYS:
            raise DualhubError(f"unknown parameter {name!r}; portfolio keys: {', '.join(PORTFOLIO_KEYS)}")
        return f"risk.{PORTFOLIO_KEYS[leaf]}"
    return name


def check_param_name(name: str) -> None:
    """Raise :class:`DualhubError` unless ``name`` is a settable ReplayConfig field (dotted for nested)."""
    if name == SCALE_LATENCY_KEY:
        return
    name = _alias(name)
    nested = _nested()
    head, dot, leaf = name.partition(".")
    top = _fields(ReplayConfig)
    if not dot:
        if name not in top:
            raise DualhubError(f"unknown parameter {name!r}; ReplayConfig fields: {', '.join(top)}")
        if name in nested or name == STRATEGY_PARAMS:
            raise DualhubError(f"parameter {name!r} is a group; set its fields ({name}.FIELD)")
        return
    if head == STRATEGY_PARAMS and leaf:
        return  # the strategy's own names: check_strategy_params
    if head not in nested:
        raise DualhubError(f"unknown parameter group {head!r} in {name!r}; groups: {', '.join(nested)}")
    if leaf not in _fields(nested[head]):
        raise DualhubError(f"unknown parameter {name!r}; {head} fields: {', '.join(_fields(nested[head]))}")


def _type_name(f: dataclasses.Field[Any]) -> str:
    t = f.type
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _coerce(name: str, f: dataclasses.Field[Any], v: Any) -> Any:
    """TOML values to the field's type: ints for floats, strings for paths, exact decimals."""
    t = _type_name(f)
    ok: bool
    if t == "float":
        ok = isinstance(v, int | float) and not isinstance(v, bool)
        v = float(v) if ok else v
    elif t in ("int", "Nanos"):
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif t == "bool":
        ok = isinstance(v, bool)
    elif t == "str":
        ok = isinstance(v, str)
    elif t == "Path":
        ok = isinstance(v, str | Path)
        v = Path(v) if ok else v
    elif t == "Decimal":
        ok = isinstance(v, int | float | str | Decimal) and not isinstance(v, bool)
        v = Decimal(str(v)) if ok else v
    else:
        ok = True
    if not ok:
        raise DualhubError(f"parameter {name} = {v!r} is not a valid {t}")
    # TOML reads 1e400 as inf and has inf and nan literals: a limit of inf would switch its rule off
    # and be recorded as null, and the command line refuses them all (engine/bounds.py)
    if t == "float" and not math.isfinite(v):
        raise DualhubError(f"parameter {name} = {v!r} must be a finite number")
    if t in ("int", "Nanos") and not -(2**63) < v < 2**63:
        raise DualhubError(f"parameter {name} = {v!r} does not fit a 64-bit integer")
    if t == "Decimal" and not v.is_finite():
        raise DualhubError(f"parameter {name} = {v!r} must be a finite number")
    return v


def build_config(params: Mapping[str, Any], base: ReplayConfig | None = None) -> ReplayConfig:
    """A ReplayConfig from flat parameters (``{"seed": 1, "risk.max_position": 0.02, ...}``)."""
    top_fields, nested = _fields(ReplayConfig), _nested()
    top: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    scales: dict[str, float] = {}
    strategy_params: dict[str, float] = {}
    for name, value in params.items():
        check_param_name(name)
        name = _alias(name)
        if name == SCALE_LATENCY_KEY:
            if not isinstance(value, str):
                raise DualhubError(f"{SCALE_LATENCY_KEY} = {value!r} must be a spec string like 'kev=2'")
            scales = parse_scale_latency(value)
            continue
        head, dot, leaf = name.partition(".")
        if head == STRATEGY_PARAMS:
            strategy_params.update(_strategy_param(leaf, value))
        elif dot:
            groups.setdefault(head, {})[leaf] = _coerce(name, _fields(nested[head])[leaf], value)
        else:
            top[name] = _coerce(name, top_fields[name], value)
    cfg = base or ReplayConfig()
    for head, values in groups.items():
        top[head] = dataclasses.replace(getattr(cfg, head), **values)
    if strategy_params:
        top[STRATEGY_PARAMS] = {**cfg.strategy_params, **strategy_params}
    cfg = dataclasses.replace(cfg, **top)
    return apply_scales(cfg, scales) if scales else cfg


def params_config(text: str, base: ReplayConfig) -> ReplayConfig:
    """``dualhub replay --params JSON``: a results row's parameters over ``base`` (the flags' config)."""
    try:
        params = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise DualhubError(f"--params is not JSON: {e}") from None
    if not isinstance(params, dict):
        raise DualhubError("--params must be a JSON object of parameters, e.g. '{\"seed\": 2}'")
    return build_config(params, base)


def _strategy_param(name: str, value: Any) -> dict[str, float]:
    """``strategy_params.NAME = value`` as ``--strategy-param NAME=value`` reads it."""
    text = str(value).lower() if isinstance(value, bool) else str(value)  # a bool is no number
    return parse_params([f"{name}={text}"], flag=f"{STRATEGY_PARAMS}.{name}")


def check_strategy_params(base: Mapping[str, Any], axes: Mapping[str, list[Any]]) -> None:
    """Raise :class:`DualhubError` unless every combination of ``strategy`` and ``strategy_params.*``
    the grid makes names a strategy of the registry and only its parameters, each in its range."""
    names = [n for n in axes if n == "strategy" or n.partition(".")[0] == STRATEGY_PARAMS]
    default = _fields(ReplayConfig)["strategy"].default
    for values in itertools.product(*(axes[n] for n in names)):
        point = {**base, **dict(zip(names, values, strict=True))}
        params: dict[str, float] = {}
        for name, value in point.items():
            head, _, leaf = name.partition(".")
            if head == STRATEGY_PARAMS:
                params.update(_strategy_param(leaf, value))
        strategy = point.get("strategy", default)
        if params or "strategy" in point:
            resolve(strategy if isinstance(strategy, str) else repr(strategy), params)


# ---------------------------------------------------------------------------------------------------
# grid


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}.{k}" if prefix else k
        out.update(_flatten(v, name) if isinstance(v, dict) else {name: v})
    return out


@dataclass(frozen=True)
class Grid:
    base: dict[str, Any]
    axes: dict[str, list[Any]]  # sorted by name

    def points(self) -> list[dict[str, Any]]:
        """Full parameter sets (base, then the axes' values), in a stable order."""
        names = list(self.axes)
        return [
            {**self.base, **dict(zip(names, values, strict=True))}
            for values in itertools.product(*(self.axes[n] for n in names))
        ]


def parse_grid(doc: Mapping[str, Any], source: str = "grid") -> Grid:
    unknown = sorted(set(doc) - {"base", "grid"})
    if unknown:
        raise DualhubError(f"{source}: unknown tables {unknown}; expected [base] and [grid]")
    base, axes = _flatten(doc.get("base", {})), _flatten(doc.get("grid", {}))
    if not axes:
        raise DualhubError(f"{source}: [grid] has no axes (e.g. scale_kev = [0.5, 1, 2])")
    for name in (*base, *axes):
        try:
            check_param_name(name)
        except DualhubError as e:
            raise DualhubError(f"{source}: {e}") from None
    for name, values in axes.items():
        if not isinstance(values, list) or not values:
            raise DualhubError(f"{source}: grid axis {name!r} must be a non-empty list of values")
    both = sorted(set(base) & set(axes))
    if both:
        raise DualhubError(f"{source}: {both} set in both [base] and [grid]")
    try:
        check_strategy_params(base, axes)
    except DualhubError as e:
        raise DualhubError(f"{source}: {e}") from None
    grid = Grid(base=base, axes={n: axes[n] for n in sorted(axes)})
    check_points(grid, source)
    return grid


def check_points(grid: Grid, source: str = "grid") -> None:
    """Every parameter set of the grid built into a config, so that each value meets the bounds the
    command line and the config put on it before any run starts (not as a failed row, or worse an
    accepted value, once the sweep is under way)."""
    for point in grid.points():
        try:
            build_config(point)
        except (DualhubError, ValueError, TypeError) as e:
            axes = ", ".join(f"{n} = {point[n]!r}" for n in grid.axes)
            raise DualhubError(f"{source}: [grid] point {axes}: {e}") from None


def load_grid(path: Path | str) -> Grid:
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as e:
        raise DualhubError(f"cannot read grid {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise DualhubError(f"{path} is not valid TOML: {e}") from None
    return parse_grid(doc, str(path))


def param_json(params: Mapping[str, Any]) -> str:
    return orjson.dumps(dict(params), option=orjson.OPT_SORT_KEYS, default=str).decode()


def param_hash(params: Mapping[str, Any]) -> str:
    return hashlib.sha256(param_json(params).encode()).hexdigest()


def param_column(name: str) -> str:
    return PARAM_PREFIX + name.replace(".", "_")


CODE_ROOTS: Final = ("replay.sweep",)  # the code version covers these and what they import, transitively
_PACKAGES: Final = ("engine", "venue", "replay")


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
    files.update(root.glob("engine/report/*.sql"))
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
    from engine.report.report import verify_run

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


@dataclass(frozen=True)
class SweepSummary:
    out: Path | str  # a path, or a filesystem URL (Ray sweeps)
    ran: int
    skipped: int
    failed: int
    rows: int
    notes: tuple[str, ...] = ()  # lines for the user (e.g. :func:`loss_stop_note`)


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
