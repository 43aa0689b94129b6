"""Subcommands ``diff`` (first divergence between two runs), ``parity`` (replay a live session as it
happened and report the first divergence from what the live run decided: ``replay/parity.py``),
``sweep`` (what-if grids) and ``sql`` (DuckDB over a run through the views in
``analysis/views.sql``)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import DualhubError

if TYPE_CHECKING:
    import duckdb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from replay.cli import add_range_args
    from replay.diff import COMPARABLE_STREAMS, DECISION_STREAMS

    p = sub.add_parser(
        "diff",
        help="the first event where two runs' decisions differ, with the context around it",
        description="Merge both runs' decision streams in replay order (ts_recv, stream priority, seq) and "
        "report the first event where they differ: which field, the decisions before it and the Laya "
        "labels and Kev responses leading up to it. Provenance-only fields (e.g. the Kev advisor's name) "
        "are ignored. Exit status: 0 identical, 1 diverged, 2 error.",
    )
    p.add_argument("run_a", type=Path, metavar="RUN_A", help="run directory (has manifest.json)")
    p.add_argument("run_b", type=Path, metavar="RUN_B", help="run directory to compare with")
    p.add_argument("--context", type=int, default=5, help="events shown before the divergence (default 5)")
    p.add_argument(
        "--streams",
        default=",".join(DECISION_STREAMS),
        help=f"comma-separated streams to compare (default {','.join(DECISION_STREAMS)}; "
        f"any of {','.join(COMPARABLE_STREAMS)})",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of tables")
    p.add_argument(
        "--allow-modified",
        action="store_true",
        help="compare runs even where an event file no longer matches its manifest (each is named in a "
        "warning); by default such a run is refused as tampered",
    )
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser(
        "parity",
        help="replay a live session as it happened; print 'no divergence' or the first divergence",
        description="Replays each run of LIVE_SESSION (runs/live-<SYMBOL>) with what the live run observed: "
        "its Laya latencies, order and cancel delays, Kev answers with their lags (its cassette) and market "
        "data at receipt, then compares labels, Kev and decisions with the live run's events. Exit 0: no "
        "divergence; 1: a divergence (shown with context). A --live (real orders) session is compared up to "
        "the first execution report: the venue's acks and fills cannot be reproduced, and it says so.",
    )
    p.add_argument(
        "session",
        metavar="LIVE_SESSION",
        type=Path,
        help="a `dualhub live` session directory (or one of its runs)",
    )
    p.add_argument(
        "--out", type=Path, help="where the replays go (default SESSION/runs): DIR/parity-<SYMBOL>"
    )
    p.add_argument("--context", type=int, default=5, help="events of context around a divergence (5)")
    p.set_defaults(func=cmd_parity)

    p = sub.add_parser(
        "sweep",
        help="replay sessions over a grid of configs; one row per run in a Parquet results table",
        description="GRID.toml has [base] (settings for every run) and [grid] (axes: lists of values; the "
        "cartesian product runs, axes sorted by name). Keys are ReplayConfig fields, dotted for risk.*, "
        "quotes.*, contract.*, or scale_latency (a --scale-latency spec); every value is checked before any "
        "run. A run's event log goes to runs/<key> beside the --out table where --keep-logs asks for it "
        "(each row keeps the run's digest, metrics and replay_command either way; a session's books are read "
        "and labelled once, into its market cache); a failed run is a row with its error. Each run is a Ray "
        "task: on a local Ray instance sized to the machine, or on the cluster at "
        "--ray (docs/SCALE.md); --serial runs them one by one in this process. "
        "Exit status 1 when any run failed.",
    )
    p.add_argument("grid", type=Path, metavar="GRID.toml", help="the grid: [base] and [grid] tables")
    p.add_argument(
        "--sessions",
        action="append",
        metavar="GLOB",
        help="session directories (glob, quote it; repeatable); or a filesystem URL glob (s3://, file://)",
    )
    p.add_argument(
        "--range",
        action="append",
        metavar="FOLDER|GLOB",
        help="several consecutive sessions of the same instruments as one session of the sweep, each run "
        "over them all (a folder of sessions, a quoted glob, or a catalog folder with --from/--to; "
        "replay/sessions.py; repeatable)",
    )
    add_range_args(p)
    p.add_argument("--out", default="results.parquet", help="results table: a path or a filesystem URL")
    p.add_argument("--resume", action="store_true", help="skip runs already in --out without an error")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--serial", action="store_true", help="no Ray: run one by one in this process")
    p.add_argument(
        "--ray", metavar="ADDRESS", help="join this Ray cluster (ray://HEAD:10001, HEAD:6379 or auto)"
    )
    p.add_argument(
        "--workers", type=int, help="local Ray instance size (default: all cores); with --ray: tasks at once"
    )
    p.add_argument(
        "--memory-mb", type=int, default=2048, help="memory declared per run to Ray (default 2048)"
    )
    p.add_argument(
        "--max-retries", type=int, default=1, help="retries of a run whose worker or node died (default 1)"
    )
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        help="also plot the results: metrics by the swept parameter, seeds as error bars "
        "(analysis/sweep_plot.py)",
    )
    p.add_argument(
        "--keep-logs",
        metavar="none|all|best:K",
        help="which runs write their event log to runs/<key>: none (each run keeps its digest and its "
        "results row; `dualhub replay` of a row's replay_command writes the same log; the default with "
        "--serial), all (the default on Ray, which takes no other yet), or best:K (the K best by --best's "
        "metric, replayed again with their logs once the sweep is done)",
    )
    p.add_argument(
        "--best",
        metavar="METRIC",
        help="print the parameter sets ranked by this results column's mean over seeds and sessions "
        "(e.g. sharpe, pnl_usdt, max_drawdown_usdt); also --keep-logs best:K's ranking (default sharpe)",
    )
    p.add_argument(
        "--no-market-cache",
        action="store_true",
        help="read and label the session's books in every run instead of once (replay/market_cache.py)",
    )
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "sql",
        help="DuckDB SQL over a run (event streams, books, decisions, latency, PnL) or a sweep's results",
        description="TARGET is a run directory: its event files are checked against its manifest and "
        "opened with the views of analysis/views.sql (one per event stream, books15 from the "
        "session, and the derived decisions, decision_counts, latency_stages, latency_stage_stats and "
        "fills_pnl; docs/ANALYSIS.md). Or TARGET is a Parquet file (a sweep's results table): the view "
        "is `results`. With QUERY: run it and print the result. Without: read statements from stdin, "
        "each ending with ';' at the end of a line, until EOF or .quit, and print each result. Tables are "
        "printed in full width: no column is ever left out. Exit status: 0; 1 when a statement read from "
        "stdin failed; 2 error.",
    )
    p.add_argument("target", type=Path, metavar="TARGET", help="run directory, or a results .parquet file")
    p.add_argument("query", nargs="?", metavar="QUERY", help="SQL to run (default: statements from stdin)")
    p.add_argument(
        "--max-rows",
        type=int,
        default=100,
        help="rows printed per result, the first and last ones (0: all; default 100)",
    )
    p.add_argument(
        "--raw", action="store_true", help="no table: one line per row, values tab-separated (for scripts)"
    )
    p.set_defaults(func=cmd_sql)


def cmd_diff(args: argparse.Namespace) -> int:
    import orjson

    from replay.diff import diff_runs, print_diff, tampered

    streams = [s.strip() for s in args.streams.split(",") if s.strip()]
    if not args.allow_modified:
        for run in (args.run_a, args.run_b):
            if problems := tampered(run):
                raise DualhubError(
                    f"{run} is tampered: {'; '.join(problems)} (the run no longer is what its digest "
                    "describes; replay it again, or --allow-modified to compare it anyway)"
                )
    result = diff_runs(args.run_a, args.run_b, streams=streams, context=args.context)
    if args.json:
        sys.stdout.write(
            orjson.dumps(result.to_json(), default=str, option=orjson.OPT_INDENT_2).decode() + "\n"
        )
    else:
        print_diff(result)
    return 1 if result.diverged else 0


def cmd_parity(args: argparse.Namespace) -> int:
    from replay.diff import print_diff
    from replay.parity import NOT_REPRODUCED, check_parity, live_runs

    if args.context < 0:
        raise DualhubError(f"--context must be >= 0, not {args.context}")
    runs = live_runs(args.session)
    worst = 0
    for run in runs:
        r = check_parity(run, args.out, context=args.context)
        d = r.diff
        print(f"parity: {run}  ({r.mode} run)")
        print(f"  replay   {r.replay_run}")
        kev = r.kev
        print(
            f"  kev      cassette: {kev.get('hits', 0)} hits, {kev.get('misses', 0)} misses "
            f"({d.counts_a.get('kev_request', 0)} requests in the live run)"
        )
        if kev.get("misses"):
            print(
                f"  WARNING  {kev['misses']} Kev requests missed the run's cassette: "
                "the replay did not get the live run's answers for them"
            )
        print(f"  compared {', '.join(d.streams)}: {r.compared} of the live run's {r.total} events")
        if r.mode == "live":
            print(f"  NOTE     {NOT_REPRODUCED}")
            if r.window_end_ns is None:
                print("           (no execution report in either run: the whole run is compared)")
            else:
                print(
                    f"           the first report came at ts_recv {r.window_end_ns}; the "
                    f"{r.total - r.compared} events from then on are not compared"
                )
        if r.durable_end_ns is not None:  # rebuilt by `dualhub recover` after a crash
            print(
                f"  NOTE     recovered from its write-ahead journal: durable until ts_recv "
                f"{r.durable_end_ns - 1}; nothing after the compared window is"
            )
        if r.labels is not None:
            lab = r.labels
            verdict = "DIVERGED (below)" if lab.diverged else f"no divergence ({lab.compared_a} identical)"
            print(f"  labels   compared over the whole run (market data and Laya only): {verdict}")
            if lab.diverged:
                print_diff(dataclasses.replace(lab, provenance=[]))
        if r.window_diverged:
            # a live config beside a replay config differs in every field: no news, left out
            print_diff(dataclasses.replace(d, provenance=[]))
        elif d.divergence is not None and r.window_end_ns == r.durable_end_ns:
            print(
                f"  no divergence up to the journal's end ({d.identical_prefix} events identical); "
                f"the replay goes on past it (ts_recv {d.divergence.ts_recv} on)"
            )
        elif d.divergence is not None:
            print(
                f"  no divergence before the first execution report ({d.identical_prefix} events identical); "
                f"from ts_recv {d.divergence.ts_recv} on the runs differ, as expected with venue reports"
            )
        else:
            print(f"  no divergence: {d.identical_prefix} events identical in the live run and its replay")
        worst = max(worst, int(r.diverged))
    return worst


def cmd_sweep(args: argparse.Namespace) -> int:
    import importlib.util

    from replay.sweep import DEFAULT_RANK, check_metric, find_sessions, load_grid, parse_keep_logs, sweep

    if args.resume and args.overwrite:
        raise DualhubError("--resume and --overwrite exclude each other")
    if not args.sessions and not args.range:
        raise DualhubError("name the sessions: --sessions GLOB or --range FOLDER|GLOB")
    if args.range:  # each range: one range directory, a session like any other from here on
        from replay.sessions import resolve

        ranges = [str(resolve(spec, args.date_from, args.date_to)) for spec in args.range]
        args.sessions = [*(args.sessions or []), *ranges]
    elif args.date_from or args.date_to:
        raise DualhubError("--from/--to pick the sessions of a --range")
    if args.keep_logs:
        parse_keep_logs(args.keep_logs)
    rank_by = args.best or DEFAULT_RANK
    check_metric(rank_by)
    grid = load_grid(args.grid)
    if args.plot:
        from analysis.report import check_output_file
        from engine.optional import need

        need("matplotlib")  # before the runs, not after them
        check_output_file(args.plot)
        if "://" in args.out:
            raise DualhubError("--plot needs a local --out")
    serial = args.serial
    if not serial and not args.ray and importlib.util.find_spec("ray") is None:
        print("sweep: Ray is not installed (pip install 'dualhub[scale]'); running serially", file=sys.stderr)
        serial = True
    keep_logs = args.keep_logs or ("none" if serial else "all")
    keep = parse_keep_logs(keep_logs)
    if serial:
        if "://" in args.out or any("://" in s for s in args.sessions):
            raise DualhubError("--serial reads and writes local paths only; URLs need Ray")
        sessions: list[Path] | list[str] = find_sessions(args.sessions)
    else:
        from replay.ray_sweep import discover_sessions

        sessions = discover_sessions(args.sessions)
    n = len(grid.points()) * len(sessions)
    print(f"sweep: {len(sessions)} session(s) x {len(grid.points())} parameter set(s) = {n} runs")
    common = {"resume": args.resume, "overwrite": args.overwrite, "progress": not args.no_progress}
    if serial:
        res = sweep(
            grid,
            sessions,
            Path(args.out),
            keep_logs=keep_logs,
            rank_by=rank_by,
            market_cache=not args.no_market_cache,
            **common,
        )
    else:
        from replay.ray_sweep import ray_sweep

        if keep is not None:  # every run on Ray writes its log
            raise DualhubError(f"--keep-logs {keep_logs} is for --serial sweeps; Ray sweeps keep every log")

        res = ray_sweep(
            grid,
            sessions,
            args.out,
            address=args.ray,
            workers=args.workers,
            memory_mb=args.memory_mb,
            max_retries=args.max_retries,
            **common,
        )
    print(
        f"{res.ran} run, {res.skipped} skipped (--resume), {res.failed} failed; {res.rows} rows in {res.out}"
    )
    for note in res.notes:
        print(f"sweep: {note}")
    if "://" not in str(res.out):
        print(f"query: dualhub sql {shlex.quote(str(res.out))} 'SELECT * FROM results'")
    if args.plot:
        from analysis.sweep_plot import plot_sweep
        from replay.sweep import read_results

        print(f"plot: {plot_sweep(read_results(Path(res.out)), args.plot)}")
    if args.best and "://" not in str(res.out):
        from rich.console import Console

        from analysis.report import Section, print_table
        from replay.sweep import best_table, read_results

        columns, rows = best_table(read_results(Path(res.out)), args.best)
        title = f"best by {args.best} (mean over seeds and sessions)"
        print_table(Console(), Section("best", title, columns, rows))
    return 1 if res.failed else 0


def _connect_target(target: Path) -> duckdb.DuckDBPyConnection:
    import duckdb

    from analysis.report import _q, connect, one_line

    if target.is_dir() and not (target / "manifest.json").exists():
        from replay.sessions import find_sessions

        if find_sessions(target):  # a folder of sessions: the catalog's views over them (replay/catalog.py)
            from replay.catalog import connect_catalog

            return connect_catalog(target)
    if target.is_dir() or target.suffix != ".parquet":
        return connect(target)
    if not target.is_file():
        raise DualhubError(f"{target} does not exist")
    con = duckdb.connect()
    try:
        con.execute(f"CREATE VIEW results AS SELECT * FROM read_parquet({_q(target.resolve())})")
    except duckdb.Error as e:
        con.close()
        raise DualhubError(f"{target} is not a readable Parquet file: {one_line(e)}") from None
    return con


# Statements that write files or reach outside the connection: refused, so `dualhub sql` over a run is
# read-only (a COPY TO could overwrite the run's own event log, which its manifest would then refuse).
# What stays is reading, and tables and views in the connection's memory.
_WRITES = ("COPY", "EXPORT", "ATTACH", "DETACH", "LOAD", "COPY_DATABASE", "EXTENSION")


def _read_only(con: duckdb.DuckDBPyConnection) -> None:
    """No setting can change from here on: the settings that write files (profiling_output, the
    temporary directory, the log) and those that would let a statement reach further stay as set."""
    con.execute("SET lock_configuration = true")


def _sql(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    """``con.sql(sql)`` once no statement in it writes files (:data:`_WRITES`)."""
    for stmt in con.extract_statements(sql):
        if stmt.type.name in _WRITES:
            raise DualhubError(
                f"{stmt.type.name} is refused: dualhub sql is read-only (the run's files are its record); "
                "print the result with --raw and redirect it, or open the files in duckdb yourself"
            )
    return con.sql(sql)


def _print(rel: Any, args: argparse.Namespace) -> None:
    if rel is None:  # a statement without a result (CREATE, SET)
        return
    if args.raw:
        for row in rel.fetchall():
            print("\t".join("" if v is None else str(v) for v in row))
    else:
        rel.show(max_width=1 << 30, max_col_width=1 << 30, max_rows=args.max_rows or (1 << 62))


def _statements(stream: Any) -> Iterator[str]:
    """SQL statements read from ``stream``: lines gathered until one ends with ';' (or EOF, or .quit),
    and dot commands (a line starting with '.'). A terminal gets a prompt and line editing."""
    interactive = stream.isatty()
    if interactive:
        import readline  # noqa: F401 (input() then has history and editing)
    buf: list[str] = []
    while True:
        if interactive:
            try:
                line = input("dualhub> " if not buf else "    ...> ") + "\n"
            except EOFError:
                break
        else:
            line = stream.readline()
            if not line:
                break
        if not buf and line.startswith("."):
            if line.split()[0] in (".quit", ".exit"):
                return
            yield line.strip()  # a dot command: one line, no ';'
            continue
        if not buf and not line.strip():
            continue
        buf.append(line)
        if line.rstrip().endswith(";"):
            yield "".join(buf)
            buf = []
    if "".join(buf).strip():
        yield "".join(buf)


def cmd_sql(args: argparse.Namespace) -> int:
    import duckdb

    from analysis.report import one_line

    if args.max_rows < 0:
        raise DualhubError(f"--max-rows must be 0 (all) or more, not {args.max_rows}")
    con = _connect_target(args.target)
    try:
        _read_only(con)
        if args.query is not None:
            try:
                _print(_sql(con, args.query), args)
            except duckdb.Error as e:
                raise DualhubError(one_line(e)) from None
            return 0
        failed = 0
        for stmt in _statements(sys.stdin):
            if stmt.startswith("."):
                cmd, _, arg = stmt.partition(" ")
                if cmd == ".tables" and not arg:
                    stmt = "SHOW TABLES"
                elif cmd == ".schema" and arg.strip():
                    stmt = f"DESCRIBE {arg.strip()}"
                else:
                    failed += 1
                    print(
                        f"error: unknown command {stmt!r} (known: .tables, .schema VIEW, .quit)",
                        file=sys.stderr,
                    )
                    continue
            try:
                _print(_sql(con, stmt), args)
            except (duckdb.Error, DualhubError) as e:
                failed += 1
                print(f"error: {one_line(e)}", file=sys.stderr)
            sys.stdout.flush()
        return 1 if failed else 0
    finally:
        con.close()
