"""``dualhub import tardis-csv``: Tardis.dev CSV datasets (written here from a simulated market in Tardis's
documented columns) become a session with the market's books and trades, bad rows counted by reason,
and it replays with fills."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest

from dualhub.cli import main
from engine.events import BookSnapshot, Trade
from engine.store import open_session
from recorder.importers.tardis_csv import INCREMENTAL, SNAPSHOT, TRADES, import_tardis_csv
from replay.driver import run_replay
from venue.bitget.public_server import _plain
from venue.simulator import generate_frames
from wire.bitget.bitget_v2 import StreamCounters, decode


def _market() -> tuple[list[BookSnapshot], list[Trade]]:
    c = StreamCounters()
    books, trades = [], []
    for ts, raw in generate_frames(minutes=2, seed=3):
        for e in decode(raw, ts, c):
            if isinstance(e, BookSnapshot):
                books.append(e)
            elif isinstance(e, Trade):
                trades.append(e)
    return books, trades


def _us(ns: int) -> str:
    return str(ns // 1000)


def _levels(b: BookSnapshot) -> tuple[dict[str, str], dict[str, str]]:
    bids = {_plain(p): _plain(q) for p, q in zip(b.bid_px, b.bid_sz, strict=True) if not math.isnan(p)}
    asks = {_plain(p): _plain(q) for p, q in zip(b.ask_px, b.ask_sz, strict=True) if not math.isnan(p)}
    return bids, asks


def _write(path: Path, header: tuple[str, ...], rows: list[list[str]], gz: bool = False) -> Path:
    text = ",".join(header) + "\n" + "".join(",".join(r) + "\n" for r in rows)
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def _trades_rows(trades: list[Trade]) -> list[list[str]]:
    return [["bitget-futures", t.symbol, _us(t.ts_event), _us(t.ts_recv), t.trade_id, t.side, _plain(t.px),
             _plain(t.sz)] for t in trades]  # fmt: skip


def _snapshot_rows(books: list[BookSnapshot]) -> list[list[str]]:
    rows = []
    for b in books:
        bids, asks = _levels(b)
        bl, al = list(bids.items()), list(asks.items())
        cells = []
        for i in range(25):
            cells += list(al[i]) if i < len(al) else ["", ""]
            cells += list(bl[i]) if i < len(bl) else ["", ""]
        rows.append(["bitget-futures", b.symbol, _us(b.ts_event), _us(b.ts_recv), *cells])
    return rows


def _incremental_rows(books: list[BookSnapshot]) -> list[list[str]]:
    rows: list[list[str]] = []
    prev: tuple[dict[str, str], dict[str, str]] | None = None
    for b in books:
        bids, asks = _levels(b)
        head = ["bitget-futures", b.symbol, _us(b.ts_event), _us(b.ts_recv)]
        if prev is None:
            rows += [[*head, "true", "bid", p, q] for p, q in bids.items()]
            rows += [[*head, "true", "ask", p, q] for p, q in asks.items()]
        else:
            for side, new, old in (("bid", bids, prev[0]), ("ask", asks, prev[1])):
                rows += [[*head, "false", side, p, q] for p, q in new.items() if old.get(p) != q]
                rows += [[*head, "false", side, p, "0"] for p in old if p not in new]
        prev = (bids, asks)
    return rows


@pytest.fixture(scope="module")
def market() -> tuple[list[BookSnapshot], list[Trade]]:
    return _market()


def _same_books(s_books: list[BookSnapshot], books: list[BookSnapshot]) -> None:
    assert len(s_books) == len(books)
    for a, b in zip(s_books, books, strict=True):
        assert (a.bid_px, a.bid_sz, a.ask_px, a.ask_sz) == (b.bid_px, b.bid_sz, b.ask_px, b.ask_sz)
        assert a.ts_recv == b.ts_recv // 1000 * 1000


@pytest.mark.parametrize("book_dataset", ["book_snapshot_25", "incremental_book_L2"])
def test_books_and_trades_import_and_replay_with_fills(tmp_path: Path, market, book_dataset: str) -> None:
    books, trades = market
    t = _write(tmp_path / "trades.csv.gz", TRADES, _trades_rows(trades), gz=True)
    if book_dataset == "book_snapshot_25":
        b = _write(tmp_path / "snap.csv", SNAPSHOT, _snapshot_rows(books))
    else:
        b = _write(tmp_path / "inc.csv", INCREMENTAL, _incremental_rows(books))
    assert main(["import", "tardis-csv", str(t), str(b), "--out", str(tmp_path / "s")]) == 0
    s = open_session(tmp_path / "s")
    assert s.manifest["import"]["discarded"] == {}
    _same_books(s.read_events("books15"), books)
    got = s.read_events("trade")
    assert [(x.trade_id, x.px, x.sz, x.side) for x in got] == [
        (x.trade_id, x.px, x.sz, x.side) for x in trades
    ]
    res = run_replay(tmp_path / "s", out_dir=tmp_path / "r")
    assert res.counts.get("fill", 0) > 0


def test_bad_rows_are_counted_by_reason(tmp_path: Path, market) -> None:
    books, trades = market
    rows = _trades_rows(trades[:50])
    mid = (books[0].bid_px[0] + books[0].ask_px[0]) / 2
    sym = trades[0].symbol
    bad = [
        ["bitget-futures", sym, rows[10][2], rows[10][3], "x1", "buy", "1e300", "1"],
        ["bitget-futures", sym, rows[10][2], rows[10][3], "x2", "buy", repr(mid * 10), "1"],
        ["bitget-futures", sym, rows[10][2], rows[10][3], "x3", "unknown", repr(mid), "1"],
        ["bitget-futures", sym, "99999999999999999999", rows[10][3], "x4", "buy", repr(mid), "1"],
        ["bitget-futures", sym, rows[10][2], rows[10][3], "x5", "buy", "NaN", "1"],
        rows[5],  # the same trade id again
        ["not", "enough", "cells"],
    ]
    t = _write(tmp_path / "t.csv", TRADES, rows[:20] + bad + rows[20:])
    b = _write(tmp_path / "b.csv", SNAPSHOT, _snapshot_rows(books[:300]))
    m = import_tardis_csv([b, t], tmp_path / "s")
    assert m["import"]["discarded"] == {
        "trade_bad_price": 2,
        "trade_out_of_band": 1,
        "trade_bad_side": 1,
        "trade_bad_row": 2,
        "trade_duplicate": 1,
    }
    assert m["streams"]["trade"]["rows"] == 50


def test_another_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "x.csv"
    f.write_text("a,b,c\n1,2,3\n")
    assert main(["import", "tardis-csv", str(f), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "not a Tardis CSV dataset" in err and "Traceback" not in err
    t = _write(tmp_path / "t.csv", TRADES, [["bitget-futures", "X", "1", "1", "1", "buy", "1", "1"]])
    assert main(["import", "tardis-csv", str(t), "--out", str(tmp_path / "o2")]) == 2
    assert "no order book" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()
