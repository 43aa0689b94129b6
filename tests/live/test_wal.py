"""The live write-ahead journal (live/wal.py): what is committed reads back exactly; a torn tail is
ignored, a damaged record stops the read there with one line naming it, never a traceback; the CLI
refuses a journal it cannot read with one error line, changing nothing."""

import subprocess
import sys
from decimal import Decimal

import pyarrow as pa
import pytest

from engine.events import STREAMS, ReconcileEvent
from engine.kev.cassette import CassetteEntry
from live.wal import MAGIC, WAL_FILE, JournaledLog, JournaledSink, LiveWal, load_wal, scan_wal
from tests.helpers import REPO as ROOT

HEADER = {"run": "live-BTCUSDT", "mode": "paper", "manifest": {"kind": "live", "symbols": ["BTCUSDT"]}}


class _Stream:
    """Stands in for one of the core's output streams: what the log is handed (JournaledLog.watch)."""

    def __init__(self) -> None:
        self.got: list[pa.Table] = []

    def add(self, table: pa.Table) -> None:
        self.got.append(table)


def _label(i: int) -> tuple:
    return (1_000 + i, 2_000 + i, "BTCUSDT", i, 1_500 + i, "HOLD", 0.7, 0.1, 0.1, 0.05, 0.05)


def _write(path, fsync_ms=0):
    wal = LiveWal(path, HEADER, fsync_ms=fsync_ms)
    log = JournaledLog(None, wal)
    sink = JournaledSink(wal)
    stream = _Stream()
    log.watch({"order": stream})
    no_seq = pa.schema([f for f in STREAMS["order"].schema if f.name != "seq"])  # as the core's tables
    orders = pa.Table.from_pylist(
        [
            {"ts_event": 5, "ts_recv": 7, "client_oid": "dh-1", "symbol": "BTCUSDT", "kind": "new",
             "side": "buy", "order_type": "limit", "px": 30000.1, "qty": 0.01, "reason": ""},
            {"ts_event": 6, "ts_recv": 9_999, "client_oid": "dh-1", "symbol": "BTCUSDT", "kind": "ack",
             "side": "buy", "order_type": "limit", "px": 30000.1, "qty": 0.01, "reason": ""},
        ],
        schema=no_seq,
    )  # fmt: skip
    for i in range(3):
        log.append("label", _label(i))
        sink.add("laya", 1_500 + i, 400 + i)
    stream.add(orders)  # as the core hands rows over
    wal.commit()
    wal.event(
        "reconcile",
        ReconcileEvent(
            ts_event=1,
            ts_recv=2,
            seq=0,
            symbol="BTCUSDT",
            kind="missed_fill",
            client_oid="dh-1",
            order_id="9",
            engine_value=0.0,
            exchange_value=0.01,
            action="fill_applied",
        ),  # fmt: skip
    )
    wal.cassette(0, CassetteEntry(key="k", raw='{"a": 1}', error="", lag_ns=5, request_id=1))
    for i in range(3, 5):
        log.append("label", _label(i))
    stats = wal.close()
    return orders, stream, stats


def test_what_is_committed_reads_back_exactly(tmp_path):
    path = tmp_path / WAL_FILE
    orders, stream, stats = _write(path, fsync_ms=0)
    assert stream.got == [orders]  # the stream still gets every table
    assert stats["fsyncs"] >= 3 and stats["records"] >= 7  # fsync_ms 0: every commit fsyncs
    c = load_wal(path)
    assert c.scan.problem == "" and c.scan.good_bytes == c.scan.total_bytes == path.stat().st_size
    assert c.header == HEADER
    assert c.rows["label"] == [_label(i) for i in range(5)]
    assert c.tables["order"][0].equals(orders)
    assert c.latency == [("laya", 1_500 + i, 400 + i) for i in range(3)]
    assert c.events["reconcile"][0]["exchange_value"] == 0.01
    assert c.cassette[0]["raw"] == '{"a": 1}' and c.cassette[0]["lag_ns"] == 5
    assert c.last_ts_ns == 9_999  # the latest ts_recv journaled
    assert c.stream_rows("label") == 5 and c.stream_rows("order") == 2


