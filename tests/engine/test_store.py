import os

import duckdb
import polars as pl
import pytest

from engine.events import STREAMS, Trade, events_to_table, table_to_events
from engine.store import SessionError, SessionWriter, open_session
from tests.helpers import make_book


def _trade(i):
    return Trade(
        ts_event=i, ts_recv=i + 1, seq=i, symbol="BTCUSDT", trade_id=str(i), px=100.0 + i, sz=0.5, side="buy"
    )


def test_session_roundtrip_with_rotation_and_manifest(tmp_path):
    w = SessionWriter(tmp_path / "s", source="test", symbols=["BTCUSDT"], rows_per_part=3)
    books = [make_book(100.0, 100.1, ts=10 + i, seq=i, levels=5) for i in range(7)]
    w.add_all(books)
    w.add_all(_trade(i) for i in range(2))
    m = w.close()
    assert m["streams"] == {"books15": {"rows": 7}, "trade": {"rows": 2}}
    assert len([f for f in m["files"] if f.startswith("books15/")]) == 3
    s = open_session(tmp_path / "s")
    s.verify()
    back = s.read_events("books15")
    assert [b.seq for b in back] == list(range(7))
    assert back[0].bid_px[:5] == books[0].bid_px[:5]
    assert back[0].bid_px[5] != back[0].bid_px[5]  # NaN padding survives as NaN
    assert s.read_events("trade") == [_trade(0), _trade(1)]


def test_each_symbols_rows_are_read_apart_in_the_files_order(tmp_path):
    import dataclasses

    w = SessionWriter(tmp_path / "s", source="test", symbols=["BTCUSDT", "ETHUSDT"], rows_per_part=3)
    syms = ["BTCUSDT", "ETHUSDT", "ETHUSDT", "BTCUSDT", "ETHUSDT", "ETHUSDT", "ETHUSDT"]
    w.add_all(dataclasses.replace(_trade(i), symbol=s) for i, s in enumerate(syms))
    w.close()
    s = open_session(tmp_path / "s")
    btc, eth, sol = s.read_symbols("trade", ["BTCUSDT", "ETHUSDT", "SOLUSDT"])
    assert btc.column("seq").to_pylist() == [0, 3]
    assert eth.column("seq").to_pylist() == [1, 2, 4, 5, 6]  # a part wholly ETHUSDT's is taken whole
    assert sol.num_rows == 0 and sol.schema == STREAMS["trade"].schema
    assert table_to_events(btc, "trade") == [_trade(0), _trade(3)]


def test_books_are_wide_typed_columns_readable_by_duckdb_and_polars(tmp_path):
    w = SessionWriter(tmp_path / "s", source="test", symbols=["BTCUSDT"])
    w.add_all(make_book(100.0, 100.1, ts=i, seq=i, levels=3) for i in range(4))
    w.close()
    part = next((tmp_path / "s" / "books15").glob("*.parquet"))
    names = pl.read_parquet(part).columns
    assert "bid_px_0" in names and "ask_sz_14" in names and len(names) == 65
    assert pl.read_parquet(part).schema["bid_px_0"] == pl.Float64
    [(n_null, best)] = duckdb.sql(f"SELECT count(bid_px_5), max(bid_px_0) FROM '{part}'").fetchall()
    assert n_null == 0 and best == 100.0  # missing levels are nulls on disk


