"""Bad input at the command line: one stderr line ``dualhub CMD: error: ...``, exit 2, nothing
half-written left behind (no ``*.tmp``), SIGINT and a full disk included.

The full-disk cases write to a real 64 KiB tmpfs (``mount -t tmpfs``: the tests run as root, here and
in CI); the SIGINT case signals a real ``dualhub replay`` subprocess mid-run."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dualhub.cli import main
from engine.store import open_session
from replay.config import ReplayConfig
from replay.driver import run_replay
from tests.helpers import REPO
from venue.simulator import simulate_session
from wire.journal import RECV, replay


def one_error(err: str, cmd: str) -> str:
    """The single stderr line, which must be ``dualhub CMD: error: ...``."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dualhub {cmd}: error: "), err
    return lines[0]


def no_tmp(root: Path) -> None:
    assert not list(root.rglob("*.tmp")), list(root.rglob("*.tmp"))


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def dualhub_proc(*args: str, **kw) -> subprocess.Popen:  # type: ignore[type-arg]
    return subprocess.Popen(
        [sys.executable, "-m", "dualhub.cli", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=2.0, seed=11)


@pytest.fixture(scope="module")
def run_dir(session: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    return run_replay(session, ReplayConfig(laya_provider="cpu"), out_dir=out).run_dir


# ---------------------------------------------------------------- replay --out, checked before the run


def test_replay_out_that_is_a_file_fails_before_the_run(session, tmp_path, capsys):
    target = tmp_path / "out"
    target.write_text("mine")
    for extra in ([], ["--overwrite"]):
        rc, err = cli(capsys, "replay", str(session), "--provider", "cpu", "--out", str(target), *extra)
        assert rc == 2 and "is a file" in one_error(err, "replay")
        assert target.read_text() == "mine"
        no_tmp(tmp_path)


def test_replay_out_under_a_file_fails_before_the_run(session, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    rc, err = cli(capsys, "replay", str(session), "--provider", "cpu", "--out", str(tmp_path / "f" / "run"))
    assert rc == 2 and "is a file, not a directory" in one_error(err, "replay")
    no_tmp(tmp_path)


def test_overwrite_replaces_runs_only_never_another_directory(session, tmp_path, capsys):
    before = tree_digest(session)
    rc, err = cli(capsys, "replay", str(session), "--provider", "cpu", "--out", str(session), "--overwrite")
    assert rc == 2 and "not a run directory" in one_error(err, "replay")
    assert tree_digest(session) == before


def test_replay_failing_mid_run_leaves_no_tmp(session, tmp_path, capsys):
    # the cassette is opened after the run directory is made: its error must take <run>.tmp with it
    out = tmp_path / "run"
    rc, err = cli(
        capsys, "replay", str(session), "--provider", "cpu", "--out", str(out),
        "--kev-mode", "cassette", "--kev-cassette", str(tmp_path / "missing.parquet"),
    )  # fmt: skip
    assert rc == 2 and "cassette" in one_error(err, "replay")
    assert not out.exists()
    no_tmp(tmp_path)


def test_replay_disk_error_at_the_end_leaves_no_tmp(session, tmp_path, capsys, monkeypatch):
    # fault injection: the manifest write fails as on a full disk, after the whole event log is written
    import replay.finish as finish

    def enospc(path, obj):
        raise OSError(28, os.strerror(28), str(path))

    monkeypatch.setattr(finish, "write_json", enospc)
    rc, err = cli(capsys, "replay", str(session), "--provider", "cpu", "--out", str(tmp_path / "run"))
    line = one_error(err, "replay")
    assert rc == 2 and "No space left on device" in line and "manifest.json" in line
    assert not (tmp_path / "run").exists()
    no_tmp(tmp_path)


@pytest.fixture(scope="module")
def long_session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 30 simulated minutes: about a second of replay after the run directory appears
    return simulate_session(tmp_path_factory.mktemp("sim30") / "s", minutes=30.0, seed=3)


def test_sigint_mid_replay_leaves_no_tmp(long_session, tmp_path):
    out = tmp_path / "run"
    tmp = out.with_name("run.tmp")
    proc = dualhub_proc("replay", str(long_session), "--provider", "cpu", "--out", str(out))
    deadline = time.monotonic() + 120
    while not tmp.exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "the replay never made its run directory"
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err  # interrupted mid-run, not finished
    assert "Traceback" not in err and err.strip().splitlines() == ["dualhub replay: interrupted"]
    assert not out.exists()
    no_tmp(tmp_path)


# ---------------------------------------------------------------- URLs, checked before anything runs


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "SESSION", "--kev-mode", "llm", "--kev-url", "localhost:8080"],
        ["replay", "SESSION", "--kev-mode", "llm", "--kev-url", "http://127.0.0.1:99999"],
        ["replay", "SESSION", "--kev-mode", "llm", "--kev-url", "http://[::1"],
        ["live", "--exchange-url", "api.bitget.com", "--duration", "1"],
        ["live", "--kev-url", "ftp://127.0.0.1:8080", "--duration", "1"],
        ["live", "--ws-url", "http://127.0.0.1:8081", "--duration", "1"],
        ["kev", "bench", "--url", "127.0.0.1:8080", "-n", "1"],
        ["doctor", "--kev-url", "localhost:8080"],
        ["doctor", "--exchange-url", "http//api.bitget.com"],
        ["record", "--symbols", "BTCUSDT", "--out", "OUT", "--url", "https://ws.bitget.com/v2/ws/public"],
    ],
)
def test_malformed_urls_are_one_line_before_anything_runs(argv, session, tmp_path, capsys):
    argv = [str(session) if a == "SESSION" else str(tmp_path / "o") if a == "OUT" else a for a in argv]
    rc, err = cli(capsys, *argv)
    assert rc == 2 and "is not a valid URL" in one_error(err, argv[0])
    assert not list(tmp_path.iterdir()) and not (session / "runs").exists()


