"""engine.jit: the compiled core's on-disk cache follows every source file of the core, so an edited
rule is never served from a cache compiled against its old text."""

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numba
import numpy as np
import pytest

from engine import jit
from engine.jit import njit

RUN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    d = Path(sys.argv[1])
    sys.path.insert(0, str(d))
    if sys.argv[2] == "core":
        import engine.jit as J
        J.core_files = lambda: (d / "rule.py", d / "kern.py", d / "other.py")
    import kern
    print(kern.kern(1.0))
    print(sum(kern.kern.stats.cache_hits.values()), file=sys.stderr)
    """
)


def _module_pair(d: Path, decorator_import: str, decorator: str, step: float) -> None:
    (d / "rule.py").write_text(f"{decorator_import}\n\n@{decorator}\ndef rule(x):\n    return x + {step}\n")
    (d / "kern.py").write_text(
        f"{decorator_import}\nfrom rule import rule\n\n@{decorator}\ndef kern(x):\n    return rule(x) * 10\n"
    )


def _run(d: Path, how: str = "core", loaded: list[bool] | None = None) -> str:
    """``kern(1.0)`` in a fresh process; ``loaded`` gets whether kern came from the disk cache."""
    p = subprocess.run(
        [sys.executable, "-c", RUN, str(d), how], capture_output=True, text=True, check=True, timeout=300
    )
    if loaded is not None:
        loaded.append(p.stderr.split()[-1] != "0")
    return p.stdout.strip()


def test_an_edit_to_a_called_rule_recompiles_the_caller(tmp_path):
    _module_pair(tmp_path, "from engine.jit import njit", "njit", 1.0)
    assert _run(tmp_path) == "20.0"
    assert list((tmp_path / "__pycache__").glob("kern.kern-*.nbi")), "the caller was cached on disk"
    _module_pair(tmp_path, "from engine.jit import njit", "njit", 2.0)  # only rule.py's text changes
    (tmp_path / "kern.py").touch()
    assert _run(tmp_path) == "30.0"


def test_an_edit_to_a_module_the_caller_does_not_import_keeps_its_cache(tmp_path, monkeypatch):
    """Only what a function can reach invalidates it: the core's kernels are not compiled again (a
    minute) for an edit to a compiled helper they never call."""
    _module_pair(tmp_path, "from engine.jit import njit", "njit", 1.0)
    other = "from engine.jit import njit\n\n@njit\ndef other(x):\n    return x - {}\n"
    (tmp_path / "other.py").write_text(other.format(1.0))
    loaded: list[bool] = []
    assert _run(tmp_path, loaded=loaded) == "20.0"
    assert _run(tmp_path, loaded=loaded) == "20.0"
    (tmp_path / "other.py").write_text(other.format(2.0))  # compiled through engine.jit, not imported
    assert _run(tmp_path, loaded=loaded) == "20.0"
    _module_pair(tmp_path, "from engine.jit import njit", "njit", 2.0)  # what kern imports
    assert _run(tmp_path, loaded=loaded) == "30.0"
    assert loaded == [False, True, True, False]
    monkeypatch.syspath_prepend(str(tmp_path))  # as the runs had it: rule is found, other is not
    want = {tmp_path / "kern.py", tmp_path / "rule.py", Path(jit.__file__)}
    assert set(jit.reach(tmp_path / "kern.py")) == {p.resolve() for p in want}


ENTRY_RUN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    d = Path(sys.argv[1])
    sys.path.insert(0, str(d))
    import engine.jit as J
    J.core_files = lambda: (d / "strat.py", d / "entry.py")
    import entry
    e = entry.make()
    print(e.ctypes(1.0))
    print(e.cache_hits, file=sys.stderr)
    """
)


