"""``dualhub train``: sessions -> triple-barrier labels -> purged walk-forward vs baselines -> ONNX.

    dualhub train SESSION [SESSION ...] --out data/models/<name>.onnx [--features v0|v1]
        [--horizon-ms 2000] [--lean-bps 1.5] [--emergency-bps 8] [--folds 4] [--embargo-ms H] [--seed 0]

Prints the walk-forward metrics per class next to two trivial baselines (always the training
majority class; sampling from the training class prior), then fits the model on every labelled row
and writes it with its metadata: feature version, label map, horizon and thresholds, per-session and
overall training-data hashes, and the walk-forward results as JSON (``walk_forward``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from engine.bounds import check_count, check_ms, check_seed
from engine.errors import DualhubError

MS = 1_000_000


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "train",
        help="train Laya from recorded sessions (triple-barrier labels, purged walk-forward, ONNX)",
        description="Label sessions with triple barriers, evaluate by purged and embargoed walk-forward "
        "against trivial baselines, then fit on all rows and export the model to ONNX with metadata.",
    )
    p.add_argument("sessions", nargs="+", type=Path, help="session directories (have manifest.json)")
    p.add_argument("--out", type=Path, required=True, help="model to write, e.g. data/models/<name>.onnx")
    p.add_argument(
        "--features",
        choices=("v0", "v1"),
        default="v1",
        help="features the model is trained on: v0, books15 (128 values); v1, books15 + trades (36; the "
        "default here, while the shipped default model is v0). Replay reads them from the model's metadata",
    )
    p.add_argument("--symbol", help="only this symbol (default: every symbol of each session)")
    p.add_argument("--horizon-ms", type=float, default=2000.0, help="label horizon (default 2000)")
    p.add_argument("--lean-bps", type=float, default=1.5, help="LEAN_BUY/LEAN_SELL barrier (default 1.5)")
    p.add_argument("--emergency-bps", type=float, default=8.0, help="EMERGENCY move (default 8)")
    p.add_argument(
        "--burst-ratio", type=float, default=2.0, help="EMERGENCY volume burst: x the look-back rate"
    )
    p.add_argument("--burst-lookback-ms", type=float, default=30_000.0, help="volume look-back (30000)")
    p.add_argument("--folds", type=int, default=4, help="walk-forward test folds (default 4)")
    p.add_argument("--embargo-ms", type=float, help="embargo around each test fold (default: the horizon)")
    p.add_argument("--seed", type=int, default=0, help="model seed (default 0)")
    p.add_argument(
        "--class-weighting",
        choices=("none", "balanced", "sqrt_balanced"),
        default="sqrt_balanced",
        help="weights of the rare labels in the fit: none, balanced (inverse frequency) or sqrt_balanced "
        "(its square root; default)",
    )
    p.add_argument("--metrics-json", type=Path, help="also write the walk-forward results to this file")
    p.set_defaults(func=cmd_train)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def print_results(results: dict[str, Any], console: Any = None) -> None:
    """Rich tables: pooled per-class metrics of the model beside the baselines, then each fold."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    pooled = results["pooled"]
    model, major, prior = pooled["model"], pooled["majority"], pooled["prior"]
    t = Table(
        title=f"walk-forward, features {results['feature_version']}: {results['n_folds']} folds, "
        f"embargo {results['embargo_ns'] / MS:g} ms, {model['n']} test rows (pooled)",
        title_justify="left",
    )
    for c in ("class", "support", "precision", "recall", "F1", "F1 majority", "F1 prior"):
        t.add_column(c, justify="right")
    for name, m in model["per_class"].items():
        t.add_row(
            name,
            _fmt(m["support"]),
            _fmt(m["precision"]),
            _fmt(m["recall"]),
            _fmt(m["f1"]),
            _fmt(major["per_class"][name]["f1"]),
            _fmt(prior["per_class"][name]["f1"]),
        )
    t.add_section()
    for key, label in (("accuracy", "accuracy"), ("macro_f1", "macro F1"), ("balanced_accuracy", "bal. acc")):
        t.add_row(label, "", "", "", _fmt(model[key]), _fmt(major[key]), _fmt(prior[key]))
    console.print(t)

    f = Table(title="per fold (macro F1)", title_justify="left")
    for c in ("fold", "train", "test", "purged", "embargoed", "model", "majority", "prior", "accuracy"):
        f.add_column(c, justify="right")
    for fold in results["folds"]:
        if "skipped" in fold:
            f.add_row(str(fold["fold"]), str(fold["n_train"]), str(fold["n_test"]), "", "", fold["skipped"])
            continue
        f.add_row(
            str(fold["fold"]),
            str(fold["n_train"]),
            str(fold["n_test"]),
            str(fold["purged"]),
            str(fold["embargoed"]),
            _fmt(fold["model"]["macro_f1"]),
            _fmt(fold["majority"]["macro_f1"]),
            _fmt(fold["prior"]["macro_f1"]),
            _fmt(fold["model"]["accuracy"]),
        )
    console.print(f)


