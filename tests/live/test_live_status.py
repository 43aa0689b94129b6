"""Live mode says when it is blind: the local exchange (its own process) is killed mid-run, and the
console shows a WARNING within 5 s, the run's log gets ``venue_status`` events, the status line shows
the link down, the run ends non-zero once the venue is lost, and whether orders may still be open at
the venue is said in words. ``--kill-flattens`` closes a position through the risk gateway."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from engine.kev.advisor import KevReply
from engine.strategy import QuoteConfig
from live.health import VenueHealth
from live.runner import LiveConfig, LiveRunner
from tests.helpers import REPO as ROOT
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames
from wire.bitget.bitget_v2_rest import Credentials

CONFIRM = "--i-understand-this-trades-real-money"
LOCAL_KEYS = {
    "BITGET_API_KEY": "local-key",
    "BITGET_API_SECRET": "local-secret",
    "BITGET_API_PASSPHRASE": "local-passphrase",
}


def test_venue_health_reports_each_change_once_and_loses_a_link_after_the_limit():
    h = VenueHealth(lost_after_ns=10_000)
    assert h.observe("public_feed", "up", "", 0) is None
    stale = h.observe("public_feed", "stale", "no data", 5_000, since_ns=1_000)
    assert (stale.state, stale.age_ns) == ("stale", 4_000)  # out since its last frame
    assert h.observe("public_feed", "stale", "no data", 6_000) is None  # no change: no second warning
    down = h.observe("public_feed", "down", "refused", 7_000)
    assert (down.state, down.detail) == ("down", "refused")
    assert h.degraded(9_000) == {"public_feed": "down for 0.0 s: refused"}
    back = h.observe("public_feed", "up", "", 9_000)
    assert back.state == "up" and back.age_ns == 8_000
    h.observe("private_ws", "down", "closed", 20_000)
    lost = h.observe("private_ws", "down", "closed", 30_000)
    assert lost.state == "lost" and lost.age_ns == 10_000
    assert h.observe("private_ws", "up", "", 31_000) is None  # lost is final: the run ends
    assert h.states() == {"public_feed": "up", "private_ws": "lost"}


def _serve(session: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str, str]:
    srv = subprocess.Popen(
        [sys.executable, "-m", "dualhub.cli", "serve-exchange", str(session), "--speed", "10"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    first = srv.stdout.readline().split()
    assert "REST" in first, first
    return srv, first[first.index("REST") + 1], first[first.index("WS") + 1]


class _Lines:
    """A process's stderr, line by line, each with the monotonic time it arrived."""

    def __init__(self, stream) -> None:
        self.lines: list[tuple[float, str]] = []
        self._t = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._t.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, pred, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while sum(1 for _, line in list(self.lines) if pred(line)) == 0:
            assert time.monotonic() < deadline, "\n".join(x for _, x in self.lines[-30:])
            time.sleep(0.05)

    def text(self) -> str:
        self._t.join(5)
        return "\n".join(x for _, x in self.lines)


