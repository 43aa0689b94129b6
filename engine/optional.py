"""Optional dependencies: which extra of ``pyproject.toml`` installs each one, so a command that needs
one that is missing says, in one line, the ``pip install`` that fixes it (never a traceback).

``dualhub/cli.py`` turns a ``ModuleNotFoundError`` for any module named here into that line; a command
can also call :func:`need` up front, before it does work it would then throw away.
"""

from __future__ import annotations

import importlib.util

from engine.errors import DualhubError

# module imported -> the extra that installs it. `research` (what README command 1 installs) holds
# everything the README's own commands need; `train` and `scale` are its smaller parts.
EXTRA_OF = {
    "matplotlib": "research",
    "jupyterlab": "research",
    "nbclient": "research",
    "nbformat": "research",
    "ipykernel": "research",
    "sklearn": "train",
    "threadpoolctl": "train",
    "onnx": "train",
    "ray": "scale",
}

# the distribution a module comes from, where the names differ
_DIST = {"sklearn": "scikit-learn"}


class MissingDependency(DualhubError):
    """An optional dependency that is not installed."""


def install_hint(module: str) -> str:
    """The one line naming the ``pip install`` that brings ``module`` (top-level name) in."""
    top = module.split(".", 1)[0]
    extra = EXTRA_OF.get(top, "research")
    dist = _DIST.get(top, top)
    return (
        f"{dist} is not installed; install it with: pip install -e '.[{extra}]' "
        f"(in the clone; or pip install '{dist}')"
    )


def is_optional(module: str | None) -> bool:
    return bool(module) and module.split(".", 1)[0] in EXTRA_OF  # type: ignore[union-attr]


def need(*modules: str) -> None:
    """Refuse, before any work, a command whose optional dependencies are not all installed."""
    for m in modules:
        if importlib.util.find_spec(m) is None:
            raise MissingDependency(install_hint(m))


def has_nvidia_gpu() -> bool:
    """Whether this machine has an NVIDIA device node at all: without one, CUDA cannot be what a
    command is missing, and its fallback to CPU is no news (`dualhub doctor` still reports it)."""
    from pathlib import Path

    return any(Path("/dev").glob("nvidia[0-9]*"))
