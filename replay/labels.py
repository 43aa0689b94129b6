"""Laya's labels for a replay: the whole table in a batch, or each book through the tick path (v0),
or features v1 (books and trades), as the compiled loop reads them by tape row."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from engine.clock import ReplayClock
from engine.events import BookSnapshot
from engine.laya.features import features_v0, features_v0_batch
from engine.laya.features_v1 import FeaturesV1, features_v1_batch
from engine.laya.model import N_CLASSES, Laya, LayaConfig
from engine.store import (
    SeqOrderError,
)
from replay.config import ReplayConfig
from replay.fast_path import LookAheadError
from replay.tape import _Tape


class _BatchLabeler:
    """Labels for a whole session computed up front (features and inference over all rows at once).

    It answers only for a book the engine has already received (``ts_recv <= now``): precomputed
    labels of future books exist in memory, and this guard is what keeps them unreadable.
    """

    def __init__(
        self, seqs: np.ndarray, labels: np.ndarray, probs: np.ndarray, clock: ReplayClock, lazy: bool = False
    ) -> None:
        """``lazy``: the arrays are filled as the replay goes (a streamed tape, which checks the seqs
        itself); they are looked at on the first call, which only the per-event driver makes."""
        self.seqs = np.asarray(seqs, dtype=np.int64)
        self.labels, self.probs, self.clock = labels, probs, clock
        self._n = len(self.seqs)
        self._ready = False
        if not lazy:
            self._prepare()

    def _prepare(self) -> None:
        # Book seqs are per stream across symbols, so one symbol's seqs can skip: look rows up by seq
        # (binary search over the sorted seqs; a dict of a million ints would cost ~100 MB).
        n, seqs = self._n, self.seqs
        if n > 1 and not bool(np.all(np.diff(seqs) > 0)):
            raise SeqOrderError("book seqs must be strictly increasing within a session stream")
        # Contiguous seqs (the usual one-symbol session): a row is seq - first, no search needed.
        self._first = int(seqs[0]) if n else 0
        self._contiguous = n > 0 and int(seqs[-1]) - self._first == n - 1
        self._label_ids: list[int] = np.asarray(self.labels).tolist()  # ints: cheaper than int(a[i])
        self._ready = True

    def __call__(self, book: BookSnapshot) -> tuple[int, np.ndarray]:
        if not self._ready:
            self._prepare()
        if book.ts_recv > self.clock.now_ns():
            raise LookAheadError(
                f"label of book seq {book.seq} asked at {self.clock.now_ns()} < {book.ts_recv}"
            )
        seq = book.seq
        if self._contiguous:
            i = seq - self._first
            if not 0 <= i < self._n:
                raise KeyError(f"book seq {seq} is not in this session")
        else:
            i = int(np.searchsorted(self.seqs, seq))
            if i >= self._n or self.seqs[i] != seq:
                raise KeyError(f"book seq {seq} is not in this session")
        return self._label_ids[i], self.probs[i]


def _batch_v0(
    laya: Laya, books: pa.Table, chunk_rows: int = 65_536, tick: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Features v0 and inference over the session in chunks, so only labels and probabilities stay in
    memory (a 1M-row feature matrix alone would be 512 MB). ``tick``: each row through Laya's tick
    path (``predict_each``), as live labels it; the features are the tick path's bits either way."""
    predict = laya.predict_each if tick else laya.predict_batch
    labels, probs = [], []
    for start in range(0, books.num_rows, chunk_rows):
        # one pass per chunk
        lab, pr = predict(features_v0_batch(books.slice(start, chunk_rows)))
        labels.append(lab.astype(np.int8))
        probs.append(pr.astype(np.float32))
    return np.concatenate(labels), np.concatenate(probs)


def _tick_labeler(laya: Laya) -> Callable[[BookSnapshot], tuple[int, np.ndarray]]:
    buf = np.zeros(128, dtype=np.float32)

    def label(book: BookSnapshot) -> tuple[int, np.ndarray]:
        return laya.predict(features_v0(book, out=buf))

    return label


def _tick_labels(
    labeler: Callable[[BookSnapshot], tuple[int, np.ndarray]], tape: _Tape, clock: ReplayClock
) -> _BatchLabeler:
    """A tick labeler's labels of every book, called in the order the engine receives the books (a v1
    labeler feeds itself the trades before each), as a batch labeler's arrays: the compiled loop reads
    labels by row. A label depends on the book (and trades before it), never on the engine's state, so
    these are the bits the engine computes per tick."""
    n = len(tape.b_seq)
    labels = np.empty(n, dtype=np.int8)
    probs = np.empty((n, N_CLASSES), dtype=np.float32)
    book = tape.book
    for i in tape.engine_book_order().tolist():
        labels[i], probs[i] = labeler(book(i))
    return _BatchLabeler(tape.b_seq, labels, probs, clock)


def _v1_labeler(
    laya: Laya, mode: str, books: pa.Table, trades: pa.Table, tape: _Tape, clock: ReplayClock
) -> Callable[[BookSnapshot], tuple[int, np.ndarray]]:
    """Features v1 (books15 + the trades received strictly before each book, on the replay's local
    timeline): all at once (batch) or per snapshot (tick); bit-identical either way."""
    if mode == "batch":
        x = features_v1_batch(books, trades, book_ts_recv=tape.b_loc, trade_ts_recv=tape.t_loc)
        labels, probs = laya.predict_batch(x)
        return _BatchLabeler(tape.b_seq, labels, probs, clock)
    order = np.lexsort((tape.t_seq, tape.t_loc)).tolist()  # the order the engine receives trades in
    state, buf, fed = FeaturesV1(), np.zeros(laya.n_features, dtype=np.float32), 0

    def label(book: BookSnapshot) -> tuple[int, np.ndarray]:
        nonlocal fed
        while fed < len(order) and tape.t_loc[order[fed]] < book.ts_recv:
            state.on_trade(tape.trade(order[fed]))
            fed += 1
        return laya.predict(state.features(book, out=buf))

    return label


def _load_laya(cfg: ReplayConfig) -> Laya:
    """Laya refuses a model trained on other features than the replay computes (``laya_features``;
    ``"auto"`` takes the model's own)."""
    return Laya(
        LayaConfig(
            model_path=Path(cfg.model_path), provider=cfg.laya_provider, feature_version=cfg.laya_features
        )
    )
