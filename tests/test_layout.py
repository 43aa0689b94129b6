"""engine/ is the shared core: it imports neither replay/, recorder/ nor live/ (checked on the source)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("replay", "recorder", "live", "dualhub")


def test_engine_imports_no_application_package():
    offenders = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in FORBIDDEN
            ]
    assert not offenders, "engine must not import application packages:\n" + "\n".join(offenders)
