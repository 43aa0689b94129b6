"""Datasets from recorded sessions, and purged, embargoed walk-forward evaluation of Laya.

Dataset. Each session is labelled per symbol with triple-barrier labels on the replay's clock
(``ts_recv``, books in ``(ts_recv, seq)`` order; see :mod:`engine.laya.labels`) and featurised with
v0 (books only) or v1 (books + trades received before each book). Rows without a full horizon are
dropped. Every row keeps ``t0_ns`` (its book's ``ts_recv``) and ``t1_ns`` (when its label was
decided), and the session it came from (``group``). Within a session rows are in ``t0`` order;
sessions follow one another in the order given.

Walk-forward. The rows are cut into ``n_folds + 1`` contiguous blocks; fold ``k`` tests on block
``k`` and trains only on rows before it (never on the future). Purging drops every training row of
the same session whose label interval ``[t0, t1]`` overlaps the test fold's ``[min t0, max t1]``;
the embargo widens that interval by ``embargo_ns`` on both sides. Different sessions are taken as
independent (simulated sessions share timestamps; separate recordings do not overlap in time), so
only rows of the same session are purged. :func:`check_no_overlap` asserts the invariant.

Metrics. Per class precision, recall, F1 and support, plus accuracy, macro F1 and balanced accuracy,
for the model and two trivial baselines fitted on the same training rows: always the majority class,
and sampling classes from the training prior (expected values, computed exactly from the expected
confusion matrix ``E[C_ij] = n_i * p_j``, so no random draw is needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.events import Label
from engine.laya.features import features_v0_batch
from engine.laya.features_v1 import features_v1_batch
from engine.laya.labels import LabelConfig, triple_barrier_labels
from engine.laya.training import make_classifier, training_data_sha256
from engine.store import open_session

FEATURE_VERSIONS: Final = ("v0", "v1")
CLASSES: Final = tuple(lab.name for lab in Label)
N_CLASSES: Final = len(Label)


@dataclass(frozen=True)
class Dataset:
    """Rows from one or more sessions. ``X`` float32, ``y`` int64 (``Label`` ids), ``t0_ns`` and
    ``t1_ns`` int64 (label start and decision time), ``group`` int64 (session index),
    ``move_bps`` the mid move at ``t1``; ``sessions`` describes each session's part."""

    X: np.ndarray
    y: np.ndarray
    t0_ns: np.ndarray
    t1_ns: np.ndarray
    group: np.ndarray
    move_bps: np.ndarray
    feature_version: str
    labels: LabelConfig
    sessions: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def class_counts(self) -> dict[str, int]:
        return {name: int((self.y == i).sum()) for i, name in enumerate(CLASSES)}


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("ts_recv", "ascending"), ("seq", "ascending")])


