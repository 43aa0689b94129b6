"""Integrity at every door (issue 58): each bad input a newcomer tried is one stderr line
``dualhub CMD: error: ...`` and exit 2 (or, for SIGTERM, the interrupted status), never a traceback,
never a silent success, never a process that blocks."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from engine.store import SessionError, open_session
from replay.config import ReplayConfig
from replay.driver import run_replay
from tests.dualhub.test_cli_errors import cli, dualhub_proc, no_tmp, one_error
from tests.helpers import REPO
from venue.simulator import simulate_session


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=1.0, seed=5)


@pytest.fixture(scope="module")
def run_dir(session: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    return run_replay(session, ReplayConfig(laya_provider="cpu"), out_dir=out).run_dir


def copy_session(session: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(session, dest, ignore=shutil.ignore_patterns("runs"))
    return dest


# ---------------------------------------------------------------- user code that exits or never returns


def test_a_strategy_calling_sys_exit_is_an_error_not_exit_0(session, tmp_path, capsys):
    strat = tmp_path / "exits.py"
    strat.write_text(
        "import sys\ndef s(book, tick, qty, label, pos, target, max_pos, params):\n    sys.exit(0)\n"
    )
    rc, err = cli(capsys, "replay", str(session), "--provider", "cpu", "--strategy", f"{strat}:s",
                  "--out", str(tmp_path / "run"))  # fmt: skip
    assert rc == 2 and "SystemExit" in one_error(err, "replay")
    assert not (tmp_path / "run").exists()
    no_tmp(tmp_path)


def test_a_strategy_module_calling_sys_exit_at_import_is_an_error(session, tmp_path, capsys):
    strat = tmp_path / "exits_at_import.py"
    strat.write_text("import sys\nsys.exit(0)\n")
    rc, err = cli(capsys, "replay", str(session), "--provider", "cpu", "--strategy", f"{strat}:s")
    assert rc == 2 and "SystemExit" in one_error(err, "replay")


def test_sys_exit_from_inside_any_command_is_an_error(monkeypatch, capsys):
    import replay.cli

    def exits(args):
        raise SystemExit(0)

    monkeypatch.setattr(replay.cli, "cmd_simulate", exits)
    rc, err = cli(capsys, "simulate", "--out", "unused")
    assert rc == 2 and "SystemExit(0)" in one_error(err, "simulate")


@pytest.mark.parametrize(
    "body",
    [
        "    while True:\n        pass\n",
        "    import time\n    time.sleep(3600)\n",
        "    import time\n    while True:\n        try:\n            time.sleep(0.01)\n"
        "        except Exception:\n            pass\n",
    ],
    ids=["spins", "sleeps", "swallows-exceptions"],
)
def test_a_strategy_that_never_returns_stops_at_its_time_budget(session, tmp_path, body, capsys):
    strat = tmp_path / "stuck.py"
    strat.write_text("def s(book, tick, qty, label, pos, target, max_pos, params):\n" + body)
    rc, err = cli(capsys, "replay", str(session), "--provider", "cpu", "--strategy", f"{strat}:s",
                  "--strategy-budget-ms", "200", "--out", str(tmp_path / "run"))  # fmt: skip
    assert rc == 2 and "time budget of 200 ms" in one_error(err, "replay")
    no_tmp(tmp_path)


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_the_strategy_budget_is_checked(session, value, capsys):
    rc, err = cli(capsys, "replay", str(session), "--strategy-budget-ms", value)
    assert rc == 2 and "budget" in one_error(err, "replay")


def test_the_strategy_budget_from_the_environment_is_checked(session, tmp_path, monkeypatch, capsys):
    strat = tmp_path / "quick.py"
    strat.write_text(
        "def s(book, tick, qty, label, pos, target, max_pos, params):\n    return (0, 0, 0, 0)\n"
    )
    monkeypatch.setenv("DUALHUB_STRATEGY_BUDGET_MS", "soon")
    rc, err = cli(capsys, "replay", str(session), "--provider", "cpu", "--strategy", f"{strat}:s",
                  "--out", str(tmp_path / "run"))  # fmt: skip
    assert rc == 2 and "DUALHUB_STRATEGY_BUDGET_MS='soon'" in one_error(err, "replay")


# ---------------------------------------------------------------- the command line's own values


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--symbols", "BTCUSDT,,"], "an empty symbol"),
        (["--symbols", "BTCUSDT,BTCUSDT"], "given twice"),
        (["--instrument", "ETHUSDT:quote_qty=0.01"], "not a symbol of this replay"),
        (["--instrument", "BTCUSDT:quote_qty=0.01,quote_qty=5"], "quote_qty is given twice"),
        (["--instrument", "BTCUSDT:quote_qty=0.01", "--instrument", "BTCUSDT:quote_qty=5"], "given twice"),
    ],
)
def test_replay_symbols_and_instruments_are_checked(session, extra, said, capsys):
    rc, err = cli(capsys, "replay", str(session), "--provider", "cpu", *extra)
    assert rc == 2 and said in one_error(err, "replay")
    assert not (session / "runs").exists() or not any((session / "runs").iterdir())


def test_simulate_refuses_an_empty_symbol(tmp_path, capsys):
    rc, err = cli(capsys, "simulate", "--out", str(tmp_path / "s"), "--symbols", "BTCUSDT,,ETHUSDT")
    assert rc == 2 and "an empty symbol" in one_error(err, "simulate")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("option", "value"), [("--minutes", "-1"), ("--minutes", "nan"), ("--seed", "-3")])
def test_demo_checks_its_numbers(option, value, tmp_path, capsys):
    rc, err = cli(capsys, "demo", "--out", str(tmp_path / "d"), option, value)
    assert rc == 2 and option in one_error(err, "demo")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('"risk.max_position" = [0.01, 1e400]', "must be a finite number"),
        ('"risk.max_position" = [0.01, nan]', "must be a finite number"),
        ('"risk.max_position" = [0.01, -1]', "max_position must be > 0"),
        ("kev_timeout_ms = [100, 0]", "kev_timeout_ms"),
        ("seed = [1, 99999999999999999999]", "64-bit"),
    ],
)
def test_sweep_grid_values_meet_the_command_lines_bounds(session, tmp_path, line, said, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(f"[grid]\n{line}\n")
    out = tmp_path / "results.parquet"
    rc, err = cli(capsys, "sweep", str(grid), "--sessions", str(session), "--serial", "--out", str(out))
    assert rc == 2 and said in one_error(err, "sweep")
    assert not out.exists() and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- sessions that are not what they say


def test_a_manifest_whose_rows_disagree_with_the_file_is_refused(session, tmp_path, capsys):
    s = copy_session(session, tmp_path / "s")
    m = orjson.loads((s / "manifest.json").read_bytes())
    rel = next(r for r in m["files"] if r.startswith("books15/"))
    m["files"][rel]["rows"] += 1
    (s / "manifest.json").write_bytes(orjson.dumps(m))
    with pytest.raises(SessionError, match="rows"):
        open_session(s).verify()
    rc, err = cli(capsys, "replay", str(s), "--provider", "cpu", "--out", str(tmp_path / "run"))
    assert rc == 2 and "rows" in one_error(err, "replay")
    no_tmp(tmp_path)


def test_a_stream_row_count_that_disagrees_is_refused(session, tmp_path):
    s = copy_session(session, tmp_path / "s")
    m = orjson.loads((s / "manifest.json").read_bytes())
    m["streams"]["trade"]["rows"] -= 1
    (s / "manifest.json").write_bytes(orjson.dumps(m))
    with pytest.raises(SessionError, match="stream 'trade' lists"):
        open_session(s).verify()


def test_a_part_replaced_by_a_link_outside_the_session_is_refused(session, tmp_path, capsys):
    s = copy_session(session, tmp_path / "s")
    m = orjson.loads((s / "manifest.json").read_bytes())
    rel = next(r for r in m["files"] if r.startswith("trade/"))
    outside = tmp_path / "elsewhere.parquet"
    (s / rel).rename(outside)  # the very same bytes: the hash alone would pass it
    (s / rel).symlink_to(outside)
    rc, err = cli(capsys, "replay", str(s), "--provider", "cpu", "--out", str(tmp_path / "run"))
    assert rc == 2 and "is a link" in one_error(err, "replay")


def test_a_manifest_that_is_a_fifo_does_not_block(session, tmp_path):
    s = copy_session(session, tmp_path / "s")
    (s / "manifest.json").unlink()
    os.mkfifo(s / "manifest.json")
    proc = subprocess.run(
        [sys.executable, "-m", "dualhub.cli", "replay", str(s), "--provider", "cpu"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2 and "not a regular file" in one_error(proc.stderr, "replay")


# ---------------------------------------------------------------- runs: diff, sql, report


def test_diff_says_tampered_for_a_truncated_label_file(run_dir, tmp_path, capsys):
    import shutil

    b = tmp_path / "b"
    shutil.copytree(run_dir, b)
    label = b / "events" / "label.parquet"
    label.write_bytes(label.read_bytes()[: label.stat().st_size // 2])
    for argv in ([str(run_dir), str(b)], [str(b), str(run_dir)]):
        rc, err = cli(capsys, "diff", *argv)
        line = one_error(err, "diff")
        assert (
            rc == 2 and "tampered" in line and "events/label.parquet" in line and "no divergence" not in err
        )


def test_diff_of_a_run_with_itself_is_clean(run_dir, capsys):
    rc, err = cli(capsys, "diff", str(run_dir), str(run_dir))
    assert rc == 0 and not err


def test_sql_over_a_run_is_read_only(run_dir, capsys):
    label = run_dir / "events" / "label.parquet"
    before = label.read_bytes()
    for stmt in (
        f"COPY (SELECT * FROM label LIMIT 1) TO '{label}' (FORMAT parquet)",
        f"EXPORT DATABASE '{run_dir / 'x'}'",
        f"ATTACH '{run_dir / 'x.db'}' AS x",
        "SET profiling_output = '/tmp/p.json'",
    ):
        rc, err = cli(capsys, "sql", str(run_dir), stmt)
        assert rc == 2, stmt
        one_error(err, "sql")
    assert label.read_bytes() == before
    assert not (run_dir / "x").exists() and not (run_dir / "x.db").exists()
    # reading stays open, and tables of the connection's own
    rc, err = cli(
        capsys, "sql", str(run_dir), "CREATE TABLE t AS SELECT count(*) n FROM label; SELECT * FROM t"
    )
    assert rc == 0, err


def test_sql_read_only_on_stdin_too(run_dir, monkeypatch, capsys):
    import io

    label = run_dir / "events" / "label.parquet"
    before = label.read_bytes()
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"COPY (SELECT 1) TO '{label}';\nSELECT 1;\n"))
    rc = main(["sql", str(run_dir)])
    assert rc == 1 and "refused" in capsys.readouterr().err
    assert label.read_bytes() == before


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("/proc/version", "cannot write /proc/version"),
        ("/nonexistent/dir/x.html", "does not exist"),
        ("DIR", "is a directory"),
    ],
)
def test_report_html_to_a_place_that_takes_no_file(run_dir, tmp_path, target, said, capsys):
    target = str(tmp_path) if target == "DIR" else target
    rc = main(["report", str(run_dir), "--html", target])
    out, err = capsys.readouterr()
    line = one_error(err, "report")
    assert rc == 2 and said in line and ".tmp" not in line
    assert not Path("/nonexistent").exists()
    assert out == ""  # refused before the report, not after printing it


def test_a_missing_optional_dependency_is_one_line_naming_the_install(run_dir, tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a))
    rc, err = cli(capsys, "report", str(run_dir), "--html", str(tmp_path / "r.html"))
    line = one_error(err, "report")
    assert rc == 2 and "matplotlib is not installed" in line and "pip install -e '.[research]'" in line


def test_a_missing_optional_module_raised_anywhere_is_one_line(monkeypatch, capsys):
    import replay.cli

    def needs_sklearn(args):
        raise ModuleNotFoundError("No module named 'sklearn'", name="sklearn")

    monkeypatch.setattr(replay.cli, "cmd_simulate", needs_sklearn)
    rc, err = cli(capsys, "simulate", "--out", "unused")
    line = one_error(err, "simulate")
    assert rc == 2 and "scikit-learn is not installed" in line and "'.[train]'" in line


# ---------------------------------------------------------------- signals


@pytest.fixture(scope="module")
def long_session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("sim30") / "s", minutes=30.0, seed=3)


def test_sigterm_mid_replay_leaves_no_tmp(long_session, tmp_path):
    out = tmp_path / "run"
    tmp = out.with_name("run.tmp")
    proc = dualhub_proc("replay", str(long_session), "--provider", "cpu", "--out", str(out))
    deadline = time.monotonic() + 300
    while not tmp.exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "the replay never made its run directory"
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "dualhub replay: terminated (SIGTERM)"
    assert not out.exists()
    no_tmp(tmp_path)


# ---------------------------------------------------------------- noise


def test_cuda_fallback_on_a_machine_without_gpu_is_one_quiet_line(capsys):
    from engine.optional import _CpuOnlyMachine

    f = _CpuOnlyMachine()
    _CpuOnlyMachine.said = False
    msg = "CUDA was requested but onnxruntime fell back to CPUExecutionProvider: no GPU. Run `dualhub doctor`"
    rec = logging.LogRecord(
        "engine.laya.model", logging.WARNING, __file__, 1, "Laya %s: %s", ("m", msg), None
    )
    assert f.filter(rec) is False and f.filter(rec) is False
    out = capsys.readouterr()
    assert out.out.splitlines() == ["Laya runs on CPU (no GPU on this machine; `dualhub doctor` for details)"]
    assert out.err == ""
    other = logging.LogRecord("engine.laya.model", logging.WARNING, __file__, 1, "something else", (), None)
    assert f.filter(other) is True


def test_the_compile_is_announced_and_timed(capsys):
    import numba

    from replay.cli import CompileWatch

    @numba.njit(cache=False)
    def fresh(x):
        return x * 3 + 1

    with CompileWatch() as watch:
        assert fresh(2) == 7
        assert fresh(5) == 16  # compiled once
    assert watch.seconds > 0
    assert capsys.readouterr().out.count("compiling the replay core") == 1


def test_replay_report_prints_the_run_and_digest_once(session, tmp_path, capsys):
    rc = main(["replay", str(session), "--provider", "cpu", "--out", str(tmp_path / "run"), "--report"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert sum(ln.startswith(("run:", "run ")) for ln in lines) == 1
    assert sum(ln.startswith(("digest:", "digest ")) for ln in lines) == 1
    assert lines[0].strip(), "no blank first line"
    assert pq.read_metadata(tmp_path / "run" / "events" / "label.parquet").num_rows > 0


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["record", "--symbols", "BTCUSDT,,", "--out", "OUT"], "empty entry"),
        (["live", "--symbols", "BTCUSDT,,", "--paper", "--duration", "1"], "an empty symbol"),
        (["replay"], "required: session"),
        (["import", "nope", "f"], "invalid choice"),
    ],
)
def test_usage_errors_and_empty_symbols_are_one_line(argv, said, tmp_path, capsys):
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in argv]
    with pytest.raises(SystemExit) as e:  # argparse's own exit, as the console script gets it
        rc = main(argv)
        raise SystemExit(rc)
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in one_error(err, argv[0])
    if argv[0] != "live":  # argparse's errors point at the usage
        assert f"dualhub {argv[0]} --help" in err
    assert not (tmp_path / "o").exists()


def test_a_closed_pipe_ends_quietly(run_dir):
    # `dualhub report RUN | head -1`: the reader goes away, which is no error to report
    p = subprocess.run(
        f"{sys.executable} -m dualhub.cli report {run_dir} | head -1", shell=True, cwd=REPO,
        capture_output=True, text=True, executable="/bin/bash", timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert p.stdout.startswith("run ") and p.stderr == "", p.stderr


def test_a_run_manifest_whose_rows_disagree_is_refused(run_dir, tmp_path, capsys):
    import shutil

    b = tmp_path / "b"
    shutil.copytree(run_dir, b)
    m = orjson.loads((b / "manifest.json").read_bytes())
    m["files"]["events/fill.parquet"]["rows"] += 1  # the file, and so its hash, untouched
    (b / "manifest.json").write_bytes(orjson.dumps(m))
    for argv in (["report", str(b)], ["sql", str(b), "SELECT 1"], ["diff", str(run_dir), str(b)]):
        rc, err = cli(capsys, *argv)
        line = one_error(err, argv[0])
        assert rc == 2 and "rows" in line and "fill.parquet" in line, line


def test_sweep_plot_into_a_missing_directory_is_refused_before_the_runs(session, tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text("[grid]\nscale_kev = [1]\n")
    out = tmp_path / "results.parquet"
    rc, err = cli(capsys, "sweep", str(grid), "--sessions", str(session), "--serial", "--out", str(out),
                  "--plot", str(tmp_path / "missing" / "p.png"))  # fmt: skip
    assert rc == 2 and "does not exist" in one_error(err, "sweep")
    assert not out.exists() and not (tmp_path / "missing").exists()