def train(
    sessions: list[Path],
    out: Path,
    *,
    features: str = "v1",
    symbol: str | None = None,
    labels: Any = None,
    folds: int = 4,
    embargo_ns: int | None = None,
    seed: int = 0,
    class_weighting: str = "sqrt_balanced",
) -> dict[str, Any]:
    """Evaluate and export; returns ``{"walk_forward": ..., "training": ..., "dataset": ...}``."""
    from engine.laya.evaluate import build_dataset, walk_forward
    from engine.laya.features_v1 import FEATURE_NAMES
    from engine.laya.labels import LabelConfig
    from engine.laya.training import fit_export

    label_cfg = labels or LabelConfig()
    try:
        ds = build_dataset(sessions, features=features, labels=label_cfg, symbol=symbol)
        results = walk_forward(
            ds, n_folds=folds, embargo_ns=embargo_ns, seed=seed, class_weighting=class_weighting
        )
    except ValueError as e:
        raise DualhubError(str(e)) from None
    cfg = label_cfg.to_json()
    metadata: dict[str, Any] = {
        "producer": "dualhub train",
        "labels": {"scheme": "triple_barrier", **cfg},
        "training_sessions": [
            {
                "name": Path(s["path"]).name,
                "source": s["source"],
                "session_digest": s["session_digest"],
                "symbols": s["symbols"],
                "labelled_rows": s["labelled_rows"],
                "class_counts": s["class_counts"],
                "training_data_sha256": s["training_data_sha256"],
            }
            for s in ds.sessions
        ],
        "walk_forward": results,
    }
    if features == "v1":
        metadata["feature_names"] = list(FEATURE_NAMES)
    try:
        training = fit_export(
            ds.X,
            ds.y,
            seed=seed,
            out_path=out,
            metadata=metadata,
            feature_version=features,
            horizon_ns=label_cfg.horizon_ns,
            thresholds={k: cfg[k] for k in ("lean_bps", "emergency_bps", "burst_ratio", "burst_lookback_ns")},
            class_weighting=class_weighting,
            n_excluded=sum(s["excluded_rows"] for s in ds.sessions),
        )
    except ValueError as e:
        raise DualhubError(f"cannot fit the final model: {e}") from None
    return {"walk_forward": results, "training": training, "dataset": ds.sessions}


def _train(args: argparse.Namespace, labels: Any) -> Any:
    return train(
        args.sessions,
        args.out,
        features=args.features,
        symbol=args.symbol,
        labels=labels,
        folds=args.folds,
        embargo_ns=None if args.embargo_ms is None else round(args.embargo_ms * MS),
        seed=args.seed,
        class_weighting=args.class_weighting,
    )


def cmd_train(args: argparse.Namespace) -> int:
    from engine.laya.labels import LabelConfig
    from engine.optional import need

    need("sklearn", "onnx", "threadpoolctl")  # the [train] extra: before the labelling, not after

    check_ms(args.horizon_ms, "--horizon-ms")
    check_ms(args.burst_lookback_ms, "--burst-lookback-ms")
    if args.embargo_ms is not None:
        check_ms(args.embargo_ms, "--embargo-ms", zero=True)
    check_seed(args.seed, "--seed")
    check_count(args.folds, "--folds")
    try:
        labels = LabelConfig(
            horizon_ns=round(args.horizon_ms * MS),
            lean_bps=args.lean_bps,
            emergency_bps=args.emergency_bps,
            burst_ratio=args.burst_ratio,
            burst_lookback_ns=round(args.burst_lookback_ms * MS),
        )
    except ValueError as e:
        raise DualhubError(str(e)) from None
    import contextlib

    from rich.console import Console

    console = Console(stderr=True)
    # labelling, the walk-forward folds and the fit take a while on a long session: a spinner on a
    # terminal (piped, it would leave only a blank line)
    busy = (
        console.status(f"training on {len(args.sessions)} session(s): labels, {args.folds} folds, the fit...")
        if console.is_terminal
        else contextlib.nullcontext()
    )
    with busy:
        res = _train(args, labels)
    for s in res["dataset"]:
        counts = ", ".join(f"{k} {v}" for k, v in s["class_counts"].items())
        print(f"{s['path']}: {s['labelled_rows']} labelled rows ({counts}); {s['excluded_rows']} excluded")
    print_results(res["walk_forward"])
    tr = res["training"]
    print(f"model: {tr['out_path']} ({tr['model_bytes']} bytes, sha256 {tr['model_sha256'][:16]}...)")
    print(f"in-sample accuracy {tr['accuracy']:.3f} on {tr['n_rows']} rows")
    print(f"replay it: dualhub replay SESSION --model {tr['out_path']} (features from the model)")
    if args.metrics_json:
        args.metrics_json.parent.mkdir(parents=True, exist_ok=True)
        args.metrics_json.write_text(json.dumps(res["walk_forward"], indent=2, sort_keys=True) + "\n")
    return 0
