"""Build the committed default Laya model, ``data/models/laya-v0.onnx``, from simulated sessions.

    python -m replay.make_default_model [--out data/models/laya-v0.onnx]

Training sessions come from the simulator with seeds 101, 102, 103 (not the demo seed 7, so the demo
is out of sample), written to a temporary directory that is removed afterwards. The result is
reproducible: running this twice gives a byte-identical file (``engine.laya.training``). The
metadata names the simulator seeds and the training data's sha256 (of features and labels, not of
Parquet bytes, which depend on the pyarrow version).
Needs the ``train`` extra (scikit-learn, onnx).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
DEFAULT_OUT: Final = REPO_ROOT / "data" / "models" / "laya-v0.onnx"
TRAIN_SEEDS: Final = (101, 102, 103)
TRAIN_MINUTES: Final = 10.0
TRAIN_SYMBOL: Final = "BTCUSDT"
MODEL_SEED: Final = 0


def build(
    out: Path,
    *,
    seeds: tuple[int, ...] = TRAIN_SEEDS,
    minutes: float = TRAIN_MINUTES,
    symbol: str = TRAIN_SYMBOL,
    progress: bool = False,
) -> dict[str, Any]:
    """Simulate the training sessions, train, write ``out``; returns the training metrics."""
    from engine.laya.training import train_model
    from engine.store import open_session
    from venue.simulator import simulate_session

    with tempfile.TemporaryDirectory(prefix="laya-train-") as tmp:
        tables = []
        for seed in seeds:
            root = simulate_session(
                Path(tmp) / f"sim-{seed}", symbol=symbol, minutes=minutes, seed=seed, progress=progress
            )
            tables.append(open_session(root).read_table("books15"))
        metadata = {
            "producer": "replay.make_default_model",
            "training_sessions": {
                "simulator": "venue.simulator.simulate_session",
                "symbol": symbol,
                "minutes": minutes,
                "seeds": list(seeds),
            },
        }
        return train_model(tables, seed=MODEL_SEED, out_path=out, metadata=metadata)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m replay.make_default_model", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output ONNX file (default {DEFAULT_OUT})")
    ap.add_argument("--minutes", type=float, default=TRAIN_MINUTES, help="simulated minutes per session")
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=list(TRAIN_SEEDS), help="simulator seeds, one session each"
    )
    ap.add_argument("--progress", action="store_true", help="show the simulator's progress")
    args = ap.parse_args(argv)
    metrics = build(args.out, seeds=tuple(args.seeds), minutes=args.minutes, progress=args.progress)
    json.dump(metrics, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
