"""The package tree is the architecture: which top-level package may import which (checked on the source).

``docs/ARCHITECTURE.md`` ("Packages") has the same map in words. Every ``import``/``from`` statement
counts, lazy ones inside functions too; ``dualhub/cli.py`` reaches the subcommand modules by name
(``importlib``), which is the one way in from ``dualhub``.

The tests mirror the same tree: ``tests/engine/kev/test_kev_queue.py`` tests ``engine/kev/queue.py``, and
a test file sits in the folder of the package it tests, never flat in ``tests/`` (checked here too).
"""

import ast
from pathlib import Path

from tests.helpers import REPO as ROOT

PACKAGES = ("engine", "venue", "wire", "recorder", "replay", "live", "dualhub")

# What each package may import besides itself. ``engine`` importing ``venue`` is safe only because
# ``venue`` imports no application package (it sits below them all, beside ``engine``).
ALLOWED = {
    "engine": {"venue"},  # the latency models alone: see ENGINE_FROM_VENUE
    "venue": {"engine"},
    "wire": {"engine"},  # codecs and file helpers alone: see WIRE_FROM_ENGINE
    "recorder": {"engine", "wire", "venue"},  # venue: `dualhub serve` runs the local public server
    "replay": {"engine", "venue"},
    "live": {"engine", "venue", "wire", "recorder"},  # recorder: the public feed recorded as a session
    "dualhub": {"engine"},
}
# The engine delays Laya labels and Kev answers by a latency model (and records them live).
ENGINE_FROM_VENUE = ("venue.latency", "venue.recorded_latency")
# The connection speaks Bitget's public protocol (engine.venues) and the journal fsyncs (engine.store).
WIRE_FROM_ENGINE = ("engine.venues", "engine.store")


def _imports(top: str) -> list[tuple[str, int, str]]:
    """(file, line, imported module) for every absolute import in package ``top``."""
    found = []
    for path in sorted((ROOT / top).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found += [(rel, node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from venue import simulator` names the module venue.simulator
                found += [(rel, node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_every_package_imports_only_what_the_map_allows():
    offenders = []
    for top in PACKAGES:
        for rel, line, name in _imports(top):
            other = name.split(".")[0]
            if other in PACKAGES and other != top and other not in ALLOWED[top]:
                offenders.append(f"{rel}:{line} {name} ({top} may import {sorted(ALLOWED[top])})")
    assert not offenders, "imports against the package map:\n" + "\n".join(offenders)


def test_engine_takes_only_latency_models_from_the_venue():
    offenders = [
        f"{rel}:{line} {name}"
        for rel, line, name in _imports("engine")
        if name.split(".")[0] == "venue" and not _within(name, ENGINE_FROM_VENUE)
    ]
    assert not offenders, "engine may import only the venue's latency models:\n" + "\n".join(offenders)


def test_wire_takes_only_codecs_and_file_helpers_from_the_engine():
    offenders = [
        f"{rel}:{line} {name}"
        for rel, line, name in _imports("wire")
        if name.split(".")[0] == "engine" and not _within(name, WIRE_FROM_ENGINE)
    ]
    assert not offenders, "wire may import only engine.venues and engine.store:\n" + "\n".join(offenders)


def test_the_map_covers_every_package_and_the_rules_hold_on_the_real_tree():
    # a new top-level package must get a line here (and in docs/ARCHITECTURE.md)
    # (tests/ has an __init__.py too, only so that its modules get unique names: it is no part of the map)
    tops = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert tops == set(PACKAGES), f"top-level packages {sorted(tops)} != the map's {sorted(PACKAGES)}"
    # the checks above read real imports: each allowed edge that matters is in use
    used = {(top, n.split(".")[0]) for top in PACKAGES for _, _, n in _imports(top)}
    assert {("engine", "venue"), ("live", "wire"), ("recorder", "wire"), ("replay", "venue")} <= used


# Tests mirror the package tree. These whole-repository tests alone sit in tests/ itself (this one reads
# every package's source); every other test file lives in tests/<package>/..., a folder of the repository
# that is a package (its __init__.py) or one of the folders below, which hold no package of their own.
ROOT_LEVEL_TESTS = {"test_layout.py"}
MIRRORED_FOLDERS = {"notebooks"}  # tests/notebooks/: the notebooks run headless


def test_tests_mirror_the_package_tree():
    tests = ROOT / "tests"
    offenders = []
    for path in sorted({*tests.rglob("test_*.py"), *tests.rglob("*_test.py")}):  # what pytest collects
        rel = path.relative_to(tests)
        where = rel.parent
        if where == Path("."):
            if rel.name not in ROOT_LEVEL_TESTS:
                offenders.append(
                    f"tests/{rel}: flat in tests/; move it to tests/<package>/, the folder of what it tests"
                )
        elif where.parts[0] in PACKAGES:
            if not (ROOT / where / "__init__.py").is_file():
                offenders.append(f"tests/{rel}: {where}/ is not a package of the repository")
        elif where.parts[0] in MIRRORED_FOLDERS:
            if not (ROOT / where).is_dir():
                offenders.append(f"tests/{rel}: {where}/ is not a folder of the repository")
        else:
            offenders.append(
                f"tests/{rel}: {where.parts[0]}/ is neither a package nor one of {sorted(MIRRORED_FOLDERS)}"
            )
    # every folder of tests/ is a package, so that test modules of the same name in two folders never collide
    for folder in sorted({tests, *(p.parent for p in tests.rglob("*.py"))}):
        if not (folder / "__init__.py").is_file():
            offenders.append(f"{folder.relative_to(ROOT)}/ has no __init__.py")
    assert not offenders, "tests/ must mirror the package tree:\n" + "\n".join(offenders)