def test_group_commit_fsyncs_off_the_loop(tmp_path):
    path = tmp_path / WAL_FILE
    wal = LiveWal(path, HEADER, fsync_ms=5)
    for i in range(20):
        wal.rows.append(("label", _label(i)))
        wal.commit()
    stats = wal.close()
    assert stats["commits"] >= 21 and 1 <= stats["fsyncs"] < stats["commits"]  # grouped
    assert load_wal(path).rows["label"] == [_label(i) for i in range(20)]


def test_a_torn_tail_is_ignored(tmp_path):
    path = tmp_path / WAL_FILE
    _write(path)
    whole = load_wal(path)
    data = path.read_bytes()
    for cut in (1, 5, 9):  # the last record cut short
        path.write_bytes(data[:-cut])
        c = load_wal(path)
        assert "torn tail" in c.scan.problem and "\n" not in c.scan.problem
        assert len(c.scan.records) == len(whole.scan.records) - 1
        assert c.rows["label"] == [_label(i) for i in range(3)]  # the last commit's two labels are gone
    path.write_bytes(MAGIC[:3])
    c = load_wal(path)
    assert "torn header" in c.scan.problem and c.header == {} and c.scan.records == []


def test_a_damaged_record_stops_the_read_there(tmp_path):
    path = tmp_path / WAL_FILE
    _write(path)
    whole = scan_wal(path)
    data = bytearray(path.read_bytes())
    # the third record's payload: offsets from a scan of the records' lengths
    pos = len(MAGIC)
    for _ in range(2):
        pos += 8 + int.from_bytes(data[pos : pos + 4], "little")
    data[pos + 12] ^= 0xFF
    path.write_bytes(bytes(data))
    c = load_wal(path)
    assert f"record 2 at byte {pos}: CRC mismatch" in c.scan.problem
    assert len(c.scan.records) == 2 < len(whole.records) and c.scan.good_bytes == pos
    assert c.header == HEADER  # what came before it is kept
    # a length that cannot be: damage, not a record
    data[pos : pos + 4] = (1 << 31).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert "impossible length" in load_wal(path).scan.problem


def test_a_record_that_passes_its_crc_and_cannot_be_decoded_is_one_line(tmp_path):
    path = tmp_path / WAL_FILE
    wal = LiveWal(path, HEADER, fsync_ms=0)
    wal.writer.add(b"R", b'{"s": "no_such_stream", "r": []}')
    wal.rows.append(("label", _label(0)))
    wal.close()
    c = load_wal(path)
    assert "record 1 (R) cannot be decoded" in c.scan.problem and "no_such_stream" in c.scan.problem
    assert c.rows == {} and c.header == HEADER


def test_decimals_survive_the_json_rows(tmp_path):
    path = tmp_path / WAL_FILE
    wal = LiveWal(path, HEADER, fsync_ms=0)
    row = (1, 2, "dh-1", "BTCUSDT", "buy", 30000.5, 0.01, "maker", Decimal("300.005"), Decimal("-0.06"), 0.01)
    wal.rows.append(("fill", row))
    wal.close()
    assert load_wal(path).rows["fill"] == [row]


@pytest.mark.parametrize("content", [b"not a journal at all", MAGIC + b"\x05\x00\x00\x00garbage!!"])
def test_recover_refuses_an_unreadable_journal_with_one_line(tmp_path, content):
    run = tmp_path / "s" / "runs" / "live-BTCUSDT.tmp"
    run.mkdir(parents=True)
    (run / WAL_FILE).write_bytes(content)
    p = subprocess.run(
        [sys.executable, "-m", "dualhub.cli", "recover", str(tmp_path / "s")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith("dualhub recover: error: ") and "Traceback" not in p.stderr
    assert "nothing to rebuild" in lines[-1] or "not a dualhub live journal" in p.stderr
    assert (run / WAL_FILE).read_bytes() == content  # nothing changed