def test_unfinished_session_and_tampering_are_detected(tmp_path):
    w = SessionWriter(tmp_path / "s", source="test", symbols=["BTCUSDT"])
    w.add(make_book(ts=1))
    w.flush()
    with pytest.raises(SessionError, match="not a finished session"):
        open_session(tmp_path / "s")
    w.close()
    with pytest.raises(SessionError, match="already holds"):
        SessionWriter(tmp_path / "s", source="test", symbols=[])
    part = next((tmp_path / "s" / "books15").glob("*.parquet"))
    with open(part, "r+b") as f:
        f.seek(os.path.getsize(part) // 2)
        f.write(b"\x00garbage")
    with pytest.raises(SessionError, match="does not match its manifest blake3"):
        open_session(tmp_path / "s").verify()


def test_no_tmp_files_left_behind(tmp_path):
    w = SessionWriter(tmp_path / "s", source="test", symbols=["BTCUSDT"])
    w.add(make_book(ts=1))
    w.close()
    assert not list((tmp_path / "s").rglob("*.tmp"))


def test_every_stream_schema_roundtrips_an_empty_and_a_full_table():
    for name, spec in STREAMS.items():
        assert spec.schema.field("ts_event").type.bit_width == 64
        assert spec.schema.field("ts_recv").type.bit_width == 64
        assert table_to_events(spec.schema.empty_table(), name) == []
    t = events_to_table([_trade(3)], "trade")
    assert table_to_events(t, "trade") == [_trade(3)]


def test_extra_manifest_keys_cannot_overwrite_core_fields(tmp_path):
    with pytest.raises(ValueError, match="files"):
        SessionWriter(tmp_path / "s", source="t", symbols=[], extra={"files": {}})


def test_a_failed_atomic_write_leaves_neither_the_file_nor_its_tmp(tmp_path, monkeypatch):
    from engine.store import atomic_write_bytes

    target = tmp_path / "x.json"

    def full_disk(*_a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)  # fault injection: the write fails at its fsync
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"{}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("chosen", "first", "expect"),
    [
        (None, "replay.driver", "jemalloc 0"),  # Parquet's own buffers too: nothing from mimalloc
        (None, "pyarrow", "jemalloc"),  # pyarrow loaded first: its Python calls at least
        ("system", "replay.driver", "system 0"),
    ],
)
def test_arrow_buffers_come_from_jemalloc_unless_a_pool_is_chosen(tmp_path, chosen, first, expect):
    """mimalloc, Arrow's default, kept a replay's freed buffers out of reach of the next replay in the
    process: the project has Arrow use jemalloc, and a pool the user names in ARROW_DEFAULT_MEMORY_POOL
    stands."""
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": list(range(100_000))}), tmp_path / "x.parquet")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    code = (
        f"import {first}\n"
        "import engine.store, pyarrow as pa, pyarrow.parquet as pq\n"
        f"t = pq.read_table({str(tmp_path / 'x.parquet')!r})\n"
        "mi = pa.mimalloc_memory_pool().max_memory()\n"
        "print(pa.default_memory_pool().backend_name, mi)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith(expect), out.stdout


def test_parts_are_lz4_with_blake3_hashes_and_an_older_sha256_session_still_verifies(tmp_path):
    import hashlib

    import orjson
    import pyarrow.parquet as pq

    from engine.store import blake3_file, sha256_file

    w = SessionWriter(tmp_path / "s", source="test", symbols=["BTCUSDT"], rows_per_part=3)
    w.add_all(make_book(100.0, 100.1, ts=i, seq=i, levels=3) for i in range(5))
    m = w.close()
    for rel, meta in m["files"].items():
        p = tmp_path / "s" / rel
        assert meta["blake3"] == blake3_file(p) and "sha256" not in meta
        md = pq.ParquetFile(p).metadata
        assert {md.row_group(0).column(c).compression for c in range(md.num_columns)} == {"LZ4"}
    new = open_session(tmp_path / "s")
    new.verify()

    # the same files listed as a session written before BLAKE3 lists them: checked by sha256, and its
    # digest is what it was then (sha256 over each file's path and sha256)
    mpath = tmp_path / "s" / "manifest.json"
    old = orjson.loads(mpath.read_bytes())
    for rel, meta in old["files"].items():
        old["files"][rel] = {"rows": meta["rows"], "sha256": sha256_file(tmp_path / "s" / rel)}
    mpath.write_bytes(orjson.dumps(old))
    s = open_session(tmp_path / "s")
    s.verify()
    want = hashlib.sha256()
    for rel, meta in sorted(old["files"].items()):
        want.update(f"{rel}\t{meta['sha256']}\n".encode())
    assert s.digest() == want.hexdigest() != new.digest()
    part = next((tmp_path / "s" / "books15").glob("*.parquet"))
    with open(part, "r+b") as f:
        f.seek(os.path.getsize(part) // 2)
        f.write(b"\x00garbage")
    with pytest.raises(SessionError, match="does not match its manifest sha256"):
        s.verify()
    # an entry with no hash at all is refused when the session is opened
    old["files"][next(iter(old["files"]))] = {"rows": 1}
    mpath.write_bytes(orjson.dumps(old))
    with pytest.raises(SessionError, match="has no hash"):
        open_session(tmp_path / "s")
