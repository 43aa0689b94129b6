"""A module as it was at a git revision, loaded beside this tree's: the peer a bench alternates with."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def child_env() -> dict[str, str]:
    """The environment the bench was started with, for the processes it runs: without what importing
    this tree set in it (Arrow's memory pool, engine/__init__.py), which a peer tree would otherwise
    inherit and be measured with."""
    import engine

    env = dict(os.environ)
    if getattr(engine, "ARROW_POOL_SET_HERE", False):
        env.pop("ARROW_DEFAULT_MEMORY_POOL", None)
    return env


def module_at(rev: str, rel: str) -> ModuleType:
    """``rel`` (a path in the repository, e.g. ``replay/walk.py``) at ``rev``, as a module of its own
    name (``walk_<rev>``); what it imports comes from this tree."""
    src = subprocess.run(
        ["git", "show", f"{rev}:{rel}"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    name = f"{Path(rel).stem}_{rev}"
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(src.stdout)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def tree_at(rev: str) -> Path:
    """A checkout of the whole repository at ``rev`` (a detached git worktree in a temporary folder),
    for a bench that runs the peer's code end to end in a process of its own (``cwd`` the tree). Its
    compiled code is cached there: the peer's first run is cold, as this tree's first run is."""
    path = Path(tempfile.mkdtemp(prefix=f"peer-{rev}-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), rev], cwd=ROOT, check=True)
    return path


def drop_tree(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


@contextlib.contextmanager
def peer_tree(rev: str | None) -> Iterator[Path | None]:
    """:func:`tree_at` ``rev`` for the ``with`` block, removed after it; None when ``rev`` is None."""
    path = tree_at(rev) if rev else None
    try:
        yield path
    finally:
        if path is not None:
            drop_tree(path)
