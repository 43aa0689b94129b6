"""A bad-frame corpus sent by the local Bitget server to ``dualhub record``: the recording keeps going,
every bad frame is a quarantine row with its reason, the good frames around them are all kept, the
``trade`` snapshot after a resubscribe is not counted twice, and ``recover`` rebuilds the same session
from the journal. Also each fixed-depth book channel, recorded alone and beside ``books15``."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from engine.store import open_session
from recorder.recover import recover
from tests.recorder.test_recorder import SYMS, record, run
from venue.bitget.public_server import Fault, toy_frames

SYM = SYMS[0]
NOW_MS = time.time_ns() // 1_000_000
T_MS = 1_700_000_000_000 + 50 * 100  # a toy feed's exchange time, in the middle of it


def _book(
    ts: Any = str(T_MS),
    *,
    bids: Any = (("30000.0", "1"),),
    asks: Any = (("30000.5", "1"),),
    inst_type: str = "USDT-FUTURES",
    channel: str = "books15",
) -> bytes:
    d = {"asks": [list(a) for a in asks], "bids": [list(b) for b in bids], "checksum": 0, "seq": 1, "ts": ts}
    arg = {"instType": inst_type, "channel": channel, "instId": SYM}
    return orjson.dumps({"action": "snapshot", "arg": arg, "data": [d], "ts": T_MS})


def _trade(
    price: str = "30000.0",
    *,
    side: str = "buy",
    tid: str = "x1",
    inst_type: str = "USDT-FUTURES",
    ts: str = str(T_MS),
) -> bytes:
    row = {"ts": ts, "price": price, "size": "0.010", "side": side, "tradeId": tid}
    arg = {"instType": inst_type, "channel": "trade", "instId": SYM}
    return orjson.dumps({"action": "update", "arg": arg, "data": [row], "ts": T_MS})


BOOKS = ("USDT-FUTURES", "books15", SYM)
TRADE = ("USDT-FUTURES", "trade", SYM)
# (frame, the subscription it is sent on, the tag it is counted under)
CORPUS: list[tuple[bytes, tuple[str, str, str], str]] = [
    (_book("99999999999999999999"), BOOKS, "books15_bad_ts"),
    (_book("abc"), BOOKS, "books15_malformed"),
    (_book("0"), BOOKS, "books15_bad_ts"),
    (_book(str(NOW_MS + 86_400_000)), BOOKS, "books15_bad_ts"),
    (_book(bids=[("1e300", "1")], asks=[("2e300", "1")]), BOOKS, "books15_bad_price"),
    (_book(bids=[("300000.0", "1")], asks=[("300000.5", "1")]), BOOKS, "books15_out_of_band"),
    (_book(inst_type="SPOT"), BOOKS, "books15_inst_type"),
    (_book(inst_type="COIN-FUTURES"), BOOKS, "books15_inst_type"),
    (_trade("1e300"), TRADE, "trade_bad_price"),
    (_trade("1e-300"), TRADE, "trade_bad_price"),
    (_trade("-30000.0"), TRADE, "trade_malformed"),
    (_trade("NaN"), TRADE, "trade_malformed"),
    (_trade("300000.0"), TRADE, "trade_out_of_band"),
    (_trade(side="sideways"), TRADE, "trade_malformed"),
    (_trade(ts="99999999999999999999"), TRADE, "trade_bad_ts"),
    (_trade(inst_type="USDC-FUTURES"), TRADE, "trade_inst_type"),
    (b"\x00not json at all", BOOKS, "bad_json"),
]


def _source(n: int = 120) -> tuple[list[Any], list[tuple[int, bytes]]]:
    """The toy feed with the corpus in its middle (and one good trade frame sent twice)."""
    good = toy_frames(SYMS, n=n)
    mid = len(good) // 2
    ts = good[mid][0]
    dup = next(f for _, f in good[:mid] if b'"trade"' in f[:80] and SYM.encode() in f[:120])
    bad: list[Any] = [(ts, f, route) for f, route, _ in CORPUS]
    return [*good[:mid], *bad, (ts, dup, TRADE), *good[mid:]], good


def _rows(s: Any, stream: str) -> list[Any]:
    return sorted(s.read_table(stream).to_pylist(), key=lambda r: (r["symbol"], r["seq"]))


def test_record_quarantines_the_corpus_keeps_the_rest_and_recovers(tmp_path: Path) -> None:
    src, good = _source()
    srv, rec, m = run(record(tmp_path, src, speed=0))
    r = m["recorder"]
    assert rec.stop_reason == "test" and not rec.normalise_error
    want = Counter(tag for _, _, tag in CORPUS)
    assert r["discarded"] == dict(want) and r["quarantined"] == len(CORPUS)
    assert r["duplicate_trades"] == {SYM: 1}
    s = open_session(tmp_path / "s")
    q = s.read_events("quarantine")
    assert len(q) == len(CORPUS) and all(e.reason and e.raw for e in q)
    assert any("does not fit int64" in e.reason for e in q) and any("band" in e.reason for e in q)
    # every good frame is a row: nothing before or after a bad one was lost
    n_books = sum(b'"books15"' in f[:80] for _, f in good)
    n_trades = sum(b'"trade"' in f[:80] for _, f in good)
    books, trades = s.read_table("books15"), s.read_table("trade")
    assert books.num_rows == n_books and trades.num_rows == n_trades
    assert (
        len(set(zip(trades.column("symbol").to_pylist(), trades.column("trade_id").to_pylist(), strict=True)))
        == n_trades
    )
    # a lost books15/trade frame is a gap for its arg; another market's frame is not
    reasons = Counter(g["reason"] for g in r["gaps"])
    assert reasons["quarantined:books15_bad_ts"] == 3 and "quarantined:books15_inst_type" not in reasons
    # recover rebuilds the same session from the journal alone
    before_books, before_trades = _rows(s, "books15"), _rows(s, "trade")
    (tmp_path / "s" / "manifest.json").unlink()
    after = recover(tmp_path / "s")
    assert after["recorder"]["discarded"] == r["discarded"] and after["recorder"]["recovered"] is True
    s2 = open_session(tmp_path / "s")
    assert _rows(s2, "books15") == before_books and _rows(s2, "trade") == before_trades
    assert len(s2.read_events("quarantine")) == len(CORPUS)


def test_recover_takes_a_journal_with_an_overflowing_frame(tmp_path: Path) -> None:
    """A recording killed before its manifest, whose journal holds the frame that once made recover
    fail with an OverflowError: recover finishes it, the frames before and after kept."""
    good = toy_frames(SYMS, n=40)
    mid = len(good) // 2
    src = [*good[:mid], (good[mid][0], _book("99999999999999999999"), BOOKS), *good[mid:]]
    run(record(tmp_path, src, speed=0))
    (tmp_path / "s" / "manifest.json").unlink()
    m = recover(tmp_path / "s")
    assert m["recorder"]["discarded"] == {"books15_bad_ts": 1}
    assert m["streams"]["books15"]["rows"] == sum(b'"books15"' in f[:80] for _, f in good)


def test_trade_snapshot_after_a_resubscribe_is_not_counted_twice(tmp_path: Path) -> None:
    """The server sends a snapshot of its last 20 trades after every trade subscribe; a drop makes the
    recorder resubscribe while the feed runs, so the second snapshot repeats trades it already has
    (and may bring back one lost in the drop)."""
    good = toy_frames(SYMS, n=200)
    srv, _, m = run(
        record(
            tmp_path,
            good,
            speed=20,
            faults=(Fault(kind="drop", at_frame=150),),
            server_kw={"trade_snapshot": 20},
        )
    )
    r = m["recorder"]
    head = b'{"action":"snapshot","arg":{"instType":"USDT-FUTURES","channel":"trade"'
    assert sum(s.kind == "data" and s.frame.startswith(head) for s in srv.log) >= 2  # one per symbol
    assert r["connects"] == 2 and sum(r["duplicate_trades"].values()) > 0
    t = open_session(tmp_path / "s").read_table("trade")
    ids = list(zip(t.column("symbol").to_pylist(), t.column("trade_id").to_pylist(), strict=True))
    assert len(ids) == len(set(ids))  # never twice
    assert r["events"]["Trade"] == len(ids)


def test_each_fixed_depth_channel_is_recorded(tmp_path: Path) -> None:
    good = toy_frames(SYMS, n=60)
    n_books = sum(b'"books15"' in f[:80] for _, f in good)
    for channels in (("books1",), ("books5", "trade"), ("books15", "books5", "books1")):
        out = tmp_path / "-".join(channels)
        out.mkdir()
        _, _, m = run(record(out, good, speed=0, channels=channels))
        r = m["recorder"]
        assert r["quarantined"] == 0, r["discarded"]
        for ch in channels:
            assert sum(v["frames"] for k, v in r["received"].items() if k.startswith(f"{ch}:")) > 0, ch
        books = open_session(out / "s").read_table("books15")
        assert books.num_rows == n_books  # one book source per symbol: no row twice
        depth = {"books1": 1, "books5": 5}.get(channels[0], 15)
        assert books.column(f"bid_px_{depth - 1}").null_count == 0
        if depth < 15:
            assert books.column(f"bid_px_{depth}").null_count == books.num_rows


def test_compiled_scan_and_general_path_write_the_same_session(tmp_path: Path) -> None:
    """The corpus, duplicated trades and a resubscribe's trade snapshot, normalised both ways: the
    same bytes, rows, quarantine reasons and counters (the compiled scan hands every refused frame to
    the general parser and drops seen trade ids as it does)."""
    from tests.recorder.test_normalise_fast import assert_same_session

    src, _ = _source(200)
    run(
        record(
            tmp_path,
            src,
            speed=20,
            faults=(Fault(kind="drop", at_frame=450),),
            server_kw={"trade_snapshot": 20},
        )
    )
    s = tmp_path / "s"
    asked = orjson.loads((s / "record.json").read_bytes())
    m = assert_same_session(s / "journal", asked, tmp_path)
    r = m["recorder"]
    assert r["quarantined"] == len(CORPUS) and sum(r["duplicate_trades"].values()) > 1


def test_books_channel_snapshot_updates_and_crc_over_25_levels(tmp_path: Path) -> None:
    """A 30-level ``books`` snapshot and its updates, each carrying the CRC32 of the top 25 levels of
    the full book (a 15-level book would give another CRC), one update with a wrong checksum, then a
    new snapshot: every good push is a row, the bad one is quarantined as ``books_checksum``."""
    from wire.bitget.bitget_v2_books import book_checksum, encode_books

    eth = SYMS[1]
    bids = {f"{27000.0 - 0.5 * i:.1f}": "1.000" for i in range(30)}
    asks = {f"{27000.5 + 0.5 * i:.1f}": "2.000" for i in range(30)}

    def side(d: dict[str, str], desc: bool) -> list[tuple[str, str]]:
        return sorted(d.items(), key=lambda kv: float(kv[0]), reverse=desc)

    def push(action: str, b: list, a: list, seq: int, pseq: int, off: int = 0, ts: int = 0) -> bytes:
        for d, lv in ((bids, b), (asks, a)):
            if action == "snapshot":
                d.clear()
            for p, q in lv:
                if q == "0":
                    d.pop(p, None)
                else:
                    d[p] = q
        cs = book_checksum(side(bids, True), side(asks, False)) + off if action == "update" else 0
        return encode_books(eth, action=action, bids=b, asks=a, ts_ms=ts or T_MS + seq, seq=seq, pseq=pseq,
                            push_ts_ms=T_MS + seq, checksum=cs)  # fmt: skip

    snap = (side(bids, True), side(asks, False))
    frames = [push("snapshot", [list(x) for x in snap[0]], [list(x) for x in snap[1]], 100, 0)]
    assert book_checksum(snap[0], snap[1]) == -393382498  # the documented 30-level example
    frames.append(push("update", [["27000.0", "3.000"]], [["27000.5", "0"]], 101, 100))
    frames.append(push("update", [["27000.2", "1.000"]], [], 102, 101))
    tops = [side(bids, True)[0], side(asks, False)[0]]
    frames.append(push("update", [["26990.0", "0"]], [], 103, 102, off=1))  # wrong checksum
    frames.append(push("snapshot", [list(x) for x in snap[0]], [list(x) for x in snap[1]], 200, 0))
    frames.append(push("update", [], [["27000.5", "5.000"]], 201, 200))
    frames.append(
        push("update", [["26999.0", "1.500"]], [], 202, 201, ts=2**62)
    )  # the book is right, its time not
    good = toy_frames((SYMS[0],), n=40)
    route = ("USDT-FUTURES", "books", eth)
    src = [*good[:20], *((good[20][0], f, route) for f in frames), *good[20:]]
    _, _, m = run(record(tmp_path, src, speed=0, channels=("books",)))
    r = m["recorder"]
    assert r["discarded"] == {"books_checksum": 1, "books_bad_ts": 1}
    assert [g["reason"] for g in r["gaps"] if g["reason"].startswith("quarantined:")] == [
        "quarantined:books_bad_ts"
    ]
    rows = [b for b in open_session(tmp_path / "s").read_events("books15") if b.symbol == eth]
    assert len(rows) == 5  # snapshot, 2 updates, the new snapshot, its update
    assert (rows[2].bid_px[0], rows[2].ask_px[0]) == (float(tops[0][0]), float(tops[1][0]))
    assert rows[2].bid_sz[0] == 1.0 and all(b.bid_px[14] == b.bid_px[14] for b in rows)  # 15 levels kept
    assert rows[4].ask_sz[0] == 5.0


def test_normaliser_never_raises_on_a_record(tmp_path: Path) -> None:
    """Whatever a journal holds (a META record that is not JSON or lacks its keys, a frame that is
    not UTF-8, the overflowing frame), the normaliser counts it and goes on, both ways."""
    from recorder.normalise import Normaliser
    from wire.journal import META, RECV, Record

    t = time.time_ns()
    recs = [
        Record(t + 1, 0, META, b"not json"),
        Record(t + 2, 0, META, b'{"t":"gap_open","channel":"trade"}'),
        Record(t + 3, 0, META, b'{"t":"gap_close","channel":"trade","instId":"X","end_ns":"soon"}'),
        Record(t + 4, 0, RECV, b"\xff\xfe\x00"),
        Record(t + 5, 0, RECV, _book("99999999999999999999")),
        Record(t + 6, 0, RECV, _book(str(T_MS))),
    ]
    for fast in (False, True):
        norm = Normaliser({"url": "ws://x", "symbols": [SYM], "channels": ["books15"]}, fast=fast)
        out = norm.feed_all(recs)
        assert norm.discarded == {"bad_meta": 3, "bad_json": 1, "books15_bad_ts": 1}
        assert [type(e).__name__ for e in out].count("BookSnapshot") == 1


def test_the_2026_fixed_depth_variant_records_the_same_books_on_the_compiled_path(tmp_path: Path) -> None:
    from recorder.normalise import Normaliser
    from recorder.record import new_writer, normalise_segment
    from wire.journal import list_segments

    good = toy_frames(SYMS, n=60)
    books = {}
    for variant in ("2024", "2026"):
        out = tmp_path / variant
        out.mkdir()
        srv, _, m = run(
            record(
                out,
                good,
                speed=0,
                channels=("books15", "books5", "trade"),
                server_kw={"book_variant": variant},
            )
        )
        assert m["recorder"]["quarantined"] == 0
        if variant == "2026":
            f = next(s.frame for s in srv.log if s.kind == "data" and b'"books15"' in s.frame[:90])
            assert b'"pseq"' in f and b'"checksum"' not in f
        books[variant] = open_session(out / "s").read_table("books15")
        asked = orjson.loads((out / "s" / "record.json").read_bytes())
        norm = Normaliser(asked)
        w = new_writer(tmp_path / f"n{variant}", asked)
        for _, p, _ in list_segments(out / "s" / "journal"):
            normalise_segment(p, norm, w)
        assert norm.scanned >= sum(b'"books15"' in f[:80] for _, f in good)  # every books15 push compiled
    a, b = books["2024"], books["2026"]
    assert a.drop(["ts_recv"]).equals(b.drop(["ts_recv"]))