@pytest.mark.parametrize("mode", ["paper", "live"])
def test_exchange_killed_mid_run_warns_within_5s_and_ends_non_zero(mode, tmp_path):
    assert main(["simulate", "--out", str(tmp_path / "sim"), "--minutes", "2", "--seed", "3"]) == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("BITGET_")} | LOCAL_KEYS
    srv, rest, ws = _serve(tmp_path / "sim", env)
    out = tmp_path / "s"
    how = ["--live", CONFIRM] if mode == "live" else ["--paper"]
    cmd = [sys.executable, "-m", "dualhub.cli", "live", *how,
           "--exchange-url", rest, "--ws-url", ws, "--out", str(out), "--duration", "60", "--provider", "cpu",
           "--status-every", "1", "--venue-lost", "4"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        err = _Lines(proc.stderr)
        # trading: a status line with the feed up and orders sent
        err.wait(
            lambda x: x.startswith(f"live {mode}") and "public_feed up" in x and "orders 0 " not in x, 30
        )
        killed_at = time.monotonic()
        srv.send_signal(signal.SIGKILL)  # the exchange goes away: no goodbye on any socket
        srv.wait(10)
        proc.wait(30)
    finally:
        for p in (srv, proc):
            if p.poll() is None:
                p.kill()
    text = err.text()
    assert proc.returncode == 1, text[-3000:]
    warned = [t for t, x in err.lines if x.startswith("WARNING") and "venue: public_feed down" in x]
    assert warned and 0 <= warned[0] - killed_at < 5.0, text[-3000:]
    after = [x for t, x in err.lines if t > warned[0] and x.startswith(f"live {mode}")]
    assert after and "public_feed down" in after[0]  # the status line says it too
    assert "LOST     venue: public_feed lost" in text
    run = out / "runs" / "live-BTCUSDT"
    events = pq.read_table(run / "events" / "venue_status.parquet").to_pylist()
    states = [(e["component"], e["state"]) for e in events]
    assert ("public_feed", "down") in states and ("public_feed", "lost") in states
    lost = next(e for e in events if e["state"] == "lost")
    assert lost["age_ns"] >= 4e9 and "not up for" in lost["detail"]
    m = orjson.loads((run / "manifest.json").read_bytes())
    left = m["shutdown"]["cancel_all"]["left_open"]
    if mode == "paper":
        assert m["stopped_by"] == "venue_lost:public_feed" and left == []
    else:
        assert ("private_ws", "down") in states
        assert m["killed"].startswith("venue_lost:") and m["stopped_by"].startswith("kill:venue_lost:")
        # the venue could not be asked: said so, never "None" or 0
        assert left.startswith("unknown: cancel-all failed: ") and "Connect" in left
        assert "OPEN     orders may still be open at the venue: unknown: cancel-all failed" in text


class _LongKev:
    """Always wants the longest position the limits allow: the engine buys at market towards it."""

    name = "long"

    def key(self, ctx):
        return f"long-{ctx.request_id}"

    async def advise(self, ctx):
        raw = {"action": "LEAN_BUY", "target_position": ctx.max_position, "hedge_ratio": 0.0,
               "max_slippage_bps": 10.0, "reason": "test: long"}  # fmt: skip
        return KevReply(raw=raw, key=self.key(ctx))


def test_kill_flattens_closes_the_position_at_the_venue(tmp_path):
    frames = list(simulator_frames(["BTCUSDT"], minutes=2, seed=3))
    out = tmp_path / "flat"
    creds = Credentials("local-key", "local-secret", "local-passphrase")
    with LocalExchangeThread(LocalExchange(frames, speed=10.0)) as ex:
        cfg = LiveConfig(
            out=str(out), mode="live", exchange_url=ex.rest_url, ws_url=ex.ws_url, laya_provider="cpu",
            duration_s=30, kill_flattens=True, quotes=QuoteConfig(offset_ticks=300),  # quotes rest far away
        )  # fmt: skip
        runner = LiveRunner(cfg, credentials=creds, advisor=_LongKev())
        box = {}
        t = threading.Thread(target=lambda: box.update(r=asyncio.run(runner.run())), daemon=True)
        t.start()
        deadline = time.monotonic() + 20
        while ex.position("BTCUSDT", "local-key") < 0.02:
            assert time.monotonic() < deadline and t.is_alive(), "no position was built"
            time.sleep(0.05)
        held = ex.position("BTCUSDT", "local-key")
        # The venue's fills reach the engine over the private socket, a moment later: kill once it has
        # heard of these, so the position it flattens is at least what the venue held here.
        while float(runner.syms["BTCUSDT"].engine.portfolio.position) < held - 1e-9:
            assert time.monotonic() < deadline and t.is_alive(), "the engine never heard of the fills"
            time.sleep(0.01)
        (out / "KILL").write_text("flatten-test")
        t.join(30)
        r = box["r"]
        assert r.exit_code == 3 and r.killed == "file:flatten-test"
        assert ex.position("BTCUSDT", "local-key") == pytest.approx(0.0, abs=1e-9)  # flat at the venue
        sells = [o for o in ex.orders.values() if o.side == "sell" and o.order_type == "market"]
    f = r.summary["flatten"]["BTCUSDT"]
    assert f["position_before"] >= held - 1e-9 and f["position_after"] == pytest.approx(0.0, abs=1e-9)
    assert sum(o.filled for o in sells) == pytest.approx(f["position_before"])  # the venue sold it all
    risk = pq.read_table(r.run_dirs["BTCUSDT"] / "events" / "risk.parquet").to_pylist()
    flat = [x for x in risk if x["source"] == "flatten"]
    # through the risk gateway: reduce-only market sells, every rule but the kill switch applied; one
    # refused for the order rate (the strategy's last second counts), or as reduce-only while the sell
    # quotes being cancelled still rest (either could fill: together they could leave it short), is sent
    # again, never dropped
    assert flat and all(x["side"] == "sell" and x["order_type"] == "market" for x in flat)
    assert all(x["reason"] in ("order_rate", "reduce_only") for x in flat if not x["accepted"])
    assert [x["client_oid"] for x in flat if x["accepted"]] == f["orders"]
    killed = orjson.loads((r.run_dirs["BTCUSDT"] / "manifest.json").read_bytes())["killed_at_ns"]
    assert killed and min(x["ts_recv"] for x in flat) == killed  # the flatten went out with the kill
    others = [x for x in risk if x["intent"] == "new" and x["source"] != "flatten" and x["ts_recv"] >= killed]
    assert all(not x["accepted"] and x["reason"] == "kill_switch" for x in others)
