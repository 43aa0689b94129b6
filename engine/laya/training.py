"""Training Laya: labels from future mid moves, a small deterministic sklearn model, ONNX export.

scikit-learn and onnx are the ``train`` extra, so they are imported inside the functions that need
them; importing this module (for :func:`make_labels`) needs numpy and pyarrow only.

Determinism: the same tables, seed and metadata give a byte-identical ONNX file (the pipeline is
StandardScaler + lbfgs LogisticRegression with a fixed ``random_state``, fitted on one BLAS thread;
the graph's opset is pinned, its name is fixed and nothing time- or path-dependent goes into the
metadata).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.events import Label
from engine.laya.features import FEATURE_VERSION, N_FEATURES, features_v0_batch
from engine.store import atomic_write_bytes

DEFAULT_HORIZON_NS: Final = 2_000_000_000
DEFAULT_LEAN_BPS: Final = 1.5
DEFAULT_EMERGENCY_BPS: Final = 8.0
INPUT_NAME: Final = "features"
TARGET_OPSET: Final = 17
IR_VERSION: Final = 8  # what opset 17 needs: every onnxruntime the project supports reads it
LABEL_MAP: Final = {str(int(lab)): lab.name for lab in Label}
# Metadata keys train_model writes itself; callers' ``metadata`` may not override them.
RESERVED_METADATA: Final = frozenset(
    {
        "feature_version",
        "class_weighting",
        "label_map",
        "horizon_ns",
        "thresholds",
        "training_data_sha256",
        "seed",
        "n_features",
        "n_train_rows",
    }
)


def future_move_bps(mid: np.ndarray, ts_ns: np.ndarray, *, horizon_ns: int) -> np.ndarray:
    """Mid move in basis points from row t to the first row at or after ``ts_ns[t] + horizon_ns``.

    NaN where that row does not exist (the last ``horizon_ns`` of a session) or either mid is not
    finite (a one-sided book). ``ts_ns`` must be non-decreasing.
    """
    mid = np.asarray(mid, dtype=np.float64)
    ts = np.asarray(ts_ns, dtype=np.int64)
    if mid.shape != ts.shape or mid.ndim != 1:
        raise ValueError(f"mid and ts_ns must be 1-d of equal length, got {mid.shape} and {ts.shape}")
    if horizon_ns <= 0:
        raise ValueError(f"horizon_ns must be > 0, got {horizon_ns}")
    if ts.size > 1 and np.any(np.diff(ts) < 0):
        bad = int(np.argmax(np.diff(ts) < 0))
        raise ValueError(
            f"ts_ns must be non-decreasing: ts_ns[{bad + 1}]={ts[bad + 1]} < ts_ns[{bad}]={ts[bad]}"
        )
    n = mid.shape[0]
    j = np.searchsorted(ts, ts + horizon_ns, side="left")
    has = j < n
    move = np.full(n, np.nan, dtype=np.float64)
    cur = mid[has]
    fut = mid[j[has]]
    with np.errstate(invalid="ignore", divide="ignore"):
        move[has] = (fut - cur) * 10_000.0 / cur
    move[~np.isfinite(move)] = np.nan
    return move


def make_labels(
    mid: np.ndarray,
    ts_ns: np.ndarray,
    *,
    horizon_ns: int = DEFAULT_HORIZON_NS,
    lean_bps: float = DEFAULT_LEAN_BPS,
    emergency_bps: float = DEFAULT_EMERGENCY_BPS,
) -> np.ndarray:
    """Label each row from the mid move over the next ``horizon_ns`` (see :func:`future_move_bps`).

    ``|move| >= emergency_bps`` -> EMERGENCY (either direction); else ``move >= lean_bps`` ->
    LEAN_BUY, ``move <= -lean_bps`` -> LEAN_SELL; else HOLD. Rows without a full horizon (the tail
    of the session) or without a finite mid at either end get HOLD here, so the result lines up with
    the input; :func:`train_model` excludes those rows from training instead.
    Returns int64 class ids (``engine.events.Label`` values).
    """
    if not 0.0 < lean_bps < emergency_bps:
        raise ValueError(
            f"need 0 < lean_bps < emergency_bps, got lean_bps={lean_bps}, emergency_bps={emergency_bps}"
        )
    move = future_move_bps(mid, ts_ns, horizon_ns=horizon_ns)
    labels = np.full(move.shape[0], int(Label.HOLD), dtype=np.int64)
    with np.errstate(invalid="ignore"):
        labels[move >= lean_bps] = int(Label.LEAN_BUY)
        labels[move <= -lean_bps] = int(Label.LEAN_SELL)
        labels[np.abs(move) >= emergency_bps] = int(Label.EMERGENCY)
    return labels


def _mid(table: pa.Table) -> np.ndarray:
    bid = table.column("bid_px_0").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    ask = table.column("ask_px_0").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    return (bid + ask) / 2.0


def _per_symbol(table: pa.Table) -> list[pa.Table]:
    """Split a books15 table by symbol (sorted), each sorted by (ts_event, seq)."""
    symbols = sorted(set(table.column("symbol").to_pylist()))
    out = []
    for sym in symbols:
        sub = table.filter(pc.equal(table.column("symbol"), sym))
        out.append(sub.sort_by([("ts_event", "ascending"), ("seq", "ascending")]))
    return out


def build_training_set(
    tables: list[pa.Table],
    *,
    horizon_ns: int = DEFAULT_HORIZON_NS,
    lean_bps: float = DEFAULT_LEAN_BPS,
    emergency_bps: float = DEFAULT_EMERGENCY_BPS,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Features (n, 128) float32 and labels (n,) int64 over all tables and symbols, rows without a
    full horizon excluded; also returns how many rows were excluded. Labels use ``ts_event``."""
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    excluded = 0
    for table in tables:
        for sub in _per_symbol(table):
            mid = _mid(sub)
            ts = sub.column("ts_event").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            keep = ~np.isnan(future_move_bps(mid, ts, horizon_ns=horizon_ns))
            y = make_labels(mid, ts, horizon_ns=horizon_ns, lean_bps=lean_bps, emergency_bps=emergency_bps)
            xs.append(features_v0_batch(sub)[keep])
            ys.append(y[keep])
            excluded += int((~keep).sum())
    if not xs:
        return np.empty((0, N_FEATURES), np.float32), np.empty(0, np.int64), excluded
    return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys), excluded


