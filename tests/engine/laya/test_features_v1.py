"""Laya's features v1: the per-tick class and the whole-table function give the same bits, and those
bits are pinned (sha256 of the float32 rows) on a real recording, a simulated session and a synthetic
one: they are what v1 models were trained on, so any change to them needs a new feature version.
The compiled kernels read as plain Python give the same bits."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pyarrow as pa
import pytest

from engine.errors import DualhubError
from engine.events import BOOK_LEVELS, BookSnapshot, Trade, events_to_table, table_to_events
from engine.laya.features_v1 import FEATURE_NAMES, N_FEATURES, FeaturesV1, features_v1_batch, new_state
from engine.store import open_session
from tests.helpers import REPO, as_plain_python, make_book

MS = 1_000_000
SEC = 1_000_000_000
REAL_FILE = REPO.parent / "shared/data/real/binance-usdm/usdm_btcusdt_20240808.gz"
NAN = math.nan

# sha256 of the (rows, 36) float32 outputs: per tick and batch (equal), batch on shifted timelines
# (books + (row % 7) * 0.3 ms, trades + 2 ms), batch without trades
PINNED = {
    "real": (
        "77a1a08b5dad9599f1efd52de836ccd0b9d0f60a47ce2b10b2a9d2981a4281de",
        "69e452761bc0b4cd30c7d1e791f316ed20e462799fdaa598b22bf1dede3de992",
        "be192491be1e327e9c2b8bc69e89fe39a0251ad15058616143d1bfd8f9f9f287",
    ),
    "simulated": (
        "8a52c44d25d02f8080fdb0831396f1c6acd04e17f2a56e95096f16abfeece3f5",
        "8dc82b321a46ed085f73d0eba01042db3690ea1e8ac68d4184e5e928db9c29d4",
        "6c5b64f5cec8de01267118723a9449196e19cd5f542c1052029cad45d6a605ad",
    ),
    "synthetic": (
        "1a8965e6dbc468f11e8f0929650fc8c53e6e9a11c4591db2b865183b15ccbd61",
        "2bdf4ddd96fed088555bfcadd01538aa108b2372afa8923e71f04c1db43fbafe",
        "39256d59021ec238ff73b6d1779b49d44f754ab757be8560a72599d378ceb4cb",
    ),
}


@pytest.fixture(scope="module")
def real_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[pa.Table, pa.Table]:
    """The Binance BTCUSDT recording (345 s, 21 313 trades) as books15 and trade tables."""
    from recorder.importers.binance_usdm import import_binance_usdm

    assert REAL_FILE.exists(), f"{REAL_FILE} is missing (see shared/data/real/SOURCES.md)"
    out = tmp_path_factory.mktemp("real") / "binance"
    import_binance_usdm(REAL_FILE, out)
    s = open_session(out)
    return s.read_table("books15"), s.read_table("trade")


@pytest.fixture(scope="module")
def sim_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[pa.Table, pa.Table]:
    from venue.simulator import simulate_session

    s = open_session(simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=1.5, seed=31))
    return s.read_table("books15"), s.read_table("trade")


def _trade(ts: int, seq: int, px: float, sz: float, side: str, symbol: str = "BTCUSDT") -> Trade:
    return Trade(ts_event=ts, ts_recv=ts, seq=seq, symbol=symbol, trade_id=str(seq), px=px, sz=sz, side=side)


def synthetic_session() -> tuple[pa.Table, pa.Table]:
    """Books with one-sided rows, a lone missing size, a price missing beside its size; trades tied
    with book times, large ones that complete several volume buckets at once, a 70 s silence."""
    rng = np.random.default_rng(11)
    books, trades = [], []
    mid = 60_000.0
    for k in range(400):
        ts = 10**12 + k * 50 * MS + (70 * SEC if k >= 250 else 0)
        mid *= math.exp(rng.normal(0.0, 3e-5))
        bid = math.floor(mid * 10.0) / 10.0
        depth = int(rng.integers(0, BOOK_LEVELS + 1))  # 0: no bids
        bids = [(bid - 0.1 * i, float(rng.exponential(1.5))) for i in range(depth)]
        asks = [(bid + 0.1 + 0.1 * i, float(rng.exponential(1.5))) for i in range(BOOK_LEVELS)]
        if k % 13 == 4:
            asks[2] = (asks[2][0], NAN)
        if k % 29 == 9:
            asks[0] = (NAN, asks[0][1])
        pad = [(NAN, NAN)] * (BOOK_LEVELS - len(bids))
        bids += pad
        books.append(
            BookSnapshot(
                ts_event=ts,
                ts_recv=ts,
                seq=k,
                symbol="BTCUSDT",
                exch_seq=k,
                bid_px=tuple(p for p, _ in bids),
                bid_sz=tuple(s for _, s in bids),
                ask_px=tuple(p for p, _ in asks),
                ask_sz=tuple(s for _, s in asks),
            )
        )
        if k >= 240 and k < 250:
            continue  # no trades just before the silence
        for j in range(int(rng.poisson(4))):
            t_ts = ts if j == 0 and k % 4 == 0 else ts + int(rng.integers(0, 50 * MS))
            sz = 40.0 if rng.random() < 0.01 else float(rng.exponential(0.3))
            side = "buy" if rng.random() < 0.55 else "sell"
            trades.append(_trade(t_ts, len(trades), bid + 0.1 * int(rng.integers(0, 2)), sz, side))
    trades.sort(key=lambda t: (t.ts_recv, t.seq))
    return events_to_table(books, "books15"), events_to_table(trades, "trade")


def _per_tick(books: pa.Table, trades: pa.Table) -> np.ndarray:
    """Per-tick features, fed the way the replay feeds them: trades and books by (ts_recv, seq)."""
    events = table_to_events(books, "books15")
    tr = sorted(table_to_events(trades, "trade"), key=lambda t: (t.ts_recv, t.seq))
    out = np.zeros((len(events), N_FEATURES), dtype=np.float32)
    st, j = FeaturesV1(), 0
    for i in sorted(range(len(events)), key=lambda k: (events[k].ts_recv, events[k].seq)):
        while j < len(tr) and tr[j].ts_recv < events[i].ts_recv:
            st.on_trade(tr[j])
            j += 1
        assert st.features(events[i], out=out[i]) is not None
    return out


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _digests(books: pa.Table, trades: pa.Table) -> list[str]:
    batch = features_v1_batch(books, trades)
    assert batch.dtype == np.float32 and batch.shape == (books.num_rows, N_FEATURES)
    assert np.array_equal(_per_tick(books, trades).view(np.uint32), batch.view(np.uint32))
    bts = books.column("ts_recv").to_numpy().astype(np.int64)
    tts = trades.column("ts_recv").to_numpy().astype(np.int64)
    shifted = features_v1_batch(
        books, trades, book_ts_recv=bts + (np.arange(len(bts)) % 7) * 300_000, trade_ts_recv=tts + 2 * MS
    )
    return [_sha(batch), _sha(shifted), _sha(features_v1_batch(books, None))]


def synthetic_digests() -> list[str]:
    return _digests(*synthetic_session())


def test_outputs_are_pinned_on_real_binance(real_session: tuple[pa.Table, pa.Table]) -> None:
    books, trades = real_session
    assert _digests(books, trades) == list(PINNED["real"])
    # the recording is long enough for VPIN's full 50-bucket window
    x = features_v1_batch(books, trades)
    assert x[:, FEATURE_NAMES.index("vpin_fill")].max() == 1.0


def test_outputs_are_pinned_on_a_simulated_session(sim_session: tuple[pa.Table, pa.Table]) -> None:
    assert _digests(*sim_session) == list(PINNED["simulated"])


def test_outputs_are_pinned_on_a_synthetic_session_with_gaps_and_big_trades() -> None:
    assert synthetic_digests() == list(PINNED["synthetic"])


def test_the_kernels_read_as_plain_python_give_the_compiled_bits() -> None:
    pure = as_plain_python(
        "engine.laya.features_v1.v1_features", "tests.engine.laya.test_features_v1.synthetic_digests"
    )
    assert pure == synthetic_digests()


def _as_symbol(table: pa.Table, symbol: str) -> pa.Table:
    i = table.schema.get_field_index("symbol")
    return table.set_column(
        i, table.schema.field(i), pa.array([symbol] * table.num_rows, table.schema.field(i).type)
    )


def test_batch_rows_do_not_depend_on_order_chunks_or_other_symbols(
    sim_session: tuple[pa.Table, pa.Table],
) -> None:
    books, trades = synthetic_session()
    base = features_v1_batch(books, trades)
    assert np.array_equal(features_v1_batch(books, trades, chunk_rows=37), base)
    rng = np.random.default_rng(0)
    perm = rng.permutation(books.num_rows)
    shuffled = trades.take(rng.permutation(trades.num_rows))
    assert np.array_equal(features_v1_batch(books.take(perm), shuffled), base[perm])
    eth_books, eth_trades = (_as_symbol(t, "ETHUSDT") for t in sim_session)
    both = features_v1_batch(pa.concat_tables([books, eth_books]), pa.concat_tables([eth_trades, trades]))
    assert np.array_equal(both[: books.num_rows], base)
    assert np.array_equal(both[books.num_rows :], features_v1_batch(eth_books, eth_trades))


def test_one_trade_that_completes_many_buckets() -> None:
    fed = [
        _trade(1 * SEC, 0, 100.0, 100_000.0, "buy"),  # 10M notional: 100 buckets at once, all buy
        _trade(1_500 * MS, 1, 100.0, 500.0, "sell"),  # 50k: no boundary
        _trade(1_800 * MS, 2, 100.0, 500.0, "buy"),  # 50k: bucket 101, half and half
    ]
    st = FeaturesV1()
    for t in fed:
        st.on_trade(t)
    book = make_book(99.95, 100.05, ts=3 * SEC)
    f = dict(zip(FEATURE_NAMES, st.features(book).tolist(), strict=True))
    assert f["vpin_fill"] == 1.0 and f["vpin"] == pytest.approx(49 / 50)  # the last 50: 49 one-sided
    assert f["flow_imb_1s"] == 0.0 and f["trades_1s"] == 0.0  # nothing in [2 s, 3 s)
    assert f["flow_imb_5s"] == pytest.approx(10e6 / 10.1e6)
    assert f["since_trade_ms"] == pytest.approx(math.log1p(1200.0))
    batch = features_v1_batch(events_to_table([book], "books15"), events_to_table(fed, "trade"))
    assert np.array_equal(batch[0], st.features(book))


def test_features_fill_the_given_row_and_see_only_earlier_trades() -> None:
    st = FeaturesV1()
    book = make_book(99.95, 100.05, ts=5 * SEC)
    empty = st.features(book)
    assert empty[FEATURE_NAMES.index("since_trade_ms")] == np.float32(math.log1p(60_000.0))
    st.on_trade(_trade(5 * SEC, 0, 100.0, 1.0, "buy"))  # at the book's ts_recv: after it
    out = np.full(N_FEATURES, 7.0, dtype=np.float32)
    assert st.features(book, out=out) is out and np.array_equal(out, empty)
    later = make_book(99.95, 100.05, ts=5 * SEC + 1)
    assert st.features(later)[FEATURE_NAMES.index("trades_1s")] == np.float32(math.log1p(1.0))


def test_refused_trades_leave_the_state_as_it_was() -> None:
    st = FeaturesV1()
    st.on_trade(_trade(2 * SEC, 0, 100.0, 1.0, "buy"))
    book = make_book(99.95, 100.05, ts=3 * SEC)
    before = st.features(book)
    with pytest.raises(ValueError, match="ts_recv order"):
        st.on_trade(_trade(1 * SEC, 1, 100.0, 1.0, "sell"))
    for px, sz in ((NAN, 1.0), (100.0, math.inf)):
        with pytest.raises(DualhubError, match="not a finite notional"):
            st.on_trade(_trade(2 * SEC, 2, px, sz, "sell"))
    assert np.array_equal(st.features(book), before)
    trades = events_to_table(
        [_trade(1 * SEC, 0, 100.0, 1.0, "buy"), _trade(2 * SEC, 1, NAN, 1.0, "buy")], "trade"
    )
    with pytest.raises(DualhubError, match="ts_recv=2000000000"):
        features_v1_batch(events_to_table([book], "books15"), trades)


def test_the_state_grows_past_its_first_allocation() -> None:
    ti, tf, bf, n = new_state()
    st = FeaturesV1()
    first = ti.shape[1] - 1
    fed = [
        _trade(SEC + i * MS, i, 100.0, 100.0 + i % 7, "buy" if i % 3 else "sell") for i in range(first + 5)
    ]
    for t in fed:
        st.on_trade(t)
    book = make_book(99.95, 100.05, ts=SEC + (first + 5) * MS)
    x = st.features(book)
    assert np.array_equal(
        x, features_v1_batch(events_to_table([book], "books15"), events_to_table(fed, "trade"))[0]
    )
    assert x[FEATURE_NAMES.index("vpin_fill")] == 1.0  # ~10.6M notional: more buckets than first room


def test_a_row_of_another_type_is_refused() -> None:
    book = make_book(99.95, 100.05, ts=SEC)
    for out in (np.zeros(N_FEATURES), np.zeros(N_FEATURES + 1, dtype=np.float32)):
        with pytest.raises(ValueError, match="out must be float32"):
            FeaturesV1().features(book, out=out)
