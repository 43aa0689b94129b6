"""``dualhub report``: DuckDB SQL over a run's Parquet event log. The SQL lives in ``queries.sql``."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import orjson

from engine.errors import DualhubError
from engine.eventlog import OUTPUT_STREAMS


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    columns: list[str]
    rows: list[tuple[Any, ...]]


def load_queries() -> list[tuple[str, str, str]]:
    """``(name, title, sql)`` for every block of ``queries.sql``, in file order."""
    text = resources.files("engine.report").joinpath("queries.sql").read_text()
    out = []
    for block in text.split("-- name: ")[1:]:
        header, _, sql = block.partition("\n")
        name, _, title = header.partition("|")
        out.append((name.strip(), title.strip(), sql.strip().rstrip(";")))
    return out


def _q(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def connect(run_dir: Path | str) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one view per event stream of the run, plus the session's books."""
    run = Path(run_dir)
    mpath = run / "manifest.json"
    if not mpath.exists():
        raise DualhubError(f"{run} is not a finished run (no manifest.json)")
    manifest = orjson.loads(mpath.read_bytes())
    con = duckdb.connect()
    for stream in OUTPUT_STREAMS:
        p = run / "events" / f"{stream}.parquet"
        if not p.exists():
            raise DualhubError(f"{run} is missing {p.name}")
        con.execute(f'CREATE VIEW "{stream}" AS SELECT * FROM read_parquet({_q(p)})')
    session = Path(manifest["session"]["path"])
    book_files = sorted(session / rel for rel in manifest["session"]["files"] if rel.startswith("books15/"))
    if not book_files or not all(f.exists() for f in book_files):
        raise DualhubError(f"the run's session {session} is not readable any more (books15 files missing)")
    files = ", ".join(_q(f) for f in book_files)
    con.execute(f"CREATE VIEW books15 AS SELECT * FROM read_parquet([{files}])")
    return con


def run_report(run_dir: Path | str) -> list[Section]:
    con = connect(run_dir)
    try:
        sections = []
        for name, title, sql in load_queries():
            rel = con.sql(sql)
            sections.append(Section(name, title, list(rel.columns), rel.fetchall()))
        return sections
    finally:
        con.close()


def print_report(run_dir: Path | str, console: Any = None) -> list[Section]:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    sections = run_report(run_dir)
    manifest = orjson.loads((Path(run_dir) / "manifest.json").read_bytes())
    console.print(f"[bold]run[/]    {run_dir}")
    console.print(f"[bold]digest[/] {manifest['digest']}")
    for s in sections:
        t = Table(title=s.title, title_justify="left")
        for c in s.columns:
            t.add_column(c, justify="right")
        for r in s.rows:
            t.add_row(*("" if v is None else str(v) for v in r))
        console.print(t)
    return sections
