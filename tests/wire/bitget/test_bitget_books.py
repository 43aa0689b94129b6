"""Full-depth ``books``: local book, seq/pseq gap rule, CRC32 checksum (every worked example in
bitget-v2.md) and every ``books`` message of the real Bitget v1 capture."""

from __future__ import annotations

import math
import random

import orjson
import pytest

from engine.events import BookSnapshot, Quarantined
from recorder.importers.bitget_v1 import iter_capture, to_v2
from tests.helpers import REPO
from wire.bitget.bitget_v2 import StreamCounters
from wire.bitget.bitget_v2_books import (
    BookError,
    BookFault,
    BooksEncoder,
    BooksOptions,
    BooksState,
    LocalBook,
    book_checksum,
    checksum_string,
    crc32_signed,
    decode_with_books,
    encode_books,
)

REAL = REPO / ".." / "shared" / "data" / "real"
V1_CAPTURE = REAL / "bitget-v1" / "BITGET.ws.1.0"

SNAP_BIDS = [["27000.0", "2.710"], ["26999.5", "1.460"], ["26999.0", "0.300"]]
SNAP_ASKS = [["27000.5", "8.760"], ["27001.0", "0.400"]]
UPD_BIDS = [["26999.5", "0"], ["27000.0", "3.000"]]
UPD_ASKS = [["27000.5", "8.000"], ["27002.0", "1.250"]]


# ---------------------------------------------------------------- worked examples (bitget-v2.md §1)


def test_doc_example_1() -> None:
    assert crc32_signed("43231.1:4:43232.8:9:43231:6:43232.9:8") == -1504501796
    assert (
        book_checksum([("43231.1", "4"), ("43231", "6")], [("43232.8", "9"), ("43232.9", "8")]) == -1504501796
    )


def test_doc_example_2() -> None:
    assert crc32_signed("3366.1:7:3366.8:9:3368:8:3372:8") == 831078360
    assert book_checksum([("3366.1", "7"), ("3368", "8")], [("3366.8", "9"), ("3372", "8")]) == 831078360


def test_signed_conversion_of_unsigned_value() -> None:
    # -1504501796 is unsigned 2790465500
    assert crc32_signed("43231.1:4:43232.8:9:43231:6:43232.9:8") + (1 << 32) == 2790465500


def test_frame_test_snapshot_then_update() -> None:
    st = BooksState()
    book = st.apply("BTCUSDT", "snapshot", {"bids": SNAP_BIDS, "asks": SNAP_ASKS})
    assert book.checksum() == -1205641921  # the snapshot's own checksum
    book = st.apply("BTCUSDT", "update", {"bids": UPD_BIDS, "asks": UPD_ASKS, "checksum": 1697788046})
    assert checksum_string(book.bids(), book.asks()) == (
        "27000.0:3.000:27000.5:8.000:26999.0:0.300:27001.0:0.400:27002.0:1.250"
    )
    assert st.checksums_verified == 1


def test_frame_test_checksum_plus_one_is_flagged() -> None:
    st = BooksState()
    st.apply("BTCUSDT", "snapshot", {"bids": SNAP_BIDS, "asks": SNAP_ASKS})
    with pytest.raises(BookError) as e:
        st.apply("BTCUSDT", "update", {"bids": UPD_BIDS, "asks": UPD_ASKS, "checksum": 1697788047})
    assert e.value.reason == "checksum"
    assert not st.book("BTCUSDT").ready  # unusable until a new snapshot


def test_thirty_levels_cut_at_25() -> None:
    bids = [(f"{27000.0 - 0.5 * i:.1f}", "1.000") for i in range(30)]
    asks = [(f"{27000.5 + 0.5 * i:.1f}", "2.000") for i in range(30)]
    assert book_checksum(bids, asks) == -393382498
    book = LocalBook()
    # delivered out of order: the book sorts them
    rb, ra = bids[:], asks[:]
    random.Random(1).shuffle(rb)
    random.Random(2).shuffle(ra)
    book.load_snapshot([list(x) for x in rb], [list(x) for x in ra])
    assert book.checksum() == -393382498
    assert checksum_string(book.bids(), book.asks()).count(":") == 25 * 4 - 1


def test_original_strings_not_normalised() -> None:
    # "If price is '0.5000', DO NOT calculate the checksum by '0.5'"
    book = LocalBook()
    book.load_snapshot([["0.5000", "1.00"]], [["0.5010", "2.0"]])
    assert checksum_string(book.bids(), book.asks()) == "0.5000:1.00:0.5010:2.0"
    assert book.checksum() == crc32_signed("0.5000:1.00:0.5010:2.0") != crc32_signed("0.5:1:0.501:2")


