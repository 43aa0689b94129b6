import pyarrow as pa
import pyarrow.parquet as pq

from engine.eventlog import EventLog
from engine.state import _KernelStream, _no_seq


def _rows(first: int, n: int) -> pa.Table:
    ts = list(range(first, first + n))
    return pa.Table.from_pydict(
        {"ts_event": ts, "ts_recv": ts, "request_id": ts, "kind": ["enqueued"] * n, "depth": [1] * n},
        schema=_no_seq("kev_queue"),
    )


def test_rows_handed_over_while_the_log_flushes_keep_their_seqs_and_flush_points(tmp_path):
    """An engine driven per event hands its rows over when the log asks what a stream holds, and that
    hand-over may itself fill a row group. Seqs stay those of the rows' places, and every row group
    but the last holds flush_rows rows, as when the rows come in by themselves."""
    log = EventLog(tmp_path, flush_rows=4)
    st = _KernelStream(log, "kev_queue")
    made, buffered = [3], [0]

    def hand_over() -> None:  # the engine's buffered rows, given to the stream when the log asks
        n, buffered[0] = buffered[0], 0
        if n:
            st.add(_rows(made[0], n))
            made[0] += n

    st.before = hand_over
    st.add(_rows(0, 3))
    buffered[0] = 7
    assert log.digest  # asks: 7 more arrive inside its question, and groups fill there
    buffered[0] = 6
    made[0] += 2
    st.add(_rows(made[0] - 2, 2))  # its row-group flush asks too, and 6 more arrive inside
    buffered[0] = 5
    log.write()
    t = pq.read_table(tmp_path / "kev_queue.parquet")
    assert t.column("seq").to_pylist() == list(range(made[0]))
    assert t.column("ts_event").to_pylist() == list(range(made[0]))
    md = pq.ParquetFile(tmp_path / "kev_queue.parquet").metadata
    sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    assert sizes[:-1] == [4] * (len(sizes) - 1) and 0 < sizes[-1] <= 4, sizes
