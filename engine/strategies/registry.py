"""The strategies compiled for the core, by name and kind code, and the compiled entry of each.

The core calls the configured strategy through the address of its C entry (:func:`entry`, compiled
and cached once per strategy): ``engine/strategies/call.py`` says why. So the core's cache does not
depend on any strategy, and an edited strategy recompiles its entry alone on its next use.

Adding a strategy: its module in this package, its place in :data:`STRATEGIES` and its entry
function in :data:`_ENTRIES` (docs/STRATEGY.md). A plain Python function (``MODULE:FUNCTION``) needs
none of that: :mod:`engine.strategies.plugin` loads it and ``call.quote``'s first branch calls it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numba as nb
import numpy as np
from numba import carray

from engine.errors import DualhubError
from engine.jit import cfunc
from engine.strategies import baseline, call, imbalance_lean, plugin
from engine.strategies.call import BOOK_LEN, ENTRY_SIGNATURE, MAX_PARAMS

STRATEGIES = (baseline, imbalance_lean)  # a strategy's kind code is its place here
KINDS = {m.NAME: k for k, m in enumerate(STRATEGIES)}
assert all(len(m.PARAMS) <= MAX_PARAMS for m in STRATEGIES) and len(KINDS) == len(STRATEGIES)
assert len(STRATEGIES) <= plugin.FIRST_KIND


# The C entries (call.ENTRY_SIGNATURE), one per strategy, each a module-level function of its own:
# numba's cache tells cached functions apart by name and place, so a factory's closures would share one.
def _entry_baseline(out, book, tick, qty, label, position, target, max_position, params):
    b, p = carray(book, (BOOK_LEN,)), carray(params, (MAX_PARAMS,))
    out[0], out[1], out[2], out[3] = baseline.quote(b, tick, qty, label, position, target, max_position, p)


def _entry_imbalance_lean(out, book, tick, qty, label, position, target, max_position, params):
    b, p = carray(book, (BOOK_LEN,)), carray(params, (MAX_PARAMS,))
    out[0], out[1], out[2], out[3] = imbalance_lean.quote(
        b, tick, qty, label, position, target, max_position, p
    )


_ENTRIES = (_entry_baseline, _entry_imbalance_lean)  # by kind code
assert len(_ENTRIES) == len(STRATEGIES)
_compiled: dict[int, Any] = {}


def entry(kind: int) -> int:
    """The address of the compiled entry of strategy ``kind``, compiled (or loaded from the cache) on
    first use; 0 for a Python strategy, and with the JIT off (``call.quote`` needs none then)."""
    if kind >= plugin.FIRST_KIND or nb.config.DISABLE_JIT:
        return 0
    cf = _compiled.get(kind)
    if cf is None:
        cf = _compiled[kind] = cfunc(ENTRY_SIGNATURE)(_ENTRIES[kind])
    return int(cf.address)


def quote(kind, book, tick, qty, label, position, target, max_position, params):
    """The strategy of ``kind`` (:data:`KINDS`) on the signature of :mod:`engine.strategies`, as the
    core calls it (``call.quote``), for Python callers."""
    return call.quote(entry(kind), kind, book, tick, qty, label, position, target, max_position, params)


def resolve(name: str, params: Mapping[str, float], defaults: Any = None) -> tuple[int, np.ndarray]:
    """(kind code, parameter array) of strategy ``name`` with ``params`` set over its defaults.

    A parameter that ``defaults`` (the engine's ``QuoteConfig``) also has starts from its value there
    (the baseline's ``offset_ticks``, ``label_skew_ticks``, ``inventory_skew_ticks``), so a quote
    config that sets them keeps working. A name or value the strategy does not declare is an error."""
    if plugin.is_spec(name):
        kind, declared = plugin.load(name)
        if len(declared) > MAX_PARAMS:
            raise DualhubError(f"strategy {name!r} declares {len(declared)} PARAMS; at most {MAX_PARAMS}")
    elif name not in KINDS:
        raise DualhubError(
            f"unknown strategy {name!r}; known: {', '.join(KINDS)}, or MODULE:FUNCTION for a Python one"
        )
    else:
        kind = KINDS[name]
        declared = STRATEGIES[kind].PARAMS
    names = [p.name for p in declared]
    for key in params:
        if key not in names:
            raise DualhubError(
                f"strategy {name} has no parameter {key!r}; its parameters: {', '.join(names) or 'none'}"
            )
    out = np.zeros(MAX_PARAMS, dtype=np.float64)
    for i, p in enumerate(declared):
        v = params.get(p.name, getattr(defaults, p.name, p.default))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not p.lo <= v <= p.hi:
            raise DualhubError(
                f"strategy {name}: {p.name} must be a number in [{p.lo:g}, {p.hi:g}], got {v!r}"
            )
        out[i] = v
    return kind, out


def parse_params(items: Iterable[str], flag: str = "--strategy-param") -> dict[str, float]:
    """``["k=v", ...]`` from the command line as ``{k: float(v)}``."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, text = item.partition("=")
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not sep or not key.strip() or not math.isfinite(value):
            raise DualhubError(f"{flag} wants NAME=NUMBER, got {item!r}")
        out[key.strip()] = value
    return out


def describe() -> str:
    """Every strategy and its parameters with their defaults, one line each (for --help)."""
    return "; ".join(
        [f"{m.NAME} ({', '.join(f'{p.name}={p.default:g}' for p in m.PARAMS)})" for m in STRATEGIES]
        + ["MODULE:FUNCTION (a plain Python function, its module's PARAMS)"]
    )


def add_strategy_args(p: argparse.ArgumentParser) -> None:
    """``--strategy NAME`` and ``--strategy-param NAME=NUMBER`` (``dualhub replay`` and ``dualhub live``)."""
    p.add_argument(
        "--strategy",
        default="baseline",
        metavar="NAME",
        help=f"how the engine quotes (docs/STRATEGY.md; default baseline): {describe()}",
    )
    p.add_argument(
        "--strategy-param",
        action="append",
        default=[],
        metavar="NAME=NUMBER",
        help="set one of the strategy's parameters (repeatable)",
    )


def strategy_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields of the two flags."""
    return {"strategy": args.strategy, "strategy_params": parse_params(args.strategy_param)}