def test_short_side_entries_skipped() -> None:
    assert (
        checksum_string([("1", "1"), ("0.9", "2"), ("0.8", "3")], [("1.1", "4")]) == "1:1:1.1:4:0.9:2:0.8:3"
    )


# ---------------------------------------------------------------- book mechanics


def test_update_deletes_inserts_sorted_and_replaces() -> None:
    book = LocalBook()
    book.load_snapshot([["100", "1"], ["99", "1"]], [["101", "1"], ["103", "1"]])
    book.apply_update([["99.5", "2"], ["100", "0"], ["98", "5"]], [["102", "7"], ["101", "0"], ["103", "9"]])
    assert book.bids() == [("99.5", "2"), ("99", "1"), ("98", "5")]
    assert book.asks() == [("102", "7"), ("103", "9")]
    book.apply_update([["42", "0"]], [])  # deleting an absent level is a no-op
    assert book.depth() == (3, 2)
    bid_px, bid_sz, ask_px, ask_sz = book.top_levels(15)
    assert bid_px[:3] == (99.5, 99.0, 98.0) and math.isnan(bid_px[3])
    assert ask_sz[:2] == (7.0, 9.0)


def test_pseq_gap_rule() -> None:
    st = BooksState()
    st.apply("X", "snapshot", {"bids": [["1", "1"]], "asks": [["2", "1"]], "seq": 10, "pseq": 0})
    st.apply("X", "update", {"bids": [["1", "2"]], "asks": [], "seq": 11, "pseq": 10})
    with pytest.raises(BookError) as e:
        st.apply("X", "update", {"bids": [["1", "3"]], "asks": [], "seq": 13, "pseq": 12})
    assert e.value.reason == "seq_gap"
    with pytest.raises(BookError) as e:
        st.apply("X", "update", {"bids": [["1", "3"]], "asks": [], "seq": 14, "pseq": 13})
    assert e.value.reason == "no_snapshot"
    st.apply("X", "snapshot", {"bids": [["1", "1"]], "asks": [["2", "1"]], "seq": 20, "pseq": 0})
    st.apply("X", "update", {"bids": [], "asks": [["2", "4"]], "seq": 21, "pseq": 20})


def test_seq_beyond_2_53_is_exact() -> None:
    big = (1 << 60) + 1
    frame = encode_books(
        "X", action="snapshot", bids=[["1", "1"]], asks=[["2", "1"]], ts_ms=1, seq=big, pseq=0, push_ts_ms=1
    )
    upd = encode_books(
        "X", action="update", bids=[["1", "2"]], asks=[], ts_ms=2, seq=big + 1, pseq=big, push_ts_ms=2
    )
    st, c = BooksState(), StreamCounters()
    out = decode_with_books(frame, 1, c, st) + decode_with_books(upd, 2, c, st)
    assert [e.exch_seq for e in out if isinstance(e, BookSnapshot)] == [big, big + 1]


def test_checksum_only_on_updates_and_only_when_present() -> None:
    st = BooksState()
    # a snapshot's checksum (0 or wrong) is not checked by default, as ccxt
    st.apply("X", "snapshot", {"bids": SNAP_BIDS, "asks": SNAP_ASKS, "checksum": 0})
    st.apply("X", "update", {"bids": UPD_BIDS, "asks": UPD_ASKS})  # no key: not validated
    assert st.checksums_verified == 0
    strict = BooksState(BooksOptions(verify_snapshot_checksum=True))
    with pytest.raises(BookError):
        strict.apply("X", "snapshot", {"bids": SNAP_BIDS, "asks": SNAP_ASKS, "checksum": 0})
    strict.apply("X", "snapshot", {"bids": SNAP_BIDS, "asks": SNAP_ASKS, "checksum": -1205641921})


def test_crossed_and_malformed_books_are_faults() -> None:
    st = BooksState()
    with pytest.raises(BookError) as e:
        st.apply("X", "snapshot", {"bids": [["2", "1"]], "asks": [["1", "1"]]})
    assert e.value.reason == "crossed"
    for bad in ([["x", "1"]], [["1"]], [[1.0, "1"]], "nope", [["-1", "1"]]):
        with pytest.raises(BookError) as e:
            st.apply("X", "snapshot", {"bids": bad, "asks": [["5", "1"]]})
        assert e.value.reason == "malformed"


