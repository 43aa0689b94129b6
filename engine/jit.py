"""The compiler of the decision core: ``njit`` is ``numba.njit(cache=True)`` with a cache stamp that
covers every source the function may compile in.

Numba keys a function's on-disk cache on its own source file only, so a kernel compiled against
``engine/risk.py`` would keep running the old rules after an edit to ``engine/risk.py`` (the kernel's
file did not change). Every function compiled through this module is stamped instead with a hash of
its file and of every module that file imports, transitively (this project's packages wherever
they are installed; not the interpreter's other libraries): whatever it calls, and every constant it
reads, comes from one of them (the core reaches its functions by import, never through a function
passed as an argument). Change a rule and every cached function that can reach it recompiles on its
next use; an edit elsewhere (the book source, a report) leaves the compiled core's cache alone.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

import numba as nb
from numba.core import caching

ROOT = Path(__file__).resolve().parent.parent
CORE_DIRS = ("engine", "venue", "replay", "wire")
_MARK = b"from engine.jit import"


@functools.cache
def core_files() -> tuple[Path, ...]:
    """The source files compiled through this module (they import it), and this module."""
    found = [Path(__file__).resolve()]
    for top in CORE_DIRS:
        found += [p for p in sorted((ROOT / top).rglob("*.py")) if _MARK in p.read_bytes()]
    return tuple(found)


def core_stamp() -> str:
    """sha256 over the whole core's sources (paths and bytes): the engine's identity in a run's
    ``runtime.json`` (each function's cache has its own, narrower stamp: :func:`stamp_of`)."""
    return _stamp(tuple(_stat_key(p) for p in core_files()))


def _stat_key(p: Path) -> tuple[Path, int, int]:
    """A file with its mtime and size: caches keyed on it see an edit made while a process runs."""
    st = p.stat()
    return p, st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=64)
def _stamp(files: tuple[tuple[Path, int, int], ...]) -> str:
    h = hashlib.sha256()
    for p, _, _ in files:
        h.update(os.path.relpath(p, ROOT).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


# what the interpreter brings (the standard library, installed packages): not followed, except this
# project's own packages (pyproject's), wherever they are installed: a release installed into
# site-packages replaces a rule's file under a kernel whose own file did not change
_OUTSIDE = tuple(
    {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)
OWN = ("engine", "venue", "wire", "analysis", "doctor", "recorder", "replay", "live", "dualhub")


@functools.lru_cache(maxsize=256)
def _home(top: str, path: tuple[str, ...]) -> Path | None:
    """The ``sys.path`` entry (``path``) that the top-level module ``top`` is imported from, when it
    is followed. This project's own packages are where this module is, whatever ``sys.path`` holds: an
    editable install imports them through an import hook, not a ``sys.path`` entry, so a process
    started outside the checkout found none of them there, stamped each cache with its own file
    alone (an edited rule went unseen) and disagreed with every process started inside it."""
    if top in OWN and ((ROOT / top / "__init__.py").is_file() or (ROOT / f"{top}.py").is_file()):
        return ROOT
    for entry in path:
        base = Path(entry or ".").resolve()
        if (base / top / "__init__.py").is_file() or (base / f"{top}.py").is_file():
            outside = any(base.is_relative_to(o) for o in _OUTSIDE)
            return None if outside and top not in OWN else base
    return None


def _module_file(name: str) -> Path | None:
    """The source file of module ``name`` (a package's ``__init__.py``) when it is followed; None for
    the interpreter's own libraries and for a name imported from a module rather than a module."""
    parts = name.split(".")
    home = _home(parts[0], tuple(sys.path))
    if home is None:
        return None
    base = home.joinpath(*parts)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


@functools.lru_cache(maxsize=512)
def _imports(key: tuple[Path, int, int]) -> tuple[Path, ...]:
    """The followed modules ``key``'s file imports (keyed on its size and mtime: an edit is seen)."""
    names: set[str] = set()
    for stmt in _import_statements(key[0].read_text(encoding="utf-8")):
        try:
            nodes = ast.parse(stmt).body
        except SyntaxError:  # prose that starts like an import (a docstring's "from the ...")
            continue
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
    return tuple(sorted({f for f in map(_module_file, names) if f is not None}))


def _import_statements(src: str) -> list[str]:
    """Every statement of ``src`` that starts with ``import`` or ``from``, at any indentation, with its
    continuation lines: parsing only these takes a tenth of parsing the module, and whatever else
    they catch only adds to a stamp."""
    out: list[str] = []
    open_parens, cont = 0, False
    for line in src.splitlines():
        s = line.strip()
        if open_parens > 0 or cont:
            out[-1] += "\n" + s
        elif s.startswith(("import ", "from ")):
            out.append(s)
            open_parens = 0
        else:
            continue
        open_parens += s.count("(") - s.count(")")
        cont = s.endswith("\\")
    return out


def reach(py_file: str | Path) -> tuple[Path, ...]:
    """``py_file`` and every followed module it imports, transitively, sorted."""
    seen: set[Path] = set()
    todo = [Path(py_file).resolve()]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(_imports(_stat_key(p)))
    return tuple(sorted(seen))


def stamp_of(py_file: str | Path) -> str:
    """sha256 over the sources (paths and bytes) a function of ``py_file`` may compile in."""
    return _stamp(tuple(_stat_key(p) for p in reach(py_file)))


def _in_core(py_file: str) -> bool:
    return Path(py_file).resolve() in core_files()


class _CoreStamp:
    _py_file: str

    def get_source_stamp(self) -> str:
        return stamp_of(self._py_file)

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


def cfunc(signature):
    """``numba.cfunc(signature, cache=True)`` under the core's stamp: a C entry (a strategy's,
    ``engine/strategies/call.py``) recompiles when a source it compiles in changes."""
    return nb.cfunc(signature, cache=True)