def training_data_sha256(X: np.ndarray, y: np.ndarray) -> str:
    """Identity of a training set: sha256 over shapes, float32 features and int64 labels."""
    h = hashlib.sha256()
    h.update(f"X{X.shape}float32;y{y.shape}int64;".encode())
    h.update(np.ascontiguousarray(X, dtype=np.float32).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
    return h.hexdigest()


def _meta_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def class_weights(y: np.ndarray, scheme: str) -> dict[int, float] | None:
    """Per-class weights. ``balanced`` is n/(k*count); ``sqrt_balanced`` its square root.

    Fully balanced weights make a rare class (EMERGENCY, ~0.5% of rows) as heavy as HOLD, and with
    weak features the model then calls it on a fifth of all ticks; the square root keeps rare classes
    visible while leaving EMERGENCY rare, which is what its meaning (pull everything now) demands.
    """
    if scheme == "none":
        return None
    classes, counts = np.unique(y, return_counts=True)
    w = len(y) / (len(classes) * counts.astype(np.float64))
    if scheme == "balanced":
        pass
    elif scheme == "sqrt_balanced":
        w = np.sqrt(w)
    else:
        raise ValueError(f"unknown class weighting {scheme!r}: none, balanced or sqrt_balanced")
    return {int(c): float(x) for c, x in zip(classes, w, strict=True)}


def train_model(
    tables: list[pa.Table],
    *,
    seed: int,
    out_path: Path,
    metadata: dict[str, Any],
    horizon_ns: int = DEFAULT_HORIZON_NS,
    lean_bps: float = DEFAULT_LEAN_BPS,
    emergency_bps: float = DEFAULT_EMERGENCY_BPS,
    class_weighting: str = "sqrt_balanced",
) -> dict[str, Any]:
    """Fit StandardScaler + multinomial LogisticRegression on ``tables`` (books15) and write the ONNX
    model to ``out_path`` atomically. ``metadata`` values (str, or JSON-encoded) go into the model's
    ``metadata_props`` beside the reserved keys (:data:`RESERVED_METADATA`). Returns training metrics.
    """
    clash = RESERVED_METADATA & set(metadata)
    if clash:
        raise ValueError(f"metadata keys {sorted(clash)} are written by train_model and cannot be set")
    X, y, excluded = build_training_set(
        tables, horizon_ns=horizon_ns, lean_bps=lean_bps, emergency_bps=emergency_bps
    )
    return fit_export(
        X,
        y,
        seed=seed,
        out_path=out_path,
        metadata=metadata,
        feature_version=FEATURE_VERSION,
        horizon_ns=horizon_ns,
        thresholds={"emergency_bps": emergency_bps, "lean_bps": lean_bps},
        class_weighting=class_weighting,
        n_excluded=excluded,
    )


def make_classifier(y: np.ndarray, *, seed: int, class_weighting: str = "sqrt_balanced") -> Any:
    """The estimator Laya is trained as: StandardScaler + multinomial lbfgs LogisticRegression, class
    weights from ``y`` (:func:`class_weights`). Fit it under ``threadpool_limits(1)`` (see below)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    clf = LogisticRegression(
        C=1.0, class_weight=class_weights(y, class_weighting), max_iter=2000, random_state=seed
    )
    return Pipeline([("scaler", StandardScaler()), ("clf", clf)])


def linear_graph(
    mean: np.ndarray, scale: np.ndarray, coef: np.ndarray, intercept: np.ndarray, *, name: str
) -> Any:
    """The fitted StandardScaler + multinomial LogisticRegression as an ONNX model of standard
    operators: Sub of the scaler's means, one Gemm for the classes' scores (the scaler's scale folded
    into the weights), Softmax for the probabilities and ArgMax for the label. The means stay a node of
    their own, as the Scaler's were: folded into the bias, the centring would rest on float32
    cancellation between ``x . w`` and ``mean . w``, which loses digits for features far from zero.

    Why not skl2onnx's graph (Scaler, LinearClassifier, Normalizer of the ai.onnx.ml domain): onnxruntime
    runs those with a loop of its own per row, on the CPU only. A Gemm runs on its BLAS kernels, and on
    the CUDA provider too, where the ai.onnx.ml nodes would fall back to the CPU."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    coef = np.asarray(coef, dtype=np.float64)
    n_classes, n_features = coef.shape
    if n_classes != len(Label):
        raise ValueError(f"the classifier has {n_classes} classes' weights, not {len(Label)}")
    weights = coef / np.asarray(scale, dtype=np.float64)  # (x - mean) / scale . coef = (x - mean) . w
    graph = helper.make_graph(
        [
            helper.make_node("Sub", [INPUT_NAME, "mean"], ["centred"]),
            helper.make_node("Gemm", ["centred", "weights", "bias"], ["scores"], transB=1),
            helper.make_node("Softmax", ["scores"], ["probabilities"], axis=1),
            helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0),
        ],
        name,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [None, n_features])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, n_classes]),
        ],
        [
            numpy_helper.from_array(np.asarray(mean, dtype=np.float32), "mean"),
            numpy_helper.from_array(weights.astype(np.float32), "weights"),
            numpy_helper.from_array(np.asarray(intercept, dtype=np.float32), "bias"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", TARGET_OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def fit_export(
    X: np.ndarray,
    y: np.ndarray,
    *,
    seed: int,
    out_path: Path,
    metadata: dict[str, Any],
    feature_version: str,
    horizon_ns: int,
    thresholds: dict[str, float],
    class_weighting: str = "sqrt_balanced",
    n_excluded: int = 0,
) -> dict[str, Any]:
    """Fit :func:`make_classifier` on features ``X`` (any width; ``feature_version`` names them) and
    labels ``y``, export to ONNX with the reserved metadata (``thresholds`` is stored as given),
    write ``out_path`` atomically. Returns in-sample metrics measured on the exported model."""
    import onnx
    import onnxruntime as ort
    import sklearn
    from threadpoolctl import threadpool_limits

    clash = RESERVED_METADATA & set(metadata)
    if clash:
        raise ValueError(f"metadata keys {sorted(clash)} are written by train_model and cannot be set")
    X = np.ascontiguousarray(X, dtype=np.float32)
    y = np.asarray(y, dtype=np.int64)
    present = sorted(set(y.tolist()))
    if len(present) < 2:
        raise ValueError(
            f"training data has {len(y)} labelled rows and classes {present}: need at least 2 classes"
        )
    missing = [Label(c).name for c in range(len(Label)) if c not in present]
    if missing:
        # The model's probability output must have all 4 columns; a class never seen cannot be fit.
        raise ValueError(
            f"training data has no rows of class(es) {missing}; use more data or lower thresholds"
        )

    pipe = make_classifier(y, seed=seed, class_weighting=class_weighting)
    clf = pipe.named_steps["clf"]
    # One BLAS/OpenMP thread: the fit's float results (and lbfgs's iteration count) depend on the
    # thread count, and several threads on a busy machine contend for its cores.
    with threadpool_limits(limits=1):
        pipe.fit(X.astype(np.float64), y)
        sk_labels = pipe.predict(X.astype(np.float64))

    n_features = int(X.shape[1])
    scaler = pipe.named_steps["scaler"]
    onx = linear_graph(scaler.mean_, scaler.scale_, clf.coef_, clf.intercept_, name=f"laya_{feature_version}")
    data_sha = training_data_sha256(X, y)
    props = {k: _meta_str(v) for k, v in sorted(metadata.items())}
    props.setdefault("producer", "engine.laya.training")
    props.update(
        {
            "feature_version": feature_version,
            "n_features": str(n_features),
            "label_map": json.dumps(LABEL_MAP, sort_keys=True),
            "horizon_ns": str(int(horizon_ns)),
            "thresholds": json.dumps(thresholds, sort_keys=True),
            "training_data_sha256": data_sha,
            "seed": str(int(seed)),
            "class_weighting": class_weighting,
            "n_train_rows": str(int(len(y))),
            "trainer": f"scikit-learn {sklearn.__version__}, onnx {onnx.__version__}",
        }
    )
    onnx.helper.set_model_props(onx, dict(sorted(props.items())))
    inputs = "books15 features" if feature_version == FEATURE_VERSION else "books15 + trade features"
    onx.doc_string = f"Laya {feature_version}: {inputs} -> HOLD/LEAN_BUY/LEAN_SELL/EMERGENCY"
    data = onx.SerializeToString(deterministic=True)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_path, data)

    # In-sample metrics, from the exported model itself (so the export is checked too).
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    onnx_labels = sess.run(None, {INPUT_NAME: X})[0].astype(np.int64)
    counts = {lab.name: int((y == lab).sum()) for lab in Label}
    predicted = {lab.name: int((onnx_labels == lab).sum()) for lab in Label}
    per_class = {
        lab.name: (float((onnx_labels[y == lab] == lab).mean()) if counts[lab.name] else float("nan"))
        for lab in Label
    }
    return {
        "n_rows": int(len(y)),
        "n_excluded_no_horizon": n_excluded,
        "class_counts": counts,
        "predicted_counts": predicted,
        "accuracy": float((onnx_labels == y).mean()),
        "per_class_accuracy": per_class,
        "onnx_sklearn_label_agreement": float((onnx_labels == sk_labels).mean()),
        "training_data_sha256": data_sha,
        "model_sha256": hashlib.sha256(data).hexdigest(),
        "model_bytes": len(data),
        "out_path": str(out_path),
    }
