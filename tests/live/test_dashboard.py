"""The live dashboard (live/dashboard.py, live/snapshot.py) against a running paper session on the local
exchange: the page in headless Chromium (driven over the DevTools protocol, so one page is watched as it
updates), ``/metrics`` read with Prometheus' own parser, the kill switch through the page's endpoint, and
the address and token rules, through the CLI."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dualhub.cli import main
from engine.errors import DualhubError
from live.dashboard import ENV_TOKEN, Dashboard, is_loopback, parse_address
from live.runner import LiveConfig, LiveRunner
from tests.analysis.test_report_browser import CHROMIUM_FLAGS, chromium
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames

TOKEN = "test-token-7f3a"
SPEED = 10.0


class Session:
    """A paper run with a dashboard, running in a thread for the module's tests."""

    def __init__(self, out: Path) -> None:
        # 90 s of market data at SPEED: enough for every test of the module on a slow machine
        frames = list(simulator_frames(["BTCUSDT"], minutes=15, seed=3))
        self.ex = LocalExchangeThread(LocalExchange(frames, speed=SPEED))
        ex = self.ex.__enter__()
        self.dash = Dashboard("127.0.0.1:0", TOKEN)
        cfg = LiveConfig(
            out=str(out), exchange_url=ex.rest_url, ws_url=ex.ws_url, laya_provider="cpu", duration_s=120.0
        )
        self.runner = LiveRunner(cfg, dashboard=self.dash)
        self.result: Any = None
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        async def go() -> Any:
            self.loop = asyncio.get_running_loop()
            return await self.runner.run()

        try:
            self.result = asyncio.run(go())
        except BaseException as e:  # the test that reads the result reports it
            self.error = e

    def state(self) -> dict[str, Any]:
        r = httpx.get(self.dash.url + "api/state", timeout=10)
        assert r.status_code == 200, r.text
        return orjson.loads(r.content)

    def wait_trading(self, timeout: float = 120.0) -> dict[str, Any]:
        """Until the engine has orders and a tick-to-order figure (start-up compiles and loads first)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.thread.is_alive(), f"the run ended early: {self.error or self.result}"
            if self.dash.latest() is not None:
                d = self.state()
                if d["counts"]["fill"] > 0 and d["tick_to_order_us"]["p50"] is not None:
                    return d
            time.sleep(0.25)
        raise AssertionError("the paper run never traded")

    def stop(self) -> None:
        if self.thread.is_alive() and self.loop is not None:
            self.loop.call_soon_threadsafe(self.runner.request_stop, "test")
        self.thread.join(60)
        self.dash.close()
        self.ex.__exit__(None, None, None)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory):
    s = Session(tmp_path_factory.mktemp("dash") / "paper")
    try:
        s.wait_trading()
        yield s
    finally:
        s.stop()


def test_metrics_parse_with_prometheus_parser_and_counters_move(session: Session) -> None:
    def scrape() -> dict[str, float]:
        r = httpx.get(session.dash.url + "metrics", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        values: dict[str, float] = {}
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()))
                values[key] = s.value
        return values

    first = scrape()
    time.sleep(2.0)
    second = scrape()
    for counter in ("dualhub_live_frames_total", "dualhub_live_events_total,stream=label"):
        assert second[counter] > first[counter] > 0, counter
    assert second["dualhub_live_up"] == 1 and second["dualhub_live_kill_switch"] == 0
    assert second["dualhub_live_snapshot_seq"] > first["dualhub_live_snapshot_seq"]
    assert "dualhub_live_position,symbol=BTCUSDT" in second
    assert second["dualhub_live_tick_to_order_seconds_count"] >= 1
    assert (
        second["dualhub_live_tick_to_order_seconds_bucket,le=+Inf"]
        == (second["dualhub_live_tick_to_order_seconds_count"])
    )
    assert second["dualhub_live_venue_link,link=public_feed,state=up"] == 1
    # what /metrics says is what the engine logged: the run's own counts, not a second tally
    d = session.state()
    assert d["counts"]["order"] >= second["dualhub_live_events_total,stream=order"] > 0


def test_the_page_and_its_assets_come_from_the_package_only(session: Session) -> None:
    page = httpx.get(session.dash.url, timeout=10)
    assert page.status_code == 200 and "default-src 'none'" in page.headers["content-security-policy"]
    text = page.text
    assert "http://" not in text and "https://" not in text  # nothing fetched from elsewhere
    for asset in ("uPlot.iife.min.js", "dashboard.js", "dashboard.css", "uPlot.min.css"):
        assert f"/assets/{asset}" in text
        r = httpx.get(session.dash.url + "assets/" + asset, timeout=10)
        assert r.status_code == 200 and len(r.content) > 500
    assert "MIT" in httpx.get(session.dash.url + "assets/uPlot.LICENSE", timeout=10).text
    assert httpx.get(session.dash.url + "assets/../dashboard.py", timeout=10).status_code == 404
    # a page elsewhere reaching 127.0.0.1 through a rebound DNS name is refused
    r = httpx.get(session.dash.url + "api/state", headers={"Host": "evil.example:80"}, timeout=10)
    assert r.status_code == 403


def test_the_snapshot_follows_the_engine(session: Session) -> None:
    d = session.state()
    inst = d["instruments"]["BTCUSDT"]
    eng = session.runner.syms["BTCUSDT"].engine
    assert d["mode"] == "paper" and d["running"] and not d["kill"]["engaged"]
    assert inst["mid"] > 0 and inst["label"] in ("HOLD", "LEAN_BUY", "LEAN_SELL", "EMERGENCY")
    assert d["risk"]["decisions"] >= d["risk"]["accepted"] > 0
    assert d["fills"] and all(f["symbol"] == "BTCUSDT" for f in d["fills"])
    assert d["labels"]["rate_per_s"] > 0 and d["feed"]["frames"] > 0
    assert d["resting_total"] <= d["counts"]["order"]
    assert not d["error"] and not d["unseen_rows"]
    # the published position is one the engine held (the run goes on between the two reads)
    assert abs(inst["position"]) <= float(eng.cfg.risk.max_position) + 1e-9


# ---------------------------------------------------------------------------------------------------
# the page in Chromium


class DevTools:
    """Headless Chromium with its DevTools protocol on a loopback port: one page, evaluated over time."""

    def __init__(self, url: str, tmp: Path) -> None:
        from websockets.sync.client import connect

        profile = tmp / "profile"
        self.proc = subprocess.Popen(
            [
                chromium(),
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=1400,1500",
                url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"HOME": str(tmp), "PATH": "/usr/bin:/bin"},
        )
        port_file = profile / "DevToolsActivePort"
        end = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < end and self.proc.poll() is None, "Chromium did not start DevTools"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets: list[dict[str, Any]] = []
        while not any(t["type"] == "page" for t in targets):
            assert time.monotonic() < end, "no page target"
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            time.sleep(0.1)
        ws_url = next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
        self.ws = connect(ws_url, max_size=None, open_timeout=30, proxy=None, legacy=True)
        self.n = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        self.ws.send(orjson.dumps({"id": self.n, "method": method, "params": params}).decode())  # text frames
        while True:
            msg = orjson.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.n:
                assert "error" not in msg, msg
                return msg["result"]

    def eval(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(30)


READ = """(() => {
  const q = (s) => { const e = document.querySelector(s); return e ? e.textContent : null; };
  return {
    seq: q('#seq'), position: q('[data-sym="BTCUSDT"][data-k="position"]'), pnl: q('#pf-pnl'),
    p50: q('#t2o-p50'), p99: q('#t2o-p99'), n: q('#t2o-n'), labels: q('#label-total'),
    fills: document.querySelectorAll('#fills tbody tr').length, links: q('#venue tbody'),
    kill: q('#kill-state'), charts: document.querySelectorAll('.uplot canvas').length,
  };
})()"""


@pytest.mark.slow
def test_chromium_shows_the_run_changing(session: Session, tmp_path: Path) -> None:
    from PIL import Image

    browser = DevTools(session.dash.url, tmp_path)
    try:
        seen: list[dict[str, Any]] = []
        end = time.monotonic() + 60
        while time.monotonic() < end:
            time.sleep(0.5)
            v = browser.eval(READ)
            if v["seq"] not in (None, "-"):
                seen.append(v)
            positions = {s["position"] for s in seen}
            latency = {(s["p50"], s["n"]) for s in seen}
            if len(seen) >= 12 and len(positions) >= 2 and len(latency) >= 2:
                break
        assert len(seen) >= 12, f"the page showed no snapshot: {seen[-1:] or 'nothing'}"
        last = seen[-1]
        # the page updates itself: one page load, its values moving with the run
        assert len({s["seq"] for s in seen}) >= 6
        assert len({s["labels"] for s in seen}) >= 2
        assert len({s["position"] for s in seen}) >= 2, [s["position"] for s in seen]
        assert len({(s["p50"], s["n"]) for s in seen}) >= 2, [(s["p50"], s["n"]) for s in seen]
        assert float(last["p50"]) > 0 and float(last["p99"]) >= float(last["p50"])
        assert last["fills"] > 0 and "public_feed" in last["links"] and "up" in last["links"]
        assert last["kill"] == "kill switch off" and last["charts"] >= 2
        shot = browser.call("Page.captureScreenshot", format="png")
        out = tmp_path / "dashboard.png"
        out.write_bytes(base64.b64decode(shot["data"]))
    finally:
        browser.close()
    px = np.asarray(Image.open(out).convert("RGB"), dtype=np.int16)
    assert px.shape[0] >= 800 and px.shape[1] >= 1200
    assert px.std() > 20, "the screenshot is blank"
    print(f"dashboard screenshot: {out}")


# ---------------------------------------------------------------------------------------------------
# the kill switch (last: it ends the module's run)


def test_the_kill_switch_needs_the_token_and_a_confirmation(session: Session) -> None:
    url = session.dash.url + "api/kill"
    body = orjson.dumps({"confirm": "KILL"})
    assert httpx.post(url, content=body, timeout=10).status_code == 403
    wrong = {"Authorization": "Bearer not-the-token"}
    assert httpx.post(url, content=body, headers=wrong, timeout=10).status_code == 403
    assert httpx.post(url + f"?token={TOKEN}", content=body, timeout=10).status_code == 403  # header only
    ok = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(url, content=b'{"confirm": "yes"}', headers=ok, timeout=10)
    assert r.status_code == 400 and TOKEN not in r.text
    assert not session.runner.killed
    r = httpx.post(url, content=body, headers=ok, timeout=10)
    assert r.status_code == 202, r.text
    session.thread.join(60)
    assert session.error is None and session.result is not None
    assert session.result.killed == "dashboard" and session.result.stopped_by == "kill:dashboard"
    d = session.state()  # the last snapshot, published as the run stopped
    assert d["kill"]["engaged"] and d["kill"]["source"] == "dashboard" and not d["running"]
    assert httpx.post(url, content=body, headers=ok, timeout=10).status_code == 409  # the run is over


# ---------------------------------------------------------------------------------------------------
# addresses and tokens


def test_addresses() -> None:
    assert parse_address("8080") == ("127.0.0.1", 8080)
    assert parse_address("0.0.0.0:9") == ("0.0.0.0", 9)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("", "x", "host:", ":80", "127.0.0.1:99999", "[::1]80"):
        with pytest.raises(DualhubError, match="--dashboard"):
            parse_address(bad)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("example.com")


def test_public_address_without_a_token_is_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    out = tmp_path / "s"
    for address in ("0.0.0.0:0", "192.0.2.1:8080"):
        code = main(["live", "--out", str(out), "--duration", "1", "--dashboard", address])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith("dualhub live: error: --dashboard") and "token" in err
    assert not out.exists()  # refused before anything was made
    code = main(["live", "--out", str(out), "--dashboard-token", "x"])
    assert code == 2 and "--dashboard-token only goes with --dashboard" in capsys.readouterr().err
    # with a token the address is accepted (a constructor bound to an unroutable address fails to bind,
    # which says the token rule passed)
    monkeypatch.setenv(ENV_TOKEN, "from-env")
    with pytest.raises(DualhubError, match="cannot listen there"):
        Dashboard("192.0.2.1:8080", "from-env")


def test_a_busy_port_is_one_line(tmp_path: Path, capsys) -> None:
    with Dashboard("127.0.0.1:0") as taken:
        code = main(["live", "--out", str(tmp_path / "s"), "--dashboard", f"127.0.0.1:{taken.port}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot listen there" in err, err
    assert not (tmp_path / "s").exists()


def test_a_loopback_dashboard_without_a_token_is_read_only() -> None:
    with Dashboard("127.0.0.1:0") as dash:
        dash.serve()
        assert httpx.get(dash.url + "api/state", timeout=10).status_code == 503  # no run attached
        metrics = httpx.get(dash.url + "metrics", timeout=10).text
        assert "dualhub_live_up 0.0" in metrics
        r = httpx.post(dash.url + "api/kill", content=b'{"confirm": "KILL"}', timeout=10)
        assert r.status_code == 403 and "token" in r.json()["error"]


def test_a_public_dashboard_asks_every_data_route_for_the_token() -> None:
    """Bound elsewhere than loopback, the state and the metrics need the token (header or the page's
    ?token=); the page itself and its assets hold no data. (Loopback-bound here, marked public as a
    non-loopback bind is: the tests reach no other address.)"""
    with Dashboard("127.0.0.1:0", TOKEN) as dash:
        dash.public = True
        dash.serve()
        get = lambda path, **kw: httpx.get(dash.url + path, timeout=10, **kw)  # noqa: E731
        assert get("").status_code == 200 and get("assets/dashboard.js").status_code == 200
        for path in ("api/state", "metrics"):
            assert get(path).status_code == 403
            assert get(path, headers={"Authorization": "Bearer nope"}).status_code == 403
            assert get(path + "?token=nope").status_code == 403
        assert get("metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert get(f"metrics?token={TOKEN}").status_code == 200
        assert get("api/state", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 503  # no run
        assert TOKEN not in get("api/state").text


def test_dualhub_live_serves_the_dashboard_while_it_runs(tmp_path: Path, capsys) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    states: list[dict[str, Any]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.3):
            try:
                r = httpx.get(url + "api/state", timeout=5)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                states.append(orjson.loads(r.content))

    frames = list(simulator_frames(["BTCUSDT"], minutes=2, seed=3))
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED)) as ex:
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            code = main(
                [
                    "live", "--exchange-url", ex.rest_url, "--ws-url", ex.ws_url, "--provider", "cpu",
                    "--duration", "5", "--status-every", "0", "--out", str(tmp_path / "s"),
                    "--dashboard", str(port),
                ]
            )  # fmt: skip
        finally:
            done.set()
            watcher.join(10)
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"dualhub live: dashboard {url}" in err
    assert states, "the dashboard never answered during the run"
    assert states[-1]["mode"] == "paper" and states[-1]["counts"]["label"] > 0
    assert len({s["seq"] for s in states}) > 3
    with pytest.raises(httpx.HTTPError):  # closed with the run
        httpx.get(url + "api/state", timeout=2)
