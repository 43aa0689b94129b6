"""Sessions written before the wire checks existed (or by hand) that hold rows no market has: books
stamped at INT64_MAX and trades at 1e300. Replay quarantines those rows (``bad_time``,
``price_out_of_range``) and runs the rest, with the v0 and the v1 features: no LookAheadError, no hang,
no fill at an absurd price."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from engine.errors import DualhubError
from engine.events import BookSnapshot, Trade
from engine.laya.labels import LabelConfig
from engine.store import SessionWriter
from replay.config import ReplayConfig
from replay.driver import run_replay
from replay.train_cli import train
from venue.simulator import generate_frames
from wire.bitget.bitget_v2 import StreamCounters, decode

INT64_MAX = 2**63 - 1


def _session(root: Path, *, bad: bool = True, at: int = 100) -> Path:
    c = StreamCounters()
    evs = []
    for ts, raw in generate_frames(minutes=1, seed=3):
        evs += [e for e in decode(raw, ts, c) if isinstance(e, BookSnapshot | Trade)]
    books = [i for i, e in enumerate(evs) if isinstance(e, BookSnapshot)]
    trades = [i for i, e in enumerate(evs) if isinstance(e, Trade)]
    # as an old recorder stored data.ts = 9223372036854 received "then"
    for i in books[at : at + 10 or None] if bad else ():
        evs[i] = dataclasses.replace(evs[i], ts_event=9223372036854 * 1_000_000, ts_recv=INT64_MAX)
    for i in trades[50:55] if bad else ():
        evs[i] = dataclasses.replace(evs[i], px=1e300)
    w = SessionWriter(root, source="test", symbols=["BTCUSDT"])
    w.add_all(evs)
    w.close()
    return root


@pytest.mark.parametrize("features", ["v0", "v1"])
def test_replay_quarantines_impossible_rows_and_runs_the_rest(tmp_path: Path, features: str) -> None:
    s = _session(tmp_path / "s")
    cfg = ReplayConfig()
    if features == "v1":  # a v1 model, trained on the same market without the bad rows
        model = tmp_path / "v1.onnx"
        train([_session(tmp_path / "clean", bad=False)], model, features="v1",
              labels=LabelConfig(lean_bps=1.0, emergency_bps=3.0), folds=2)  # fmt: skip
        cfg = ReplayConfig(model_path=model, laya_features="v1")
    res = run_replay(s, cfg, out_dir=tmp_path / "r")
    assert res.quarantine["books15"] == {"bad_time": 10}
    assert res.quarantine["trade"] == {"price_out_of_range": 5}
    fills = tmp_path / "r" / "events" / "fill.parquet"
    if fills.exists():
        assert all(px < 1e6 for px in pq.read_table(fills).column("px").to_pylist())


def test_training_on_an_absurd_print_is_one_clear_error_not_a_hang(tmp_path: Path) -> None:
    s = _session(tmp_path / "s")
    with pytest.raises(DualhubError, match="no market trades at once"):
        train(
            [s],
            tmp_path / "m.onnx",
            features="v1",
            labels=LabelConfig(lean_bps=1.0, emergency_bps=3.0),
            folds=2,
        )


def test_books_stamped_int64_max_at_the_end_are_quarantined_not_a_look_ahead_error(tmp_path: Path) -> None:
    """The last books at INT64_MAX are not out of order (nothing comes after them): before the
    ``bad_time`` code they reached the engine, whose clock never gets there (a LookAheadError)."""
    s = _session(tmp_path / "s", at=-10)
    res = run_replay(s, ReplayConfig(), out_dir=tmp_path / "r")
    assert res.quarantine["books15"] == {"bad_time": 10}
