"""A catalog of sessions: DuckDB views over every session under a folder, so a month is one statement.

``dualhub catalog DIR`` writes ``DIR/catalog.sql``: one view per stream (``books15``, ``trade``, ``gap``,
...) over the part files every session's manifest lists, each row with its ``session``, its
``instrument`` (the symbol) and its UTC ``day`` (of ``ts_recv``), the columns a hive layout
(``instrument=.../day=...``) would give, without copying or moving a session's files; and a
``sessions`` view, one row per session. Plain DuckDB reads it (``duckdb -init DIR/catalog.sql``), as does
``dualhub sql DIR [QUERY]`` (a folder of sessions, not a run: the file is refreshed first). The file
names its folder once (``SET VARIABLE catalog``): a moved catalog is written again, not edited.

Only the files a manifest lists are read (never a crash's ``*.tmp``), and only finished sessions are
found (``replay.sessions.find_sessions``: a session's runs, caches and hidden folders such as ranges are
not entered, so a range's rows are never counted twice).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Final

from engine.errors import DualhubError
from engine.store import SessionError, atomic_write_bytes, first_line, open_session

CATALOG_SQL: Final = "catalog.sql"


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def catalog_sql(folder: Path) -> tuple[str, int]:
    """The views file's text for the sessions under ``folder``, and how many sessions it covers."""
    from replay.sessions import find_sessions

    root = folder.resolve()
    sessions = []
    for path in find_sessions(root):
        try:
            sessions.append(open_session(path))
        except SessionError as e:
            raise DualhubError(f"catalog {folder}: {e}") from None
    if not sessions:
        raise DualhubError(f"{folder} holds no session (a directory with manifest.json)")
    day = "CAST(make_timestamp(ts_recv // 1000) AS DATE)"
    out = [
        "-- DuckDB views over every session under this folder (`dualhub catalog`: replay/catalog.py).",
        "-- Each stream's rows carry session, instrument (the symbol) and day (UTC, of ts_recv).",
        f"SET VARIABLE catalog = {_lit(str(root))};",
    ]
    streams = sorted({s for x in sessions for s in x.streams})
    for stream in streams:
        branches = []
        for s in sessions:
            rels = sorted(rel for rel in s.manifest["files"] if rel.split("/", 1)[0] == stream)
            if not rels:
                continue
            base = s.root.relative_to(root).as_posix()
            files = ", ".join(f"getvariable('catalog') || {_lit('/' + base + '/' + r)}" for r in rels)
            branches.append(
                f"SELECT *, {_lit(base)} AS session, symbol AS instrument, {day} AS day "
                f"FROM read_parquet([{files}])"
            )
        out.append(f'CREATE OR REPLACE VIEW "{stream}" AS\n' + "\nUNION ALL ".join(branches) + ";")
    rows = []
    for s in sessions:
        m: dict[str, Any] = s.manifest
        syms = "[" + ", ".join(_lit(x) for x in m.get("symbols") or []) + "]::VARCHAR[]"
        lo, hi = m.get("ts_recv_min"), m.get("ts_recv_max")
        rows.append(
            f"({_lit(s.root.relative_to(root).as_posix())}, {_lit(str(m.get('source', '')))}, {syms}, "
            f"{'NULL' if lo is None else int(lo)}::BIGINT, {'NULL' if hi is None else int(hi)}::BIGINT, "
            f"{_lit(s.digest())})"
        )
    out.append(
        "CREATE OR REPLACE VIEW sessions AS SELECT *, "
        "CAST(make_timestamp(ts_recv_min // 1000) AS DATE) AS first_day, "
        "CAST(make_timestamp(ts_recv_max // 1000) AS DATE) AS last_day FROM (VALUES\n    "
        + ",\n    ".join(rows)
        + "\n) AS t(session, source, symbols, ts_recv_min, ts_recv_max, digest);"
    )
    return "\n\n".join(out) + "\n", len(sessions)


def write_catalog(folder: Path) -> tuple[Path, int]:
    """Write (or refresh) ``folder/catalog.sql``; returns its path and how many sessions it covers."""
    if not folder.is_dir():
        raise DualhubError(f"{folder} is not a folder")
    text, n = catalog_sql(folder)
    path = folder / CATALOG_SQL
    atomic_write_bytes(path, text.encode())
    return path, n


def connect_catalog(folder: Path) -> Any:
    """An in-memory DuckDB with the catalog's views over ``folder`` (its views file refreshed first)."""
    import duckdb

    path, _ = write_catalog(folder)
    con = duckdb.connect()
    try:
        con.execute(path.read_text())
    except duckdb.Error as e:
        con.close()
        raise DualhubError(f"the catalog's views over {folder} do not load: {first_line(e)}") from None
    return con


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "catalog",
        help="DuckDB views over every session under a folder (a month in one statement)",
        description="Write FOLDER/catalog.sql: one view per stream (books15, trade, gap, ...) over every "
        "session under FOLDER, each row with its session, instrument and UTC day, and a sessions view; "
        "`dualhub sql FOLDER [QUERY]` opens the same views (read-only, as over a run); plain DuckDB reads "
        "the file too (duckdb -init FOLDER/catalog.sql).",
    )
    p.add_argument("folder", type=Path, help="a folder of sessions (at any depth)")
    p.set_defaults(func=cmd_catalog)


def cmd_catalog(args: argparse.Namespace) -> int:
    path, n = write_catalog(args.folder)
    print(f"catalog: {n} session(s) -> {path} (views: sessions and one per stream)")
    print(f'query it: dualhub sql {args.folder} "SELECT day, count(*) FROM books15 GROUP BY day"')
    return 0
