"""Research loop: triple-barrier labels, features v1 (per tick == batch), purged walk-forward with
baselines, `dualhub train` end to end into `dualhub replay`, and `dualhub report --html`."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pytest

from dualhub.cli import main
from engine.events import BOOK_LEVELS, BookSnapshot, Label, Trade, events_to_table, table_to_events
from engine.laya.evaluate import (
    Fold,
    build_dataset,
    check_no_overlap,
    metrics_from_confusion,
    prior_confusion,
    purged_walk_forward,
    walk_forward,
)
from engine.laya.features_v1 import FEATURE_NAMES, N_FEATURES, FeaturesV1, features_v1_batch
from engine.laya.labels import LabelConfig, triple_barrier_labels
from engine.laya.model import Laya, LayaConfig, LayaModelError
from engine.store import open_session
from tests.helpers import REPO

MS = 1_000_000
SEC = 1_000_000_000
H, B, S, E = (int(x) for x in (Label.HOLD, Label.LEAN_BUY, Label.LEAN_SELL, Label.EMERGENCY))
REAL_BINANCE = REPO.parent / "shared" / "data" / "real" / "binance-usdm"
REAL_FILE = REAL_BINANCE / "usdm_btcusdt_20240808.gz"
# Small thresholds so 90 simulated seconds hold every class (EMERGENCY included).
TRAIN_ARGS = ["--lean-bps", "1.0", "--emergency-bps", "3.0", "--folds", "3", "--seed", "0"]


@pytest.fixture(scope="module")
def sim_sessions(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from venue.simulator import simulate_session

    root = tmp_path_factory.mktemp("research")
    return [simulate_session(root / f"sim-{seed}", minutes=1.5, seed=seed) for seed in (31, 33)]


@pytest.fixture(scope="module")
def real_session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    importer = pytest.importorskip("recorder.importers.binance_usdm")
    if not REAL_FILE.exists():
        pytest.skip(f"{REAL_FILE} is not there")
    out = tmp_path_factory.mktemp("real") / "binance"
    importer.import_binance_usdm(REAL_FILE, out)
    return out


# -- labels ---------------------------------------------------------------------------------------


def _labels(mids: list[float], cfg: LabelConfig, **kw: object):
    ts = np.arange(len(mids), dtype=np.int64) * 100 * MS
    return triple_barrier_labels(np.array(mids, dtype=float), ts, cfg, **kw), ts


CFG = LabelConfig(horizon_ns=300 * MS, lean_bps=1.0, emergency_bps=5.0)


def test_lean_labels_end_at_the_first_touch() -> None:
    lab, ts = _labels([100.0, 100.005, 100.012, 99.985, 100.0, 100.0, 100.0], CFG)
    assert lab.label[0] == B and lab.end_ns[0] == ts[2]  # +1.2 bp at row 2, before -1.5 bp at row 3
    assert lab.move_bps[0] == pytest.approx(1.2)
    lab, ts = _labels([100.0, 99.995, 99.988, 100.015, 100.0, 100.0, 100.0], CFG)
    assert lab.label[0] == S and lab.end_ns[0] == ts[2]
    # an EMERGENCY-size move inside the horizon overrides the earlier lean touch (no trade stream:
    # the volume condition cannot be checked and is dropped)
    lab, ts = _labels([100.0, 100.005, 100.012, 99.9, 100.0, 100.0, 100.0], CFG)
    assert lab.label[0] == E and lab.end_ns[0] == ts[3] and lab.move_bps[0] == pytest.approx(-10.0)


def test_hold_ends_at_the_horizon_and_the_tail_is_not_labelled() -> None:
    lab, ts = _labels([100.0] * 8, CFG)
    assert lab.valid.tolist() == [True] * 5 + [False] * 3  # rows 5..7 have no full 300 ms ahead
    assert (lab.label[lab.valid] == H).all()
    assert (lab.end_ns[lab.valid] == ts[lab.valid] + 300 * MS).all()
    # a touch exactly at t + horizon counts; one row later does not
    lab, ts = _labels([100.0, 100.0, 100.0, 100.02, 100.0, 100.0], CFG)
    assert lab.label[0] == B and lab.end_ns[0] == ts[3]
    lab, ts = _labels([100.0, 100.0, 100.0, 100.0, 100.02, 100.0, 100.0], CFG)
    assert lab.label[0] == H and lab.end_ns[0] == 300 * MS


def test_emergency_needs_a_big_move_and_a_volume_burst() -> None:
    mids = [100.0] * 30 + [100.02, 100.06] + [100.06] * 8  # +2 bp, then +6 bp at row 31
    ts = np.arange(len(mids), dtype=np.int64) * 100 * MS
    steady_ts = np.arange(1, 40, dtype=np.int64) * 100 * MS - 50 * MS  # one trade every 100 ms
    steady = np.full(steady_ts.shape, 1000.0)
    cfg = LabelConfig(horizon_ns=300 * MS, lean_bps=1.0, emergency_bps=5.0, burst_lookback_ns=2 * SEC)
    no_trades = triple_barrier_labels(np.array(mids), ts, cfg)
    assert no_trades.label[29] == E and no_trades.end_ns[29] == ts[31]
    calm = triple_barrier_labels(np.array(mids), ts, cfg, trade_ts_ns=steady_ts, trade_notional=steady)
    assert calm.label[29] == B and calm.end_ns[29] == ts[30]  # the same rate as before: no burst
    burst_notional = steady.copy()
    burst_notional[30] = 50_000.0  # a sweep between rows 30 and 31
    burst = triple_barrier_labels(
        np.array(mids), ts, cfg, trade_ts_ns=steady_ts, trade_notional=burst_notional
    )
    assert burst.label[29] == E and burst.end_ns[29] == ts[31]
    assert burst.move_bps[29] == pytest.approx(6.0)


def test_gaps_and_missing_mids_invalidate_labels() -> None:
    lab, _ = _labels([100.0] * 10, CFG, exclude_ns=np.array([450 * MS]))
    # rows whose [t, t + 300 ms] contains 450 ms: t = 200, 300, 400 ms
    assert lab.valid.tolist() == [True, True, False, False, False, True, True, False, False, False]
    lab, _ = _labels([100.0, math.nan, 100.0, 100.0, 100.0, 100.0], CFG)
    assert not lab.valid[1] and lab.valid[0]


def test_label_config_is_checked() -> None:
    with pytest.raises(ValueError, match="lean_bps"):
        LabelConfig(lean_bps=5.0, emergency_bps=5.0)
    with pytest.raises(ValueError, match="horizon_ns"):
        LabelConfig(horizon_ns=0)
    with pytest.raises(ValueError, match="non-decreasing"):
        triple_barrier_labels(np.ones(3), np.array([0, 2, 1]), CFG)


# -- features v1 ----------------------------------------------------------------------------------


def _book(
    ts: int, seq: int, bids: list[tuple[float, float]], asks: list[tuple[float, float]]
) -> BookSnapshot:
    def side(levels: list[tuple[float, float]], k: int) -> tuple[float, ...]:
        return tuple(levels[i][k] if i < len(levels) else math.nan for i in range(BOOK_LEVELS))

    return BookSnapshot(
        ts_event=ts,
        ts_recv=ts,
        seq=seq,
        symbol="BTCUSDT",
        exch_seq=seq,
        bid_px=side(bids, 0),
        bid_sz=side(bids, 1),
        ask_px=side(asks, 0),
        ask_sz=side(asks, 1),
    )


def _trade(ts: int, seq: int, px: float, sz: float, side: str) -> Trade:
    return Trade(
        ts_event=ts, ts_recv=ts, seq=seq, symbol="BTCUSDT", trade_id=str(seq), px=px, sz=sz, side=side
    )


def test_features_v1_by_hand() -> None:
    book = _book(3 * SEC, 0, [(100.0, 1.0)], [(100.1, 3.0)])
    st = FeaturesV1()
    st.on_trade(_trade(1 * SEC, 0, 100.0, 1500.0, "buy"))  # 150k: completes bucket 1 (all buy)
    st.on_trade(_trade(2_500 * MS, 1, 100.0, 1000.0, "sell"))  # 100k: completes bucket 2 (half/half)
    st.on_trade(_trade(3 * SEC, 2, 100.0, 5000.0, "buy"))  # at the book's ts_recv: not seen by it
    f = dict(zip(FEATURE_NAMES, st.features(book).tolist(), strict=True))
    mid = 100.05
    assert f["spread_bps"] == pytest.approx(0.1 / mid * 1e4, rel=1e-6)
    assert f["microprice_bps"] == pytest.approx(((100.0 * 3 + 100.1 * 1) / 4 - mid) / mid * 1e4, rel=1e-5)
    assert f["imb_l0"] == -0.5 and f["imb_l1"] == 0.0 and f["imb_cum3"] == -0.5
    assert f["depth_bid"] == pytest.approx(math.log1p(100.0), rel=1e-6)
    assert f["slope_bid_5"] == pytest.approx(math.log1p(100.0 / ((mid - 100.0) / mid * 1e4)), rel=1e-6)
    assert f["flow_imb_1s"] == -1.0  # only the sell lies in (2 s, 3 s)
    assert f["flow_imb_5s"] == pytest.approx((150e3 - 100e3) / 250e3)
    assert f["notional_5s"] == pytest.approx(math.log1p(250e3), rel=1e-6)
    assert f["trades_1s"] == pytest.approx(math.log1p(1.0))
    assert f["since_trade_ms"] == pytest.approx(math.log1p(500.0), rel=1e-6)
    assert f["last_trade_bps"] == pytest.approx((100.0 - mid) / mid * 1e4, rel=1e-5)
    assert f["vpin"] == pytest.approx(0.5) and f["vpin_fill"] == pytest.approx(2 / 50)
    one_sided = FeaturesV1().features(_book(SEC, 1, [(100.0, 1.0)], []))
    assert np.isfinite(one_sided).all() and one_sided[0] == 0.0  # no mid: mid-based features are 0


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
        st.features(events[i], out=out[i])
    return out


def _synthetic_session(n: int = 600, seed: int = 3) -> tuple[pa.Table, pa.Table]:
    """Random books with missing levels and one-sided rows, trades that tie with book times."""
    rng = np.random.default_rng(seed)
    books, trades = [], []
    mid = 60_000.0
    for k in range(n):
        ts = 1_000 * SEC + k * 100 * MS
        mid *= math.exp(rng.normal(0, 2e-5))
        bid = math.floor(mid * 10) / 10
        levels = int(rng.integers(1, BOOK_LEVELS + 1))
        bids = [(bid - 0.1 * i, float(rng.exponential(2.0))) for i in range(levels)]
        asks = [(bid + 0.1 + 0.1 * i, float(rng.exponential(2.0))) for i in range(BOOK_LEVELS)]
        if k % 41 == 5:
            bids = []  # one-sided book
        if k % 17 == 2:
            asks[3] = (asks[3][0], math.nan)  # a lone missing size
        books.append(_book(ts, k, bids, asks))
        for m in range(int(rng.poisson(3))):
            t_ts = ts if m == 0 and k % 5 == 0 else ts + int(rng.integers(0, 100 * MS))  # ties included
            side = "buy" if rng.random() < 0.5 else "sell"
            trades.append(_trade(t_ts, len(trades), round(bid, 1), float(rng.exponential(0.5)), side))
    trades.sort(key=lambda t: (t.ts_recv, t.seq))
    return events_to_table(books, "books15"), events_to_table(trades, "trade")


def test_features_v1_per_tick_equal_batch_on_synthetic_and_simulated(sim_sessions: list[Path]) -> None:
    books, trades = _synthetic_session()
    batch = features_v1_batch(books, trades)
    assert batch.dtype == np.float32 and batch.shape == (books.num_rows, N_FEATURES)
    assert np.array_equal(_per_tick(books, trades), batch)
    assert np.array_equal(features_v1_batch(books, trades, chunk_rows=97), batch)  # chunking neither
    perm = np.random.default_rng(0).permutation(books.num_rows)  # row order does not matter
    assert np.array_equal(features_v1_batch(books.take(perm), trades), batch[perm])
    s = open_session(sim_sessions[0])
    books, trades = s.read_table("books15"), s.read_table("trade")
    assert np.array_equal(_per_tick(books, trades), features_v1_batch(books, trades))


def test_features_v1_per_tick_equal_batch_on_real_binance(real_session: Path) -> None:
    s = open_session(real_session)
    books, trades = s.read_table("books15"), s.read_table("trade")
    batch = features_v1_batch(books, trades)
    assert np.array_equal(_per_tick(books, trades), batch)
    assert np.isfinite(batch).all() and batch[:, FEATURE_NAMES.index("vpin")].max() > 0


def test_features_v1_never_look_ahead() -> None:
    books, trades = _synthetic_session(n=200)
    base = features_v1_batch(books, trades)
    # a trade appended after the last book changes nothing; one at a book's exact ts_recv changes
    # only later books
    t_last = int(books.column("ts_recv")[-1].as_py())
    extra = events_to_table([_trade(t_last, 10**6, 60_000.0, 50.0, "buy")], "trade")
    assert np.array_equal(features_v1_batch(books, pa.concat_tables([trades, extra])), base)
    t_mid = int(books.column("ts_recv")[100].as_py())
    extra = events_to_table([_trade(t_mid, 10**6, 60_000.0, 50.0, "buy")], "trade")
    moved = features_v1_batch(books, pa.concat_tables([trades, extra]))
    assert np.array_equal(moved[:101], base[:101]) and not np.array_equal(moved[101:], base[101:])


# -- purged walk-forward --------------------------------------------------------------------------


def _spans(n: int = 100, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t0 = np.concatenate([np.arange(n), np.arange(n)]).astype(np.int64) * SEC  # two sessions, same clock
    t1 = t0 + rng.integers(0, 5 * SEC, size=2 * n)
    group = np.repeat([0, 1], n).astype(np.int64)
    return t0, t1, group


def test_purge_and_embargo_keep_every_training_horizon_off_the_test_fold() -> None:
    t0, t1, group = _spans()
    emb = 2 * SEC
    folds = purged_walk_forward(t0, t1, group, n_folds=4, embargo_ns=emb)
    assert len(folds) == 4
    for fold in folds:
        assert fold.train.max() < fold.test.min()  # walk-forward: only the past
        for g in np.unique(group[fold.test]):
            test = fold.test[group[fold.test] == g]
            lo, hi = t0[test].min(), t1[test].max()
            tr = fold.train[group[fold.train] == g]
            assert not np.any((t0[tr] <= hi + emb) & (t1[tr] >= lo - emb))
        check_no_overlap(fold, t0, t1, group, emb)
        assert fold.purged > 0
    # sessions are independent: a fold testing on session 1 keeps session 0 rows at the same times
    f3 = folds[2]
    assert set(group[f3.test].tolist()) == {1}
    lo, hi = t0[f3.test].min(), t1[f3.test].max()
    other = f3.train[group[f3.train] == 0]
    assert np.any((t0[other] <= hi) & (t1[other] >= lo))
    # embargo 0 purges only true overlaps, so it keeps at least as many rows
    plain = purged_walk_forward(t0, t1, group, n_folds=4, embargo_ns=0)
    assert all(p.train.size >= f.train.size for p, f in zip(plain, folds, strict=True))


def test_check_no_overlap_catches_a_leaky_fold() -> None:
    t0, t1, group = _spans()
    test = np.arange(40, 60)
    leaky = Fold(1, np.arange(0, 40), test, 0, 0)  # row 39 ends after row 40 starts
    with pytest.raises(AssertionError, match="overlaps the test span"):
        check_no_overlap(leaky, t0, t1, group, 0)


def test_walk_forward_refuses_bad_input() -> None:
    t0, t1, group = _spans()
    with pytest.raises(ValueError, match="ordered"):
        purged_walk_forward(t0[::-1], t1[::-1], group[::-1], n_folds=3, embargo_ns=0)
    with pytest.raises(ValueError, match="too few"):
        purged_walk_forward(t0[:5], t1[:5], group[:5], n_folds=3, embargo_ns=0)


# -- metrics and baselines ------------------------------------------------------------------------


def test_metrics_from_confusion_by_hand() -> None:
    y_true = np.array([H, H, H, H, B, B, S, S])
    y_pred = np.array([H, H, H, B, B, H, S, S])
    c = np.zeros((4, 4))
    np.add.at(c, (y_true, y_pred), 1)
    m = metrics_from_confusion(c)
    assert m["n"] == 8 and m["accuracy"] == pytest.approx(6 / 8)
    hold = m["per_class"]["HOLD"]
    assert hold["precision"] == pytest.approx(3 / 4) and hold["recall"] == pytest.approx(3 / 4)
    assert m["per_class"]["LEAN_BUY"]["f1"] == pytest.approx(0.5)
    assert m["per_class"]["EMERGENCY"]["support"] == 0 and m["per_class"]["EMERGENCY"]["precision"] is None
    assert m["macro_f1"] == pytest.approx((0.75 + 0.5 + 1.0) / 3)  # over classes present in the truth
    assert m["balanced_accuracy"] == pytest.approx((0.75 + 0.5 + 1.0) / 3)
    # prior sampling, in expectation: recall = the prior, precision = the test prevalence
    prior = np.array([0.5, 0.25, 0.25, 0.0])
    p = metrics_from_confusion(prior_confusion(y_true, prior))
    assert p["per_class"]["HOLD"]["recall"] == pytest.approx(0.5)
    assert p["per_class"]["HOLD"]["precision"] == pytest.approx(0.5)
    assert p["per_class"]["LEAN_BUY"]["precision"] == pytest.approx(0.25)


def test_walk_forward_compares_with_baselines(sim_sessions: list[Path]) -> None:
    labels = LabelConfig(lean_bps=1.0, emergency_bps=3.0)
    ds = build_dataset(sim_sessions, features="v1", labels=labels)
    assert ds.X.shape == (len(ds), N_FEATURES) and set(ds.group.tolist()) == {0, 1}
    assert np.all(ds.t1_ns >= ds.t0_ns) and np.all(ds.t1_ns <= ds.t0_ns + labels.horizon_ns)
    res = walk_forward(ds, n_folds=3)
    json.dumps(res, allow_nan=False)  # goes into the model's metadata
    assert res["embargo_ns"] == labels.horizon_ns
    pooled = res["pooled"]
    assert set(pooled) == {"model", "majority", "prior"}
    n_test = sum(f["n_test"] for f in res["folds"])
    assert pooled["model"]["n"] == pooled["majority"]["n"] == n_test
    # always-majority: recall 1 on its class, 0 elsewhere; balanced accuracy exactly 1/k
    for f in res["folds"]:
        maj = f["majority"]["per_class"][f["majority_class"]]
        assert maj["recall"] == 1.0
        assert f["purged"] > 0
    assert pooled["model"]["macro_f1"] is not None and pooled["prior"]["macro_f1"] is not None


# -- dualhub train -> dualhub replay --------------------------------------------------------------


def _meta(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(path).metadata_props}


def test_train_cli_v1_model_goes_to_replay(
    sim_sessions: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "models" / "laya-v1.onnx"
    metrics = tmp_path / "wf.json"
    args = ["train", *map(str, sim_sessions), "--out", str(out), "--features", "v1", *TRAIN_ARGS]
    assert main([*args, "--metrics-json", str(metrics)]) == 0
    printed = capsys.readouterr().out
    assert "walk-forward, features v1" in printed and "F1 majority" in printed and "macro F1" in printed
    meta = _meta(out)
    assert meta["feature_version"] == "v1" and meta["n_features"] == str(N_FEATURES)
    assert json.loads(meta["label_map"]) == {str(int(x)): x.name for x in Label}
    assert meta["horizon_ns"] == str(2 * SEC)
    assert json.loads(meta["thresholds"])["emergency_bps"] == 3.0
    sessions = json.loads(meta["training_sessions"])
    assert [s["name"] for s in sessions] == [p.name for p in sim_sessions]
    assert all(len(s["training_data_sha256"]) == 64 and len(s["session_digest"]) == 64 for s in sessions)
    assert len(meta["training_data_sha256"]) == 64
    wf = json.loads(meta["walk_forward"])
    assert len(wf["folds"]) == 3 and wf == json.loads(metrics.read_text())
    assert json.loads(meta["feature_names"]) == list(FEATURE_NAMES)

    # the same command again writes the same bytes
    first = out.read_bytes()
    assert main(args) == 0
    assert out.read_bytes() == first
    capsys.readouterr()

    # replay: a v0 replay refuses the v1 model; the v1 path takes it, per tick == batch
    session = sim_sessions[0]
    base = ["replay", str(session), "--model", str(out), "--provider", "cpu"]
    assert main([*base, "--features", "v0", "--out", str(tmp_path / "r0")]) == 2
    assert "trained on features 'v1' but this engine computes 'v0'" in capsys.readouterr().err
    assert main([*base, "--features", "v1", "--out", str(tmp_path / "b")]) == 0
    assert main([*base, "--features", "v1", "--laya-mode", "tick", "--out", str(tmp_path / "t")]) == 0
    digests = re.findall(r"^digest: ([0-9a-f]{64})", capsys.readouterr().out, re.M)
    assert len(digests) == 2 and digests[0] == digests[1]
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["model"]["feature_version"] == "v1" and manifest["config"]["laya_features"] == "v1"
    with pytest.raises(LayaModelError, match="trained on features 'v1'"):
        Laya(LayaConfig(model_path=out, provider="cpu", warmup_runs=1))
    laya = Laya(LayaConfig(model_path=out, provider="cpu", warmup_runs=1, feature_version="v1"))
    assert laya.n_features == N_FEATURES and laya.describe()["n_features"] == N_FEATURES
    with pytest.raises(ValueError, match="feature_version"):
        LayaConfig(model_path=out, feature_version="v9")


def test_v1_replay_tick_equals_batch_under_modelled_feed_latency(
    sim_sessions: list[Path], tmp_path: Path
) -> None:
    from replay.config import ReplayConfig
    from replay.driver import run_replay
    from replay.train_cli import train

    model = tmp_path / "m.onnx"
    train(sim_sessions, model, features="v1", labels=LabelConfig(lean_bps=1.0, emergency_bps=3.0), folds=2)
    common = dict(model_path=model, laya_provider="cpu", laya_features="v1", scale_feed=3.0, seed=4)
    batch = run_replay(sim_sessions[1], ReplayConfig(**common), out_dir=tmp_path / "b")  # type: ignore[arg-type]
    tick = run_replay(
        sim_sessions[1],
        ReplayConfig(**common, laya_mode="tick"),  # type: ignore[arg-type]
        out_dir=tmp_path / "t",
    )
    assert batch.digest == tick.digest and batch.counts["label"] > 0


def test_train_cli_v0_model_is_accepted_by_the_default_replay(
    sim_sessions: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "laya-v0-tb.onnx"
    assert main(["train", *map(str, sim_sessions), "--out", str(out), "--features", "v0", *TRAIN_ARGS]) == 0
    assert _meta(out)["feature_version"] == "v0"
    assert (
        main(
            [
                "replay",
                str(sim_sessions[1]),
                "--model",
                str(out),
                "--provider",
                "cpu",
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "replay",
                str(sim_sessions[1]),
                "--model",
                str(out),
                "--features",
                "v1",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "trained on features 'v0' but this engine computes 'v1'" in capsys.readouterr().err


def test_train_cli_explains_missing_classes(
    sim_sessions: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # default thresholds: 90 s of simulation has no 8 bp EMERGENCY move, so no 4-class model
    rc = main(
        [
            "train",
            str(sim_sessions[0]),
            "--out",
            str(tmp_path / "x.onnx"),
            "--folds",
            "2",
            "--emergency-bps",
            "50",
        ]
    )
    assert rc == 2
    assert "no rows of class(es) ['EMERGENCY']" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


# -- dualhub report --html ------------------------------------------------------------------------


def test_report_html_is_self_contained_with_plots(
    sim_sessions: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(["replay", str(sim_sessions[0]), "--provider", "cpu", "--out", str(run)]) == 0
    out = tmp_path / "report" / "run.html"
    out.parent.mkdir()  # `report --html` creates no directories (a typo would pass silently)
    assert main(["report", str(run), "--html", str(out)]) == 0
    assert f"html report: {out}" in capsys.readouterr().out
    text = out.read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert len(images) >= 3
    assert all(len(b) > 1000 for b in images)
    assert not re.search(r"(src|href)=['\"]?https?:", text)  # nothing fetched from elsewhere
    for title in ("Mid, fills, inventory, PnL", "Latency breakdown", "Labels", "PnL"):
        assert title in text