def test_a_c_entry_recompiles_when_the_strategy_it_calls_is_edited(tmp_path):
    """A strategy's C entry (engine.jit.cfunc, as engine/strategies/registry.py makes them) is cached
    under the stamp of what it calls: an edited strategy is never served from the old entry."""
    strat = "from engine.jit import njit\n\n@njit\ndef quote(x):\n    return x + {}\n"
    (tmp_path / "strat.py").write_text(strat.format(1.0))
    (tmp_path / "entry.py").write_text(
        "from numba import types\nfrom engine.jit import cfunc\nimport strat\n\n"
        "def _entry(x):\n    return strat.quote(x) * 10\n\n"
        "def make():\n    return cfunc(types.float64(types.float64))(_entry)\n"
    )

    def run() -> tuple[str, bool]:
        p = subprocess.run(
            [sys.executable, "-c", ENTRY_RUN, str(tmp_path)], capture_output=True, text=True, check=True
        )
        return p.stdout.strip(), p.stderr.split()[-1] != "0"

    assert run() == ("20.0", False)
    assert run() == ("20.0", True)  # loaded from the disk cache
    (tmp_path / "strat.py").write_text(strat.format(2.0))  # entry.py's own text is unchanged
    assert run() == ("30.0", False)


def test_the_compiled_loops_reach_every_rule_they_run():
    """The replay loop's stamp covers the rules, fill and latency models it compiles in; a compiled
    helper it never calls (the book source's row gatherer) is outside it, and so are the strategies
    and the risk rules, which it calls through their entries' addresses: the stamps of their entries'
    modules cover them."""

    def reached(loop: str) -> set[str]:
        return {p.relative_to(jit.ROOT).as_posix() for p in jit.reach(jit.ROOT / loop)}

    strategies = {"engine/strategies/baseline.py", "engine/strategies/imbalance_lean.py"}
    for loop in ("replay/kernel.py", "engine/kernel/__init__.py", "venue/kernel.py"):
        assert not strategies & reached(loop), loop
        assert "engine/risk.py" not in reached(loop), loop
    assert strategies <= reached("engine/strategies/registry.py")
    risk_rules = {"engine/risk.py", "engine/risk_codes.py", "engine/book.py", "engine/exact.py"}
    assert risk_rules <= reached("engine/risk.py")
    core = {p.relative_to(jit.ROOT).as_posix() for p in jit.core_files()}
    assert {"engine/strategies/registry.py", "engine/risk.py"} <= core
    replay_rules = {
        "engine/kernel/__init__.py",
        "engine/risk_codes.py",
        "engine/risk_call.py",
        "engine/strategies/call.py",
        "engine/kev/rules.py",
        "engine/kev/pairs.py",
        "venue/fills.py",
        "venue/matching.py",
        "venue/kernel.py",
    }
    assert replay_rules <= reached("replay/kernel.py"), replay_rules - reached("replay/kernel.py")
    engine_rules = {"engine/risk_codes.py", "engine/strategy.py", "engine/kev/queue.py", "engine/exact.py"}
    assert engine_rules <= reached("engine/kernel/__init__.py")
    assert "replay/book_source.py" not in reached("replay/kernel.py")


