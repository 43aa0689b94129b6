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

PACKAGES = ("engine", "wire", "venue", "analysis", "doctor", "recorder", "replay", "live", "dualhub")

# The packages are layers: each imports only packages of layers below its own, never one beside or above
# it (checked below), so no two packages import each other.
LAYERS = (
    ("engine",),
    ("wire",),
    ("venue",),
    ("analysis", "doctor"),
    ("recorder", "replay"),
    ("live",),
    ("dualhub",),
)

# What each package may import besides itself (all of it below it, by LAYERS).
ALLOWED = {
    "engine": set(),  # the decision core and what it stands on (the latency models too)
    "wire": {"engine"},  # the engine's foundations alone: see WIRE_FROM_ENGINE
    "venue": {"engine", "wire"},  # wire: the local Bitget servers speak the codecs
    "analysis": {"engine"},
    "doctor": {"engine", "wire"},  # wire: the exchange's REST address
    "recorder": {"engine", "wire", "venue"},  # venue: `dualhub serve` runs the local public server
    "replay": {"engine", "venue", "analysis"},  # analysis: the report and the run's views
    "live": {"engine", "venue", "wire", "recorder"},  # recorder: the public feed recorded as a session
    "dualhub": {"engine", "doctor"},
}
# The codecs turn frames into the engine's typed events (validated by its rules) and the journal fsyncs:
# what wire takes from the engine is its foundations, never the decision core (kernel, risk, Kev ...).
WIRE_FROM_ENGINE = (
    "engine.events",
    "engine.validate",
    "engine.contract",
    "engine.errors",
    "engine.fastinit",
    "engine.jit",
    "engine.store",
)


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


def test_the_map_imports_only_downwards():
    layer = {top: i for i, tops in enumerate(LAYERS) for top in tops}
    assert sorted(layer) == sorted(PACKAGES) and set(ALLOWED) == set(PACKAGES)
    upwards = [
        f"{top} -> {other}" for top, below in ALLOWED.items() for other in below if layer[other] >= layer[top]
    ]
    assert not upwards, "the map lets a package import one beside or above it:\n" + "\n".join(upwards)


def test_wire_takes_only_codecs_and_file_helpers_from_the_engine():
    offenders = [
        f"{rel}:{line} {name}"
        for rel, line, name in _imports("wire")
        if name.split(".")[0] == "engine" and not _within(name, WIRE_FROM_ENGINE)
    ]
    assert not offenders, f"wire may import only {WIRE_FROM_ENGINE} of engine:\n" + "\n".join(offenders)


def test_the_map_covers_every_package_and_the_rules_hold_on_the_real_tree():
    # a new top-level package must get a line here (and in docs/ARCHITECTURE.md)
    # (tests/ has an __init__.py too, only so that its modules get unique names: it is no part of the map)
    tops = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert tops == set(PACKAGES), f"top-level packages {sorted(tops)} != the map's {sorted(PACKAGES)}"
    # the checks above read real imports: each allowed edge that matters is in use
    used = {(top, n.split(".")[0]) for top in PACKAGES for _, _, n in _imports(top)}
    assert {
        ("wire", "engine"),
        ("venue", "wire"),
        ("doctor", "wire"),
        ("replay", "analysis"),
        ("dualhub", "doctor"),
        ("live", "wire"),
        ("recorder", "wire"),
        ("replay", "venue"),
    } <= used


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


# -- Units a reader can hold ------------------------------------------------------------------------
# No source file over MAX_FILE_LINES lines and no function with more than MAX_PARAMETERS parameters
# (a method's self/cls not counted): a function that needs more takes a record. The files and functions
# over the limits when the rule came in are named below with their size then as a ceiling: they may
# shrink, never grow, and an entry leaves the list once it is within the limit (the test says so).
# The import graph (every import, lazy ones too) has no loop beyond the LEGACY_CYCLES, which may only
# lose modules.

MAX_FILE_LINES = 800
MAX_PARAMETERS = 8

