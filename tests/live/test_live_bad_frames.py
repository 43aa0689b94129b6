"""The bad-frame corpus sent by a test WebSocket server to ``dualhub live --paper``: the run keeps going
to its planned stop, every bad frame is quarantined with its reason (never traded: the 10x print makes
no fill), the shutdown summary is written, no run is left half made, and ``recover`` rebuilds the same
session from the journal."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from engine.store import open_session
from recorder.recover import recover
from tests.helpers import REPO as ROOT
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import BitgetServer, simulator_frames

SYM = "BTCUSDT"
BOOKS = ("USDT-FUTURES", "books15", SYM)
TRADE = ("USDT-FUTURES", "trade", SYM)


class _ServerThread:
    """A :class:`BitgetServer` on its own event loop in a daemon thread (the CLI runs in a subprocess)."""

    def __init__(self, server: BitgetServer) -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> BitgetServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout=10)
        return self.server

    def __exit__(self, *exc: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)


def _corpus(t_ms: int, mid: float) -> list[tuple[bytes, tuple[str, str, str], str]]:
    now_ms = time.time_ns() // 1_000_000

    def book(
        ts: Any = str(t_ms), bid: float = mid - 0.5, ask: float = mid + 0.5, inst: str = "USDT-FUTURES"
    ) -> bytes:
        d = {"asks": [[repr(ask), "1"]], "bids": [[repr(bid), "1"]], "checksum": 0, "seq": 1, "ts": ts}
        arg = {"instType": inst, "channel": "books15", "instId": SYM}
        return orjson.dumps({"action": "snapshot", "arg": arg, "data": [d], "ts": t_ms})

    def trade(price: str, side: str = "buy", ts: str = str(t_ms), inst: str = "USDT-FUTURES") -> bytes:
        row = {"ts": ts, "price": price, "size": "0.001", "side": side, "tradeId": f"bad-{price}-{side}-{ts}"}
        arg = {"instType": inst, "channel": "trade", "instId": SYM}
        return orjson.dumps({"action": "update", "arg": arg, "data": [row], "ts": t_ms})

    return [
        (book("99999999999999999999"), BOOKS, "books15_bad_ts"),
        (book("not a time"), BOOKS, "books15_malformed"),
        (book("0"), BOOKS, "books15_bad_ts"),
        (book(str(now_ms + 86_400_000)), BOOKS, "books15_bad_ts"),
        (book(bid=1e300, ask=2e300), BOOKS, "books15_bad_price"),
        (book(inst="SPOT"), BOOKS, "books15_inst_type"),
        (trade("1e300"), TRADE, "trade_bad_price"),
        (trade("1e-300"), TRADE, "trade_bad_price"),
        (trade("-5"), TRADE, "trade_malformed"),
        (trade("NaN"), TRADE, "trade_malformed"),
        (trade(repr(mid * 10)), TRADE, "trade_out_of_band"),
        (trade(repr(mid), side="both"), TRADE, "trade_malformed"),
        (trade(repr(mid), ts="99999999999999999999"), TRADE, "trade_bad_ts"),
        (trade(repr(mid), inst="COIN-FUTURES"), TRADE, "trade_inst_type"),
        (b"{garbage", BOOKS, "bad_json"),
    ]


def _source() -> tuple[list[Any], list[tuple[bytes, tuple[str, str, str], str]], float]:
    frames = list(simulator_frames([SYM], minutes=1, seed=4))
    mid_at = len(frames) // 3
    last_book = next(orjson.loads(f) for _, f in reversed(frames[:mid_at]) if b'"books15"' in f[:90])
    d = last_book["data"][0]
    mid = (float(d["bids"][0][0]) + float(d["asks"][0][0])) / 2
    corpus = _corpus(int(d["ts"]), mid)
    ts = frames[mid_at][0]
    bad = [(ts, f, route) for f, route, _ in corpus]
    return [*frames[:mid_at], *bad, *frames[mid_at:]], corpus, mid


@pytest.mark.slow
def test_live_paper_survives_the_corpus_and_recovers(tmp_path: Path) -> None:
    src, corpus, mid = _source()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "paper"
    with (
        LocalExchangeThread(LocalExchange((), speed=10)) as ex,
        _ServerThread(BitgetServer(src, speed=10)) as srv,
    ):
        ws = f"ws://{srv.host}:{srv.port}"
        cmd = [sys.executable, "-m", "dualhub.cli", "live", "--paper", "--exchange-url", ex.rest_url,
               "--ws-url", ws, "--out", str(out), "--duration", "8", "--provider", "cpu"]  # fmt: skip
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
        sent = srv.sent_count
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "paper run stopped by duration" in p.stderr, p.stderr[-3000:]
    assert sent > len(corpus)
    assert not list((out / "runs").glob("*.tmp"))  # the run was finished, not orphaned
    want = dict(Counter(tag for _, _, tag in corpus))
    s = open_session(out)
    r = s.manifest["recorder"]
    assert r["discarded"] == want and r["quarantined"] == len(corpus)
    q = s.read_events("quarantine")
    assert len(q) == len(corpus) and all(e.reason for e in q)
    summary = orjson.loads((out / "live.json").read_bytes())["summary"]
    assert {
        k.removeprefix("wire:"): v for k, v in summary["quarantined"].items() if k.startswith("wire:")
    } == want
    # the 10x print was never traded
    fills = out / "runs" / f"live-{SYM}" / "events" / "fill.parquet"
    if fills.exists():
        assert all(px < 2 * mid for px in pq.read_table(fills).column("px").to_pylist())
    books, trades = s.read_table("books15"), s.read_table("trade")
    assert books.num_rows > 50 and trades.num_rows > 10
    # recover rebuilds the same session from the journal
    (out / "manifest.json").unlink()
    m = recover(out)
    assert m["recorder"]["discarded"] == want
    s2 = open_session(out)
    assert s2.read_table("books15").equals(books) and s2.read_table("trade").equals(trades)
