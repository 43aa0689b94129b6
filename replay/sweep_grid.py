"""A sweep's grid and parameters: ``--scale-latency`` specs, dotted parameter names read into a
:class:`~replay.driver.ReplayConfig` (checked when the grid is read), the TOML grid (``[base]`` and
``[grid]``, :class:`Grid`) and the parameter set's JSON, hash and results column. ``replay/sweep.py``
runs it; its module docstring shows a grid."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import orjson

from engine.errors import DualhubError
from engine.risk_args import PORTFOLIO_KEYS
from engine.strategies.registry import parse_params, resolve
from replay.config import ReplayConfig

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
