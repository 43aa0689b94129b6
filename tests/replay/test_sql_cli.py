"""``dualhub sql``: the views of analysis/views.sql over a real replay run, a query, statements
piped on stdin, a sweep's results table, and errors as one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.report import connect
from dualhub.cli import main
from engine.events import STREAMS
from tests.helpers import REPO


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from replay.config import ReplayConfig
    from replay.driver import run_replay
    from venue.simulator import simulate_session

    root = tmp_path_factory.mktemp("sql")
    session = simulate_session(root / "session", minutes=1.0, seed=4)
    return run_replay(session, ReplayConfig(seed=3, laya_provider="cpu"), out_dir=root / "run").run_dir


def test_every_event_file_of_a_run_has_a_view_and_every_view_reads(run: Path) -> None:
    con = connect(run)
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    streams = {p.stem for p in (run / "events").glob("*.parquet")}
    assert streams and streams <= views, f"views.sql lacks a view for {sorted(streams - views)}"
    for v in sorted(views):
        con.execute(f'SELECT count(*) FROM "{v}"').fetchall()
    for s in streams:  # each stream view has its event schema's columns
        cols = [r[0] for r in con.execute(f'DESCRIBE "{s}"').fetchall()]
        assert cols == STREAMS[s].schema.names


def test_decision_views_agree_with_the_raw_events(run: Path) -> None:
    con = connect(run)
    one = lambda sql: con.execute(sql).fetchall()[0]  # noqa: E731
    news, filled_oids = one("""SELECT count(*) FILTER (WHERE kind = 'new'),
        (SELECT count(DISTINCT client_oid) FROM fill) FROM "order" """)
    decisions, filled, unfilled = one(
        "SELECT decisions, filled, unfilled FROM decision_counts WHERE driver = 'all'"
    )
    assert (decisions, filled, decisions - unfilled) == (news, filled_oids, filled_oids)
    assert unfilled > 0  # the default run leaves quotes unfilled: what the old fill stage counted as 0 ms
    (n_fill,) = one("SELECT n FROM latency_stage_stats WHERE driver = 'all' AND stage = 'fill'")
    assert n_fill == filled
    (last_pos,) = one("SELECT position FROM fills_pnl ORDER BY ts_recv DESC, seq DESC LIMIT 1")
    (pos_after,) = one("SELECT position_after FROM fill ORDER BY ts_recv DESC, seq DESC LIMIT 1")
    assert last_pos == pytest.approx(pos_after)


def test_a_query_prints_every_column(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", str(run), "SELECT * FROM books15 ORDER BY seq LIMIT 3"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "ts_recv" in line)
    names = [c.strip() for c in header.strip("│").split("│")]
    assert names == STREAMS["books15"].schema.names  # all 65, none elided
    assert "…" not in out


def test_statements_piped_on_stdin(run: Path) -> None:
    script = (
        "SELECT count(*) AS labels\nFROM label;\nSELECT nope FROM label;\n.tables\nSELECT 41 + 1 AS answer;\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "dualhub.cli", "sql", str(run)],
        input=script,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 1, p.stderr  # one statement failed; the others still ran
    assert "labels" in p.stdout and "decision_counts" in p.stdout and "42" in p.stdout
    errors = p.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and "nope" in errors[0]


def test_a_results_table_and_raw_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.parquet"
    pq.write_table(pa.table({"p_scale_kev": [1.0, 2.0, 2.0], "pnl_usdt": [1.5, -2.0, 3.0]}), out)
    q = "SELECT p_scale_kev, sum(pnl_usdt) FROM results GROUP BY 1 ORDER BY 1"
    assert main(["sql", "--raw", str(out), q]) == 0
    assert capsys.readouterr().out.splitlines() == ["1.0\t1.5", "2.0\t1.0"]


def test_errors_are_one_line(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", str(run), "SELECT * FROM no_such_view"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dualhub sql: error: ") and "no_such_view" in err[0]
    assert main(["sql", str(tmp_path / "missing"), "SELECT 1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a run directory" in err[0]
    assert main(["sql", "--max-rows", "-1", str(run), "SELECT 1"]) == 2
