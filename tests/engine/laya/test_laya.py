"""Laya: features v0 (per-tick == batch), the ONNX model wrapper, labels and training."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pytest
from onnx import TensorProto, helper

from engine.events import BOOK_LEVELS, BookSnapshot, Label, events_to_table, table_to_events
from engine.laya.features import FEATURE_VERSION, N_FEATURES, features_v0, features_v0_batch, pymod
from engine.laya.model import CPU, CUDA, Laya, LayaConfig, LayaModelError
from engine.laya.training import build_training_set, future_move_bps, make_labels, train_model
from tests.helpers import REPO

DEFAULT_MODEL = REPO / "data" / "models" / "laya-v0.onnx"
SEC = 1_000_000_000
H, B, S, E = (int(x) for x in (Label.HOLD, Label.LEAN_BUY, Label.LEAN_SELL, Label.EMERGENCY))


def synth_books(n: int, seed: int, *, symbol: str = "BTCUSDT", dt_ns: int = 100_000_000) -> pa.Table:
    """A random-walk books15 session: heavy-tailed steps, a 12 bp jump every 250 rows, some rows
    with missing levels (one-sided tails, a lone missing size), sizes over several magnitudes."""
    rng = np.random.default_rng(seed)
    steps = rng.standard_t(3, n) * 0.3e-4
    steps[125::250] += rng.choice([-12e-4, 12e-4], size=len(steps[125::250]))
    mid = 60_000.0 * np.exp(np.cumsum(steps))
    levels = np.arange(BOOK_LEVELS)
    books = []
    for k in range(n):
        best_bid = np.floor(mid[k] * 10.0) / 10.0
        bp = best_bid - 0.1 * levels
        ap = best_bid + 0.1 + 0.1 * levels
        bs = rng.exponential(1.5, BOOK_LEVELS) * rng.choice([1.0, 1e-3, 1e3])
        az = rng.exponential(1.5, BOOK_LEVELS)
        if k % 37 == 3:
            cut = int(rng.integers(1, BOOK_LEVELS))
            ap[cut:] = np.nan
            az[cut:] = np.nan
        if k % 53 == 7:
            bs[int(rng.integers(0, BOOK_LEVELS))] = np.nan
        books.append(
            BookSnapshot(
                ts_event=k * dt_ns,
                ts_recv=k * dt_ns + 250_000,
                seq=k,
                symbol=symbol,
                exch_seq=k,
                bid_px=tuple(bp.tolist()),
                bid_sz=tuple(bs.tolist()),
                ask_px=tuple(ap.tolist()),
                ask_sz=tuple(az.tolist()),
            )
        )
    return events_to_table(books, "books15")


@pytest.fixture(scope="module")
def synth_table() -> pa.Table:
    return synth_books(1500, seed=1)


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory: pytest.TempPathFactory, synth_table: pa.Table) -> Path:
    out = tmp_path_factory.mktemp("laya") / "m.onnx"
    train_model([synth_table], seed=5, out_path=out, metadata={"producer": "tests"})
    return out


@pytest.fixture(scope="module")
def sim_books() -> pa.Table:
    """books15 of a short simulated session (demo seed 7)."""
    simulator = pytest.importorskip("venue.simulator")
    from engine.store import open_session

    with tempfile.TemporaryDirectory() as tmp:
        root = simulator.simulate_session(Path(tmp) / "s", minutes=2.0, seed=7)
        return open_session(root).read_table("books15")


def _cpu(path: Path, **kw: object) -> Laya:
    return Laya(LayaConfig(model_path=path, provider="cpu", warmup_runs=3, **kw))


# -- features -------------------------------------------------------------------------------------


def _per_tick_matches_batch(table: pa.Table) -> None:
    batch = features_v0_batch(table)
    rows = np.stack([features_v0(b) for b in table_to_events(table, "books15")])
    assert batch.dtype == np.float32 and batch.shape == (table.num_rows, N_FEATURES)
    assert np.array_equal(rows.view(np.uint32), batch.view(np.uint32))  # a BookSnapshot or a table row


def test_features_per_tick_equal_batch_on_random_session(synth_table: pa.Table) -> None:
    _per_tick_matches_batch(synth_table)


def test_features_per_tick_equal_batch_on_simulated_session(sim_books: pa.Table) -> None:
    _per_tick_matches_batch(sim_books)


def test_features_layout_by_hand() -> None:
    nan = float("nan")
    bid_px = (60123.5, 60123.4) + (nan,) * 13
    bid_sz = (1.5, 3.0) + (nan,) * 13
    ask_px = (60123.6,) + (nan,) * 14
    ask_sz = (0.5,) + (nan,) * 14
    book = BookSnapshot(
        ts_event=1,
        ts_recv=2,
        seq=0,
        symbol="X",
        exch_seq=0,
        bid_px=bid_px,
        bid_sz=bid_sz,
        ask_px=ask_px,
        ask_sz=ask_sz,
    )
    f = features_v0(book)
    expected = np.zeros(N_FEATURES)
    expected[0:4] = [123.5, 150.0, 60123.4 % 1000, 45.0]
    expected[30:32] = [60123.6 % 1000, 50.0]
    expected[60] = (4.5 - 0.5) / 5.0
    assert f.dtype == np.float32 and f.shape == (N_FEATURES,)
    assert np.array_equal(f, expected.astype(np.float32))
    out = np.full(N_FEATURES, 7.0, dtype=np.float32)
    assert features_v0(book, out) is out and np.array_equal(out, f)
    empty = BookSnapshot(
        ts_event=1, ts_recv=2, seq=0, symbol="X", exch_seq=0, bid_px=(nan,) * 15, bid_sz=(nan,) * 15,
        ask_px=(nan,) * 15, ask_sz=(nan,) * 15,
    )  # fmt: skip
    assert not features_v0(empty).any()
    assert features_v0_batch(events_to_table([book, empty], "books15")).tolist() == [f.tolist(), [0.0] * 128]


def test_pymod_is_python_modulo_bit_for_bit() -> None:
    """The compiled features' floor-and-multiply residue against CPython's ``%``: near multiples of
    the modulus (one ulp either side), every magnitude, the fast range's edge, and what falls back."""
    rng = np.random.default_rng(7)
    xs: list[float] = [
        0.0,
        -0.0,
        1e-320,
        5e-324,
        0.5,
        1.0,
        127.5,
        254.99999999999997,
        255.0,
        999.9999999999999,
    ]
    xs += [
        float("inf"),
        float("-inf"),
        1e300,
        -1e300,
        -3.5,
        -1000.0,
        -1e-300,
        2.0**49,
        2.0**49 - 1,
        2.0**53 + 2,
    ]
    for m in (1000.0, 255.0):
        ks = np.concatenate([np.arange(1, 3000), rng.integers(1, 2**40, 3000)]).astype(np.float64)
        exact = ks * m
        xs += exact.tolist() + np.nextafter(exact, 0).tolist() + np.nextafter(exact, np.inf).tolist()
    xs += (10.0 ** rng.uniform(-8, 15, 20_000)).tolist()  # every magnitude
    xs += (rng.exponential(1.5, 20_000) * rng.choice([1e-3, 1.0, 1e3], 20_000) * 100.0).tolist()  # sz * 100
    xs += (np.round(rng.uniform(1, 200_000, 20_000) * 10) / 10).tolist()  # prices on a 0.1 tick
    for m in (1000.0, 255.0):
        for x in xs:
            got, want = pymod(x, m, 1.0 / m), x % m
            assert got.hex() == want.hex(), (x, m, got, want)


