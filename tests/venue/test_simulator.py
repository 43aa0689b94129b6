"""The Bitget v2 market simulator: determinism, wire format, receive times, realism, sessions, and
multi-symbol sessions (a cointegrated pair with a mean-reverting spread and regime shifts)."""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from engine.contract import ContractConfig
from engine.events import BOOK_LEVELS, BookSnapshot, Trade
from engine.store import open_session
from venue.bitget.public_server import simulator_frames
from venue.simulator import (
    DEFAULT_START_MS,
    INSTRUMENTS,
    MultiSim,
    PairConfig,
    SimConfig,
    _Market,
    _Tape,
    generate_frames,
    simulate_session,
)
from wire.bitget.bitget_v2 import MS, StreamCounters, decode

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


# ---------------------------------------------------------------- one symbol: the bytes are pinned


def _frames_sha(frames: Iterable[tuple[int, bytes]]) -> str:
    h = hashlib.sha256()
    for ts, raw in frames:
        h.update(ts.to_bytes(8, "little") + len(raw).to_bytes(4, "little") + raw)
    return h.hexdigest()


def test_single_symbol_bytes_are_pinned(ten_minutes: dict, tmp_path: Path) -> None:
    """What the single-symbol simulator wrote before multi-symbol sessions existed: every session of
    the other tests (and their golden digests) stands on these bytes."""
    assert len(ten_minutes["frames"]) == 17220
    assert (
        _frames_sha(ten_minutes["frames"])
        == "6ed49d75395abc1f37a70b897f74713450ace2240ffccbf6197d84076afa0850"
    )
    served = simulator_frames(["BTCUSDT"], minutes=2, seed=3)  # the live tests' feed
    assert _frames_sha(served) == "61fb976b14b6a73e2428b7047a815e92fa6d986e94fc8bd720c8b36da8d61714"
    a = open_session(simulate_session(tmp_path / "a", minutes=0.5, seed=11))
    b = open_session(simulate_session(tmp_path / "b", symbols=["BTCUSDT"], minutes=0.5, seed=11))
    assert a.digest() == b.digest() and a.manifest["simulator"] == b.manifest["simulator"]
    assert a.manifest["simulator"] == {
        "seed": 11,
        "minutes": 0.5,
        "symbol": "BTCUSDT",
        "start_ms": DEFAULT_START_MS,
    }


# ---------------------------------------------------------------- several symbols


PAIR = ("BTCUSDT", "ETHUSDT")


def _by_symbol(frames: list[tuple[int, bytes]]) -> dict[str, dict[str, list]]:
    out: dict[str, dict[str, list]] = {}
    counters = StreamCounters()
    for ts_recv, raw in frames:
        for e in decode(raw, ts_recv, counters):
            assert isinstance(e, BookSnapshot | Trade), f"not a book or trade: {e!r}"[:300]
            d = out.setdefault(e.symbol, {"books": [], "trades": []})
            d["books" if isinstance(e, BookSnapshot) else "trades"].append(e)
    return out


@pytest.fixture(scope="module")
def pair_session() -> dict:
    sim = MultiSim(PAIR, minutes=10.0, seed=7)
    frames = list(sim.frames())
    return {"frames": frames, "truth": sim.truth(), "by_symbol": _by_symbol(frames)}


def test_multi_symbol_same_seed_same_bytes(pair_session: dict, ten_minutes: dict) -> None:
    frames = pair_session["frames"]
    assert list(MultiSim(PAIR, minutes=10.0, seed=7).frames()) == frames
    other = list(MultiSim(PAIR, minutes=1.0, seed=8).frames())
    assert other[:100] != frames[:100]
    # One time order over both symbols: receive times never go back.
    recv = [t for t, _ in frames]
    assert recv == sorted(recv)
    syms = [orjson.loads(raw)["arg"]["instId"] for _, raw in frames]
    assert Counter(syms).keys() == set(PAIR)
    # The leader draws from the single-symbol streams: its frames are the single-symbol session's.
    lead = [f for f, s in zip(frames, syms, strict=True) if s == "BTCUSDT"]
    assert lead == ten_minutes["frames"]
    # The server source is the same merge.
    assert list(simulator_frames(PAIR, minutes=1.0, seed=8)) == other
    # A shorter session's frames are a prefix of a longer one's.
    short = list(MultiSim(PAIR, minutes=0.5, seed=8).frames())
    assert len(other) > len(short) > 100 and other[: len(short)] == short