def test_installed_into_site_packages_the_project_is_still_followed(monkeypatch):
    """A non-editable install puts the project among the interpreter's libraries, which are not
    followed: its own packages still are, so a new release's rules reach the cached loop's stamp."""
    monkeypatch.setattr(jit, "_OUTSIDE", (*jit._OUTSIDE, jit.ROOT))
    jit._home.cache_clear()
    jit._imports.cache_clear()
    try:
        reached = {p.relative_to(jit.ROOT).as_posix() for p in jit.reach(jit.ROOT / "replay/kernel.py")}
        assert {"engine/risk_codes.py", "venue/fills.py", "engine/strategies/call.py"} <= reached
    finally:
        jit._home.cache_clear()
        jit._imports.cache_clear()
    pyproject = tomllib.loads((jit.ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert set(jit.OWN) == {p.rstrip("*") for p in include}


def test_plain_numba_caching_would_serve_the_stale_rule(tmp_path):
    # Why engine.jit exists: numba stamps a cache with its own file only.
    _module_pair(tmp_path, "import numba", "numba.njit(cache=True)", 1.0)
    assert _run(tmp_path, "plain") == "20.0"
    (tmp_path / "rule.py").write_text(
        "import numba\n\n@numba.njit(cache=True)\ndef rule(x):\n    return x + 2.0\n"
    )
    assert _run(tmp_path, "plain") == "20.0"


def test_the_core_is_every_module_compiled_through_engine_jit():
    root = jit.ROOT
    names = {p.relative_to(root).as_posix() for p in jit.core_files()}
    for core in (
        "engine/risk.py",
        "engine/strategy.py",
        "engine/kev/rules.py",
        "venue/fills.py",
        "replay/kernel.py",
    ):
        assert core in names
    # nothing in the tree compiles with its own cache stamp
    stray = [
        p.relative_to(root).as_posix()
        for top in ("engine", "venue", "replay", "live", "recorder", "wire")
        for p in (root / top).rglob("*.py")
        if "cache=True" in p.read_text() and p.name != "jit.py"
    ]
    assert not stray, stray


# ---------------------------------------------------------------------------------------------------
# compiled without reference counting (engine.jit.njit's default)


def test_without_nrt_no_reference_is_taken_or_lost():
    @njit(cache=False)
    def touch(a, b):
        a[0] += b[1, 0]
        return a.shape[0]

    @njit(cache=False, nrt=True)
    def entry(a, b):
        scratch = np.zeros(2)  # an entry may make arrays
        n = 0
        for _ in range(1000):
            n += touch(a, b[:, 1:])  # views made here and handed down
        return n + scratch.shape[0]

    a, b = np.zeros(3), np.ones((4, 3))
    before = sys.getrefcount(a), sys.getrefcount(b)
    for _ in range(100):
        assert touch(a, b) == 3 and entry(a, b) == 3002
    assert (sys.getrefcount(a), sys.getrefcount(b)) == before
    assert a[0] == 100 + 100 * 1000


def test_without_nrt_a_function_cannot_make_an_array():
    @njit(cache=False)
    def make(n):
        return np.zeros(n).sum()

    with pytest.raises(numba.core.errors.TypingError):
        make(3)


def test_without_nrt_returning_an_array_is_refused():
    @njit(cache=False)
    def same(a):
        a[0] = 1.0
        return a  # numba allows an argument back (a view it refuses itself); its caller would drop it

    with pytest.raises(TypeError, match="compiled without nrt and returns"):
        same(np.zeros(3))

    @njit(cache=False, inline="always")
    def inlined_view(a):  # its body becomes its caller's: allowed
        return a[1:]

    @njit(cache=False)
    def caller(a):
        return inlined_view(a)[0]

    assert caller(np.arange(3.0)) == 1.0


def test_without_nrt_calling_a_function_that_returns_an_array_is_refused():
    @njit(cache=False, nrt=True)
    def fresh(n):
        return np.zeros(n)

    @njit(cache=False)
    def leaks(n):
        return fresh(n).shape[0]

    with pytest.raises(Exception, match="calls .*fresh, which returns an array"):
        leaks(3)
    assert fresh(2).shape == (2,)  # from Python it is fine


def test_without_nrt_leaving_compiled_code_is_refused():
    # numba would hand the interpreter the array a view was taken from, not the view
    def show(a):
        return float(a.sum())

    def leaves(b):
        with numba.objmode(s="float64"):
            s = show(b[2:])
        return s

    with pytest.raises(TypeError, match="objmode"):
        njit(cache=False)(leaves)
    assert njit(cache=False, nrt=True)(leaves)(np.arange(10.0)) == 44.0


def test_a_process_started_outside_the_checkout_stamps_the_same_sources(tmp_path):
    """Where the interpreter was started must not change what a cache's stamp covers: an editable
    install imports the project through an import hook, and a process started outside the checkout
    (a notebook's folder, a shell elsewhere) once followed none of the kernel's imports: its caches
    were stamped with their own file alone, so an edited rule was served from the old cache, and each
    such process and one started in the checkout recompiled the loop after the other."""
    script = (
        "from engine import jit\n"
        "print('\\n'.join(str(p) for p in jit.reach(jit.ROOT / 'replay/kernel.py')))\n"
        "print(jit.stamp_of(jit.ROOT / 'replay/kernel.py'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True, timeout=120
    ).stdout.split("\n")
    here = [str(p) for p in jit.reach(jit.ROOT / "replay/kernel.py")]
    assert out[: len(here)] == here
    assert out[len(here)] == jit.stamp_of(jit.ROOT / "replay/kernel.py")
    assert any(p.endswith("engine/risk_codes.py") for p in here)  # what the loop calls is followed
