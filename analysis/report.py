"""``dualhub report``: DuckDB SQL over a run's Parquet event log. The SQL lives in ``queries.sql``."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import orjson

from engine.errors import DualhubError
from engine.eventlog import OUTPUT_STREAMS, RUN_SCHEMA_VERSION
from engine.store import sha256_file


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    columns: list[str]
    rows: list[tuple[Any, ...]]


def load_queries(file: str = "queries.sql") -> list[tuple[str, str, str]]:
    """``(name, title, sql)`` for every block of ``file`` (``queries.sql``, ``portfolio.sql``), in file
    order."""
    text = resources.files("analysis").joinpath(file).read_text()
    out = []
    for block in text.split("-- name: ")[1:]:
        header, _, sql = block.partition("\n")
        name, _, title = header.partition("|")
        out.append((name.strip(), title.strip(), sql.strip().rstrip(";")))
    return out


def _q(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def verify_run(run_dir: Path | str) -> dict[str, Any]:
    """The run's manifest, once every event file matches the sha256 recorded for it: a half-written
    (``.tmp``), truncated or edited run is refused, never reported on."""
    run = Path(run_dir)
    if run.name.endswith(".tmp"):
        raise DualhubError(f"{run} is a half-written run (an interrupted replay); replay the session again")
    if not run.is_dir():
        raise DualhubError(f"{run} is not a run directory")
    mpath = run / "manifest.json"
    if not mpath.is_file():
        raise DualhubError(f"{run} is not a finished run (no manifest.json)")
    try:
        manifest = orjson.loads(mpath.read_bytes())
    except orjson.JSONDecodeError as e:
        raise DualhubError(f"{mpath} is not valid JSON ({e})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or "run_schema_version" not in manifest:
        raise DualhubError(f"{mpath} is not a run manifest (no run_schema_version / files)")
    if manifest["run_schema_version"] != RUN_SCHEMA_VERSION:
        raise DualhubError(
            f"{run} was written by another dualhub (run schema {manifest['run_schema_version']}, this one "
            f"reads {RUN_SCHEMA_VERSION}): replay the session again"
        )
    for stream in OUTPUT_STREAMS:
        rel = f"events/{stream}.parquet"
        entry = files.get(rel)
        if not isinstance(entry, dict) or "sha256" not in entry:
            raise DualhubError(f"{mpath} does not list {rel}")
        p = run / rel
        if not p.is_file():
            raise DualhubError(f"{run} is missing {rel}")
        if sha256_file(p) != entry["sha256"]:
            raise DualhubError(f"{p} does not match the sha256 in its manifest (truncated or modified)")
        # the hash covers the file, not the manifest: an edited row count would pass it
        if "rows" in entry and (rows := _rows(p)) != entry["rows"]:
            raise DualhubError(f"{p} holds {rows} rows, its manifest says {entry['rows']!r}")
    return manifest


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except Exception as e:  # pyarrow raises several types for a damaged footer
        raise DualhubError(f"{path} is not a readable Parquet file ({type(e).__name__})") from None


def check_output_file(path: Path | str) -> None:
    """Refuse, before the work that produces it (a report, a sweep's plot), an output file that cannot
    be written: a directory, a parent directory that does not exist (never created silently: a typo
    would hide the file), or a place that takes no new file (``/proc``). Files are written as
    ``OUT.tmp`` then renamed; the error names the user's path, never that ``.tmp``."""
    import os

    out = Path(path)
    parent = out.absolute().parent
    if out.is_dir():
        raise DualhubError(f"{out} is a directory; give a file name")
    if parent.exists() and not parent.is_dir():
        raise DualhubError(f"cannot write {out}: {parent} is a file, not a directory")
    if not parent.is_dir():
        raise DualhubError(f"cannot write {out}: the directory {parent} does not exist (create it first)")
    if out.exists() and not out.is_file():
        raise DualhubError(f"cannot write {out}: it exists and is not a regular file")
    probe = parent / f".{out.name}.{os.getpid()}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError as e:
        raise DualhubError(f"cannot write {out}: {parent} takes no new file ({e.strerror})") from None
    probe.unlink(missing_ok=True)
    if out.exists() and not os.access(out, os.W_OK):
        raise DualhubError(f"cannot write {out}: it is not writable")


def views_sql() -> str:
    """``views.sql``: every event stream of a run, its session's books and the derived views."""
    return resources.files("analysis").joinpath("views.sql").read_text()


def one_line(e: Exception) -> str:
    """A DuckDB error on one line: its message without the echoed query and the caret under it."""
    lines = (ln.strip() for ln in str(e).splitlines())
    return " ".join(ln for ln in lines if ln and not ln.startswith(("LINE ", "^")))


def connect(run_dir: Path | str) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with every view of ``views.sql`` over the run, once the run's event files
    match its manifest: what the report, ``dualhub sql``, sweeps and the notebooks all query."""
    run = Path(run_dir).resolve()
    verify_run(run)
    con = duckdb.connect()
    try:
        con.execute(f"SET VARIABLE run = {_q(run)}")
        con.execute(views_sql())
    except duckdb.Error as e:
        con.close()
        raise DualhubError(f"the views over {run} do not load: {one_line(e)}") from None
    return con


def without_null_symbol(s: Section) -> Section:
    """``s`` without its ``symbol`` column where that column is NULL throughout: a single-symbol run's
    table (queries.sql names the symbol only in a run of several instruments)."""
    if "symbol" not in s.columns:
        return s
    i = s.columns.index("symbol")
    if any(r[i] is not None for r in s.rows):
        return s
    return Section(s.name, s.title, s.columns[:i] + s.columns[i + 1 :], [r[:i] + r[i + 1 :] for r in s.rows])


def run_report(run_dir: Path | str) -> list[Section]:
    """The report's tables (queries.sql): in a run of several instruments every table of per-instrument
    rows has a ``symbol`` column; in a single-symbol run none has."""
    con = connect(run_dir)
    try:
        by_symbol = bool(con.sql("SELECT getvariable('by_symbol')").fetchall()[0][0])
        sections = []
        for name, title, sql in load_queries():
            rel = con.sql(sql)
            s = without_null_symbol(Section(name, title, list(rel.columns), rel.fetchall()))
            if by_symbol and "symbol" not in s.columns:
                # the Kev tables: a portfolio's one queue and hub, whichever instrument's label asked
                s = Section(
                    s.name, f"{s.title}, all instruments (the portfolio's one Kev queue)", s.columns, s.rows
                )
            sections.append(s)
        return sections
    finally:
        con.close()


# Console output aims to fit this many columns (a terminal's or a pasted log's): wider one-row tables are
# printed turned, one line per column, and the config wraps.
FIT_COLUMNS = 120


def _table(s: Section) -> Any:
    from rich.table import Table

    t = Table(title=s.title, title_justify="left")
    for i, c in enumerate(s.columns):
        text = any(isinstance(r[i], str) for r in s.rows)
        t.add_column(c, justify="left" if text else "right", no_wrap=True, overflow="fold")
    for r in s.rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def print_table(console: Any, s: Section) -> None:
    """``s`` as a rich table that never cuts a column: cells do not wrap and the table is printed at its
    full width even when that is wider than the console (a terminal then wraps the long lines; no
    value is ever replaced by an ellipsis). A table without rows is one line saying so, not a bare
    header; a one-row table wider than :data:`FIT_COLUMNS` is printed turned (column, value)."""
    from rich.measure import Measurement

    if not s.rows:
        console.print(f"{s.title}: none", soft_wrap=True, markup=False, highlight=False)
        return
    t = _table(s)
    need = Measurement.get(console, console.options.update_width(1 << 16), t).maximum
    if len(s.rows) == 1 and need > max(console.width, FIT_COLUMNS):
        turned = Section(
            s.name, s.title, ["column", "value"], [(c, v) for c, v in zip(s.columns, s.rows[0], strict=True)]
        )
        t = _table(turned)
        t.title = None  # the title on a line of its own: over two narrow columns it would wrap
        console.print(s.title, soft_wrap=True, markup=False, highlight=False)
        need = Measurement.get(console, console.options.update_width(1 << 16), t).maximum
    saved = console._width  # rich has no public "print this one wider": set the width, then restore it
    try:
        console.width = max(console.width, need)
        console.print(t)
    finally:
        console._width = saved


def leg_titled(s: Section, symbol: str | None) -> Section:
    """A tear-sheet table of a portfolio run, its title naming the one leg it covers."""
    if not symbol:
        return s
    return Section(s.name, f"{symbol} (tear sheet of this leg alone): {s.title}", s.columns, s.rows)
