"""What every importer shares: reading the input file (gzip by its magic bytes, never by its name),
one-line errors for bad files, and an output directory that only appears once it is complete."""

from __future__ import annotations

import contextlib
import gzip
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np

from engine.contract import data_spec
from engine.errors import DualhubError, check_output_path, os_error_text

GZIP_MAGIC: Final = b"\x1f\x8b"
# compressions we do not read: refused by name instead of parsed as garbage
OTHER_MAGIC: Final = {
    b"\x28\xb5\x2f\xfd": "zstd",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"PK\x03\x04": "zip",
}


class ImportInputError(DualhubError):
    """An input file an importer cannot use (missing, empty, corrupt, another format)."""


Progress = Callable[[int, int], None]  # (bytes of the file read so far, its size)
PROGRESS_EVERY: Final = 1 << 16  # lines between two progress calls: a call costs far more than a line


def terminal_bar(path: Path) -> tuple[Progress, Callable[[], None]] | None:
    """A progress bar of the file read so far on a terminal (``(update, close)``); None when stdout is
    not one (piped, a bar draws nothing but noise)."""
    import sys

    if not sys.stdout.isatty():
        return None
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    bar = Progress(f"[bold]import[/] {path.name}", BarColumn(), DownloadColumn(), TimeRemainingColumn())
    task = bar.add_task("read", total=path.stat().st_size)
    bar.start()
    return (lambda done, total: bar.update(task, completed=done)), bar.stop


def read_lines(path: Path | str, progress: Progress | None = None) -> Iterator[tuple[int, bytes]]:
    """``(line number, line without EOL)`` of a plain or gzip file, empty lines skipped. A missing,
    empty, corrupt or truncated file raises :class:`ImportInputError` (also midway through).
    ``progress`` is told the bytes of the file read (compressed, for gzip) every PROGRESS_EVERY lines
    and at the end; by default a bar on a terminal shows them."""
    p = Path(path)
    close: Callable[[], None] | None = None
    if progress is None and p.is_file() and (tb := terminal_bar(p)) is not None:
        progress, close = tb
    try:
        yield from _lines(p, progress)
    finally:
        if close is not None:
            close()


def _lines(p: Path, progress: Progress | None) -> Iterator[tuple[int, bytes]]:
    if not p.is_file():
        raise ImportInputError(f"{p}: no such file" if not p.exists() else f"{p}: not a regular file")
    try:
        with open(p, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise ImportInputError(f"cannot read: {os_error_text(e)}") from None
    if not head:
        raise ImportInputError(f"{p}: the file is empty")
    for magic, name in OTHER_MAGIC.items():
        if head.startswith(magic):
            raise ImportInputError(
                f"{p}: {name}-compressed; decompress it first (plain text or gzip is read)"
            )
    gz = head.startswith(GZIP_MAGIC)
    n = data = 0
    size = p.stat().st_size
    try:
        with open(p, "rb") as raw, gzip.GzipFile(fileobj=raw) if gz else raw as f:
            for n, line in enumerate(f, 1):
                line = line.rstrip(b"\r\n")
                if line:
                    data += 1
                    yield n, line
                if progress is not None and n % PROGRESS_EVERY == 0:
                    progress(raw.tell(), size)  # the compressed bytes taken: a true share of the file
            if progress is not None:
                progress(size, size)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise ImportInputError(f"{p}: truncated or corrupt gzip after {n} lines ({e})") from None
    except OSError as e:
        raise ImportInputError(f"cannot read: {os_error_text(e)}") from None
    if not data:
        what = "after decompression" if n == 0 else "(blank lines only)"
        raise ImportInputError(f"{p}: the file is empty {what}")


@contextlib.contextmanager
def staged_dir(out: Path | str) -> Iterator[Path]:
    """Yield ``<out>.tmp`` to write into; renamed to ``out`` when the block ends normally, removed when
    it raises (Ctrl-C included). ``out`` must not exist yet, or be an empty directory."""
    final = Path(out)
    check_output_path(final, directory=True)
    if final.exists() and not (final.is_dir() and not any(final.iterdir())):
        raise ImportInputError(f"--out {final} already exists and is not an empty directory")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        if final.exists():
            final.rmdir()
        tmp.rename(final)
    except OSError as e:  # a full disk, a vanished directory: the output, not the input
        shutil.rmtree(tmp, ignore_errors=True)
        raise DualhubError(f"cannot write {final}: {os_error_text(e)}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def count(d: dict[str, int], key: str, n: int = 1) -> None:
    d[key] = d.get(key, 0) + n


def contracts(
    events: list[Any],
    *,
    venue: str,
    contract_type: str | Callable[[str], str],
    origin: str,
) -> dict[str, dict[str, Any]]:
    """The manifest's ``contracts`` of an import, {symbol: spec}: each symbol's published spec where
    the data lies on its grids, else the grids of its books and trades (engine.contract.data_spec).
    ``contract_type``: one for every symbol, or a function of the symbol (a capture that mixes markets)."""
    from engine.events import BookSnapshot, Trade

    px: dict[str, list[Any]] = {}
    sz: dict[str, list[Any]] = {}
    for e in events:
        if isinstance(e, BookSnapshot):
            px.setdefault(e.symbol, []).extend((e.bid_px, e.ask_px))
            sz.setdefault(e.symbol, []).extend((e.bid_sz, e.ask_sz))
        elif isinstance(e, Trade):
            px.setdefault(e.symbol, []).append((e.px,))
            sz.setdefault(e.symbol, []).append((e.sz,))
    out = {}
    for sym in sorted(px):
        kind = contract_type(sym) if callable(contract_type) else contract_type
        flat = lambda rows: np.fromiter((x for r in rows for x in r), dtype=np.float64)  # noqa: E731
        out[sym] = data_spec(
            sym, flat(px[sym]), flat(sz[sym]), venue=venue, contract_type=kind, origin=origin
        )
    return out
