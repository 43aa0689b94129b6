"""Optional dependencies: which extra of ``pyproject.toml`` installs each one, so a command that needs
one that is missing says, in one line, the ``pip install`` that fixes it (never a traceback).

``dualhub/cli.py`` turns a ``ModuleNotFoundError`` for any module named here into that line; a command
can also call :func:`need` up front, before it does work it would then throw away.

And the optional hardware: on a machine with no GPU, Laya's CUDA fallback is one quiet line
(:func:`quiet_cuda_fallback`), not a warning on every command.
"""

from __future__ import annotations

import importlib.util
import logging

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


class _CpuOnlyMachine:
    """A logging filter: on a machine without a GPU, Laya's CUDA-fallback warning tells the user
    nothing they can act on; it becomes one quiet line saying CPU runs (`dualhub doctor` keeps the
    detail), once per process."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or "fell back to CPU" not in record.getMessage():
            return True
        if not _CpuOnlyMachine.said:
            _CpuOnlyMachine.said = True
            # stdout: a note, not an error (stderr stays one line when a command fails)
            print("Laya runs on CPU (no GPU on this machine; `dualhub doctor` for details)", flush=True)
        return False


_CPU_ONLY = _CpuOnlyMachine()


def quiet_cuda_fallback() -> None:
    """Install that filter where it applies (no NVIDIA device): the console command does, and so does
    each sweep worker, a process of its own."""
    log = logging.getLogger("engine.laya.model")
    if not has_nvidia_gpu() and _CPU_ONLY not in log.filters:
        log.addFilter(_CPU_ONLY)


def loud_cuda_fallback() -> None:
    """Take that filter away again (a command's end, in a process that goes on)."""
    logging.getLogger("engine.laya.model").removeFilter(_CPU_ONLY)