def test_decode_with_books_quarantines_and_reports_fault() -> None:
    st, c = BooksState(), StreamCounters()
    snap = encode_books(
        "BTCUSDT", action="snapshot", bids=SNAP_BIDS, asks=SNAP_ASKS, ts_ms=5, seq=1, pseq=0, push_ts_ms=6
    )
    bad = encode_books(
        "BTCUSDT",
        action="update",
        bids=UPD_BIDS,
        asks=UPD_ASKS,
        ts_ms=7,
        seq=2,
        pseq=1,
        push_ts_ms=8,
        checksum=1697788047,
    )
    out = decode_with_books(snap, 100, c, st)
    assert len(out) == 1 and isinstance(out[0], BookSnapshot)
    assert out[0].ts_event == 5_000_000 and out[0].exch_seq == 1 and out[0].bid_px[0] == 27000.0
    out = decode_with_books(bad, 200, c, st)
    q = [e for e in out if isinstance(e, Quarantined)]
    f = [e for e in out if isinstance(e, BookFault)]
    assert len(q) == 1 and "checksum" in q[0].reason and q[0].raw.startswith('{"action":"update"')
    assert f == [BookFault("BTCUSDT", "checksum", "computed 1697788046 != frame checksum 1697788047")]
    # books15 and trade still go through the shared codec
    assert decode_with_books(b"pong", 1, c, st)[0].kind == "pong"


def test_encoder_round_trip_through_local_book() -> None:
    rng = random.Random(7)
    enc = BooksEncoder("X", first_seq=500)
    st, c = BooksState(), StreamCounters()
    for k in range(200):
        mid = 1000 + rng.randint(-20, 20)
        bids = [(f"{mid - 1 - i}.0", f"{rng.randint(1, 9)}.00") for i in range(rng.randint(3, 30))]
        asks = [(f"{mid + i}.0", f"{rng.randint(1, 9)}.00") for i in range(rng.randint(3, 30))]
        frame = enc.encode(bids, asks, ts_ms=k, push_ts_ms=k)
        if frame is None:
            continue
        out = decode_with_books(frame, k, c, st)
        assert len(out) == 1 and isinstance(out[0], BookSnapshot), out
        assert st.book("X").bids() == bids and st.book("X").asks() == asks
    assert st.checksums_verified > 100


def test_encoder_skip_makes_a_gap() -> None:
    enc = BooksEncoder("X")
    st, c = BooksState(), StreamCounters()
    decode_with_books(enc.encode([("1", "1")], [("2", "1")], ts_ms=1, push_ts_ms=1), 1, c, st)
    enc.skip()
    out = decode_with_books(enc.encode([("1", "2")], [("2", "1")], ts_ms=2, push_ts_ms=2), 2, c, st)
    assert [f.reason for f in out if isinstance(f, BookFault)] == ["seq_gap"]


# ---------------------------------------------------------------- real data: Bitget v1 capture


def test_every_books_message_of_the_real_v1_capture() -> None:
    assert V1_CAPTURE.exists(), f"real data missing: {V1_CAPTURE}"
    st = BooksState(BooksOptions(verify_snapshot_checksum=True))
    c = StreamCounters()
    n = snaps = updates = 0
    symbols = set()
    for line in iter_capture(V1_CAPTURE):
        if line.kind != "recv":
            continue
        frame = orjson.loads(line.text)
        if "event" in frame or frame["arg"]["channel"] != "books":
            continue
        n += 1
        snaps += frame["action"] == "snapshot"
        updates += frame["action"] == "update"
        symbols.add(frame["arg"]["instId"])
        # every message carries a checksum; recomputed on the rebuilt book it must match
        assert all("checksum" in d for d in frame["data"])
        out = decode_with_books(orjson.dumps(to_v2(frame)), line.ts_recv_ns, c, st, source="bitget_v1")
        assert [type(e) for e in out] == [BookSnapshot], (line.text[:200], out)
        assert not st.book(frame["arg"]["instId"]).crossed()
    assert (n, snaps, updates, len(symbols)) == (443, 8, 435, 8)
    assert st.checksums_verified == 443 and st.faults == 0


def test_v1_capture_with_one_level_changed_fails_the_checksum() -> None:
    st = BooksState()
    faults = 0
    lines = [x for x in iter_capture(V1_CAPTURE) if x.kind == "recv"]
    tampered = False
    for line in lines:
        frame = orjson.loads(line.text)
        if "event" in frame or frame["arg"]["channel"] != "books":
            continue
        d = frame["data"][0]
        if not tampered and frame["action"] == "update" and d["asks"]:
            p, s = d["asks"][0]
            d["asks"][0] = [p, s + "0" if "." in s else s + ".0"]  # same number, different string
            tampered = True
        for e in decode_with_books(orjson.dumps(to_v2(frame)), line.ts_recv_ns, StreamCounters(), st):
            faults += isinstance(e, BookFault)
        if faults:
            break
    assert tampered and faults == 1
