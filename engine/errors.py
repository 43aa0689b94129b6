"""The base of every error meant for the user: the CLI prints its message as one line, no traceback."""

from __future__ import annotations

import os
from pathlib import Path


class DualhubError(Exception):
    """A problem the user can act on (bad input, missing file, wrong model). The message says what to do."""


def check_output_path(path: Path | str, *, directory: bool) -> None:
    """Refuse, before any work, an output that cannot be created: a file where a directory goes (or
    the reverse), or a nearest existing parent that is a file or not writable."""
    path = Path(path)
    if path.exists() and path.is_dir() != directory:
        kind = "a file" if directory else "a directory"
        raise DualhubError(f"{path} is {kind}; choose another output path")
    parent = next(p for p in path.absolute().parents if p.exists())
    if not parent.is_dir():
        raise DualhubError(f"cannot create {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DualhubError(f"cannot create {path}: {parent} is not writable")


def os_error_text(e: OSError) -> str:
    """``strerror: filename`` (both names for a rename) as one line."""
    names = [str(f) for f in (e.filename, e.filename2) if f is not None]
    return ": ".join([e.strerror or str(e) or type(e).__name__, *names])
