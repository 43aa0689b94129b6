"""``dualhub import bitget-v2``: a capture of Bitget v2 frames made by another tool ('<ts_recv_ns> <json>'
lines, or tardis-machine raw lines) becomes the session ``dualhub record`` would have written from the
same frames, bad frames quarantined with the same reasons, and it replays with fills."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from engine.store import open_session
from recorder.importers.bitget_v2_raw import import_bitget_v2_raw
from recorder.importers.common import ImportInputError
from replay.driver import run_replay
from tests.recorder.test_record_bad_frames import CORPUS, _source
from tests.recorder.test_recorder import record, run
from venue.bitget.public_server import simulator_frames
from wire.journal import RECV, replay


def _captured(
    tmp: Path, src: list, channels: tuple[str, ...] = ("books15", "trade")
) -> list[tuple[int, bytes]]:
    """Record ``src`` from the local server; the frames as received, with their receive times."""
    run(record(tmp, src, speed=0, channels=channels))
    return [(r.ts_recv_ns, r.payload) for r in replay(tmp / "s" / "journal") if r.kind == RECV]


def _lines(frames: list[tuple[int, bytes]]) -> bytes:
    return b"".join(b"%d %s\n" % (ts, f) for ts, f in frames)


def _tardis(frames: list[tuple[int, bytes]]) -> bytes:
    out = []
    for ts, f in frames:
        try:
            msg = orjson.loads(f)
        except orjson.JSONDecodeError:
            msg = f.decode("utf-8", "replace")  # tardis keeps a non-JSON message as a string
        iso = datetime.fromtimestamp(ts // 1000 / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        out.append(orjson.dumps({"localTimestamp": iso, "message": msg}) + b"\n")
    return b"".join(out)


def test_journal_lines_import_as_the_recorder_wrote_them(tmp_path: Path) -> None:
    src, _ = _source()
    frames = _captured(tmp_path, src, ("books15", "books5", "trade"))
    rec = open_session(tmp_path / "s")
    f = tmp_path / "cap.txt.gz"
    f.write_bytes(gzip.compress(_lines(frames)))
    m = import_bitget_v2_raw(f, tmp_path / "imp")
    imp = m["import"]
    assert imp["format"] == "bitget-v2-ts-ns-json" and imp["inst_type"] == "USDT-FUTURES"
    assert imp["discarded"] == rec.manifest["recorder"]["discarded"]
    assert imp["duplicate_trades"] == rec.manifest["recorder"]["duplicate_trades"]
    s = open_session(tmp_path / "imp")
    for stream in ("books15", "trade"):
        assert s.read_table(stream).equals(rec.read_table(stream)), stream
    assert len(s.read_events("quarantine")) == len(CORPUS)


def test_tardis_machine_lines_import(tmp_path: Path) -> None:
    src, _ = _source()
    frames = _captured(tmp_path, src)
    rec = open_session(tmp_path / "s")
    f = tmp_path / "cap.jsonl"
    f.write_bytes(_tardis(frames))
    m = import_bitget_v2_raw(f, tmp_path / "imp")
    assert m["import"]["format"] == "bitget-v2-tardis-machine-raw"
    s = open_session(tmp_path / "imp")
    a, b = s.read_table("books15"), rec.read_table("books15")
    assert a.num_rows == b.num_rows and a.column("bid_px_0").equals(b.column("bid_px_0"))
    # the local time is microseconds there
    assert [t // 1000 for t in b.column("ts_recv").to_pylist()] == [
        t // 1000 for t in a.column("ts_recv").to_pylist()
    ]
    assert s.read_table("trade").num_rows == rec.read_table("trade").num_rows
    assert m["import"]["discarded"] == rec.manifest["recorder"]["discarded"]


def test_bad_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "x.txt"
    f.write_text("hello world\n")
    assert main(["import", "bitget-v2", str(f), "--out", str(tmp_path / "o")]) == 2
    assert "not a Bitget v2 capture" in capsys.readouterr().err
    f.write_text('1 {"event":"subscribe","arg":{"channel":"books15","instId":"X"}}\n')
    with pytest.raises(ImportInputError, match="no Bitget v2 public data frame"):
        import_bitget_v2_raw(f, tmp_path / "o2")
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o2.tmp").exists()


def test_an_imported_simulated_capture_replays_with_fills(tmp_path: Path) -> None:
    frames = _captured(tmp_path, list(simulator_frames(["BTCUSDT"], minutes=2, seed=3)))
    f = tmp_path / "cap.txt"
    f.write_bytes(_lines(frames) + b"this line is not a frame\n")
    assert main(["import", "bitget-v2", str(f), "--out", str(tmp_path / "imp")]) == 0
    m = orjson.loads((tmp_path / "imp" / "manifest.json").read_bytes())
    assert m["import"]["discarded"] == {"bad_line": 1}
    res = run_replay(tmp_path / "imp", out_dir=tmp_path / "r")
    assert res.counts.get("fill", 0) > 0


def test_an_imported_tardis_machine_capture_replays_with_fills(tmp_path: Path) -> None:
    frames = _captured(tmp_path, list(simulator_frames(["BTCUSDT"], minutes=2, seed=5)))
    f = tmp_path / "cap.jsonl"
    f.write_bytes(_tardis(frames))
    assert main(["import", "bitget-v2", str(f), "--out", str(tmp_path / "imp")]) == 0
    m = orjson.loads((tmp_path / "imp" / "manifest.json").read_bytes())
    assert m["import"]["format"] == "bitget-v2-tardis-machine-raw"
    assert main(["replay", str(tmp_path / "imp"), "--out", str(tmp_path / "r")]) == 0
    fills = pq.read_table(tmp_path / "r" / "events" / "fill.parquet")
    assert fills.num_rows > 0