def test_url_credentials_never_reach_the_message(capsys):
    rc, err = cli(capsys, "doctor", "--kev-url", "http//user:s3cret@host:8080")
    assert rc == 2 and "s3cret" not in one_error(err, "doctor")


def test_llm_mode_without_a_url_is_one_line(session, capsys):
    rc, err = cli(capsys, "replay", str(session), "--kev-mode", "llm")
    assert rc == 2 and "--kev-url" in one_error(err, "replay")


def test_kev_bench_against_a_dead_port_names_the_url_and_the_error(capsys):
    url = f"http://127.0.0.1:{dead_port()}"
    rc, err = cli(capsys, "kev", "bench", "--url", url, "-n", "2")
    line = one_error(err, "kev")
    assert rc == 2 and url in line and "Connection refused" in line


# ---------------------------------------------------------------- report verifies the run


def test_report_refuses_a_half_written_run(run_dir, tmp_path, capsys):
    half = tmp_path / "run.tmp"
    shutil.copytree(run_dir, half)
    rc, err = cli(capsys, "report", str(half))
    assert rc == 2 and "half-written" in one_error(err, "report")
    no_manifest = tmp_path / "run2"
    shutil.copytree(run_dir, no_manifest)
    (no_manifest / "manifest.json").unlink()
    rc, err = cli(capsys, "report", str(no_manifest))
    assert rc == 2 and "no manifest.json" in one_error(err, "report")


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_report_refuses_a_tampered_or_truncated_event_file(damage, run_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    rc, _ = cli(capsys, "report", str(run))
    assert rc == 0  # the copy reports; the damage is what is refused
    f = run / "events" / "fill.parquet"
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        f.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        f.unlink()
    rc, err = cli(capsys, "report", str(run), "--html", str(tmp_path / "r.html"))
    assert rc == 2 and "fill.parquet" in one_error(err, "report")
    assert not (tmp_path / "r.html").exists()
    no_tmp(tmp_path)


# ---------------------------------------------------------------- the last-resort guard in main


def test_an_os_error_from_any_command_is_one_line(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    rc, err = cli(capsys, "simulate", "--out", str(tmp_path / "f" / "s"), "--minutes", "0.2")
    line = one_error(err, "simulate")
    assert rc == 2 and "Not a directory" in line and str(tmp_path / "f") in line


def test_a_real_bug_still_shows_its_traceback(monkeypatch, capsys):
    import replay.cli

    def bug(args):
        raise ValueError("a bug")

    monkeypatch.setattr(replay.cli, "cmd_simulate", bug)
    with pytest.raises(ValueError, match="a bug"):
        main(["simulate", "--out", "x"])


# ---------------------------------------------------------------- recover on bytes that are no journal


def test_recover_refuses_a_segment_of_random_bytes_and_changes_nothing(tmp_path, capsys):
    root = tmp_path / "rec"
    (root / "journal").mkdir(parents=True)
    (root / "record.json").write_text(
        '{"url": "ws://127.0.0.1:1", "symbols": ["BTCUSDT"], "channels": ["trade"]}'
    )
    (root / "journal" / "seg-000000.dhj.part").write_bytes(os.urandom(4096))
    (root / "trade").mkdir()
    (root / "trade" / "part-00000.parquet").write_bytes(b"derived")
    before = tree_digest(root)
    rc, err = cli(capsys, "recover", str(root))
    line = one_error(err, "recover")
    assert rc == 2 and "seg-000000.dhj.part is not a dualhub journal segment" in line
    assert tree_digest(root) == before


def test_recover_refuses_an_unreadable_record_json(tmp_path, capsys):
    root = tmp_path / "rec"
    root.mkdir()
    (root / "record.json").write_bytes(os.urandom(64))
    rc, err = cli(capsys, "recover", str(root))
    assert rc == 2 and "record.json" in one_error(err, "recover")


# ---------------------------------------------------------------- a full disk (a real 64 KiB tmpfs)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode:
        pytest.fail(f"cannot mount a 64 KiB tmpfs (the full-disk tests need root): {r.stderr.decode()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def fill(disk: Path) -> Path:
    """Take every byte left on ``disk``."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        with pytest.raises(OSError) as e:
            while True:
                f.write(b"\0" * 4096)
    assert e.value.errno == 28
    return filler


def test_record_and_recover_on_a_full_disk(small_disk, tmp_path):
    server = dualhub_proc("serve", "--toy", "20000", "--speed", "50", "--symbols", "BTCUSDT,ETHUSDT")
    try:
        url = server.stdout.readline().split()[-1]  # type: ignore[union-attr]
        out = small_disk / "s"
        rec = dualhub_proc(
            "record", "--symbols", "BTCUSDT,ETHUSDT", "--out", str(out), "--url", url,
            "--flush-ms", "50", "--duration", "60", "--no-status",
        )  # fmt: skip
        _, err = rec.communicate(timeout=120)
    finally:
        server.terminate()
        server.communicate(timeout=30)
    line = one_error(err, "record")
    assert rec.returncode == 2 and "No space left on device" in line and f"dualhub recover {out}" in line
    no_tmp(small_disk)
    # what reached the journal is intact: every block reads back (a torn tail is what recover cuts)
    frames = sum(r.kind == RECV for r in replay(out / "journal"))
    assert frames > 50

    # recover on the still-full disk: the same one line, nothing half-written, and it can run again
    filler = fill(small_disk)
    r = dualhub_proc("recover", str(out))
    _, err = r.communicate(timeout=120)
    line = one_error(err, "recover")
    assert r.returncode == 2 and "No space left on device" in line and "again" in line
    no_tmp(small_disk)
    assert not (out / "manifest.json").exists()

    filler.unlink()  # space again: the journal becomes the session
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    r = dualhub_proc("recover", str(out))
    _, err = r.communicate(timeout=120)
    assert r.returncode == 0, err
    s = open_session(out)
    s.verify()
    assert s.manifest["streams"]["books15"]["rows"] > 0 and s.manifest["recorder"]["recovered"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["replay", "SESSION", "--seed", "-1"], "seed"),
        (["replay", "SESSION", "--seed", "99999999999999999999999"], "seed"),
        (["replay", "SESSION", "--kev-lag-p95-ms", "inf"], "kev_lag_p95_ms"),
        (["replay", "SESSION", "--kev-lag-p5-ms", "nan"], "kev_lag_p5_ms"),
        (["replay", "SESSION", "--kev-lag-p5-ms", "400", "--kev-lag-p95-ms", "300"], "kev_lag_p5_ms"),
        (["replay", "SESSION", "--kev-min-interval-ms", "-5"], "kev_min_interval_ms"),
        (["replay", "SESSION", "--kev-timeout-ms", "99999999999999999999999"], "kev_timeout_ms"),
        (["simulate", "--out", "OUT", "--seed", "-1"], "--seed"),
        (["simulate", "--out", "OUT", "--minutes", "inf"], "--minutes"),
        (["serve", "--simulate", "--seed", "-1"], "--seed"),
        (["serve", "--simulate", "--speed", "nan"], "--speed"),
        (["serve", "--simulate", "--port", "70000"], "--port"),
        (["serve", "--simulate", "--minutes", "inf"], "--minutes"),
        (["serve", "--toy", "0"], "--toy"),
        (["live", "--duration", "nan"], "duration_s"),
        (["live", "--duration", "1", "--seed", "-1"], "seed"),
        (["live", "--duration", "1", "--venue-lost", "1e400"], "venue_lost_s"),
        (["live", "--duration", "1", "--kev-timeout-ms", "99999999999999999999999"], "kev_timeout_ms"),
        (["train", "SESSION", "--out", "OUT", "--embargo-ms", "nan"], "--embargo-ms"),
        (["train", "SESSION", "--out", "OUT", "--horizon-ms", "inf"], "--horizon-ms"),
        (["train", "SESSION", "--out", "OUT", "--burst-ratio", "nan"], "burst_ratio"),
        (["train", "SESSION", "--out", "OUT", "--seed", "-2"], "--seed"),
        (["record", "--symbols", "BTCUSDT", "--out", "OUT", "--duration", "nan"], "duration_s"),
        (["record", "--symbols", "BTCUSDT", "--out", "OUT", "--rotate-s", "inf"], "rotate_s"),
        (["record", "--symbols", "BTCUSDT", "--out", "OUT", "--rotate-mb", "inf"], "--rotate-mb"),
        (["record", "--symbols", "BTCUSDT", "--out", "OUT", "--ping-s", "nan"], "ping_interval_s"),
        (["record", "--symbols", "BTCUSDT", "--out", "OUT", "--backoff-s", "inf"], "backoff_initial_s"),
        (["record", "--symbols", "BTCUSDT", "--out", "OUT", "--silent-after-s", "-1"], "silent_after_s"),
        (["record", "--symbols", "BTCUSDT", "--out", "OUT", "--seed", "-1"], "seed"),
        (["record", "--symbols", "BTCUSDT", "--out", "OUT", "--channels", ","], "no channels"),
        (["serve-exchange", "SESSION", "--speed", "nan"], "--speed"),
        (["serve-exchange", "SESSION", "--port", "70000"], "--port"),
        (["serve-exchange", "SESSION", "--fill-model", "nosuch"], "unknown fill model"),
        (["live", "--duration", "1", "--kill-file", "/dev/null/KILL"], "could never be created"),
    ],
)
def test_settings_out_of_range_are_one_line_before_anything_runs(argv, named, session, tmp_path, capsys):
    """A negative or huge seed, a NaN or infinite duration, an impossible port, a kill file that could
    never be created: each named in one line. Before, numpy, numba or int64 conversions raised them
    deep in the run (a traceback), or the run went on (a negative request interval, a NaN duration, a
    kill switch nobody could throw)."""
    argv = [str(session) if a == "SESSION" else str(tmp_path / "o") if a == "OUT" else a for a in argv]
    if argv[0] == "live":
        argv += ["--exchange-url", f"http://127.0.0.1:{dead_port()}", "--out", str(tmp_path / "live")]
    rc, err = cli(capsys, *argv)
    assert rc == 2 and named in one_error(err, argv[0])
    assert not list(tmp_path.iterdir()) and not (session / "runs").exists()