LEGACY_LONG_FILES: dict[str, int] = {}
LEGACY_WIDE_FUNCTIONS: dict[str, int] = {
    "engine/risk.py::verdict": 34,
    "wire/bitget/bitget_v2_fast.py::scan_block": 33,
    "replay/kernel.py::run_pf": 30,
    "engine/kernel/label.py::_on_label": 27,
    "replay/kernel.py::_pf_entry_at": 28,
    "engine/kernel/steps.py::step_timer": 25,
    "engine/kernel/timers.py::_engine_timer": 24,
    "engine/kernel/kev.py::_offer_kev": 24,
    "engine/kernel/orders.py::_send_new": 24,
    "engine/kernel/steps.py::step_label": 24,
    "replay/kernel.py::_timer": 24,
    "engine/kernel/steps.py::step_command": 21,
    "engine/kernel/steps.py::step_command_part": 21,
    "engine/kernel/report.py::_engine_report": 20,
    "engine/kernel/steps.py::step_report": 20,
    "engine/kernel/kev.py::_kev_pump": 19,
    "engine/kernel/orders.py::_check_new": 21,
    "engine/kernel/steps.py::step_hedge": 18,
    "engine/kernel/orders.py::_requote": 17,
    "venue/bitget/public_server.py::BitgetServer.__init__": 20,
    "engine/kernel/orders.py::_rebalance": 16,
    "engine/kernel/steps.py::step_rebalance": 15,
    "replay/kernel.py::_timer_pf_at": 16,
    "engine/kernel/steps.py::step_flatten": 14,
    "venue/bitget/exchange.py::LocalExchange.__init__": 17,
    "engine/kernel/kev.py::_kev_start_next": 12,
    "replay/kernel.py::_room": 15,
    "replay/kernel.py::run_all_pf": 13,
    "venue/matching.py::trade_fills": 15,
    "wire/connection.py::ReconnectLoop.__init__": 15,
    "engine/kernel/rows.py::_risk_row": 12,
    "replay/finish.py::_finish": 14,
    "engine/kernel/timers.py::_apply_command": 11,
    "engine/kernel/heap.py::_heap_insert": 12,
    "engine/kernel/report.py::_on_fill": 11,
    "engine/state.py::CoreState.__init__": 13,
    "engine/strategies/baseline.py::quote_prices": 13,
    "venue/kernel.py::x_arrive": 12,
    "engine/kernel/heap.py::_heap_push": 11,
    "replay/portfolio.py::_run_compiled": 12,
    "replay/ray_sweep.py::ray_sweep": 12,
    "replay/walk.py::_merge": 12,
    "venue/kernel.py::x_on_trade": 11,
    "venue/matching.py::book_fills": 12,
    "engine/kernel/rows.py::_order_event": 9,
    "engine/kernel/steps.py::step_warm": 11,
    "wire/bitget/bitget_v2_rest.py::place_order_body": 11,
    "venue/kernel.py::_report": 10,
    "engine/core.py::Engine.__init__": 10,
    "engine/kernel/rows.py::_headroom": 10,
    "engine/kernel/rows.py::headroom": 10,
    "engine/kev/pairs.py::pairs_decide": 10,
    "engine/laya/training.py::fit_export": 10,
    "engine/risk.py::slippage_ok": 10,
    "engine/strategies/call.py::_call_entry": 10,
    "engine/strategies/call.py::_compiled": 10,
    "engine/strategies/call.py::_compiled_entry": 10,
    "engine/strategies/call.py::_compiled_entry.impl": 10,
    "engine/strategies/call.py::quote": 10,
    "wire/bitget/bitget_v2_books.py::encode_books": 10,
    "replay/driver.py::_run_replay": 10,
    "replay/fast_path.py::run_kernel": 10,
    "replay/kernel.py::_leave": 10,
    "replay/sweep.py::sweep": 10,
    "venue/kernel.py::_report_fill": 9,
    "venue/kernel.py::_x_fill": 9,
    "venue/kernel.py::x_on_book": 9,
    "venue/matching.py::match_arrival": 10,
    "engine/kev/rules.py::_key": 9,
    "engine/kev/rules.py::rule_decide": 9,
    "engine/laya/features_v1.py::_feed": 9,
    "engine/risk_call.py::_call_entry": 9,
    "engine/risk_exact.py::_net_terms": 9,
    "engine/strategies/plugin.py::call": 9,
    "engine/strategies/quoter.py::desired_quotes": 9,
    "engine/strategies/registry.py::_entry_baseline": 9,
    "engine/strategies/registry.py::_entry_imbalance_lean": 9,
    "engine/strategies/registry.py::quote": 9,
    "engine/validate.py::wire_book_code": 9,
    "engine/validate.py::wire_trades_code": 9,
    "live/gateway.py::GatewayExecution.__init__": 9,
    "live/private_ws.py::PrivateStream.__init__": 9,
    "replay/driver.py::_run_kernel": 9,
    "replay/fast_path.py::run_portfolio_kernel": 9,
    "replay/tape_stream.py::StreamedTape.__init__": 9,
    "replay/train_cli.py::train": 9,
    "venue/fills.py::on_depth": 9,
    "venue/fills.py::on_trade": 9,
    "venue/simulator.py::_SymbolSim.__init__": 9,
}
LEGACY_CYCLES: list[set[str]] = []


def _sources() -> list[Path]:
    return sorted(p for top in PACKAGES for p in (ROOT / top).rglob("*.py"))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    n = len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return n - 1 if method and names and names[0] in ("self", "cls") else n