# -- labels ---------------------------------------------------------------------------------------


def test_make_labels_by_hand() -> None:
    ts = np.arange(8, dtype=np.int64) * SEC
    mid = np.array([10000, 10000, 10002, 10001, 9998, 9990, 9990, 10009], dtype=np.float64)
    # t -> t+2: +2 bp, +1 bp, -4 bp, -11 bp, -8.0 bp, +19 bp, no horizon, no horizon
    labels = make_labels(mid, ts, horizon_ns=2 * SEC, lean_bps=1.5, emergency_bps=8.0)
    assert labels.dtype == np.int64
    assert labels.tolist() == [B, H, S, E, E, E, H, H]


def test_make_labels_takes_first_row_at_or_after_horizon() -> None:
    ts = np.array([0, SEC // 2, 5 * SEC // 2, 3 * SEC], dtype=np.int64)
    mid = np.array([100.0, 200.0, 100.02, 100.0])
    # row 0 looks at row 2 (first at/after 2 s), not at row 1's spike; row 1 lands exactly on 2.5 s
    assert make_labels(mid, ts).tolist() == [B, E, H, H]
    move = future_move_bps(mid, ts, horizon_ns=2 * SEC)
    assert np.isnan(move[2:]).all() and move[0] == pytest.approx(2.0)


def test_make_labels_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        make_labels(np.ones(3), np.array([0, 2, 1]))
    with pytest.raises(ValueError, match="lean_bps"):
        make_labels(np.ones(3), np.arange(3), lean_bps=9.0, emergency_bps=8.0)


# -- training -------------------------------------------------------------------------------------


def test_training_is_byte_reproducible(tmp_path: Path, synth_table: pa.Table, trained_model: Path) -> None:
    again = tmp_path / "again.onnx"
    metrics = train_model([synth_table], seed=5, out_path=again, metadata={"producer": "tests"})
    assert again.read_bytes() == trained_model.read_bytes()
    assert not list(tmp_path.glob("*.tmp"))
    assert metrics["onnx_sklearn_label_agreement"] == 1.0
    assert sum(metrics["class_counts"].values()) == metrics["n_rows"]
    assert all(metrics["class_counts"][lab.name] > 0 for lab in Label)
    X, y, excluded = build_training_set([synth_table])
    assert len(y) == metrics["n_rows"] and excluded == metrics["n_excluded_no_horizon"] > 0


def test_training_metadata(trained_model: Path, synth_table: pa.Table) -> None:
    from engine.laya.training import training_data_sha256

    props = {p.key: p.value for p in onnx.load(trained_model).metadata_props}
    assert props["feature_version"] == FEATURE_VERSION
    assert json.loads(props["label_map"]) == {
        "0": "HOLD",
        "1": "LEAN_BUY",
        "2": "LEAN_SELL",
        "3": "EMERGENCY",
    }
    assert props["training_data_sha256"] == training_data_sha256(*build_training_set([synth_table])[:2])
    assert props["seed"] == "5" and props["producer"] == "tests" and props["horizon_ns"] == str(2 * SEC)
    assert json.loads(props["thresholds"]) == {"emergency_bps": 8.0, "lean_bps": 1.5}


def test_training_refuses_reserved_metadata(tmp_path: Path, synth_table: pa.Table) -> None:
    with pytest.raises(ValueError, match="feature_version"):
        train_model([synth_table], seed=1, out_path=tmp_path / "x.onnx", metadata={"feature_version": "v9"})


# -- the model wrapper ----------------------------------------------------------------------------


def test_auto_provider_reports_what_is_active(trained_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.laya.model"):
        laya = Laya(LayaConfig(model_path=trained_model, warmup_runs=3))
    assert laya.requested_providers == [CUDA, CPU]
    assert laya.active_provider == laya.active_providers[0]
    if laya.active_provider == CUDA:
        assert laya.fallback_reason == ""
    else:  # a CPU-only machine (this one): the fallback is stated, never silent
        assert laya.active_provider == CPU
        assert "CUDA was requested" in laya.fallback_reason and "dualhub doctor" in laya.fallback_reason
        assert any("CUDA was requested" in r.getMessage() for r in caplog.records)
    d = laya.describe()
    assert (
        d["requested_providers"] == laya.requested_providers and d["active_provider"] == laya.active_provider
    )
    assert d["fallback_reason"] == laya.fallback_reason and d["model_sha256"] == laya.model_sha256


def test_cpu_provider_has_no_fallback(trained_model: Path) -> None:
    laya = _cpu(trained_model)
    assert laya.requested_providers == [CPU] and laya.active_provider == CPU and laya.fallback_reason == ""
    assert laya.feature_version == FEATURE_VERSION
    assert laya.label_map == {0: "HOLD", 1: "LEAN_BUY", 2: "LEAN_SELL", 3: "EMERGENCY"}
    assert laya.warmup_first_ms > 0 and laya.warmup_steady_ms > 0


def test_cuda_provider_is_strict(trained_model: Path) -> None:
    try:
        laya = Laya(LayaConfig(model_path=trained_model, provider="cuda", warmup_runs=3))
    except LayaModelError as e:
        assert "provider='cuda'" in str(e) and "dualhub doctor" in str(e)
    else:
        assert laya.active_provider == CUDA and laya.fallback_reason == ""


def test_predict_agrees_with_predict_batch(trained_model: Path, synth_table: pa.Table) -> None:
    laya = _cpu(trained_model)
    X = features_v0_batch(synth_table)
    X = np.concatenate([X, X[::-1] * np.float32(1.001), X * np.float32(0.999), X[:500]])  # > 4096 rows
    labels, probs = laya.predict_batch(X)
    assert labels.dtype == np.int64 and labels.shape == (len(X),)
    assert probs.dtype == np.float32 and probs.shape == (len(X), 4)
    one = [laya.predict(x) for x in X]
    assert [lab for lab, _ in one] == labels.tolist()
    one_probs = np.stack([p for _, p in one])
    assert np.allclose(one_probs, probs, rtol=0, atol=1e-6)
    # On CPU the tick path is built to be bit-identical to the batch (see Laya.__init__), which
    # keeps `--laya-mode tick` and `batch` replays on the same digest.
    assert np.array_equal(one_probs, probs)
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert len(set(labels.tolist())) > 1
    # the CPU tick path runs on an IO binding whose output buffer is reused: a result must not change
    # when the next tick runs
    assert laya._tick_bound is not None
    first = laya.predict(X[0])[1]
    kept = first.copy()
    laya.predict(X[1] * np.float32(3))
    assert np.array_equal(first, kept)
    assert laya.predict_batch(X[:0])[0].shape == (0,)
    with pytest.raises(ValueError, match="shape"):
        laya.predict(X[:2])


def test_predict_each_is_the_tick_path_row_by_row(trained_model: Path, synth_table: pa.Table) -> None:
    """A tick-mode replay labels its books a block at a time with predict_each: each row must come out
    as predict() labels it alone (the live tick path), on the IO binding and on plain run() alike."""
    laya = _cpu(trained_model)
    X = features_v0_batch(synth_table)[:700]
    one = [laya.predict(x) for x in X]
    bound0 = laya._tick_bound
    assert bound0 is not None
    for bound in (bound0, None):  # None: the path of providers without the binding
        laya._tick_bound = bound
        labels, probs = laya.predict_each(X)
        assert labels.dtype == np.int64 and probs.dtype == np.float32 and probs.shape == (len(X), 4)
        assert labels.tolist() == [lab for lab, _ in one]
        assert np.array_equal(probs, np.stack([p for _, p in one]))
    assert len(set(labels.tolist())) > 1
    laya._tick_bound = bound0
    odd = X.astype(np.float64)[::3]  # not float32, not contiguous: the rows it holds all the same
    labels, probs = laya.predict_each(odd)
    assert labels.tolist() == [lab for lab, _ in one[::3]]
    assert np.array_equal(probs, np.stack([p for _, p in one[::3]]))
    assert laya.predict_each(X[:0])[0].shape == (0,)
    with pytest.raises(ValueError, match="shape"):
        laya.predict_each(X[0])
    # Rows share a call two by two: a row beside NaN, infinite or huge features comes out as alone,
    # in either place of the call, at an odd count too; and the pad row is zeros again afterwards.
    rng = np.random.default_rng(3)
    wild = X[rng.permutation(len(X))[:41]].copy()
    wild[1, 5], wild[2, :] = np.nan, np.inf
    wild[7, 0], wild[8, :] = -np.inf, 3e38
    alone = [laya.predict(x) for x in wild]
    labels, probs = laya.predict_each(wild)
    assert labels.tolist() == [lab for lab, _ in alone]
    assert np.array_equal(probs, np.stack([p for _, p in alone]), equal_nan=True)
    assert not laya._x[1].any()


def test_default_model_metadata() -> None:
    assert DEFAULT_MODEL.exists(), "build it with `python -m replay.make_default_model`"
    assert DEFAULT_MODEL.stat().st_size < 100_000
    laya = _cpu(DEFAULT_MODEL)
    meta = laya.metadata
    assert meta["feature_version"] == FEATURE_VERSION and meta["producer"] == "replay.make_default_model"
    assert json.loads(meta["label_map"]) == {str(int(lab)): lab.name for lab in Label}
    assert len(meta["training_data_sha256"]) == 64
    assert 7 not in json.loads(meta["training_sessions"])["seeds"]  # the demo seed stays out of sample


def test_default_model_predicts_several_classes_on_simulated_session(sim_books: pa.Table) -> None:
    laya = _cpu(DEFAULT_MODEL)
    labels, _ = laya.predict_batch(features_v0_batch(sim_books))
    assert len(np.unique(labels)) > 1


# -- bad models -----------------------------------------------------------------------------------


def _linear_onnx(
    path: Path,
    *,
    n_in: int = N_FEATURES,
    n_classes: int = 4,
    meta: dict[str, str] | None = None,
    mix_rows: bool = False,
) -> Path:
    """A minimal classifier graph: features [N, n_in] -> MatMul -> Softmax (probabilities), ArgMax (label).
    ``mix_rows``: the features less their mean over the batch first (a row's output depends on the others)."""
    w = np.random.default_rng(0).normal(size=(n_in, n_classes)).astype(np.float32)
    mix = [
        helper.make_node("ReduceMean", ["raw"], ["mean"], axes=[0], keepdims=1),
        helper.make_node("Sub", ["raw", "mean"], ["features_in"]),
    ]
    graph = helper.make_graph(
        [
            *(mix if mix_rows else [helper.make_node("Identity", ["raw"], ["features_in"])]),
            helper.make_node("MatMul", ["features_in", "W"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
            helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
        ],
        "linear",
        [helper.make_tensor_value_info("raw", TensorProto.FLOAT, [None, n_in])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, n_classes]),
        ],
        [helper.make_tensor("W", TensorProto.FLOAT, w.shape, w.ravel().tolist())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    good = {"feature_version": FEATURE_VERSION, "label_map": json.dumps({str(int(x)): x.name for x in Label})}
    helper.set_model_props(model, good if meta is None else meta)
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def test_hand_built_model_loads(tmp_path: Path) -> None:
    laya = _cpu(_linear_onnx(tmp_path / "ok.onnx"))
    label, probs = laya.predict(np.ones(N_FEATURES, dtype=np.float32))
    assert 0 <= label < 4 and probs.shape == (4,)
    assert laya.rows_per_tick_call == 2 and laya.describe()["rows_per_tick_call"] == 2


def test_a_model_that_mixes_rows_labels_each_row_in_its_own_call(tmp_path: Path) -> None:
    """A model whose outputs for a row depend on the other rows of the call: predict_each must not
    share calls between rows, or a tick replay would label differently from live."""
    laya = _cpu(_linear_onnx(tmp_path / "mix.onnx", mix_rows=True))
    assert laya.rows_per_tick_call == 1
    X = np.random.default_rng(5).normal(size=(9, N_FEATURES)).astype(np.float32)
    alone = [laya.predict(x) for x in X]
    labels, probs = laya.predict_each(X)
    assert np.array_equal(probs, np.stack([p for _, p in alone]))
    assert labels.tolist() == [lab for lab, _ in alone]
    shared = laya.predict_batch(X[:2])[1]  # two rows in one call do come out otherwise here
    assert not np.array_equal(shared, np.stack([alone[0][1], alone[1][1]]))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"n_in": 64}, r"model input shape \[None, 64\] does not match features v0 \(128\)"),
        ({"n_classes": 3}, "3 classes"),
        ({"meta": {"label_map": '{"0": "HOLD"}'}}, "no 'feature_version'"),
        ({"meta": {"feature_version": "v1", "label_map": "{}"}}, "trained on features 'v1'"),
        ({"meta": {"feature_version": FEATURE_VERSION}}, "no 'label_map'"),
        ({"meta": {"feature_version": FEATURE_VERSION, "label_map": "[1,2"}}, "not a JSON object"),
        (
            {
                "meta": {
                    "feature_version": FEATURE_VERSION,
                    "label_map": '{"0":"HOLD","1":"LEAN_SELL","2":"LEAN_BUY","3":"EMERGENCY"}',
                }
            },
            "does not match engine labels",
        ),
    ],
)
def test_bad_models_are_refused_with_a_reason(tmp_path: Path, kw: dict, message: str) -> None:
    with pytest.raises(LayaModelError, match=message):
        _cpu(_linear_onnx(tmp_path / "bad.onnx", **kw))


def test_garbage_and_missing_files_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not an onnx model\x00\x01\x02")
    with pytest.raises(LayaModelError, match="is not a loadable ONNX model") as exc:
        _cpu(junk)
    assert exc.value.__cause__ is None and "Traceback" not in str(exc.value)
    with pytest.raises(LayaModelError, match="not found"):
        _cpu(tmp_path / "missing.onnx")


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="provider"):
        LayaConfig(model_path=Path("x"), provider="tpu")
    with pytest.raises(ValueError, match="warmup_runs"):
        LayaConfig(model_path=Path("x"), warmup_runs=0)
