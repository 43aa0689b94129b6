"""Label events kept as columns (replay/label_columns.py): what the log gets is every label, in the
order the labels became visible, with the book's fields and Laya's output of its row."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from engine.core import LABEL_NAMES
from engine.eventlog import EventLog
from replay.label_columns import LabelColumns


def _tape(n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    ts_event = np.arange(n, dtype=np.int64) * 10 + 1
    seq = np.arange(n, dtype=np.int64) + 100
    ts_recv = ts_event + 3
    labels = rng.integers(0, 4, n).astype(np.int8)
    probs = rng.random((n, 4)).astype(np.float32)
    return ts_event, seq, ts_recv, labels, probs


def test_an_in_memory_log_gets_every_label_past_the_first_buffer(tmp_path):
    rng = np.random.default_rng(3)
    n = 10_000  # more rows than the column buffers start with
    ts_event, seq, ts_recv, labels, probs = _tape(n, rng)
    log = EventLog()  # in memory: it keeps every label until write()
    cols = LabelColumns(log, "BTCUSDT", ts_event, seq, ts_recv, labels, probs)
    order = rng.permutation(n)  # the rows whose labels become visible, in that order
    at = np.sort(rng.integers(0, 10**12, n))
    for a in range(0, n, 3_000):
        cols.add_many(order[a : a + 3_000], at[a : a + 3_000])
    assert cols.oldest_row() == 0
    log.write(tmp_path)
    t = pq.read_table(tmp_path / "label.parquet")
    assert t.num_rows == n
    assert t.column("seq").to_pylist() == list(range(n))
    assert t.column("ts_event").to_pylist() == ts_event[order].tolist()
    assert t.column("ts_recv").to_pylist() == at.tolist()
    assert t.column("book_seq").to_pylist() == seq[order].tolist()
    assert t.column("book_ts_recv").to_pylist() == ts_recv[order].tolist()
    assert t.column("symbol").unique().to_pylist() == ["BTCUSDT"]
    assert t.column("label").to_pylist() == [LABEL_NAMES[k] for k in labels[order]]
    for k, name in enumerate(("p_hold", "p_lean_buy", "p_lean_sell", "p_emergency")):
        assert t.column(name).to_pylist() == probs[order, k].astype(np.float64).tolist(), name


def test_a_streaming_log_flushes_at_its_row_count_and_knows_the_oldest_row_still_held(tmp_path):
    rng = np.random.default_rng(4)
    n = 2_500
    ts_event, seq, ts_recv, labels, probs = _tape(n, rng)
    log = EventLog(tmp_path, flush_rows=1_000)
    cols = LabelColumns(log, "ETHUSDT", ts_event, seq, ts_recv, labels, probs)
    assert cols.oldest_row() is None
    order = rng.permutation(n)
    cols.add_many(order, np.arange(n, dtype=np.int64))
    # two row groups of 1 000 went to the log; the last 500 labels are still held as columns
    assert cols.oldest_row() == int(order[2_000:].min())
    log.write()
    f = pq.ParquetFile(tmp_path / "label.parquet")
    assert [f.metadata.row_group(g).num_rows for g in range(f.metadata.num_row_groups)] == [1_000, 1_000, 500]
    assert f.read().column("book_seq").to_pylist() == seq[order].tolist()