def _f64(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _i64(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def session_rows(
    session_dir: Path | str,
    *,
    features: str,
    labels: LabelConfig,
    symbol: str | None = None,
) -> dict[str, Any]:
    """One session's labelled rows (all symbols, or ``symbol``), valid rows only, in ``t0`` order.

    Returns ``X, y, t0_ns, t1_ns, move_bps`` arrays and ``info`` (path, digest, symbols, counts).
    """
    if features not in FEATURE_VERSIONS:
        raise ValueError(f"features must be one of {FEATURE_VERSIONS}, got {features!r}")
    session = open_session(session_dir)
    session.verify()
    if "books15" not in session.streams:
        raise ValueError(f"{session.root} has no books15 stream")
    books_all = session.read_table("books15")
    trades_all = session.read_table("trade") if "trade" in session.streams else None
    gaps_all = session.read_table("gap") if "gap" in session.streams else None
    symbols = sorted(set(books_all.column("symbol").to_pylist()))
    if symbol is not None:
        if symbol not in symbols:
            raise ValueError(f"{session.root} has no books15 rows for {symbol} (has {symbols})")
        symbols = [symbol]
    parts: list[tuple[np.ndarray, ...]] = []
    n_rows = n_invalid = 0
    for sym in symbols:
        books = _sorted(books_all.filter(pc.equal(books_all.column("symbol"), sym)))
        trades = (
            _sorted(trades_all.filter(pc.equal(trades_all.column("symbol"), sym)))
            if trades_all is not None
            else None
        )
        mid = (_f64(books, "bid_px_0") + _f64(books, "ask_px_0")) / 2.0
        ts = _i64(books, "ts_recv")
        trade_ts = _i64(trades, "ts_recv") if trades is not None else None
        notional = _f64(trades, "px") * _f64(trades, "sz") if trades is not None else None
        exclude = None
        if gaps_all is not None and gaps_all.num_rows:
            exclude = _i64(gaps_all.filter(pc.equal(gaps_all.column("symbol"), sym)), "ts_recv")
        lab = triple_barrier_labels(
            mid, ts, labels, trade_ts_ns=trade_ts, trade_notional=notional, exclude_ns=exclude
        )
        X = features_v0_batch(books) if features == "v0" else features_v1_batch(books, trades)
        keep = lab.valid
        parts.append((X[keep], lab.label[keep], ts[keep], lab.end_ns[keep], lab.move_bps[keep]))
        n_rows += books.num_rows
        n_invalid += int((~keep).sum())
    X = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    t0 = np.concatenate([p[2] for p in parts])
    t1 = np.concatenate([p[3] for p in parts])
    move = np.concatenate([p[4] for p in parts])
    order = np.argsort(t0, kind="stable")
    X, y, t0, t1, move = X[order], y[order], t0[order], t1[order], move[order]
    info = {
        "path": str(session.root),
        "source": session.manifest.get("source", ""),
        "session_digest": session.digest(),
        "symbols": symbols,
        "book_rows": n_rows,
        "labelled_rows": int(len(y)),
        "excluded_rows": n_invalid,
        "class_counts": {name: int((y == i).sum()) for i, name in enumerate(CLASSES)},
        "training_data_sha256": training_data_sha256(X, y),
    }
    return {"X": X, "y": y, "t0_ns": t0, "t1_ns": t1, "move_bps": move, "info": info}


def build_dataset(
    session_dirs: Sequence[Path | str],
    *,
    features: str,
    labels: LabelConfig,
    symbol: str | None = None,
) -> Dataset:
    """Rows of every session, one after the other (see the module docstring)."""
    if not session_dirs:
        raise ValueError("need at least one session")
    n_features = None
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("X", "y", "t0_ns", "t1_ns", "move_bps", "group")}
    infos = []
    for g, path in enumerate(session_dirs):
        part = session_rows(path, features=features, labels=labels, symbol=symbol)
        n_features = part["X"].shape[1]
        for k in ("X", "y", "t0_ns", "t1_ns", "move_bps"):
            cols[k].append(part[k])
        cols["group"].append(np.full(len(part["y"]), g, dtype=np.int64))
        infos.append(part["info"])
    assert n_features is not None
    return Dataset(
        X=np.ascontiguousarray(np.concatenate(cols["X"]), dtype=np.float32),
        y=np.concatenate(cols["y"]).astype(np.int64),
        t0_ns=np.concatenate(cols["t0_ns"]).astype(np.int64),
        t1_ns=np.concatenate(cols["t1_ns"]).astype(np.int64),
        group=np.concatenate(cols["group"]),
        move_bps=np.concatenate(cols["move_bps"]),
        feature_version=features,
        labels=labels,
        sessions=infos,
    )


# -- purged, embargoed walk-forward ----------------------------------------------------------------


@dataclass(frozen=True)
class Fold:
    """One walk-forward step: row indices to train and test on, and how many rows were held out."""

    index: int
    train: np.ndarray
    test: np.ndarray
    purged: int
    embargoed: int


def _test_spans(
    t0: np.ndarray, t1: np.ndarray, group: np.ndarray, test: np.ndarray
) -> dict[int, tuple[int, int]]:
    """Per session: ``(min t0, max t1)`` of the test rows."""
    spans = {}
    for g in np.unique(group[test]).tolist():
        rows = test[group[test] == g]
        spans[int(g)] = (int(t0[rows].min()), int(t1[rows].max()))
    return spans


def purged_walk_forward(
    t0_ns: np.ndarray, t1_ns: np.ndarray, group: np.ndarray, *, n_folds: int, embargo_ns: int
) -> list[Fold]:
    """Walk-forward folds with purging and an embargo (see the module docstring).

    Rows must be ordered by session, then by ``t0_ns`` within a session.
    """
    t0 = np.asarray(t0_ns, dtype=np.int64)
    t1 = np.asarray(t1_ns, dtype=np.int64)
    g = np.asarray(group, dtype=np.int64)
    n = t0.shape[0]
    if n_folds < 1:
        raise ValueError(f"n_folds must be >= 1, got {n_folds}")
    if embargo_ns < 0:
        raise ValueError(f"embargo_ns must be >= 0, got {embargo_ns}")
    if n < 2 * (n_folds + 1):
        raise ValueError(f"{n} rows are too few for {n_folds} walk-forward folds")
    if np.any(np.diff(g) < 0) or np.any((np.diff(t0) < 0) & (np.diff(g) == 0)):
        raise ValueError("rows must be ordered by session, then by t0_ns")
    if np.any(t1 < t0):
        raise ValueError("every label must end at or after it starts (t1_ns >= t0_ns)")
    blocks = np.array_split(np.arange(n), n_folds + 1)
    folds = []
    for k in range(1, n_folds + 1):
        test = blocks[k]
        cand = np.arange(int(test[0]))
        drop_purge = np.zeros(cand.shape[0], dtype=bool)
        drop_embargo = np.zeros(cand.shape[0], dtype=bool)
        for sess, (lo, hi) in _test_spans(t0, t1, g, test).items():
            same = g[cand] == sess
            overlap = same & (t0[cand] <= hi) & (t1[cand] >= lo)
            near = same & (t0[cand] <= hi + embargo_ns) & (t1[cand] >= lo - embargo_ns)
            drop_purge |= overlap
            drop_embargo |= near & ~overlap
        keep = ~(drop_purge | drop_embargo)
        folds.append(Fold(k, cand[keep], test, int(drop_purge.sum()), int(drop_embargo.sum())))
    return folds


def check_no_overlap(
    fold: Fold, t0_ns: np.ndarray, t1_ns: np.ndarray, group: np.ndarray, embargo_ns: int
) -> None:
    """Raise if a training row's label interval (widened by the embargo) touches the test fold."""
    for sess, (lo, hi) in _test_spans(t0_ns, t1_ns, group, fold.test).items():
        tr = fold.train[group[fold.train] == sess]
        bad = tr[(t0_ns[tr] <= hi + embargo_ns) & (t1_ns[tr] >= lo - embargo_ns)]
        if bad.size:
            i = int(bad[0])
            raise AssertionError(
                f"fold {fold.index}: training row {i} [{t0_ns[i]}, {t1_ns[i]}] overlaps the test span "
                f"[{lo}, {hi}] of session {sess} (embargo {embargo_ns} ns)"
            )


# -- metrics ----------------------------------------------------------------------------------------


def confusion(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """``C[i, j]`` = rows of class i predicted as j, float64 ``(4, 4)``."""
    c = np.zeros((N_CLASSES, N_CLASSES), dtype=np.float64)
    np.add.at(c, (np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)), 1.0)
    return c


def prior_confusion(y_true: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Expected confusion of predicting by sampling classes from ``prior``: ``E[C_ij] = n_i p_j``."""
    support = np.bincount(np.asarray(y_true, dtype=np.int64), minlength=N_CLASSES).astype(np.float64)
    return np.outer(support, np.asarray(prior, dtype=np.float64))


def _nan_none(x: float) -> float | None:
    return None if not np.isfinite(x) else round(float(x), 6)


def metrics_from_confusion(c: np.ndarray) -> dict[str, Any]:
    """Per class (support, predicted, precision, recall, f1) and accuracy, macro F1 over classes
    present in the truth, balanced accuracy. Undefined values (no predictions of a class) are None."""
    support = c.sum(axis=1)
    predicted = c.sum(axis=0)
    tp = np.diag(c)
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = tp / predicted
        recall = tp / support
        f1 = 2 * tp / (support + predicted)
    per_class = {
        name: {
            "support": int(round(support[i])),
            "predicted": round(float(predicted[i]), 3),
            "precision": _nan_none(precision[i]),
            "recall": _nan_none(recall[i]),
            "f1": _nan_none(f1[i]) if support[i] + predicted[i] > 0 else None,
        }
        for i, name in enumerate(CLASSES)
    }
    present = support > 0
    total = c.sum()
    f1_present = np.where(np.isfinite(f1), f1, 0.0)[present]
    return {
        "n": int(round(total)),
        "accuracy": _nan_none(tp.sum() / total) if total else None,
        "macro_f1": _nan_none(f1_present.mean()) if present.any() else None,
        "balanced_accuracy": _nan_none(recall[present].mean()) if present.any() else None,
        "per_class": per_class,
    }


def _fit_predict(X_train: np.ndarray, y_train: np.ndarray, X_test: np.ndarray, *, seed: int, weighting: str):
    from threadpoolctl import threadpool_limits

    pipe = make_classifier(y_train, seed=seed, class_weighting=weighting)
    with threadpool_limits(limits=1):
        pipe.fit(X_train.astype(np.float64), y_train)
        return pipe.predict(X_test.astype(np.float64)).astype(np.int64)


def walk_forward(
    ds: Dataset,
    *,
    n_folds: int = 4,
    embargo_ns: int | None = None,
    seed: int = 0,
    class_weighting: str = "sqrt_balanced",
) -> dict[str, Any]:
    """Purged, embargoed walk-forward of :func:`engine.laya.training.make_classifier` on ``ds``,
    with baselines. ``embargo_ns`` defaults to the label horizon. Returns JSON-ready results:
    ``folds`` (per fold: sizes, purged/embargoed counts, model / majority / prior metrics) and
    ``pooled`` (the same over all test rows together)."""
    emb = int(ds.labels.horizon_ns if embargo_ns is None else embargo_ns)
    folds = purged_walk_forward(ds.t0_ns, ds.t1_ns, ds.group, n_folds=n_folds, embargo_ns=emb)
    pooled = {
        "model": np.zeros((N_CLASSES, N_CLASSES)),
        "majority": np.zeros((N_CLASSES, N_CLASSES)),
        "prior": np.zeros((N_CLASSES, N_CLASSES)),
    }
    out_folds = []
    for fold in folds:
        check_no_overlap(fold, ds.t0_ns, ds.t1_ns, ds.group, emb)
        y_tr, y_te = ds.y[fold.train], ds.y[fold.test]
        entry: dict[str, Any] = {
            "fold": fold.index,
            "n_train": int(fold.train.size),
            "n_test": int(fold.test.size),
            "purged": fold.purged,
            "embargoed": fold.embargoed,
            "test_t0_ns": int(ds.t0_ns[fold.test].min()),
            "test_t1_ns": int(ds.t1_ns[fold.test].max()),
            "train_counts": {n: int((y_tr == i).sum()) for i, n in enumerate(CLASSES)},
        }
        if len(np.unique(y_tr)) < 2:
            entry["skipped"] = f"training rows have {len(np.unique(y_tr))} class(es)"
            out_folds.append(entry)
            continue
        pred = _fit_predict(ds.X[fold.train], y_tr, ds.X[fold.test], seed=seed, weighting=class_weighting)
        prior = np.bincount(y_tr, minlength=N_CLASSES) / len(y_tr)
        majority = int(np.argmax(prior))
        conf = {
            "model": confusion(y_te, pred),
            "majority": confusion(y_te, np.full_like(y_te, majority)),
            "prior": prior_confusion(y_te, prior),
        }
        for k, c in conf.items():
            pooled[k] += c
            entry[k] = metrics_from_confusion(c)
        entry["majority_class"] = CLASSES[majority]
        entry["confusion"] = conf["model"].astype(int).tolist()
        out_folds.append(entry)
    return {
        "n_folds": n_folds,
        "embargo_ns": emb,
        "n_rows": len(ds),
        "feature_version": ds.feature_version,
        "class_counts": ds.class_counts(),
        "folds": out_folds,
        "pooled": {k: metrics_from_confusion(c) for k, c in pooled.items()},
        "pooled_confusion": pooled["model"].astype(int).tolist(),
    }
