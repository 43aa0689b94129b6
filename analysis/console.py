"""``dualhub report RUN`` on the console: the tear sheet, a portfolio's section and the report's tables.

It stands above the modules it prints (:mod:`analysis.tearsheet`, :mod:`analysis.portfolio`,
:mod:`analysis.report`), which import none of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.report import FIT_COLUMNS, Section, leg_titled, print_table, run_report


def print_report(run_dir: Path | str, console: Any = None, *, run_lines: bool = True) -> list[Section]:
    """The tear sheet (analysis/tearsheet.py: header, performance, PnL split, round trips,
    markouts, calibration, latency), for a run with several instruments the Portfolio section
    (analysis/portfolio.py), and the report's tables (queries.sql), on the console.
    ``run_lines``: start with the run's path and digest."""
    import contextlib

    from rich.console import Console

    from analysis import portfolio, tearsheet

    console = console or Console()
    # a long run's report takes a while to compute: a spinner on a terminal (piped, it would only
    # leave a blank line)
    busy = console.status("building the report...") if console.is_terminal else contextlib.nullcontext()
    with busy:
        sections = run_report(run_dir)
        ts = tearsheet.compute(run_dir)
        pf = portfolio.compute(run_dir)
    manifest = ts.manifest
    head = tearsheet.header_lines(ts)
    ts_sections = tearsheet.sections(ts)
    if pf is not None:
        # a portfolio leads: its header (limits, every loss stop) and tables come first; the tear sheet
        # is one leg's, titled so, and its loss-stop line (any leg's 'loss_stop') gives way to the
        # Portfolio section's per-leg stops
        sym = manifest.get("config", {}).get("symbol")
        head = [ln for ln in head if not ln.startswith(tearsheet.LOSS_STOP_PREFIXES)]
        head[:0] = portfolio.header_lines(pf, sym)
        ts_sections = [leg_titled(s, sym) for s in ts_sections]
    # run_lines=False: a replay that just printed its run and digest (``replay --report``, ``demo``)
    ids = (f"run    {run_dir}", f"digest {manifest['digest']}") if run_lines else ()
    for line in (*ids, *head):
        if line.startswith("config: "):  # some sixty settings: wrapped between them, not one long line
            import textwrap

            width = max(console.width, FIT_COLUMNS) if console.is_terminal else FIT_COLUMNS
            line = textwrap.fill(line, width, subsequent_indent="        ", break_long_words=False)
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    for s in (*(portfolio.sections(pf) if pf is not None else ()), *ts_sections, *sections):
        print_table(console, s)
    return sections
