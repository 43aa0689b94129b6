"""``kill -9`` of ``dualhub live`` mid-trading, then ``dualhub recover``: every order the local exchange
saw (``--live``) is in the rebuilt run, the venue's differences are reconcile events, and ``report``,
``sql`` and ``parity`` work on the run as on one that ended normally (paper: the replay reproduces the
recovered run up to its journal's end)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import orjson
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from live.recover import _reconcile_with_venue, recover_live
from live.runner import LiveConfig, run_live
from live.wal import WAL_FILE, WalContent, WalScan, load_wal
from tests.helpers import REPO as ROOT
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames
from wire.bitget.bitget_v2_rest import Credentials

CONFIRM = "--i-understand-this-trades-real-money"
SPEED = 10.0
KEY, SECRET, PASSPHRASE = "rec-key", "rec-secret-0123456789", "rec-pass-0123456789"


@pytest.fixture(scope="module")
def frames():
    return list(simulator_frames(["BTCUSDT"], minutes=2, seed=3))


def _env(creds: bool):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BITGET_")}
    if creds:
        env.update(BITGET_API_KEY=KEY, BITGET_API_SECRET=SECRET, BITGET_API_PASSPHRASE=PASSPHRASE)
    return env


def _start(ex, out, *mode):
    cmd = [sys.executable, "-m", "dualhub.cli", "live", *mode, "--exchange-url", ex.rest_url,
           "--ws-url", ex.ws_url, "--out", str(out), "--duration", "120", "--provider", "cpu",
           "--status-every", "0"]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=ROOT, env=_env("--live" in mode), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait(proc, cond, timeout):
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"live ended or timed out: {proc.communicate()[1][-3000:]}")
        time.sleep(0.1)


def _kill9(proc):
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def _recover(out, creds: bool):
    p = subprocess.run(
        [sys.executable, "-m", "dualhub.cli", "recover", str(out)],
        cwd=ROOT, env=_env(creds), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    return p


def _analyse(run, out, capsys):
    """report, sql and parity on the run, in process as the CLI runs them."""
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    rep = capsys.readouterr().out
    assert "turnover" in rep and "Traceback" not in rep
    sql = "SELECT count(*) > 10 AND count(*) FILTER (WHERE pnl IS NULL) = 0 AS ok FROM equity"
    assert main(["sql", str(run), sql]) == 0
    assert "true" in capsys.readouterr().out
    code = main(["parity", str(out)])
    par = capsys.readouterr().out
    assert code == 0, par
    assert "recovered from its write-ahead journal" in par
    return par


def test_kill_9_of_a_live_run_then_recover_keeps_every_order_the_exchange_saw(frames, tmp_path, capsys):
    out = tmp_path / "live"
    ex = LocalExchange(frames, speed=SPEED, accounts={KEY: (SECRET, PASSPHRASE)})
    with LocalExchangeThread(ex):
        proc = _start(ex, out, "--live", CONFIRM, "--watchdog-s", "2")
        # the engine compiles before it subscribes: on a fresh checkout that is minutes
        _wait(proc, lambda: ex.public.connections > 0, 300)
        _wait(proc, lambda: sum(o.status == "filled" for o in list(ex.orders.values())) >= 3, 60)
        _wait(proc, lambda: len(ex.orders) >= 10, 60)
        resting: set[str] = set()

        def quoting():  # mid-trading: orders resting at the venue
            resting.update(o.client_oid for o in list(ex.orders.values()) if o.open)
            return bool(resting)

        _wait(proc, quoting, 30)
        _kill9(proc)
        # the watchdog sees the engine die (its pipe closes) and cancel-alls the venue
        deadline = time.monotonic() + 20
        while ex.open_orders() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ex.open_orders() == []
        seen = {o.client_oid for o in list(ex.orders.values())}
        filled = {o.client_oid for o in list(ex.orders.values()) if o.status == "filled"}
        tmp = out / "runs" / "live-BTCUSDT.tmp"
        assert (tmp / WAL_FILE).is_file() and not (out / "runs" / "live-BTCUSDT").exists()
        p = _recover(out, creds=True)
    assert "reconciled with" in p.stderr
    run = out / "runs" / "live-BTCUSDT"
    m = orjson.loads((run / "manifest.json").read_bytes())
    assert m["kind"] == "live" and m["recovered"]["reconciled"] is True
    assert not tmp.exists() and (run / WAL_FILE).is_file()
    tag = load_wal(run / WAL_FILE).header["run_tag"]
    orders = pq.read_table(run / "events" / "order.parquet").to_pylist()
    sent = {tag + o["client_oid"] for o in orders if o["kind"] == "new"}
    assert seen and seen <= sent  # every order the exchange saw is in the run
    fills = {tag + f["client_oid"] for f in pq.read_table(run / "events" / "fill.parquet").to_pylist()}
    rec = pq.read_table(run / "events" / "reconcile.parquet").to_pylist()
    # a fill the engine heard of is in the run; one it did not (its push was on the way, or it came
    # before the watchdog's cancel) is a reconcile event
    assert filled <= fills | {tag + r["client_oid"] for r in rec if r["kind"] == "missed_fill"}
    # the orders the journal leaves working when the engine died: the venue finished them (the
    # watchdog cancelled what still rested), the journal could not know: each is a reconcile event
    finished = {o["client_oid"] for o in orders if o["kind"] in ("done", "cancel_ack", "reject")}
    unfinished = {o["client_oid"] for o in orders if o["kind"] == "new"} - finished
    reconciled = {r["client_oid"] for r in rec if r["kind"] in ("missed_done", "missing_on_exchange")}
    assert unfinished and unfinished <= reconciled
    assert {c.removeprefix(tag) for c in resting} <= finished | reconciled
    assert m["counts"]["order"] == len(orders) and m["files"]["events/order.parquet"]["rows"] == len(orders)
    live_json = orjson.loads((out / "live.json").read_bytes())
    assert live_json["running"] is False and live_json["recovered"]["runs"] == ["runs/live-BTCUSDT"]
    _analyse(run, out, capsys)
    assert main(["recover", str(out)]) == 0  # again: nothing left to rebuild, nothing changed
    assert orjson.loads((run / "manifest.json").read_bytes()) == m


def test_kill_9_of_a_paper_run_then_recover_replays_identically(frames, tmp_path, capsys):
    out = tmp_path / "paper"
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED)) as ex:
        proc = _start(ex, out, "--paper")
        _wait(proc, lambda: ex.public.connections > 0, 300)
        wal = out / "runs" / "live-BTCUSDT.tmp" / WAL_FILE
        _wait(proc, lambda: wal.is_file() and load_wal(wal).stream_rows("fill") >= 3, 60)
        _kill9(proc)
    with open(wal, "ab") as f:  # a write the kill cut short
        f.write(b"\x40\x00\x00\x00\x12\x34")
    p = _recover(out, creds=False)
    assert "torn tail" in p.stderr and "paper run" in p.stderr  # one line each
    run = out / "runs" / "live-BTCUSDT"
    m = orjson.loads((run / "manifest.json").read_bytes())
    assert m["kind"] == "live" and m["counts"]["fill"] >= 3 and m["recovered"]["venue"]["state"] == "no_venue"
    assert m["recovered"]["cut_bytes"] == 6
    par = _analyse(run, out, capsys)
    assert "no divergence" in par


def test_a_finished_runs_journal_rebuilds_the_same_run(frames, tmp_path):
    """The journal holds everything the run's files hold: a normally finished paper run rebuilt from its
    orders.wal alone has the same digest, counts, delays and cassette."""
    out = tmp_path / "done"
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED)) as ex:
        res = run_live(
            LiveConfig(
                out=str(out), exchange_url=ex.rest_url, ws_url=ex.ws_url, laya_provider="cpu", duration_s=4.0
            )
        )
    assert res.exit_code == 0
    run = res.run_dirs["BTCUSDT"]
    m = orjson.loads((run / "manifest.json").read_bytes())
    assert m["recovered"] is False and m["wal"]["records"] > 5 and m["counts"]["order"] > 0
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    tmp = copy / "runs" / "live-BTCUSDT.tmp"
    (copy / "runs" / "live-BTCUSDT").rename(tmp)
    for p in tmp.iterdir():  # the journal alone
        if p.name != WAL_FILE:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    lines = []
    (r,) = recover_live(copy, say=lines.append)
    assert r.counts == m["counts"] and "paper run" in lines[-1]
    got = orjson.loads((r.run_dir / "manifest.json").read_bytes())
    assert got["digest"] == m["digest"] and got["decision_digest"] == m["decision_digest"]
    for f in ("latency_recorded.parquet", "kev_cassette.parquet", "events/reconcile.parquet"):
        assert pq.read_table(r.run_dir / f).equals(pq.read_table(run / f)), f
    assert got["config_sha256"] == m["config_sha256"] and got["engine_config"] == m["engine_config"]


def test_an_unreachable_venue_is_one_line_and_the_run_is_unreconciled(tmp_path):
    header = {
        "mode": "live",
        "rest_url": "http://127.0.0.1:9",
        "run_tag": "dh1-",
        "manifest": {"symbols": []},
    }
    content = WalContent(WalScan(tmp_path / WAL_FILE), header=header)
    events: list = []
    got = _reconcile_with_venue(tmp_path, header, content, Credentials("k", "s3cret-x", "p4ss-x"), events)
    assert got["state"] == "unreconciled" and "not reachable" in got["line"] and "\n" not in got["line"]
    assert "s3cret-x" not in got["line"] and "p4ss-x" not in got["line"] and events == []
    got = _reconcile_with_venue(tmp_path, header, content, None, events)
    assert got["state"] == "unreconciled" and "no API keys" in got["line"]
    assert (
        _reconcile_with_venue(tmp_path, {**header, "mode": "paper"}, content, None, events)["state"]
        == "no_venue"
    )
