"""Strategies written as plain Python functions, loaded at run time (``--strategy MODULE:FUNCTION``).

A compiled strategy is a C entry the core calls by address (:mod:`engine.strategies.call`). A Python one
has none: so the core's call has one more branch, for kind codes from :data:`FIRST_KIND` on: it leaves
compiled code (``numba.objmode``, the interpreter runs the block and hands the result back) and calls
:func:`call`, which finds the function loaded in this process under that code. The compiled core, and so
the cache, are the same whatever the user's function is; the replay kernel, the per-event replay and
live mode run it at the same point with the same inputs as a compiled strategy. It is slower (a few
microseconds a call), not different.

``MODULE`` is an importable module (``mypkg.strats``) or the path of a ``.py`` file; it may declare
``PARAMS`` (a tuple of :class:`engine.strategies.Param`), which the function then receives as
``params`` just as a compiled strategy does.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import DualhubError
from engine.strategies import Param

FIRST_KIND = 64  # kind codes below are the compiled registry's; FIRST_KIND + i is the i-th loaded here

_loaded: list[tuple[str, Any, tuple]] = []  # (spec, function, PARAMS), by kind - FIRST_KIND
_by_spec: dict[str, int] = {}


def is_spec(name: str) -> bool:
    """Whether a strategy name names a Python function (``MODULE:FUNCTION``), not a compiled strategy."""
    return ":" in name


def canonical(name: str) -> str:
    """``name`` with a ``.py`` file's path made absolute (a run's recorded config must name the same
    file from any directory: ``dualhub parity`` replays it later); other names unchanged."""
    module_name, _, fn_name = name.rpartition(":")
    if not is_spec(name) or not module_name.endswith(".py"):
        return name
    return f"{Path(module_name).expanduser().resolve()}:{fn_name}"


def source_sha256(spec: str) -> str:
    """sha256 of the source file of the module ``spec`` loads: part of a run's identity, so an edited
    strategy is another run, never the cached result of the old one."""
    kind, _ = load(spec)
    fn = _loaded[kind - FIRST_KIND][1]
    path = getattr(sys.modules.get(fn.__module__), "__file__", None)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else ""


def load(spec: str) -> tuple[int, tuple]:
    """(kind code, PARAMS) of the function ``spec`` names, importing it once per process."""
    if spec in _by_spec:
        kind = _by_spec[spec]
        return kind, _loaded[kind - FIRST_KIND][2]
    module_name, _, fn_name = spec.rpartition(":")
    if not module_name or not fn_name.isidentifier():
        raise DualhubError(f"strategy {spec!r}: want MODULE:FUNCTION (a module or .py file, then a function)")
    module = _import(spec, module_name)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise DualhubError(f"strategy {spec!r}: {module_name} has no function {fn_name!r}")
    params = getattr(module, "PARAMS", ())
    if not isinstance(params, (tuple, list)) or not all(isinstance(p, Param) for p in params):
        raise DualhubError(
            f"strategy {spec!r}: {module_name}.PARAMS must be a tuple of engine.strategies.Param"
        )
    params = tuple(params)
    kind = FIRST_KIND + len(_loaded)
    _loaded.append((spec, fn, params))
    _by_spec[spec] = kind
    return kind, params


def _import(spec: str, module_name: str) -> Any:
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise DualhubError(f"strategy {spec!r}: no such file {module_name}")
        name = f"dualhub_strategy_{len(_loaded)}_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(name, path)
        assert loader_spec is not None and loader_spec.loader is not None
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module  # what pickling (sweeps) and dataclasses in the module look up
        try:
            loader_spec.loader.exec_module(module)
        except (Exception, SystemExit) as e:  # the user's module: whatever it raises, one line naming it
            sys.modules.pop(name, None)
            raise DualhubError(
                f"strategy {spec!r}: importing {path.name} failed: {type(e).__name__}: {e}"
            ) from e
        return module
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise DualhubError(f"strategy {spec!r}: cannot import {module_name}: {e}") from e


# A Python strategy's time budget per call: a strategy that loops (or blocks) forever must end the run
# with one line, not hang it. The core calls strategies on the main thread; a watchdog thread watches
# the call in progress and, past the budget, sends the main thread a signal of dualhub's own (not
# SIGINT: Ctrl-C keeps its meaning, and live mode's event loop owns SIGINT), whose handler raises inside
# the strategy; a signal also breaks a blocking call (a sleep, a socket read). Per call this costs a
# clock read, not a timer: Python strategies are called often.
BUDGET_ENV = "DUALHUB_STRATEGY_BUDGET_MS"
DEFAULT_BUDGET_MS = 1000.0
_SIGNAL = signal.SIGUSR2
_budget_s: float | None = None  # seconds; None: not set yet, the environment's or the default at first call
_call_started = 0.0  # perf_counter() at the start of the main thread's call in progress; 0: none
_call_seq = 0  # calls started, so an overrun is never blamed on a later call
_overrun_seq = -1  # the call the watchdog signalled about (once per call)
_watchdog: threading.Thread | None = None


class _OverBudget(BaseException):
    """Raised in the strategy by the budget's signal. A BaseException: a strategy's own ``except
    Exception`` must not swallow it and spin on."""


def _on_signal(signum: int, frame: Any) -> None:
    if _call_started and _call_seq == _overrun_seq:  # still inside the call that overran
        raise _OverBudget


def set_budget_ms(ms: float | None) -> None:
    """The time budget of one strategy call (``--strategy-budget-ms``; 0: none; None: the
    environment's or the default, read at the next call)."""
    global _budget_s
    if ms is None:
        _budget_s = None
        return
    if not ms >= 0 or ms == float("inf"):
        raise DualhubError(f"the strategy time budget must be >= 0 ms and finite, not {ms}")
    _budget_s = ms / 1e3


def _budget_from_env() -> None:
    """``DUALHUB_STRATEGY_BUDGET_MS`` as the budget (checked like the option), else the default."""
    text = os.environ.get(BUDGET_ENV, "").strip()
    try:
        ms = float(text) if text else DEFAULT_BUDGET_MS
    except ValueError:
        raise DualhubError(f"{BUDGET_ENV}={text!r} is not a number of milliseconds") from None
    set_budget_ms(ms)


def _watch() -> None:
    global _overrun_seq
    main = threading.main_thread().ident or 0
    while True:
        budget = _budget_s or 0.0
        time.sleep(min(max(budget / 4, 0.01), 0.25) if budget else 0.25)
        started, seq = _call_started, _call_seq
        if budget and started and seq != _overrun_seq and time.perf_counter() - started > budget:
            if _call_seq == seq and _call_started == started:  # still that same call
                _overrun_seq = seq
                signal.pthread_kill(main, _SIGNAL)


def _arm_watchdog() -> None:
    """On the first call (on the main thread, where a handler can be set): the budget, the handler,
    the watchdog."""
    global _watchdog
    if _budget_s is None:
        _budget_from_env()
    if _watchdog is None:
        signal.signal(_SIGNAL, _on_signal)
        _watchdog = threading.Thread(target=_watch, name="strategy-budget", daemon=True)
        _watchdog.start()


_WANT = "want (bid_lots, bid_ticks, ask_lots, ask_ticks): integers, lots >= 0"
_LIMIT = 1 << 62


def call(kind, book, tick, qty, label, position, target, max_position, params):
    """Run the Python strategy of ``kind`` on the strategy signature (``engine.strategies``) and check
    what it returns: ``(bid_lots, bid_ticks, ask_lots, ask_ticks)``, integers (a float price is the
    old signature's, or a price between two ticks: refused, not rounded), lots never negative."""
    global _call_started, _call_seq
    # the whole call under one try (free until something raises): wherever the budget's signal lands
    # in it, it ends as the one line below
    try:
        spec, fn, _ = _loaded[kind - FIRST_KIND]
        view = book.view()  # the engine's own book: readable, not writable
        view.flags.writeable = False
        watched = threading.current_thread() is threading.main_thread()
        if watched:
            _arm_watchdog()
            _call_seq += 1
            _call_started = time.perf_counter()
        try:
            out = fn(view, tick, qty, label, position, target, max_position, params)
        except (Exception, SystemExit) as e:  # the user's code: whatever it raises (sys.exit() too, which
            # would otherwise end the command with status 0 and no run) ends the run with one line naming it
            raise DualhubError(f"strategy {spec!r} raised {type(e).__name__}: {e}") from e
        finally:
            if watched:
                _call_started = 0.0
        if type(out) is tuple and len(out) == 4:  # the usual answer, checked without the general path's
            a, b, c, d = out  # generators (they cost more than a small strategy itself)
            if (
                type(a) is int
                and type(b) is int
                and type(c) is int
                and type(d) is int
                and 0 <= a < _LIMIT
                and 0 <= c < _LIMIT
                and -_LIMIT < b < _LIMIT
                and -_LIMIT < d < _LIMIT
            ):
                return out
        try:
            values = tuple(out)
        except TypeError:
            values = ()
        if not (
            len(values) == 4
            and all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in values)
            and all(-_LIMIT < int(v) < _LIMIT for v in values)
            and values[0] >= 0
            and values[2] >= 0
        ):
            raise DualhubError(f"strategy {spec!r} returned {out!r}: {_WANT}")
        return int(values[0]), int(values[1]), int(values[2]), int(values[3])
    except _OverBudget:
        _call_started = 0.0
        raise DualhubError(
            f"strategy {_loaded[kind - FIRST_KIND][0]!r} ran past its time budget of "
            f"{(_budget_s or 0) * 1e3:g} ms in one call (--strategy-budget-ms, or {BUDGET_ENV}; 0: no budget)"
        ) from None
