"""The compiler of the decision core: ``njit`` is ``numba.njit(cache=True)`` with one cache stamp for
the whole core.

Numba keys a function's on-disk cache on its own source file only, so a kernel compiled against
``engine/risk.py`` would keep running the old rules after an edit to ``engine/risk.py`` (the kernel's
file did not change). Every function compiled through this module is stamped instead with a hash of
every source file that uses it: change any rule anywhere in the core and every cached function of
the core recompiles on its next use.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any

import numba as nb
from numba.core import caching

ROOT = Path(__file__).resolve().parent.parent
CORE_DIRS = ("engine", "venue", "replay")
_MARK = b"from engine.jit import"


@functools.cache
def core_files() -> tuple[Path, ...]:
    """The source files compiled through this module (they import it), and this module."""
    found = [Path(__file__).resolve()]
    for top in CORE_DIRS:
        found += [p for p in sorted((ROOT / top).rglob("*.py")) if _MARK in p.read_bytes()]
    return tuple(found)


def core_stamp() -> str:
    """sha256 over the core's sources (paths and bytes), recomputed when a file's size or mtime moves,
    so an edit made while a process runs is seen by the functions it compiles next."""
    stats = ((p, p.stat()) for p in core_files())
    return _stamp(tuple((p, st.st_mtime_ns, st.st_size) for p, st in stats))


@functools.lru_cache(maxsize=4)
def _stamp(files: tuple[tuple[Path, int, int], ...]) -> str:
    h = hashlib.sha256()
    for p, _, _ in files:
        h.update(os.path.relpath(p, ROOT).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _in_core(py_file: str) -> bool:
    return Path(py_file).resolve() in core_files()


class _CoreStamp:
    def get_source_stamp(self) -> str:
        return core_stamp()

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _in_core(py_file):
            return None
        return super().from_function(py_func, py_file)


# numba >= 0.62 names these without the leading underscore
_UserDir = getattr(caching, "UserProvidedCacheLocator", None) or caching._UserProvidedCacheLocator
_InTree = getattr(caching, "InTreeCacheLocator", None) or caching._InTreeCacheLocator
_Impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl


class CoreUserDirLocator(_CoreStamp, _UserDir):
    """NUMBA_CACHE_DIR set: the core's caches go there, stamped with the core's hash."""


class CoreInTreeLocator(_CoreStamp, _InTree):
    """The core's caches in ``__pycache__`` beside each source file, stamped with the core's hash."""


for _cls in (CoreInTreeLocator, CoreUserDirLocator):  # user dir first, as numba's own order has it
    if _cls not in _Impl._locator_classes:
        _Impl._locator_classes.insert(0, _cls)


def njit(*args, nrt: bool = False, **kwargs):
    """``numba.njit`` with ``cache=True`` under the core's stamp; as ``@njit`` or ``@njit(...)``.

    Compiled without numba's reference counting unless ``nrt=True``. With it, every call of a
    compiled function takes and drops a reference to each array argument (an atomic call each way):
    the core hands its ~20 state arrays down every call, and on a trading replay those calls were
    about two thirds of the compiled loop's time. Without it, a function cannot make an array (numba
    refuses to compile it: pass ``nrt=True``), and it must neither return an array nor call an
    ``nrt=True`` function that returns one, as nothing would own that reference; :func:`_guard`
    refuses both when it compiles them. Arrays come from Python or from an ``nrt=True`` entry (the
    replay loops), which holds them for the whole call.
    """
    kwargs.setdefault("cache", True)
    kwargs["_nrt"] = nrt

    def wrap(func):
        d = nb.njit(**kwargs)(func)
        if nb.config.DISABLE_JIT:  # the plain function, read as Python
            return d
        return _guard(d, nrt, kwargs.get("inline") == "always")

    if args and callable(args[0]):
        return wrap(args[0])
    return wrap


_compiling: list[tuple[str, bool]] = []  # the functions being compiled, innermost last


def _holds_array(t: object) -> bool:
    if isinstance(t, nb.types.Array):
        return True
    return isinstance(t, nb.types.BaseTuple) and any(_holds_array(x) for x in t.types)


def _guard(d: Any, nrt: bool, inlined: bool) -> Any:
    """``d`` refusing to compile what would miscount references with functions compiled without
    numba's reference counting (an inlined function's body takes its caller's way)."""
    name = f"{d.py_func.__module__}.{d.py_func.__qualname__}"
    if not nrt and "objmode" in d.py_func.__code__.co_names:
        # handing an array to the interpreter needs its reference: without one numba hands over the
        # array a view was taken from, not the view
        raise TypeError(f"{name} leaves compiled code (objmode): it needs nrt=True")
    compile_, add_overload, get_call_template = d.compile, d.add_overload, d.get_call_template

    def compile(sig: Any) -> Any:
        _compiling.append((name, nrt))
        try:
            return compile_(sig)
        finally:
            _compiling.pop()

    def checked_add_overload(cres: Any) -> None:
        rt = cres.signature.return_type
        if not nrt and not inlined and _holds_array(rt):
            raise TypeError(f"{name} is compiled without nrt and returns {rt}: nothing would own it")
        add_overload(cres)

    def checked_get_call_template(args: Any, kws: Any) -> Any:
        out = get_call_template(args, kws)
        if nrt and _compiling and not _compiling[-1][1]:
            caller = _compiling[-1][0]
            if any(_holds_array(sig.return_type) for sig in d.nopython_signatures):
                raise TypeError(f"{caller} is compiled without nrt and calls {name}, which returns an array")
        return out

    d.compile, d.add_overload, d.get_call_template = compile, checked_add_overload, checked_get_call_template
    return d