def test_multi_symbol_books_are_valid_on_each_contract(pair_session: dict) -> None:
    for sym, d in pair_session["by_symbol"].items():
        inst = INSTRUMENTS[sym]
        tick, step = float(inst.tick), float(inst.size_step)
        books: list[BookSnapshot] = d["books"]
        assert 3500 < len(books) < 4500 and len(d["trades"]) > 1000
        bid = np.array([b.bid_px for b in books])
        ask = np.array([b.ask_px for b in books])
        sizes = np.array([b.bid_sz + b.ask_sz for b in books])
        assert np.isfinite(bid).all() and np.isfinite(ask).all()
        assert (bid[:, 0] < ask[:, 0]).all()  # never crossed nor locked
        assert (np.diff(ask, axis=1) > 0).all() and (np.diff(bid, axis=1) < 0).all()
        for x, unit in (
            (bid, tick),
            (ask, tick),
            (sizes, step),
            (np.array([t.px for t in d["trades"]]), tick),
        ):
            n = x / unit
            assert np.abs(n - np.rint(n)).max() < 1e-6, sym
        assert (sizes >= step).all()
        spread_ticks = np.rint((ask[:, 0] - bid[:, 0]) / tick)
        assert Counter(spread_ticks.tolist()).most_common(1)[0][0] == 1  # mostly one tick wide
        mid = (bid[:, 0] + ask[:, 0]) / 2
        assert 0.9 * inst.price < mid.min() and mid.max() < 1.1 * inst.price
        seqs = [b.exch_seq for b in books]
        assert seqs == sorted(set(seqs))
    # The wire strings carry the contract's decimals.
    eth = next(
        orjson.loads(r) for _, r in pair_session["frames"] if b'"books15"' in r[:90] and b"ETHUSDT" in r[:120]
    )
    px, sz = eth["data"][0]["bids"][0]
    assert re.match(r"^[1-9]\d*\.\d{2}$", px) and re.match(r"^\d+\.\d{2}$", sz)


def _log_mid_grid(books: list[BookSnapshot], grid: np.ndarray) -> np.ndarray:
    ts = np.array([b.ts_event for b in books], dtype=np.int64)
    mid = np.array([b.mid for b in books])
    return np.log(mid[np.searchsorted(ts, grid, "right") - 1])


