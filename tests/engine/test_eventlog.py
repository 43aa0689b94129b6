import math
import struct
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
from blake3 import blake3

from engine.eventlog import OUTPUT_STREAMS, EventLog, digest_tables
from engine.events import STREAMS
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


def _expected_digest(rows: dict[str, list[tuple]]) -> str:
    """The run digest as engine/eventlog.py's docstring defines it, written out with struct and blake3
    (no numpy, no Arrow): per column a BLAKE3 of its values (and one of the strings' lengths), then a
    BLAKE3 over every output stream's name, row count and column digests."""
    run = blake3()
    for stream in OUTPUT_STREAMS:
        fields = list(STREAMS[stream].schema)
        got = rows.get(stream, [])
        run.update(f"{stream}\t{len(got)}\n".encode())
        lines = []
        for f in fields:
            values, lengths = blake3(), blake3()
            for seq, row in enumerate(got):
                v = seq if f.name == "seq" else row[[g.name for g in fields if g.name != "seq"].index(f.name)]
                if pa.types.is_string(f.type):
                    b = v.encode()
                    values.update(b)
                    lengths.update(struct.pack("<q", len(b)))
                elif pa.types.is_decimal(f.type):
                    values.update(int(v.scaleb(12)).to_bytes(16, "little", signed=True))
                elif pa.types.is_boolean(f.type):
                    values.update(bytes([v]))
                elif pa.types.is_floating(f.type):
                    values.update(struct.pack("<d", math.nan if math.isnan(v) else v))
                else:
                    values.update(struct.pack("<q", v))
            lines.append(f"{f.name}:{values.hexdigest()}:{lengths.hexdigest()}")
        run.update("\n".join(lines).encode())
    return run.hexdigest()


def _sample_rows(stream: str, n: int) -> list[tuple]:
    out = []
    for i in range(n):
        row = []
        for k, f in enumerate(STREAMS[stream].schema):
            if f.name == "seq":
                continue
            if pa.types.is_string(f.type):
                row.append("é" * (i % 3) + f"{f.name}-{i}")
            elif pa.types.is_decimal(f.type):
                row.append(Decimal(f"{i * 13 - 7}.000000000125"))
            elif pa.types.is_boolean(f.type):
                row.append(i % 2 == 0)
            elif pa.types.is_floating(f.type):
                row.append(-math.nan if i % 4 == 1 else i * 0.25 - k)  # a NaN of another bit pattern
            else:
                row.append(1_700_000_000_000_000_000 + i * 1_000 + k)
        out.append(tuple(row))
    return out


def test_the_run_digest_is_the_documented_blake3_of_every_column(tmp_path):
    rows = {
        "kev_queue": _sample_rows("kev_queue", 5),
        "risk": _sample_rows("risk", 7),
        "fill": _sample_rows("fill", 3),
    }
    log = EventLog(tmp_path, flush_rows=2)  # row groups of 2: the hashes are fed chunk by chunk
    for stream, got in rows.items():
        for row in got:
            log.append(stream, row)
    want = _expected_digest(rows)
    assert log.digest == want
    log.write()
    tables = {s: pq.read_table(tmp_path / f"{s}.parquet") for s in OUTPUT_STREAMS}
    assert digest_tables(tables)[0] == want
    # a column in several chunks (as the drains hand them over) digests as the one array they make
    chunked = {s: pa.concat_tables([t.slice(0, 1), t.slice(1, 2), t.slice(3)]) for s, t in tables.items()}
    assert any(t.column(0).num_chunks > 1 for t in chunked.values())
    assert digest_tables(chunked)[0] == want
    # one value changed anywhere changes it
    rows["risk"][3] = rows["risk"][3][:-1] + ("other",)
    assert _expected_digest(rows) != want
