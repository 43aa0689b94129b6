"""Subcommands ``diff`` (first divergence between two runs) and ``sweep`` (what-if grids)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.errors import DualhubError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser(
        "sweep",
        help="replay sessions over a grid of configs; one row per run in a Parquet results table",
        description="GRID.toml has [base] (settings for every run) and [grid] (axes: lists of values; the "
        "cartesian product runs, axes sorted by name). Keys are ReplayConfig fields, dotted for risk.*, "
        "quotes.*, contract.*, or scale_latency (a --scale-latency spec). Runs go to OUT_DIR/runs/<key>; "
        "a failed run is a row with its error. Each run is a Ray task: on a local Ray instance sized to the "
        "machine, or on the cluster at --ray (docs/SCALE.md); --serial runs them one by one in this process. "
        "Exit status 1 when any run failed.",
    )
    p.add_argument("grid", type=Path, metavar="GRID.toml")
    p.add_argument(
        "--sessions",
        action="append",
        required=True,
        metavar="GLOB",
        help="session directories (glob, quote it; repeatable); or a filesystem URL glob (s3://, file://)",
    )
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
    p.set_defaults(func=cmd_sweep)


def cmd_diff(args: argparse.Namespace) -> int:
    import orjson

    from replay.diff import diff_runs, print_diff

    streams = [s.strip() for s in args.streams.split(",") if s.strip()]
    result = diff_runs(args.run_a, args.run_b, streams=streams, context=args.context)
    if args.json:
        sys.stdout.write(
            orjson.dumps(result.to_json(), default=str, option=orjson.OPT_INDENT_2).decode() + "\n"
        )
    else:
        print_diff(result)
    return 1 if result.diverged else 0


def cmd_sweep(args: argparse.Namespace) -> int:
    import importlib.util

    from replay.sweep import find_sessions, load_grid, sweep

    if args.resume and args.overwrite:
        raise DualhubError("--resume and --overwrite exclude each other")
    grid = load_grid(args.grid)
    serial = args.serial
    if not serial and not args.ray and importlib.util.find_spec("ray") is None:
        print("sweep: Ray is not installed (pip install 'dualhub[scale]'); running serially", file=sys.stderr)
        serial = True
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
        res = sweep(grid, sessions, Path(args.out), **common)
    else:
        from replay.ray_sweep import ray_sweep

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
    print(f"query: duckdb -c \"SELECT * FROM '{res.out}'\"")
    return 1 if res.failed else 0
