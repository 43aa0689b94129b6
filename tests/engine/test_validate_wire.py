"""The wire checks (``engine.validate.WireGuard``) on a corpus of bad frames, through the codec's general
parser and its compiled fast paths: every bad frame is one quarantine record with a reason, never an
exception, and the fast paths decide exactly as the general parser does. Also the replay door's time
and price range codes and the v1 features' refusal of an absurd notional (it used to loop for ever)."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pyarrow as pa
import pytest

from engine.errors import DualhubError
from engine.events import BookSnapshot, Quarantined, Trade
from engine.laya.features_v1 import FeaturesV1, features_v1_batch
from engine.validate import (
    BACKWARDS,
    BAD_TIME,
    PX_RANGE,
    REASONS,
    WireGuard,
    WireLimits,
    book_table_codes,
    trade_codes,
)
from recorder.normalise import discard_reason
from wire.bitget.bitget_v2 import Control, StreamCounters, decode, encode_trades, wire_guard
from wire.bitget.bitget_v2_books import BooksState, decode_with_books, encode_books
from wire.bitget.bitget_v2_fast import decode_fast

NOW_NS = time.time_ns()
NOW_MS = NOW_NS // 1_000_000
SYM = "BTCUSDT"


def book(
    ts: object = None,
    *,
    bids: object = (("100.0", "1"),),
    asks: object = (("100.5", "2"),),
    channel: str = "books15",
    inst_type: str = "USDT-FUTURES",
    data_extra: dict | None = None,
    drop: tuple[str, ...] = (),
) -> bytes:
    d: dict = {
        "asks": [list(a) for a in asks],  # type: ignore[attr-defined]
        "bids": [list(b) for b in bids],  # type: ignore[attr-defined]
        "checksum": 0,
        "seq": 7,
        "ts": str(NOW_MS) if ts is None else ts,
    }
    d.update(data_extra or {})
    for k in drop:
        d.pop(k, None)
    arg = {"instType": inst_type, "channel": channel, "instId": SYM}
    return orjson.dumps({"action": "snapshot", "arg": arg, "data": [d], "ts": NOW_MS})


def trade(price: str = "100.2", *, ts: object = None, side: str = "buy", tid: str = "1", size: str = "0.5",
          inst_type: str = "USDT-FUTURES", action: str = "update") -> bytes:  # fmt: skip
    row = {
        "ts": str(NOW_MS) if ts is None else ts,
        "price": price,
        "size": size,
        "side": side,
        "tradeId": tid,
    }
    arg = {"instType": inst_type, "channel": "trade", "instId": SYM}
    return orjson.dumps({"action": action, "arg": arg, "data": [row], "ts": NOW_MS})


def tag_of(raw: bytes, guard: WireGuard | None = None, ts_recv: int = NOW_NS) -> str:
    """The discard tag of a frame the guard refuses (after one good book, so the band has a mid)."""
    g = guard or wire_guard()
    decode(book(), ts_recv, StreamCounters(), g)
    out = decode(raw, ts_recv, StreamCounters(), g)
    assert len(out) == 1 and isinstance(out[0], Quarantined), out
    return discard_reason(out[0].reason)


BAD = [
    # timestamps: overflowing, text, zero, negative, far future
    (book("99999999999999999999"), "books15_bad_ts"),
    (book(str(2**63)), "books15_bad_ts"),
    (book("abc"), "books15_malformed"),
    (book("1.7e12"), "books15_malformed"),
    (book("0"), "books15_bad_ts"),
    (book(-5), "books15_bad_ts"),
    (book("-5"), "books15_malformed"),
    (book(str(NOW_MS + 86_400_000)), "books15_bad_ts"),
    (trade(ts="99999999999999999999"), "trade_bad_ts"),
    (trade(ts="0"), "trade_bad_ts"),
    (trade(ts="soon"), "trade_malformed"),
    (trade(ts=str(NOW_MS + 3_600_000)), "trade_bad_ts"),
    # prices: absurd, tiny, negative, NaN, infinite; 10x away from the current book
    (trade("1e300"), "trade_bad_price"),
    (trade("1e-300"), "trade_bad_price"),
    (trade("-100.2"), "trade_malformed"),
    (trade("NaN"), "trade_malformed"),
    (trade("inf"), "trade_malformed"),
    (trade("1002.5"), "trade_out_of_band"),
    (trade("10.02"), "trade_out_of_band"),
    (book(bids=[("1e300", "1")], asks=[("2e300", "1")]), "books15_bad_price"),
    (book(bids=[("1000.0", "1")], asks=[("1000.5", "1")]), "books15_out_of_band"),
    (book(bids=[("100.0", "NaN")]), "books15_malformed"),
    # sizes
    (trade(size="1e300"), "trade_bad_size"),
    (trade(size="-1"), "trade_malformed"),
    (book(bids=[("100.0", "1e300")]), "books15_bad_size"),
    # sides
    (trade(side="sideways"), "trade_malformed"),
    (trade(side="BUY"), "trade_malformed"),
    # another instType than the subscription's
    (book(inst_type="SPOT"), "books15_inst_type"),
    (book(inst_type="COIN-FUTURES"), "books15_inst_type"),
    (trade(inst_type="USDC-FUTURES"), "trade_inst_type"),
    (book(channel="books5", inst_type="SPOT"), "books5_inst_type"),
    # fixed-depth channels: more levels than the channel has
    (book(channel="books1", bids=[("100.0", "1"), ("99.5", "1")]), "books1_malformed"),
    (book(channel="books5", bids=[(f"{100 - i}.0", "1") for i in range(6)]), "books5_malformed"),
    (book(data_extra={"seq": "18446744073709551616"}), "books15_malformed"),
    (book(data_extra={"seq": True}), "books15_malformed"),
]


@pytest.mark.parametrize("raw, tag", BAD, ids=[t for _, t in BAD])
def test_bad_frames_are_quarantined_with_their_reason(raw, tag):
    assert tag_of(raw) == tag


@pytest.mark.parametrize("raw, tag", BAD, ids=[t for _, t in BAD])
def test_fast_paths_decide_as_the_general_parser(raw, tag):
    for frames in ([book(), raw], [book(), raw, book(), trade()]):
        g_slow, g_fast = wire_guard(), wire_guard()
        c_slow, c_fast = StreamCounters(), StreamCounters()
        for f in frames:
            assert decode_fast(f, NOW_NS, c_fast, guard=g_fast) == decode(f, NOW_NS, c_slow, g_slow)
        assert c_fast.next_seq == c_slow.next_seq
        assert np.array_equal(g_fast.mid, g_slow.mid, equal_nan=True)


def test_good_frames_pass_and_move_the_band():
    g = wire_guard()
    c = StreamCounters()
    assert isinstance(decode(book(), NOW_NS, c, g)[0], BookSnapshot)
    (t,) = decode(trade("150.0"), NOW_NS, c, g)  # 1.5x the mid: inside the default band of 2
    assert isinstance(t, Trade) and t.px == 150.0
    # a jump of 10x after the reference is stale (band_book_age_s) is the market, not a bad print
    later = NOW_NS + 11_000_000_000
    (b,) = decode(book(bids=[("1000.0", "1")], asks=[("1000.5", "1")]), later, c, g)
    assert isinstance(b, BookSnapshot) and b.bid_px[0] == 1000.0


def test_fixed_depth_variants_all_decode():
    g = wire_guard()
    c = StreamCounters()
    variants = [
        book(channel="books1"),  # 2024: checksum 0 and seq
        book(channel="books5", drop=("seq",)),  # 2024: checksum 0, no seq
        book(channel="books5", drop=("checksum",), data_extra={"seq": 10, "pseq": 9}),  # 2026
        book(channel="books15", drop=("checksum",), data_extra={"seq": "11", "pseq": 10}),
        book(channel="books5", bids=[(f"{100 - i}.0", "1") for i in range(5)]),
    ]
    for raw in variants:
        (ev,) = decode(raw, NOW_NS, c, g)
        assert isinstance(ev, BookSnapshot), ev
    assert c.next_seq["books15"] == len(variants)


def test_trade_snapshot_after_resubscribe_is_not_counted_twice():
    g = wire_guard()
    c = StreamCounters()
    assert len(decode(trade(tid="1"), NOW_NS, c, g)) == 1
    assert len(decode(trade(tid="2"), NOW_NS, c, g)) == 1
    rows = [
        {"ts": str(NOW_MS), "price": "100.2", "size": "0.5", "side": "buy", "tradeId": str(i)}
        for i in (3, 2, 1)
    ]
    snap = encode_trades(SYM, rows, push_ts_ms=NOW_MS, action="snapshot")
    (new,) = decode(snap, NOW_NS, c, g)  # newest first on the wire: only trade 3 is new
    assert isinstance(new, Trade) and new.trade_id == "3" and new.seq == 2
    again = decode(snap, NOW_NS, c, g)
    assert again == [Control("duplicate", {"instType": "USDT-FUTURES", "channel": "trade", "instId": SYM})]
    assert g.duplicates == {SYM: 5} and c.next_seq["trade"] == 3
    # the compiled path drops the same ones
    g2, c2 = wire_guard(), StreamCounters()
    for f in (trade(tid="1"), trade(tid="2"), snap, snap):
        decode_fast(f, NOW_NS, c2, guard=g2)
    assert g2.duplicates == g.duplicates and c2.next_seq == c.next_seq


def test_inst_type_none_takes_any_market_and_lag_closes_the_past():
    g = wire_guard(inst_type=None)
    assert isinstance(decode(book(inst_type="SPOT"), NOW_NS, StreamCounters(), g)[0], BookSnapshot)
    g = wire_guard(WireLimits(max_lag_s=60.0))
    old = book(str(NOW_MS - 3_600_000))
    assert tag_of(old, g) == "books15_bad_ts"
    assert "max_lag_s" in decode(old, NOW_NS, StreamCounters(), g)[0].reason


def test_books_channel_frames_are_checked():
    g = wire_guard()
    state = BooksState()
    c = StreamCounters()
    snap = encode_books(SYM, action="snapshot", bids=[["100.0", "1"]], asks=[["100.5", "1"]], ts_ms=NOW_MS,
                        seq=1, pseq=0, push_ts_ms=NOW_MS)  # fmt: skip
    assert isinstance(decode_with_books(snap, NOW_NS, c, state, guard=g)[0], BookSnapshot)
    far = encode_books(SYM, action="update", bids=[["100.1", "1"]], asks=[], ts_ms=2**62, seq=2, pseq=1,
                       push_ts_ms=NOW_MS)  # fmt: skip
    (q,) = decode_with_books(far, NOW_NS, c, state, guard=g)
    assert isinstance(q, Quarantined) and q.reason.startswith("books: bad_ts:")
    assert state.book(SYM).ready  # the local book is still right: no resubscribe needed
    spot = encode_books(SYM, action="snapshot", bids=[["1", "1"]], asks=[["2", "1"]], ts_ms=NOW_MS, seq=1,
                        pseq=0, push_ts_ms=NOW_MS, inst_type="SPOT")  # fmt: skip
    (q,) = decode_with_books(spot, NOW_NS, c, state, guard=g)
    assert discard_reason(q.reason) == "books_inst_type"


def test_limits_are_checked_and_round_trip():
    lm = WireLimits(max_lag_s=5.0, band=3.0)
    assert WireLimits.from_json(lm.to_json()) == lm and WireLimits.from_json(None) == WireLimits()
    for bad in ({"band": 1.0}, {"max_px": float("nan")}, {"max_lag_s": -1.0}, {"min_px": 2e12}):
        with pytest.raises(ValueError):
            WireLimits(**bad)


# ---------------------------------------------------------------- the replay door and the features


def test_replay_door_names_bad_times_and_absurd_prices():
    lv = {f"{s}_{i}": [100.0 - i if s == "bid_px" else 101.0 + i if s == "ask_px" else 1.0] * 3
          for s in ("bid_px", "bid_sz", "ask_px", "ask_sz") for i in range(15)}  # fmt: skip
    big = 2**63 - 1
    t = pa.table(
        {"ts_event": [1, big, 3], "ts_recv": [1, big, 3], "symbol": ["X"] * 3, "seq": [0, 1, 2], **lv}
    )
    codes = book_table_codes(t)
    # the INT64_MAX row is bad_time and does not make the next row look backwards
    assert codes.tolist() == [0, BAD_TIME, 0] and REASONS[BAD_TIME] == "bad_time"
    t2 = t.set_column(1, "ts_recv", pa.array([5, 4, 6]))
    assert book_table_codes(t2.set_column(0, "ts_event", pa.array([1, 2, 3]))).tolist() == [0, BACKWARDS, 0]
    px = np.array([100.0, 1e300, 1e-300, 1e13])
    codes = trade_codes(px, np.ones(4), np.zeros(4, dtype=np.int64))
    assert codes.tolist() == [0, PX_RANGE, PX_RANGE, PX_RANGE]


def _trade_event(px: float, ts: int, sz: float = 1.0) -> Trade:
    return Trade(ts_event=ts, ts_recv=ts, seq=0, symbol="X", trade_id="1", px=px, sz=sz, side="buy")


def test_features_v1_refuse_an_absurd_notional_at_once():
    f = FeaturesV1()
    f.on_trade(_trade_event(100.0, 1))
    t0 = time.monotonic()
    with pytest.raises(DualhubError, match="no market trades at once"):
        f.on_trade(_trade_event(1e300, 2))
    f.on_trade(_trade_event(1e9, 3))  # large, but a finite number of buckets: taken
    assert time.monotonic() - t0 < 5.0
    books = pa.table({"ts_event": [10], "ts_recv": [10], "symbol": ["X"], "seq": [0],
                      **{c: [1.0] for c in _levels()}})  # fmt: skip
    trades = pa.table({"ts_event": [1, 2], "ts_recv": [1, 2], "seq": [0, 1], "symbol": ["X", "X"],
                       "px": [100.0, 1e300], "sz": [1.0, 1.0], "side": ["buy", "sell"]})  # fmt: skip
    with pytest.raises(DualhubError, match="no market trades at once"):
        features_v1_batch(books, trades)


def _levels() -> list[str]:
    return [f"{s}_{i}" for s in ("bid_px", "bid_sz", "ask_px", "ask_sz") for i in range(15)]


def test_a_big_trade_completes_its_buckets_as_before():
    """The closed form that replaced the one-bucket-at-a-time loop gives the same boundaries."""
    f = FeaturesV1()
    for i, (px, sz) in enumerate([(100.0, 999.0), (100.0, 1.0), (100.0, 1000.0), (50_000.0, 2_000.0)]):
        f.on_trade(_trade_event(px, i + 1, sz))
    # 99 900, 100 000 (boundary 1 exactly), 200 000 (boundary 2), then 100e6 more: 1 002 boundaries
    assert int(f._n[1]) == 1002


def test_the_2026_fixed_depth_layout_takes_the_compiled_path_and_decodes_equal():
    from venue.simulator import generate_frames
    from wire.bitget.bitget_v2_fast import Books15Scanner

    sc = Books15Scanner()
    c_slow, c_fast = StreamCounters(), StreamCounters()
    n = 0
    prev = 0
    for ts, raw in generate_frames(minutes=1, seed=6):
        if b'"books15"' not in raw[:90]:
            continue
        f = orjson.loads(raw)
        d = f["data"][0]
        f["data"] = [{"asks": d["asks"], "bids": d["bids"], "ts": d["ts"], "seq": d["seq"], "pseq": prev}]
        prev = d["seq"]
        new = orjson.dumps(f)
        assert sc.scan(new), new[-80:]
        (a,) = decode_fast(new, ts, c_fast)
        assert [a] == decode(new, ts, c_slow)
        (b,) = decode(raw, ts, StreamCounters())  # the 2024 layout of the same push: the same book
        assert (a.bid_px, a.ask_sz, a.exch_seq, a.ts_event) == (b.bid_px, b.ask_sz, b.exch_seq, b.ts_event)
        n += 1
    assert n > 100


def test_seen_ids_one_at_a_time_or_in_blocks_decide_alike():
    """The generations rotate at the same ids whichever way they come, across many windows."""
    from engine.validate import DEDUP_WINDOW

    rng = np.random.default_rng(3)
    ids = [str(i) for i in rng.integers(0, 3 * DEDUP_WINDOW, size=6 * DEDUP_WINDOW)]
    ids += [f"u{i}" for i in range(5 * DEDUP_WINDOW)]  # all new: blocks taken whole, rotating mid-block
    ids += ids[-DEDUP_WINDOW - 50 :]  # the last window and a little more: mostly seen
    one, block = wire_guard(), wire_guard()
    want = [one.fresh(SYM, t) for t in ids]
    got: list[bool] = []
    i = 0
    while i < len(ids):
        n = int(rng.integers(1, 3000))
        r = block.fresh_all(SYM, ids[i : i + n])
        got += [True] * len(ids[i : i + n]) if r is None else r
        i += n
    assert got == want and one.duplicates == block.duplicates
    assert one._seen == block._seen
