"""Importers of real recorded data: Binance USD-M raw feed and Bitget v1 captures."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import duckdb
import orjson
import pytest

from engine.events import BookSnapshot, Gap
from engine.store import open_session
from recorder.cli import main as recorder_main
from recorder.importers.binance_usdm import BinanceBookBuilder, import_binance_usdm, iter_lines
from recorder.importers.bitget_v1 import import_bitget_v1, seconds_to_ns
from tests.helpers import REPO
from wire.bitget.bitget_v2 import StreamCounters

REAL = REPO / ".." / "shared" / "data" / "real"
BINANCE = REAL / "binance-usdm" / "usdm_btcusdt_20240808.gz"
BITGET_V1 = REAL / "bitget-v1" / "BITGET.ws.1.0"


@pytest.fixture(scope="module")
def binance_session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert BINANCE.exists(), f"real data missing: {BINANCE}"
    out = tmp_path_factory.mktemp("bn") / "s"
    assert recorder_main(["import", "binance-futures", str(BINANCE), "--out", str(out)]) == 0
    return out


def test_binance_real_file_zero_gaps_zero_crossed(binance_session: Path) -> None:
    s = open_session(binance_session)
    s.verify()
    imp = s.manifest["import"]
    assert imp["gaps"] == 0 and imp["crossed"] == 0
    assert imp["trades"] == 21_313 and imp["skipped"] == {"bookTicker": 66_089}
    # every line accounted for: 6 551 diffs (applied or discarded by reason), trades, tickers, the snapshot
    assert imp["depth_diffs"] == 6_551 == imp["depth_applied"] + sum(imp["discarded"].values())
    assert imp["lines"] == 6_551 + 21_313 + 66_089 + imp["snapshot_lines"] and imp["snapshot_lines"] == 1
    # the only discards are diffs the snapshot already holds: counted independently from the file
    lines = [
        orjson.loads(js) for _, js in iter_lines(BINANCE) if b"depth" in js[:40] or b"lastUpdateId" in js
    ]
    (last_update_id,) = [m["lastUpdateId"] for m in lines if "stream" not in m]
    stale = sum(m["data"]["u"] <= last_update_id for m in lines if "stream" in m)
    assert stale > 0 and imp["discarded"] == {"stale_diff": stale}
    # 345 s of exchange time at one snapshot per 100 ms
    books = s.manifest["streams"]["books15"]["rows"]
    assert 3_400 <= books <= 3_460
    assert "gap" not in s.manifest["streams"]
    # the recording machine's clock ran ~1.27 s behind the exchange: kept as is, never "fixed"
    assert -1_300 < imp["local_minus_exchange_ms"]["median"] < -1_200
    q = f"read_parquet('{binance_session}/books15/*.parquet')"
    n, behind, crossed, grid, mono = duckdb.sql(
        f"select count(*), sum((ts_recv < ts_event)::int), sum((bid_px_0 >= ask_px_0)::int),"
        f" sum((ts_event % 100000000 = 0)::int),"
        f" bool_and(bid_px_14 is not null and ask_px_14 is not null) from {q}"
    ).fetchall()[0]
    assert n == books and behind == books and crossed == 0 and grid == books and mono
    steps = duckdb.sql(
        f"select distinct ts_event - lag(ts_event) over (order by seq) d from {q}"
        " where true qualify d is not null"
    ).fetchall()
    assert steps == [(100_000_000,)]  # one snapshot per 100 ms, no holes
    t = f"read_parquet('{binance_session}/trade/*.parquet')"
    sides = dict(duckdb.sql(f"select side, count(*) from {t} group by side").fetchall())
    assert sum(sides.values()) == 21_313 and set(sides) == {"buy", "sell"}


def test_binance_book_matches_book_ticker_at_equal_update_ids() -> None:
    """Independent check: where bookTicker's ``u`` is the last applied diff's ``u``, best bid/ask agree."""
    b = BinanceBookBuilder("BTCUSDT", StreamCounters())
    equal = 0
    for ts, js in iter_lines(BINANCE):
        m = orjson.loads(js)
        if "stream" not in m:
            b.on_snapshot(ts, m)
            continue
        d = m["data"]
        if d["e"] == "depthUpdate":
            b.on_diff(ts, d)
        elif d["e"] == "bookTicker" and b.prev_u is not None and d["u"] == b.prev_u:
            assert b.book.best() == (float(d["b"]), float(d["a"]))
            equal += 1
    assert equal > 100


def _diff(big_u: int, u: int, pu: int, e_ms: int, b: list[list[str]] | None = None) -> dict:
    return {
        "e": "depthUpdate",
        "E": e_ms,
        "s": "BTCUSDT",
        "U": big_u,
        "u": u,
        "pu": pu,
        "b": b or [],
        "a": [],
    }


def test_binance_sync_rule_buffer_drop_straddle_and_gap(tmp_path: Path) -> None:
    def line(ts: int, obj: dict) -> bytes:
        return str(ts).encode() + b" " + orjson.dumps(obj) + b"\n"

    snap = {"lastUpdateId": 100, "E": 1, "T": 1, "bids": [["10.0", "1"]], "asks": [["11.0", "1"]]}
    lines = [
        line(1, {"stream": "btcusdt@depth@0ms", "data": _diff(90, 95, 89, 1_000, [["9.0", "1"]])}),  # dropped
        line(
            2, {"stream": "btcusdt@depth@0ms", "data": _diff(96, 105, 95, 1_050, [["10.5", "2"]])}
        ),  # straddles
        line(3, snap),
        line(4, {"stream": "btcusdt@depth@0ms", "data": _diff(106, 110, 105, 1_260, [["10.5", "0"]])}),
        line(
            5,
            {
                "stream": "btcusdt@trade",
                "data": {
                    "e": "trade",
                    "E": 1_261,
                    "T": 1_260,
                    "s": "BTCUSDT",
                    "t": 7,
                    "p": "10.0",
                    "q": "0.5",
                    "m": True,
                },
            },
        ),
        line(6, {"stream": "btcusdt@depth@0ms", "data": _diff(111, 120, 110, 1_420, [["10.2", "3"]])}),
        line(7, {"stream": "btcusdt@depth@0ms", "data": _diff(125, 130, 121, 1_500)}),  # pu break: gap
        line(8, {"stream": "btcusdt@depth@0ms", "data": _diff(131, 140, 130, 1_700)}),  # not synced: ignored
    ]
    src = tmp_path / "f.gz"
    with gzip.open(src, "wb") as f:
        f.writelines(lines)
    m = import_binance_usdm(src, tmp_path / "s")
    imp = m["import"]
    assert imp["gaps"] == 1 and imp["depth_applied"] == 3
    # the stale diff, then the break and the one after it waited for a snapshot line that never came
    assert imp["discarded"] == {"stale_diff": 1, "no_snapshot": 2}
    s = open_session(tmp_path / "s")
    books = s.read_events("books15")
    # grid 1100, 1200 see the book after the straddling diff (10.5 best bid); 1300, 1400 after its deletion
    assert [b.ts_event // 1_000_000 for b in books] == [1_100, 1_200, 1_300, 1_400]
    assert [b.bid_px[0] for b in books] == [10.5, 10.5, 10.0, 10.0]
    assert all(isinstance(b, BookSnapshot) and math.isnan(b.bid_px[1]) is False for b in books[:2])
    gaps = s.read_events("gap")
    assert len(gaps) == 1 and isinstance(gaps[0], Gap) and "pu=121" in gaps[0].reason
    # from the last applied diff to the end of the data: never back in sync
    assert gaps[0].start_ns == 1_420 * 1_000_000 and gaps[0].end_ns == 1_700 * 1_000_000
    assert gaps[0].reason.endswith(";unresolved_at_end_of_file") and gaps[0].channel == "depth"
    assert imp["gap_windows"] == [
        {
            "symbol": "BTCUSDT",
            "channel": "depth",
            "start_ns": 1_420_000_000,
            "end_ns": 1_700_000_000,
            "reason": gaps[0].reason,
        }
    ]
    (t,) = s.read_events("trade")
    assert t.side == "sell" and t.ts_event == 1_260_000_000 and t.ts_recv == 5


def test_bitget_v1_capture_import(tmp_path: Path) -> None:
    assert seconds_to_ns("1649290078.12577") == 1_649_290_078_125_770_000
    m = import_bitget_v1(BITGET_V1, tmp_path / "s")
    imp = m["import"]
    assert imp["checksums_verified"] == 443 and imp["book_faults"] == []
    assert imp["gaps"] == 0 and imp["discarded"] == {} and "gap" not in m["streams"]
    assert imp["skipped_channels"] == {"candle1m": 43, "ticker": 128}
    assert m["streams"]["books15"]["rows"] == 443 and m["streams"]["trade"]["rows"] > 0
    assert "quarantine" not in m["streams"]
    assert len(m["symbols"]) == 8
    n = duckdb.sql(
        f"select count(*) from read_parquet('{tmp_path}/s/books15/*.parquet') where bid_px_0 < ask_px_0"
    ).fetchall()[0][0]
    assert n == 443
