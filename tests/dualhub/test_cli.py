"""The dualhub command as a user meets it: help texts, one-line errors, the demo pipeline."""

import subprocess
import sys

from tests.helpers import REPO as ROOT


def dualhub(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "dualhub.cli", *args], capture_output=True, text=True, cwd=cwd
    )


def test_help_lists_and_explains_subcommands():
    r = dualhub("--help")
    assert r.returncode == 0
    for cmd in ("simulate", "replay", "report", "demo"):
        assert cmd in r.stdout
    r = dualhub("replay", "--help")
    assert r.returncode == 0 and "Deterministic replay" in r.stdout and "--seed" in r.stdout


def test_user_errors_are_one_line_without_traceback(tmp_path):
    r = dualhub("replay", str(tmp_path / "nope"))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("dualhub replay: error:") and "not a finished session" in r.stderr
    r = dualhub("report", str(tmp_path))
    assert r.returncode == 2 and "not a finished run" in r.stderr and "Traceback" not in r.stderr


def test_verbose_is_dualhub_detail_not_the_compilers_passes():
    probe = (
        "import logging; from dualhub.cli import main; main(['-v', 'replay', '/nonexistent']); "
        "print(logging.getLogger('live.runner').isEnabledFor(logging.DEBUG), "
        "logging.getLogger('numba.core.byteflow').isEnabledFor(logging.DEBUG))"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.split() == ["True", "False"], r.stderr[-2000:]


def test_bad_model_is_a_clear_error(tmp_path):
    r = dualhub("simulate", "--out", str(tmp_path / "s"), "--minutes", "0.3", "--seed", "2")
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not an onnx model")
    r = dualhub("replay", str(tmp_path / "s"), "--model", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "bad.onnx" in r.stderr


def test_simulate_replay_report_pipeline(tmp_path):
    s = tmp_path / "s"
    assert dualhub("simulate", "--out", str(s), "--minutes", "0.5", "--seed", "3").returncode == 0
    r = dualhub("replay", str(s), "--out", str(tmp_path / "run"), "--report")
    assert r.returncode == 0, r.stderr
    assert "digest:" in r.stdout and "Laya labels" in r.stdout and "PnL" in r.stdout
    r2 = dualhub("report", str(tmp_path / "run"))
    assert r2.returncode == 0 and "Risk decisions by reason" in r2.stdout
