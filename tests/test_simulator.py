"""The Bitget v2 market simulator: determinism, wire format, receive times, realism, sessions."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from engine.events import BOOK_LEVELS, BookSnapshot, Trade
from engine.store import open_session
from engine.venues.bitget_v2 import MS, StreamCounters, decode
from venue.simulator import DEFAULT_START_MS, SimConfig, _Market, _Tape, generate_frames, simulate_session

PX_RE = re.compile(r"^[1-9]\d*\.\d$")  # tick 0.1: exactly one decimal
SZ_RE = re.compile(r"^\d+\.\d{3}$")  # size step 0.001: exactly three decimals
TICK = 0.1


def _decode_all(frames: list[tuple[int, bytes]]) -> tuple[list[BookSnapshot], list[Trade], list[list[Trade]]]:
    counters = StreamCounters()
    books: list[BookSnapshot] = []
    trades: list[Trade] = []
    pushes: list[list[Trade]] = []
    for ts_recv, raw in frames:
        evs = decode(raw, ts_recv, counters)
        assert evs, raw[:200]
        for e in evs:
            assert isinstance(e, BookSnapshot | Trade), f"not a book or trade: {e!r}"[:300]
        if isinstance(evs[0], BookSnapshot):
            assert len(evs) == 1
            books.append(evs[0])
        else:
            trades.extend(evs)
            pushes.append(evs)
    return books, trades, pushes


@pytest.fixture(scope="module")
def ten_minutes() -> dict:
    frames = list(generate_frames(minutes=10.0, seed=7))
    books, trades, pushes = _decode_all(frames)
    return {"frames": frames, "books": books, "trades": trades, "pushes": pushes}


# ---------------------------------------------------------------- determinism


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    a = list(generate_frames(minutes=1.0, seed=3))
    b = list(generate_frames(minutes=1.0, seed=3))
    c = list(generate_frames(minutes=1.0, seed=4))
    assert len(a) > 500
    assert a == b
    assert a != c
    assert [f for _, f in a[:50]] != [f for _, f in c[:50]]


def test_shorter_session_is_a_prefix_of_a_longer_one() -> None:
    short = list(generate_frames(minutes=0.5, seed=5))
    long = list(generate_frames(minutes=1.0, seed=5))
    assert len(long) > len(short) > 100
    assert long[: len(short)] == short


def test_start_ms_shifts_time_only() -> None:
    a = list(generate_frames(minutes=0.2, seed=9))
    b = list(generate_frames(minutes=0.2, seed=9, start_ms=DEFAULT_START_MS + 60_000))
    assert len(a) == len(b)
    assert [t + 60_000 * MS for t, _ in a] == [t for t, _ in b]


# ---------------------------------------------------------------- wire format


def test_frames_have_bitget_shapes(ten_minutes: dict) -> None:
    frames = ten_minutes["frames"]
    trade_actions = []
    last_seq = -1
    last_trade_id = -1
    for _, raw in frames:
        msg = orjson.loads(raw)
        assert set(msg) == {"action", "arg", "data", "ts"}
        assert isinstance(msg["ts"], int)
        assert msg["arg"]["instType"] == "USDT-FUTURES" and msg["arg"]["instId"] == "BTCUSDT"
        if msg["arg"]["channel"] == "books15":
            assert msg["action"] == "snapshot"
            (d,) = msg["data"]
            assert d["checksum"] == 0
            assert isinstance(d["seq"], int) and d["seq"] > last_seq
            last_seq = d["seq"]
            assert isinstance(d["ts"], str) and int(d["ts"]) <= msg["ts"]
            for side in ("asks", "bids"):
                assert len(d[side]) == BOOK_LEVELS
                for px, sz in d[side]:
                    assert PX_RE.match(px), px
                    assert SZ_RE.match(sz) and float(sz) > 0, sz
            asks = [float(p) for p, _ in d["asks"]]
            bids = [float(p) for p, _ in d["bids"]]
            assert all(x < y for x, y in zip(asks, asks[1:], strict=False))
            assert all(x > y for x, y in zip(bids, bids[1:], strict=False))
            assert bids[0] < asks[0]
        else:
            assert msg["arg"]["channel"] == "trade"
            trade_actions.append(msg["action"])
            rows = msg["data"]
            assert rows
            ids = [int(r["tradeId"]) for r in rows]
            ts = [int(r["ts"]) for r in rows]
            assert ids == sorted(ids, reverse=True)  # newest first
            assert ts == sorted(ts, reverse=True)
            assert ids[-1] > last_trade_id  # ids rise across pushes
            last_trade_id = ids[0]
            for r in rows:
                assert list(r) == ["ts", "price", "size", "side", "tradeId"]
                assert PX_RE.match(r["price"]) and SZ_RE.match(r["size"]) and float(r["size"]) > 0
                assert r["side"] in ("buy", "sell")
                assert int(r["ts"]) <= msg["ts"]
    assert trade_actions[0] == "snapshot"
    assert set(trade_actions[1:]) == {"update"}


def test_decoded_books_are_sane(ten_minutes: dict) -> None:
    books: list[BookSnapshot] = ten_minutes["books"]
    assert 3500 < len(books) < 4500  # ~150 ms cadence over 10 minutes
    bid = np.array([b.bid_px for b in books])
    ask = np.array([b.ask_px for b in books])
    sizes = np.array([b.bid_sz + b.ask_sz for b in books])
    assert np.isfinite(bid).all() and np.isfinite(ask).all()  # always 15 levels
    assert (bid[:, 0] < ask[:, 0]).all()
    assert (np.diff(ask, axis=1) > 0).all() and (np.diff(bid, axis=1) < 0).all()
    for px in (bid, ask):
        ticks = px / TICK
        assert np.abs(ticks - np.rint(ticks)).max() < 1e-6
    assert (sizes >= 0.001).all()
    assert np.abs(sizes * 1000 - np.rint(sizes * 1000)).max() < 1e-6
    mid = (bid[:, 0] + ask[:, 0]) / 2
    assert 80_000 < mid.min() and mid.max() < 100_000


# ---------------------------------------------------------------- time


def test_receive_times(ten_minutes: dict) -> None:
    frames = ten_minutes["frames"]
    recv = np.array([t for t, _ in frames], dtype=np.int64)
    assert (np.diff(recv) >= 0).all()
    push = np.array([orjson.loads(raw)["ts"] for _, raw in frames], dtype=np.int64) * MS
    lat_ms = (recv - push) / MS
    assert (lat_ms > 0).all()
    assert 1.0 < np.median(lat_ms) < 10.0  # a few ms of feed latency
    for e in ten_minutes["books"] + ten_minutes["trades"]:
        assert e.ts_recv >= e.ts_event
    books = ten_minutes["books"]
    gaps_ms = np.diff([b.ts_event for b in books]) / MS
    assert 100 <= np.median(gaps_ms) <= 200
    assert gaps_ms.min() >= 100 and gaps_ms.max() <= 200
    assert books[0].ts_event >= DEFAULT_START_MS * MS
    assert books[-1].ts_event < (DEFAULT_START_MS + 600_000) * MS
    # Trades come out in exchange-time order after the subscribe snapshot's history.
    live = [t.ts_event for t in ten_minutes["trades"] if t.ts_event >= DEFAULT_START_MS * MS]
    assert live == sorted(live)
    first_push = ten_minutes["pushes"][0]
    assert all(t.ts_event < DEFAULT_START_MS * MS for t in first_push)  # recent trades before subscribe


# ---------------------------------------------------------------- realism


def test_realism(ten_minutes: dict) -> None:
    books: list[BookSnapshot] = ten_minutes["books"]
    trades: list[Trade] = ten_minutes["trades"]
    pushes: list[list[Trade]] = ten_minutes["pushes"]
    sides = Counter(t.side for t in trades)
    assert sides["buy"] > 0.3 * len(trades) and sides["sell"] > 0.3 * len(trades)

    # Sweeps: pushes that walk several levels, monotonically through the book.
    # (A push holds every fill of one matching millisecond, possibly from several orders.)
    walks = [p for p in pushes[1:] if len({t.px for t in p}) >= 3]
    assert walks
    biggest = max(pushes[1:], key=lambda p: len({t.px for t in p}))
    assert len({t.px for t in biggest}) >= 20  # a liquidation-size sweep
    side = Counter(t.side for t in biggest).most_common(1)[0][0]
    px = [t.px for t in biggest if t.side == side]
    assert px == sorted(px, reverse=(side == "sell"))  # it walks the book from the touch outwards
    mid = np.array([b.mid for b in books])
    jumps_ticks = np.abs(np.diff(mid)) / TICK
    assert jumps_ticks.max() >= 10

    # Spread: mostly one tick, wider in bursts.
    spread_ticks = np.rint(np.array([b.ask_px[0] - b.bid_px[0] for b in books]) / TICK)
    spread = Counter(spread_ticks.astype(int).tolist())
    assert len(spread) >= 3
    assert spread.most_common(1)[0][0] == 1
    assert 0.5 < spread[1] / len(books) < 0.95

    # Imbalance over the displayed depth leads the mid ~1.5 s ahead.
    ts = np.array([b.ts_event for b in books], dtype=np.int64)
    bsz = np.array([sum(b.bid_sz) for b in books])
    asz = np.array([sum(b.ask_sz) for b in books])
    imb = (bsz - asz) / (bsz + asz)
    j = np.searchsorted(ts, ts + 1_500 * MS)
    ok = j < len(books)
    fut = mid[j[ok]] - mid[ok]
    corr = np.corrcoef(imb[ok], fut)[0, 1]
    assert 0.1 < corr < 0.8, corr

    # Moves big enough for the classifier's labels (1.5 / 8 bps over 2 s) but not all big.
    j2 = np.searchsorted(ts, ts + 2_000 * MS)
    ok2 = j2 < len(books)
    move_bps = (mid[j2[ok2]] - mid[ok2]) * 1e4 / mid[ok2]
    lean = np.mean(np.abs(move_bps) >= 1.5)
    assert 0.1 < lean < 0.7, lean
    assert (np.abs(move_bps) >= 8.0).any()
    assert np.mean(np.abs(move_bps) >= 8.0) < 0.1


def test_trades_consume_the_displayed_book() -> None:
    """White box: a taker order fills level by level at the displayed sizes, starting at the touch."""
    cfg = SimConfig()
    mkt = _Market(cfg, _Tape(np.random.default_rng([1, 2])), 900_000.0, first_trade_id=10, first_seq=1)
    mkt.sync(1_000, 900_000.2, 1, False)
    asks = mkt.asks
    shown = [(asks.ticks[i], asks.display(i)) for i in range(4)]
    best_bid = mkt.bids.ticks[0]
    assert best_bid < shown[0][0]
    lots = sum(q for _, q in shown[:3]) + 1
    mkt.take(True, lots, 1_000)
    got = [(t, q) for _, t, q, buy, _ in mkt.fills if buy]
    assert got == shown[:3] + [(shown[3][0], 1)]
    assert mkt.asks.ticks[0] == shown[3][0]  # the three levels are gone, the fourth is partly taken
    ids = [f[4] for f in mkt.fills]
    assert ids == sorted(set(ids))
    # A liquidation-style sell walks bids from the touch down to its target.
    mkt.fills.clear()
    top = mkt.bids.ticks[0]
    last = mkt.sweep_to(False, 900, 1_001)
    px = [t for _, t, _, _, _ in mkt.fills]
    assert px[0] == top and px == sorted(px, reverse=True) and len(set(px)) == len(px)
    assert top - 900 <= last == px[-1]
    assert len(mkt.bids.ticks) >= BOOK_LEVELS and mkt.bids.ticks[0] < last


# ---------------------------------------------------------------- sessions


def test_simulate_session_round_trip(tmp_path: Path) -> None:
    out = simulate_session(tmp_path / "sim", minutes=1.0, seed=11, progress=True)
    assert out == tmp_path / "sim"
    session = open_session(out)
    session.verify()
    assert session.manifest["source"] == "simulator"
    assert session.manifest["symbols"] == ["BTCUSDT"]
    assert session.manifest["simulator"] == {
        "seed": 11,
        "minutes": 1.0,
        "symbol": "BTCUSDT",
        "start_ms": DEFAULT_START_MS,
    }
    books, trades, _ = _decode_all(list(generate_frames(minutes=1.0, seed=11)))
    assert session.streams == ["books15", "trade"]  # no quarantine
    rows = session.manifest["streams"]
    assert rows["books15"]["rows"] == len(books) == session.read_table("books15").num_rows
    assert rows["trade"]["rows"] == len(trades) == session.read_table("trade").num_rows
    stored = session.read_events("books15")
    assert stored[0] == books[0] and stored[-1] == books[-1]
    assert session.read_events("trade")[-1] == trades[-1]
    assert session.manifest["ts_recv_min"] == min(books[0].ts_recv, trades[0].ts_recv)