def _pair_on_grid(by_symbol: dict, step_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lb, fb = by_symbol["BTCUSDT"]["books"], by_symbol["ETHUSDT"]["books"]
    lo = max(lb[0].ts_event, fb[0].ts_event)
    hi = min(lb[-1].ts_event, fb[-1].ts_event)
    grid = np.arange(lo, hi, int(step_s * 1e9), dtype=np.int64)
    return grid, _log_mid_grid(lb, grid), _log_mid_grid(fb, grid)


def _regime_spans(regimes: list[dict], grid: np.ndarray) -> list[tuple[dict, np.ndarray]]:
    out = []
    for i, r in enumerate(regimes):
        end = regimes[i + 1]["start_ms"] * MS if i + 1 < len(regimes) else grid[-1] + 1
        out.append((r, (grid >= r["start_ms"] * MS) & (grid < end)))
    return out


def test_the_spread_mean_reverts_at_its_half_life() -> None:
    """One regime (no shifts): log(ETH) - alpha - beta * log(BTC) on a 1 s grid is an AR(1) whose
    half-life is the configured one (loosely: 15 minutes of a 15 s half-life)."""
    pc = PairConfig(half_life_s=15.0, spread_sd_bps=8.0, regime_mean_s=1e9)
    sim = MultiSim(PAIR, minutes=15.0, seed=3, config=SimConfig(pair=pc))
    by_symbol = _by_symbol(list(sim.frames()))
    (pair,) = sim.truth()["pairs"]
    (r,) = pair["regimes"]
    assert pair["half_life_s"] == 15.0 and math.isclose(pair["spread_sd"], 8e-4)
    grid, lead, follow = _pair_on_grid(by_symbol, 1.0)
    spread = follow - r["alpha"] - r["beta"] * lead
    x = spread - spread.mean()
    phi = float(np.dot(x[:-1], x[1:]) / np.dot(x[:-1], x[:-1]))
    half_life = -math.log(2.0) / math.log(phi)
    assert 7.5 < half_life < 30.0, half_life
    assert 4e-4 < spread.std() < 1.6e-3  # about the configured 8 bps
    # Without the hedge the follower wanders with the leader: its log price is no stationary spread.
    assert np.std(follow - follow.mean()) > 2 * spread.std()


def test_realized_beta_follows_each_regime() -> None:
    """OLS beta of 1 s log returns over each long regime is near that regime's true beta, and nearer
    to it than to any other regime's."""
    sim = MultiSim(PAIR, minutes=15.0, seed=3, config=SimConfig(pair=PairConfig(regime_mean_s=300.0)))
    by_symbol = _by_symbol(list(sim.frames()))
    regimes = sim.truth()["pairs"][0]["regimes"]
    grid, lead, follow = _pair_on_grid(by_symbol, 1.0)
    checked = []
    for r, m in _regime_spans(regimes, grid):
        if m.sum() < 150:
            continue
        dl, df = np.diff(lead[m]), np.diff(follow[m])
        est = float(np.dot(dl, df) / np.dot(dl, dl))
        assert 0.8 < est / r["beta"] < 1.2, (est, r["beta"])
        others = [o["beta"] for o in regimes if abs(o["beta"] - r["beta"]) > 0.2]
        assert all(abs(est - r["beta"]) < abs(est - b) for b in others)
        checked.append(r["beta"])
    assert len(checked) >= 2 and max(checked) - min(checked) > 0.2


def test_regime_shifts_are_recorded(pair_session: dict, tmp_path: Path) -> None:
    truth = pair_session["truth"]
    cfg = SimConfig()
    assert truth["leader"] == "BTCUSDT"
    assert truth["instruments"]["ETHUSDT"] == {"tick": "0.01", "size_step": "0.01", "price": 3000.0}
    (pair,) = truth["pairs"]
    assert pair["leader"] == "BTCUSDT" and pair["follower"] == "ETHUSDT"
    assert pair["half_life_s"] == cfg.pair.half_life_s
    assert math.isclose(pair["kappa_per_s"], math.log(2.0) / cfg.pair.half_life_s)
    regimes = pair["regimes"]
    starts = [r["start_ms"] for r in regimes]
    end_ms = DEFAULT_START_MS + 600_000
    assert starts[0] == DEFAULT_START_MS - cfg.warmup_ms and starts == sorted(set(starts))
    assert starts[-1] < end_ms and len(regimes) >= 3  # a few shifts in 10 minutes
    assert regimes[0]["beta"] == cfg.pair.beta and regimes[0]["spread_mean"] == 0.0
    lo, hi = cfg.pair.beta_range
    assert all(lo <= r["beta"] <= hi for r in regimes[1:])
    assert len({r["spread_mean"] for r in regimes}) == len(regimes)
    # At a shift alpha moves so that the follower's price does not jump at the leader's price then.
    lb = pair_session["by_symbol"]["BTCUSDT"]["books"]
    for old, new in zip(regimes, regimes[1:], strict=False):
        if new["start_ms"] * MS < lb[0].ts_event:
            continue  # a shift in the warm-up, before the first book
        log_l = _log_mid_grid(lb, np.array([new["start_ms"] * MS]))[0]
        jump = (new["alpha"] - old["alpha"]) + (new["beta"] - old["beta"]) * log_l
        assert abs(jump) < 1e-3 * abs(new["beta"] - old["beta"]) + 1e-12
    # The session keeps the truth in its manifest.
    s = open_session(simulate_session(tmp_path / "s", symbols=PAIR, minutes=10.0, seed=7))
    assert s.manifest["symbols"] == sorted(PAIR)
    assert s.manifest["simulator"] == {
        "seed": 7,
        "minutes": 10.0,
        "symbols": list(PAIR),
        "start_ms": DEFAULT_START_MS,
        **orjson.loads(orjson.dumps(truth)),
    }
    books = s.read_table("books15")
    n = Counter(books.column("symbol").to_pylist())
    assert n == {k: len(v["books"]) for k, v in pair_session["by_symbol"].items()}


# ---------------------------------------------------------------- the command


def test_simulate_command_writes_several_symbols(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s"
    assert main(["simulate", "--out", str(out), "--symbols", "BTCUSDT,ETHUSDT", "--minutes", "0.5"]) == 0
    s = open_session(out)
    assert s.manifest["symbols"] == ["BTCUSDT", "ETHUSDT"]
    assert s.manifest["simulator"]["pairs"][0]["follower"] == "ETHUSDT"
    assert set(s.read_table("trade").column("symbol").to_pylist()) == {"BTCUSDT", "ETHUSDT"}
    assert main(["simulate", "--out", str(tmp_path / "one"), "--symbol", "ETHUSDT", "--minutes", "0.2"]) == 0
    assert open_session(tmp_path / "one").manifest["simulator"]["symbol"] == "ETHUSDT"


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (
            ["--symbols", "BTCUSDT,ETHUSDT,BTCUSDT"],
            "--symbols 'BTCUSDT,ETHUSDT,BTCUSDT': BTCUSDT given twice",
        ),
        (["--symbols", "BTCUSDT,,ETHUSDT"], "--symbols 'BTCUSDT,,ETHUSDT': an empty symbol (a stray comma?)"),
        (["--symbols", "BTCUSDT,ethusdt"], "bad symbol 'ethusdt'"),
        (["--symbols", "BTCUSDT,XRPUSDT"], "no simulated contract for XRPUSDT"),
        (["--symbol", "BTCUSDT", "--symbols", "BTCUSDT,ETHUSDT"], "not both"),
        (["--symbols", "BTCUSDT,ETHUSDT", "--minutes", "0"], "--minutes must be > 0"),
    ],
)
def test_simulate_command_refuses_bad_symbol_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], why: str
) -> None:
    out = tmp_path / "s"
    assert main(["simulate", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dualhub simulate: error: ") and why in lines[0], err
    assert not out.exists()


# ---------------------------------------------------------------- replay, one symbol of several


def test_a_multi_symbol_session_replays_each_symbol(tmp_path: Path) -> None:
    """`dualhub replay` has no --symbol: ReplayConfig.symbol picks the instrument, each on its contract."""
    from engine.strategy import QuoteConfig
    from replay.config import ReplayConfig
    from replay.driver import run_replay

    session = simulate_session(tmp_path / "s", symbols=PAIR, minutes=2.0, seed=3)
    books = Counter(open_session(session).read_table("books15").column("symbol").to_pylist())
    for sym in PAIR:
        inst = INSTRUMENTS[sym]
        step = float(inst.size_step)
        contract = ContractConfig(symbol=sym, tick=float(inst.tick), size_step=step, min_qty=step)
        cfg = ReplayConfig(seed=1, symbol=sym, contract=contract, quotes=QuoteConfig(quote_qty=step))
        r = run_replay(session, cfg, out_dir=tmp_path / sym)
        assert r.counts["label"] == books[sym]  # only its own books
        assert r.counts["fill"] > 0 and r.counts["command"] > 0
        px = pq.read_table(tmp_path / sym / "events" / "fill.parquet").column("px").to_numpy()
        assert np.abs(px / float(inst.tick) - np.rint(px / float(inst.tick))).max() < 1e-6
        assert (0.9 * inst.price < px).all() and (px < 1.1 * inst.price).all()
