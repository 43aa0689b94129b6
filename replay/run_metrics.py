"""A run's summary row (PnL and its split, Sharpe, drawdown, fills, refusals by rule, Kev use, latency
percentiles), from its event log's streams: as a metrics-only replay hands them over, or read back
from a written run. One implementation either way, so a metrics-only row equals the row of the same
run written in full (``tests/replay/test_sweep_metrics.py``).

:class:`MetricsLog` is the event log of a metrics-only run: every stream is hashed at the same flush
points as a written log (the same digest: ``engine.eventlog``), then handed to a :class:`Tally` instead
of a Parquet writer. The tally counts what it can as the tables go by and keeps only what the report's
SQL needs: the fills and the refused risk decisions (a few percent of the events). :meth:`Tally.summary`
then runs the report's own views (``analysis/views.sql``) over them with DuckDB, the books from
the session's files.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.eventlog import OUTPUT_STREAMS, EventLog
from engine.events import STREAMS

SUMMARY_THREADS: Final = 1
SUMMARY_MEMORY: Final = "256MB"
SAMPLE_NS: Final = 1_000_000_000  # the performance view's default equity sampling (1 s)
LATENCY_SPANS: Final = ("tick_to_order", "kev")  # percentiles kept in a row's flat columns
_EVENTS_VIEW: Final = re.compile(r"read_parquet\(getvariable\('run'\) \|\| '/events/(\w+)\.parquet'\)")


class Tally:
    """What a run's summary needs, fed each stream's tables in seq order (:meth:`add`)."""

    def __init__(self) -> None:
        self.labels: dict[str, int] = {}
        self.orders = self.kev_requests = self.kev_responses = self.kev_drops = 0
        self.refusals: dict[str, int] = {}
        self._fills: list[pa.Table] = []
        self._refused: list[pa.Table] = []
        self._spans: dict[str, list[np.ndarray]] = {}

    def add(self, stream: str, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if stream == "label":
            for v in pc.value_counts(table.column("label")).to_pylist():
                self.labels[v["values"]] = self.labels.get(v["values"], 0) + v["counts"]
        elif stream == "order":
            self.orders += int(pc.sum(pc.equal(table.column("kind"), "new")).as_py() or 0)
        elif stream == "kev_request":
            self.kev_requests += table.num_rows
        elif stream == "kev_response":
            self.kev_responses += table.num_rows
        elif stream == "kev_queue":
            self.kev_drops += int(pc.sum(pc.starts_with(table.column("kind"), "dropped")).as_py() or 0)
        elif stream == "risk":
            refused = table.filter(pc.invert(table.column("accepted")))
            if refused.num_rows:
                self._refused.append(refused)
                for v in pc.value_counts(refused.column("reason")).to_pylist():
                    self.refusals[v["values"]] = self.refusals.get(v["values"], 0) + v["counts"]
        elif stream == "fill":
            self._fills.append(table)
        elif stream == "latency":
            names, dur = table.column("name"), table.column("dur_ns")
            for name in LATENCY_SPANS:
                got = dur.filter(pc.equal(names, name)).to_numpy()
                if len(got):
                    self._spans.setdefault(name, []).append(got)

    @classmethod
    def of_run(cls, run_dir: Path | str) -> Tally:
        """The tally of a written run, its streams read a row group at a time."""
        t = cls()
        for stream in OUTPUT_STREAMS:
            pf = pq.ParquetFile(Path(run_dir) / "events" / f"{stream}.parquet")
            for g in range(pf.metadata.num_row_groups):
                t.add(stream, pf.read_row_group(g))
        return t

    def _table(self, stream: str) -> pa.Table:
        parts = {"fill": self._fills, "risk": self._refused}.get(stream, [])
        schema = STREAMS[stream].schema
        return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()

    def summary(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """The row's metrics, the report's views run over the kept streams (``manifest``: the run's, as
        written or as a metrics-only run would have written it)."""
        import duckdb

        from analysis.report import views_sql

        out: dict[str, Any] = {
            "orders": self.orders,
            "kev_requests": self.kev_requests,
            "kev_responses": self.kev_responses,
            "kev_drops": self.kev_drops,
            "risk_rejections": sum(self.refusals.values()),
            "refusals": json.dumps(dict(sorted(self.refusals.items()))),
            "label_counts": dict(self.labels),
        }
        for name in LATENCY_SPANS:
            a = np.concatenate(self._spans[name]) if name in self._spans else np.zeros(0, np.int64)
            for q in (50, 99):
                out[f"{name}_p{q}_ms"] = float(np.percentile(a, q)) / 1e6 if len(a) else None
        with tempfile.TemporaryDirectory(prefix="dualhub-metrics-") as td:
            # The joins and sorts over a million books took ~400 MB above the run's own peak: held to
            # SUMMARY_MEMORY, past which DuckDB spills to td (at 128 MB the spilling doubled a 1M-book
            # summary's time; with fills_pnl's join narrowed, 256 MB takes no longer than 384 MB there
            # and peaks ~40 MB lower). One thread. No progress bar on stdout.
            con = duckdb.connect(
                config={"threads": SUMMARY_THREADS, "memory_limit": SUMMARY_MEMORY, "temp_directory": td}
            )
            try:
                con.execute("SET enable_progress_bar = false")
                (Path(td) / "manifest.json").write_text(json.dumps(manifest))
                sql = needed_views(views_sql(), _ROOTS)
                for stream in sorted(set(_EVENTS_VIEW.findall(sql))):  # those not kept: empty, same schema
                    con.register(f"_events_{stream}", self._table(stream))
                con.execute(f"SET VARIABLE run = '{td}'")
                sql = _EVENTS_VIEW.sub(lambda m: f"_events_{m.group(1)}", sql)
                con.execute(sql)
                # The views as written, over tables made once: the books' few columns the views read (kept
                # for the process's next run of the session), the fills' PnL and the symbol's PnL over the
                # books they can pick (_narrow_views), and the equity curve without its running
                # peak (read twice below; the peak's window was most of a summary's time: sharpe() and
                # max_drawdown() take it from the curve). DuckDB binds a view when it is queried, so the
                # views above read these.
                books = book_columns(manifest)
                con.register("_books15", books)
                con.execute("DROP VIEW books15; CREATE VIEW books15 AS SELECT * FROM _books15")
                _narrow_views(con, sql, books, self._table("fill"))
                curve = "SELECT ts_recv, seq, mid, pnl FROM equity"
                con.execute(f"CREATE TEMP TABLE _equity AS {curve}")
                con.execute("DROP VIEW equity; CREATE VIEW equity AS SELECT * FROM _equity")
                out.update(_performance(con))
            finally:
                con.close()
        return out


_ROOTS: Final = ("symbol_pnl", "run_symbols", "pnl_attribution", "equity", "loss_stop", "run_symbol")
_CREATES: Final = re.compile(r"^\s*(?:CREATE\s+VIEW|SET\s+VARIABLE)\s+\"?(\w+)\"?", re.I | re.M)


def needed_views(sql: str, roots: tuple[str, ...]) -> str:
    """The statements of ``sql`` (views.sql) that the views and variables ``roots`` read, transitively,
    in their order: a summary binds a few of its views, not all of them (binding every view of the
    file took most of a summary's time)."""
    body = view_statements(sql)
    names = list(body)
    want, todo = set(), list(roots)
    while todo:
        n = todo.pop()
        if n in want or n not in body:
            continue
        want.add(n)
        todo.extend(m for m in names if m != n and re.search(rf"\b{m}\b", body[n]))
    return ";\n".join(body[n] for n in names if n in want) + ";\n"


# Views whose only reads of the books are an ASOF join from the fills (fills_pnl: the latest book at
# each fill) or the last finite book of each symbol (symbol_pnl's mark): each is made once, as a table,
# by its own statement over the rows of the books it can pick (:func:`book_rows_met`), not over every
# book (the ASOF join's sort of a million books was most of a summary's time). The views that read
# them (equity, pnl_attribution, the pnl query) then read the tables.
_NARROWED: Final = {"fills_pnl": "fills", "symbol_pnl": "last"}


def _narrow_views(con: Any, sql: str, books: pa.Table, fills: pa.Table) -> None:
    bodies = view_statements(sql)
    for view, rows in _NARROWED.items():
        stmt = bodies.get(view)
        head = re.compile(rf"^\s*CREATE\s+VIEW\s+{view}\s+AS\b", re.I)
        if stmt is None or not head.search(stmt):
            continue  # the view is not read by this summary, or not as this expects: left as it is
        con.register(f"_books_{view}", book_rows_met(books, fills if rows == "fills" else None))
        body = re.sub(r"\bbooks15\b", f"_books_{view}", head.sub(f"CREATE TEMP TABLE _{view} AS", stmt))
        con.execute(body)
        con.execute(f"DROP VIEW {view}; CREATE VIEW {view} AS SELECT * FROM _{view}")


def view_statements(sql: str) -> dict[str, str]:
    """The ``CREATE VIEW``/``SET VARIABLE`` statements of ``sql`` by the name they define."""
    stmts = [re.sub(r"--[^\n]*", "", x) for x in re.split(r";[ \t]*\n", sql)]
    stmts = [x for x in stmts if _CREATES.search(x)]
    return {_CREATES.search(x).group(1): x for x in stmts}  # type: ignore[union-attr]


def book_rows_met(books: pa.Table, fills: pa.Table | None) -> pa.Table:
    """The rows of ``books`` an ASOF join from ``fills`` on (symbol, ts_recv >= books.ts_recv) picks:
    the book at the latest ``ts_recv`` at or before each fill of its symbol; where such an instant holds
    several books of the symbol (the join's pick among them is its own), every book of the symbol.
    ``fills`` None: the last finite book of each symbol by (``ts_recv``, ``seq``), as symbol_pnl's mark
    takes it. The rows keep their order in ``books``."""
    keep = np.zeros(books.num_rows, dtype=bool)
    ts_all = books.column("ts_recv").to_numpy()
    for s, rows in _symbol_rows(books):

        def of(a: np.ndarray, rows: np.ndarray | None = rows) -> np.ndarray:
            return a if rows is None else a[rows]  # a column's values at the symbol's rows

        def where(i: np.ndarray, rows: np.ndarray | None = rows) -> np.ndarray:
            return i if rows is None else rows[i]  # the symbol's i-th rows, as rows of books

        ts = of(ts_all)
        if fills is None:
            mid = of(books.column("bid_px_0").to_numpy()) + of(books.column("ask_px_0").to_numpy())
            ok = where(np.flatnonzero(np.isfinite(mid)))
            if len(ok):
                at_last = ok[ts_all[ok] == ts_all[ok].max()]
                keep[at_last[np.argmax(books.column("seq").to_numpy()[at_last])]] = True
            continue
        f = fills.column("ts_recv").to_numpy()
        if pc.any(pc.not_equal(fills.column("symbol"), s)).as_py():
            f = f[pc.equal(fills.column("symbol"), s).to_numpy(zero_copy_only=False)]
        order = None if len(ts) < 2 or bool(np.all(ts[1:] >= ts[:-1])) else np.argsort(ts, kind="stable")
        ts_sorted = ts if order is None else ts[order]
        last = np.searchsorted(ts_sorted, f, side="right") - 1  # the latest book at or before each fill
        last = last[last >= 0]
        if (np.searchsorted(ts_sorted, ts_sorted[last], side="left") != last).any():
            # books at one instant: which of them the join takes is its own choice, which may change
            # with the rows it is given; every row, as before
            keep[where(np.arange(len(ts)))] = True
            continue
        keep[where(last if order is None else order[last])] = True
    return books.filter(pa.array(keep))


def _symbol_rows(books: pa.Table) -> list[tuple[str, np.ndarray | None]]:
    """Each symbol of ``books`` with its rows (None: every row, the common case of one symbol), kept
    with the process's books (:func:`book_columns`)."""
    key = (id(books), books.num_rows)
    got = _symbols.get(key)
    if got is None:
        sym = books.column("symbol")
        first = sym[0].as_py() if books.num_rows else ""
        if not pc.any(pc.not_equal(sym, first)).as_py():
            got = [(first, None)] if books.num_rows else []
        else:
            mask = [(s, pc.equal(sym, s).to_numpy(zero_copy_only=False)) for s in pc.unique(sym).to_pylist()]
            got = [(s, np.flatnonzero(m)) for s, m in mask]
        if any(b is books for b in _books.values()):
            _symbols.clear()
            _symbols[key] = got
    return got


BOOK_COLUMNS: Final = ["symbol", "ts_recv", "seq", "bid_px_0", "ask_px_0"]  # what the summary's views read
_books: dict[tuple[tuple[str, int, int], ...], pa.Table] = {}
_symbols: dict[tuple[int, int], list[tuple[str, np.ndarray | None]]] = {}  # of the table in _books


def book_columns(manifest: Mapping[str, Any]) -> pa.Table:
    """The run's session's books15 rows, :data:`BOOK_COLUMNS` only; the last session's are kept for the
    next run in this process (a sweep's), keyed by the files' paths, sizes and modification times."""
    root = Path(manifest["session"]["path"])
    files = sorted(root / rel for rel in manifest["session"]["files"] if rel.startswith("books15/"))
    key = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    table = _books.get(key)
    if table is None:
        table = pq.read_table([str(f) for f in files], columns=BOOK_COLUMNS)
        _books.clear()  # one session's at a time: memory stays one session's few columns
        _books[key] = table
    return table


def _one(con: Any, sql: str) -> dict[str, Any]:
    rel = con.sql(sql)
    rows = rel.fetchall()
    return dict(zip(rel.columns, rows[0], strict=True)) if rows else {}


def _performance(con: Any) -> dict[str, Any]:
    from analysis.report import load_queries

    pnl_sql = next(sql for name, _, sql in load_queries() if name == "pnl")
    pnl = _one(con, pnl_sql)
    split = _one(con, "SELECT spread_capture, inventory, fees, turnover_usdt, fills FROM pnl_attribution")
    stop = _one(con, "SELECT after_frac FROM loss_stop")
    eq = con.sql("SELECT ts_recv, pnl FROM _equity ORDER BY ts_recv, seq").fetchnumpy()
    pnl_curve = np.asarray(eq["pnl"], dtype=np.float64)
    return {
        "position": float(pnl["position"]) if pnl else 0.0,
        "fees_usdt": pnl.get("fees_usdt"),
        "pnl_usdt": pnl.get("pnl_usdt"),
        "spread_capture_usdt": split.get("spread_capture"),
        "inventory_usdt": split.get("inventory"),
        "fees_paid_usdt": split.get("fees"),
        "turnover_usdt": split.get("turnover_usdt"),
        "fills": split.get("fills", 0),
        "max_drawdown_usdt": max_drawdown(pnl_curve),
        "loss_stop_at_frac": stop.get("after_frac"),
        "sharpe": sharpe(np.asarray(eq["ts_recv"]), pnl_curve),
    }


def max_drawdown(pnl: np.ndarray) -> float | None:
    """The equity view's ``min(drawdown)``: the PnL's deepest fall below its running peak (<= 0)."""
    return float(np.min(pnl - np.maximum.accumulate(pnl))) if len(pnl) else None


def sharpe(ts: np.ndarray, pnl: np.ndarray, sample_ns: int = SAMPLE_NS) -> float | None:
    """The performance view's annualised Sharpe (``analysis/views.sql``): equity sampled every
    ``sample_ns`` from the first book (the last equity row at or before each instant), mean over sample
    standard deviation of its changes, times sqrt(samples in 365 days). None where it is undefined.
    The view's ASOF join takes minutes on a session of a million books; this is its arithmetic on the
    equity rows the view gives (a test holds the two equal)."""
    if len(ts) == 0:
        return None
    t = np.arange(int(ts[0]), int(ts[-1]) + 1, sample_ns, dtype=np.int64)
    at = np.searchsorted(ts, t, side="right") - 1
    ret = np.diff(pnl[at])
    if len(ret) < 2:
        return None
    sd = float(np.std(ret, ddof=1))
    if sd == 0 or not math.isfinite(sd):
        return None
    return float(np.mean(ret)) / sd * math.sqrt(365 * 86400e9 / sample_ns)


class MetricsLog(EventLog):
    """An event log that writes nothing: each stream is hashed at the flush points a written log has
    (the same digest and counts) and handed to :attr:`tally`."""

    def __init__(self, *, flush_rows: int = 16_384) -> None:
        # a directory set (never written): flush points are those of a streaming log
        super().__init__(Path(tempfile.gettempdir()) / "dualhub-metrics-only", flush_rows=flush_rows)
        self.tally = Tally()

    def _flush(self, stream: str) -> None:
        table = self._pending(stream, consume=True)
        if table is None:
            return
        self._digests[stream].update(table)
        self._flushed[stream] += table.num_rows
        self.tally.add(stream, table)

    def write(self, events_dir: Path | None = None) -> dict[str, dict[str, Any]]:
        for stream in OUTPUT_STREAMS:
            self._flush(stream)
        return {}

    def abandon(self) -> None:
        return None
