"""The compiled block scan (``Normaliser(fast=True)``) writes the same session as the general path.

Same journal, normalised twice: the Parquet parts must be byte-identical (the manifest carries every
part's sha256), the tables equal, and the manifest's recorder summary (received counts, quarantine,
gaps, errors, events) equal. Journals come from the local Bitget server with faults injected, and
from a hand-built journal that mixes canonical frames with every kind of record the scan hands back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from recorder.columns import Columns
from recorder.normalise import Normaliser
from recorder.record import finish, new_writer, normalise_segment
from tests.recorder.test_recorder import SYMS, record, run
from venue.bitget.public_server import Fault, simulator_frames, toy_frames
from wire.bitget.bitget_v2 import encode_books15, encode_trades
from wire.bitget.bitget_v2_fast import REC_HEADER
from wire.journal import _REC, JournalWriter, list_segments

ASKED = {"url": "ws://test", "symbols": ["BTCUSDT", "ETHUSDT"], "channels": ["books15", "trade"]}


SCANNED: list[int] = []  # records the compiled scan took, per fast normalisation


def normalise(
    journal: Path, asked: dict[str, Any], out: Path, *, fast: bool, rows_per_part: int = 1_000_000, **kw: Any
) -> dict[str, Any]:
    norm = Normaliser(asked, fast=fast)
    SCANNED.append(norm.scanned)
    if fast and kw.get("columns") is not None:
        norm.columns = kw["columns"]
    writer = new_writer(out, asked)
    writer.rows_per_part = rows_per_part
    for _, path, _ in list_segments(journal):
        normalise_segment(path, norm, writer)
    if fast:
        SCANNED[-1] = norm.scanned
    return finish(writer, norm, {"fixed": True})


def assert_same_session(journal: Path, asked: dict[str, Any], tmp: Path, **kw: Any) -> dict[str, Any]:
    general = normalise(journal, asked, tmp / "general", fast=False, **kw)
    fast = normalise(journal, asked, tmp / "fast", fast=True, **kw)
    assert fast["recorder"] == general["recorder"]
    assert fast == general  # files, sha256 of every part, rows per stream, time span
    for rel in general["files"]:
        a, b = tmp / "general" / rel, tmp / "fast" / rel
        assert pq.read_table(a).equals(pq.read_table(b), check_metadata=True), rel
        assert a.read_bytes() == b.read_bytes(), rel
    return general


def _recorded(tmp: Path, coro: Any) -> tuple[Path, dict[str, Any]]:
    run(coro)
    s = tmp / "s"
    asked = orjson.loads((s / "record.json").read_bytes())
    return s / "journal", asked


def test_faulty_feed_same_session(tmp_path: Path) -> None:
    faults = (
        Fault(kind="garbage", at_frame=5, count=3),
        Fault(kind="truncated", at_frame=10),
        Fault(kind="error_event", at_frame=12, code="30016"),
        Fault(kind="error_event", at_frame=14, code=30001),
        Fault(kind="drop", at_frame=80),
    )
    journal, asked = _recorded(tmp_path, record(tmp_path, toy_frames(SYMS, n=120), speed=0, faults=faults))
    m = assert_same_session(journal, asked, tmp_path)
    r = m["recorder"]
    assert r["quarantined"] >= 4 and r["gaps"] and r["errors"] and m["streams"]["books15"]["rows"] > 40


@pytest.mark.parametrize("channels", [("books",), ("books15", "trade", "books")])
def test_books_channel_same_session(tmp_path: Path, channels: tuple[str, ...]) -> None:
    """``books`` pushes (general path, rebuilt top 15 into the books15 stream when alone) between
    canonical frames; a skipped seq and a bad checksum quarantine frames and open gaps."""
    faults = (Fault(kind="skip_seq", at_frame=20), Fault(kind="bad_checksum", at_frame=60))
    coro = record(tmp_path, toy_frames(SYMS, n=100), speed=0, faults=faults, channels=channels)
    journal, asked = _recorded(tmp_path, coro)
    m = assert_same_session(journal, asked, tmp_path)
    assert m["recorder"]["book_faults"] and m["streams"]["books15"]["rows"] > 40


def test_simulated_session_same_session_and_part_split(tmp_path: Path) -> None:
    """Realistic pushes (several trades a push, snapshot trade pushes), split into small parts."""
    src = list(simulator_frames(SYMS, minutes=1, seed=3))
    journal, asked = _recorded(tmp_path, record(tmp_path, src, speed=0))
    m = assert_same_session(journal, asked, tmp_path, rows_per_part=997)
    assert SCANNED[-1] > 0.95 * m["recorder"]["frames"]  # nearly all took the compiled scan
    assert len([f for f in m["files"] if f.startswith("trade/")]) > 2


def _books(sym: str, k: int) -> bytes:
    bids = [(f"{100 - i - k % 3}.5", f"{1 + i}") for i in range(1 + k % 15)]
    asks = [(f"{101 + i}.25", "0.5") for i in range(1 + (k * 7) % 15)]
    return encode_books15(sym, ts_ms=1_700_000_000_000 + k, seq=k, bids=bids, asks=asks, push_ts_ms=1)


def _trade(sym: str, k: int, n: int = 2) -> bytes:
    rows = [
        {
            "ts": str(1_700_000_000_000 + k - (i % 2)),
            "price": "100.5",
            "size": "0.1",
            "side": "sell",
            "tradeId": f"{k}-{i}",
        }
        for i in range(n)
    ]
    return encode_trades(sym, rows, push_ts_ms=1)


def test_hand_built_journal_every_record_kind(tmp_path: Path) -> None:
    """Canonical frames interleaved with what the scan hands back: non-canonical but valid frames
    (their rows must keep their place and seq), a books15 push whose second data element is bad (a
    seq number taken, then quarantined), garbage, acks, errors, pongs, sends, gap METAs, a symbol too
    long for the compiled table and one with an escape; several blocks and two segments."""
    long_sym = "X" * 80
    j = JournalWriter(tmp_path / "j")
    t = 1_700_000_000_000_000_000  # ns: the frames' exchange times are within the wire checks' window
    j.meta(t, 0xFFFF, {"t": "start"})
    j.meta(t, 0, {"t": "connect", "args": []})
    j.append(
        t,
        0,
        b'{"event":"subscribe","arg":{"instType":"USDT-FUTURES","channel":"books15","instId":"BTCUSDT"}}',
    )
    for k in range(400):
        t += 1
        sym = SYMS[k % 2]
        j.append(t, 0, _books(sym, k))
        j.append(t, 0, _trade(sym, k, 1 + k % 4))
        if k % 37 == 0:
            j.append(t, 0, _books(sym, k).replace(b'"bids":[', b'"bids": ['))  # valid, not canonical
            j.append(t, 0, _trade(sym, k).replace(b'"side":"sell"', b'"side": "sell"'))
        if k % 53 == 0:
            f = orjson.loads(_books(sym, k))
            f["data"].append({"asks": [], "bids": [], "seq": 1, "ts": "1"})  # 2nd element: empty side
            j.append(t, 0, orjson.dumps(f))
            j.append(t, 0, b"\x00garbage")
            j.append(t, 0, _books(long_sym, k))
            j.append(t, 0, _trade("ETH\\u0055SDT", k))
            j.append(
                t,
                0,
                b'{"event":"error","code":"30016","msg":"x","arg":{"channel":"books15","instId":"ETHUSDT"}}',
            )
        if k % 25 == 0:
            j.append(t, 0, b"pong")
            j.sent(t, 0, b"ping")
        if k == 200:
            j.meta(
                t,
                0,
                {"t": "gap_open", "channel": "trade", "instId": "ETHUSDT", "start_ns": t - 5, "reason": "x"},
            )
        if k == 220:
            j.meta(
                t,
                0,
                {
                    "t": "gap_close",
                    "channel": "trade",
                    "instId": "ETHUSDT",
                    "end_ns": t,
                    "how": "resubscribed",
                },
            )
        if k % 60 == 0:
            j.flush()
        if k == 250:
            j.rotate()
    j.close()
    asked = {**ASKED, "symbols": [*SYMS, long_sym]}
    m = assert_same_session(tmp_path / "j", asked, tmp_path, rows_per_part=101)
    r = m["recorder"]
    assert SCANNED[-1] == 400 + 400 + 16  # every canonical frame and pong, nothing else
    assert r["received"][f"books15:{long_sym}"]["frames"] == 8 and "trade:ETHUSDT" in r["received"]
    assert r["quarantined"] >= 16 and r["pongs"] == 16
    # the META window, and one per quarantined books15 push (k % 53 == 0): its book was lost
    assert sorted(g["reason"] for g in r["gaps"]) == ["quarantined:books15_malformed"] * 8 + ["x"]
    # the same with tiny buffers: the scan stops FULL, the buffers grow, nothing changes
    m2 = normalise(
        tmp_path / "j", asked, tmp_path / "tiny", fast=True, rows_per_part=101, columns=Columns(2, 2)
    )
    assert m2 == m


def test_scan_reads_the_journal_record_layout() -> None:
    assert _REC.format == "<qHBI" and _REC.size == REC_HEADER


def test_forced_general_path_has_no_columns() -> None:
    assert Normaliser(ASKED, fast=False).columns is None
    with pytest.raises(AssertionError):
        Normaliser(ASKED, fast=False).feed_block(b"", [])


def test_recover_uses_the_same_path(tmp_path: Path) -> None:
    """``recover`` (which goes through ``normalise_segment``) rebuilds exactly the session recorded."""
    from recorder.recover import recover

    run(record(tmp_path, toy_frames(SYMS, n=40), speed=0))
    s = tmp_path / "s"
    before = orjson.loads((s / "manifest.json").read_bytes())
    (s / "manifest.json").unlink()
    after = recover(s)
    assert after["files"] == before["files"] and after["streams"] == before["streams"]
    assert after["recorder"]["received"] == before["recorder"]["received"]
    assert after["recorder"]["journal"]["records"] == before["recorder"]["journal"]["records"]


def test_live_arg_memo_equals_peek_arg() -> None:
    """The live path's memoised ``arg`` lookup answers what parsing every frame answered."""
    from wire.connection import ArgKeys, arg_key, peek_arg

    keys = ArgKeys()
    frames = [
        _books("BTCUSDT", 1),
        _trade("ETHUSDT", 2),
        _books("BTCUSDT", 3),
        b'{"action":"x","arg":{"a":1}}',
    ]
    frames += [b'{"action":"x","arg":{bad}', b'{"action":"x","arg":[1]}', b'{"action":"x"}', b"pong"]
    for raw in frames * 2:
        a = peek_arg(raw)
        assert keys(raw) == (arg_key(a) if a is not None else None), raw