def _function_widths() -> dict[str, int]:
    """``path::Outer.name`` -> parameters, for every def in the packages (nested ones too; a name defined
    twice counts its widest)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, rel: str, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                key = f"{rel}::{prefix}{child.name}"
                out[key] = max(out.get(key, 0), _parameters(child, in_class))
                visit(child, rel, f"{prefix}{child.name}.", False)
            elif isinstance(child, ast.ClassDef):
                visit(child, rel, f"{prefix}{child.name}.", True)
            else:
                visit(child, rel, prefix, in_class)

    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        visit(ast.parse(path.read_text(), filename=str(path)), rel, "", False)
    return out


def _module_graph() -> dict[str, set[str]]:
    """module -> the repository's modules it imports (any import statement, lazy ones too)."""
    files = {}
    for path in _sources():
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                # `from analysis import tearsheet` imports the module analysis.tearsheet
                deps |= {
                    resolve(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base) for a in node.names
                }
        graph[mod] = {d for d in deps if d is not None and d != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.add(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_no_source_file_grows_past_the_line_limit():
    offenders, stale = [], []
    for path in _sources():
        rel, n = path.relative_to(ROOT).as_posix(), _lines(path)
        ceiling = LEGACY_LONG_FILES.get(rel, MAX_FILE_LINES)
        if n > ceiling:
            offenders.append(f"{rel}: {n} lines > {ceiling}")
        elif rel in LEGACY_LONG_FILES and n <= MAX_FILE_LINES:
            stale.append(f"{rel}: {n} lines, within the limit: remove it from LEGACY_LONG_FILES")
    stale += [
        f"{rel}: gone: remove it from LEGACY_LONG_FILES"
        for rel in LEGACY_LONG_FILES
        if not (ROOT / rel).is_file()
    ]
    assert not offenders, (
        f"source files over {MAX_FILE_LINES} lines (a legacy file over its ceiling): split them by job:\n"
        + "\n".join(offenders)
    )
    assert not stale, "\n".join(stale)


def test_no_function_takes_more_parameters_than_the_limit():
    widths = _function_widths()
    offenders, stale = [], []
    for key, n in sorted(widths.items()):
        ceiling = LEGACY_WIDE_FUNCTIONS.get(key, MAX_PARAMETERS)
        if n > ceiling:
            offenders.append(f"{key}: {n} parameters > {ceiling}")
        elif key in LEGACY_WIDE_FUNCTIONS and n <= MAX_PARAMETERS:
            stale.append(f"{key}: {n} parameters, within the limit: remove it from LEGACY_WIDE_FUNCTIONS")
    stale += [
        f"{key}: gone: remove it from LEGACY_WIDE_FUNCTIONS"
        for key in LEGACY_WIDE_FUNCTIONS
        if key not in widths
    ]
    assert not offenders, (
        f"functions over {MAX_PARAMETERS} parameters (a legacy one over its ceiling): pass a record:\n"
        + "\n".join(offenders)
    )
    assert not stale, "\n".join(stale)


def test_the_import_graph_has_no_loop_beyond_the_legacy_ones():
    found = _cycles(_module_graph())
    new = [sorted(c) for c in found if not any(c <= legacy for legacy in LEGACY_CYCLES)]
    assert not new, "import loops (break them: the shared part into a module both import):\n" + "\n".join(
        " <-> ".join(c) for c in new
    )
    gone = [sorted(legacy) for legacy in LEGACY_CYCLES if not any(c <= legacy for c in found)]
    assert not gone, "legacy import loops that are gone: remove them from LEGACY_CYCLES:\n" + "\n".join(
        " <-> ".join(c) for c in gone
    )


def test_the_layout_checks_see_what_they_are_meant_to():
    # the checks above must be able to fail: each finds what it looks for in a known shape
    src = "def f(a, b, /, c, *d, e, **g):\n    class K:\n        def m(self, x): ...\n"
    tree = ast.parse(src)
    f = tree.body[0]
    k = f.body[0]
    assert _parameters(f, method=False) == 6 and _parameters(k.body[0], method=True) == 1
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert "engine/kev/llama.py::LlamaAdvisor.request_body" in _function_widths()
    graph = _module_graph()
    assert (
        "engine.kev.prompt" in graph["engine.kev.llama"] and "engine.kev.breaker" in graph["engine.kev.llama"]
    )


if __name__ == "__main__":
    # `python -m tests.test_layout`: the legacy lists as the tree is now (to shrink a ceiling after a split)
    sizes = {p.relative_to(ROOT).as_posix(): _lines(p) for p in _sources()}
    print("LEGACY_LONG_FILES:", {k: n for k, n in sorted(sizes.items()) if n > MAX_FILE_LINES})
    wide = _function_widths()
    print("LEGACY_WIDE_FUNCTIONS:", {k: n for k, n in sorted(wide.items()) if n > MAX_PARAMETERS})
    print("LEGACY_CYCLES:", [sorted(c) for c in _cycles(_module_graph())])
