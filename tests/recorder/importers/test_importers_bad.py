"""Importers on inputs that are not what they claim: a spot feed, the wrong market, bad files, a broken
checksum. Each refusal is one ``dualhub import: error:`` line, exit 2, no output left behind; each
fault found in data that is used becomes a ``Gap`` and a count by reason in the manifest."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from dualhub.cli import main
from engine.events import Gap
from engine.store import open_session
from recorder.importers.binance import import_binance
from recorder.importers.bitget_v1 import iter_capture, seconds_to_ns, to_v2
from recorder.normalise import Normaliser
from tests.helpers import REPO
from wire.bitget.bitget_v2 import encode_books15, encode_trades
from wire.bitget.bitget_v2_books import BooksOptions, BooksState
from wire.journal import RECV, Record

REAL = REPO / ".." / "shared" / "data" / "real"
BINANCE = REAL / "binance-usdm" / "usdm_btcusdt_20240808.gz"
BITGET_V1 = REAL / "bitget-v1" / "BITGET.ws.1.0"
MS = 1_000_000


def _line(ts: int, obj: dict) -> bytes:
    return str(ts).encode() + b" " + orjson.dumps(obj) + b"\n"


def _spot_diff(big_u: int, u: int, e_ms: int, b=(), a=(), pu: int | None = None) -> dict:
    d = {"e": "depthUpdate", "E": e_ms, "s": "BTCUSDT", "U": big_u, "u": u, "b": list(b), "a": list(a)}
    if pu is not None:
        d["pu"] = pu  # futures diffs carry it, spot diffs do not
    return {"stream": "btcusdt@depth@100ms", "data": d}


def _trade(t: int, e_ms: int, px: str, m: bool) -> dict:
    data = {
        "e": "trade",
        "E": e_ms,
        "s": "BTCUSDT",
        "t": t,
        "p": px,
        "q": "0.1",
        "T": e_ms,
        "m": m,
        "M": True,
    }
    return {"stream": "btcusdt@trade", "data": data}


def spot_feed() -> list[bytes]:
    """A small Binance spot raw feed: diffs before the REST snapshot (one stale, one straddling
    lastUpdateId+1), continuous diffs (U == previous u + 1), trades, a ticker, a break in U, a second
    snapshot line that re-syncs the book, a bad JSON line."""
    snap1 = {
        "lastUpdateId": 100,
        "bids": [["10.0", "1"], ["9.5", "2"]],
        "asks": [["11.0", "1"], ["11.5", "3"]],
    }
    snap2 = {"lastUpdateId": 300, "bids": [["10.0", "4"]], "asks": [["10.5", "4"]]}
    ticker = {"stream": "btcusdt@bookTicker", "data": {"u": 1, "s": "BTCUSDT", "b": "10", "a": "11"}}
    return [
        _line(1, _spot_diff(90, 100, 1_000, b=[["9.0", "1"]])),  # u <= lastUpdateId: stale
        _line(2, _spot_diff(101, 105, 1_050, b=[["10.2", "2"]])),  # U <= 101 <= u: the first applied
        _line(3, snap1),
        _line(4, _spot_diff(106, 110, 1_250, a=[["11.0", "0"]])),  # best ask 11.0 -> 11.5
        _line(5, _trade(1, 1_260, "10.2", True)),
        _line(6, ticker),
        _line(7, _trade(2, 1_270, "11.5", False)),
        _line(8, _spot_diff(111, 120, 1_420, b=[["10.4", "1"]])),
        _line(9, _spot_diff(125, 130, 1_530, b=[["10.6", "1"]])),  # U != 121: a gap from 1 420
        _line(10, _spot_diff(131, 140, 1_640)),  # out of sync: waits for a snapshot
        b"11 {not json\n",
        _line(12, snap2),  # 125..130 and 131..140 are stale against it
        _line(13, _spot_diff(295, 305, 1_880, a=[["10.8", "1"]])),  # straddles 301: in sync again
        _line(14, _spot_diff(306, 310, 2_090)),
    ]


def _write(path: Path, lines: list[bytes], *, gz: bool = False) -> Path:
    data = b"".join(lines)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], out: Path) -> str:
    """Runs the real CLI: exit 2, one stderr line, no traceback, no output or <out>.tmp left."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dualhub import: error: "), err
    assert "Traceback" not in err
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()
    return err


# ---------------------------------------------------------------- Binance spot


def test_spot_feed_rebuilds_books_and_counts_every_discard(tmp_path: Path, capsys) -> None:
    src = _write(tmp_path / "spot_btcusdt.txt", spot_feed())
    out = tmp_path / "s"
    assert main(["import", "binance-spot", str(src), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    s = open_session(out)
    s.verify()
    imp = s.manifest["import"]
    assert imp["market"] == "spot" and imp["crossed"] == 0 and imp["trades"] == 2
    assert imp["skipped"] == {"bookTicker": 1}
    assert imp["discarded"] == {"stale_diff": 3, "bad_json": 1}
    assert imp["depth_diffs"] == 8 == imp["depth_applied"] + imp["discarded"]["stale_diff"]
    books = s.read_events("books15")
    got = [(b.ts_event // MS, b.bid_px[0], b.bid_sz[0], b.ask_px[0]) for b in books]
    assert got == [
        (1_100, 10.2, 2.0, 11.0),  # snapshot + the straddling diff
        (1_200, 10.2, 2.0, 11.0),
        (1_300, 10.2, 2.0, 11.5),  # the ask at 11.0 deleted at 1 250
        (1_400, 10.2, 2.0, 11.5),
        # 1 500 .. 1 800: out of sync, nothing emitted
        (1_900, 10.0, 4.0, 10.5),  # the second snapshot + the diff at 1 880
        (2_000, 10.0, 4.0, 10.5),
    ]
    assert all(b.bid_px[0] < b.ask_px[0] for b in books)
    (gap,) = s.read_events("gap")
    assert isinstance(gap, Gap) and (gap.channel, gap.symbol) == ("depth", "BTCUSDT")
    # from the last applied diff to the first one applied after the second snapshot line
    assert (gap.start_ns, gap.end_ns) == (1_420 * MS, 1_880 * MS)
    assert "U=125 != previous u+1=121" in gap.reason
    assert imp["gap_windows"] == [
        {
            "symbol": "BTCUSDT",
            "channel": "depth",
            "start_ns": gap.start_ns,
            "end_ns": gap.end_ns,
            "reason": gap.reason,
        }
    ]
    trades = s.read_events("trade")
    assert [(t.side, t.px) for t in trades] == [("sell", 10.2), ("buy", 11.5)]


def test_spot_feed_to_futures_importer_is_refused(tmp_path: Path, capsys) -> None:
    src = _write(tmp_path / "spot.txt", spot_feed())
    out = tmp_path / "s"
    err = _fails(capsys, ["import", "binance-futures", str(src), "--out", str(out)], out)
    assert "spot" in err and "dualhub import binance-spot" in err


def test_futures_feed_to_spot_importer_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "s"
    err = _fails(capsys, ["import", "binance-spot", str(BINANCE), "--out", str(out)], out)
    assert "futures" in err and "dualhub import binance-futures" in err


def test_futures_rule_is_pu_not_u_plus_one(tmp_path: Path) -> None:
    """The same diffs with ``pu`` and gaps between U and the previous u: continuous for futures."""
    snap = {"lastUpdateId": 100, "bids": [["10.0", "1"]], "asks": [["11.0", "1"]]}
    lines = [
        _line(1, snap),
        _line(2, _spot_diff(95, 105, 1_000, pu=94)),
        _line(3, _spot_diff(110, 120, 1_200, pu=105)),  # U != 106, but pu == 105: in sync
        _line(4, _spot_diff(125, 130, 1_400, pu=120)),
    ]
    src = _write(tmp_path / "f.txt", lines)
    imp = import_binance(src, tmp_path / "s", market="futures")["import"]
    assert imp["gaps"] == 0 and imp["depth_applied"] == 3 and imp["discarded"] == {}


# ---------------------------------------------------------------- bad files


def _garbage_cases(tmp: Path) -> dict[str, tuple[str, Path, str]]:
    """name -> (importer, file, a word the message must contain)."""
    futures_lines = [_line(1, _spot_diff(1, 2, 1_000, pu=0))]
    trades_only = [_line(1, _trade(1, 1_000, "10", True)), _line(2, _trade(2, 1_001, "10", False))]
    gz = tmp / "full.gz"
    _write(gz, spot_feed(), gz=True)
    truncated = tmp / "truncated.gz"
    truncated.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    random = tmp / "random.bin"
    random.write_bytes(bytes(range(256)) * 8)
    (tmp / "empty.txt").write_bytes(b"")
    (tmp / "blank.txt").write_bytes(b"\n\n")
    (tmp / "empty.gz").write_bytes(gzip.compress(b""))
    (tmp / "doc.json").write_bytes(orjson.dumps({"lastUpdateId": 1, "bids": [], "asks": []}))
    (tmp / "zstd.txt").write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 32)
    (tmp / "capture.ws").write_bytes(BITGET_V1.read_bytes()[:20_000])
    _write(tmp / "futures_lines.txt", futures_lines)
    _write(tmp / "trades_only.txt", trades_only)
    _write(tmp / "no_snapshot.txt", [x for x in spot_feed() if b"lastUpdateId" not in x])
    return {
        "missing": ("binance-futures", tmp / "nope.gz", "no such file"),
        "missing_v1": ("bitget-v1", tmp / "nope.ws", "no such file"),
        "directory": ("bitget-v1", tmp, "not a regular file"),
        "empty": ("binance-spot", tmp / "empty.txt", "empty"),
        "blank_lines": ("binance-spot", tmp / "blank.txt", "empty"),
        "empty_v1": ("bitget-v1", tmp / "empty.txt", "empty"),
        "empty_gzip": ("binance-futures", tmp / "empty.gz", "empty"),
        "truncated_gzip": ("binance-spot", truncated, "truncated"),
        "truncated_gzip_v1": ("bitget-v1", truncated, "truncated"),
        "random_bytes": ("binance-futures", random, "not a Binance raw feed"),
        "random_bytes_v1": ("bitget-v1", random, "not a Bitget capture"),
        "json_document": ("binance-futures", tmp / "doc.json", "not a Binance raw feed"),
        "json_document_v1": ("bitget-v1", tmp / "doc.json", "not a Bitget capture"),
        "zstd": ("binance-futures", tmp / "zstd.txt", "zstd"),
        "bitget_capture_to_binance": ("binance-futures", tmp / "capture.ws", "not a Binance raw feed"),
        "binance_feed_to_bitget": ("bitget-v1", BINANCE, "not a Bitget capture"),
        "trades_only": ("binance-spot", tmp / "trades_only.txt", "no depth diffs"),
        "no_snapshot_line": ("binance-spot", tmp / "no_snapshot.txt", "no REST depth snapshot"),
        "one_diff_no_snapshot": ("binance-futures", tmp / "futures_lines.txt", "no order book"),
    }


CASES = [
    "missing", "missing_v1", "directory", "empty", "blank_lines", "empty_v1", "empty_gzip",
    "truncated_gzip", "truncated_gzip_v1", "random_bytes", "random_bytes_v1", "json_document",
    "json_document_v1", "zstd", "bitget_capture_to_binance", "binance_feed_to_bitget", "trades_only",
    "no_snapshot_line", "one_diff_no_snapshot",
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_bad_file_is_one_line_exit_2_nothing_written(case: str, tmp_path: Path, capsys) -> None:
    src_dir = tmp_path / "in"
    src_dir.mkdir()
    importer, src, word = _garbage_cases(src_dir)[case]
    out = tmp_path / "out" / "s"
    err = _fails(capsys, ["import", importer, str(src), "--out", str(out)], out)
    assert word in err, err


@pytest.mark.parametrize("name,gz", [("spot.txt", True), ("spot.gz", False), ("spot.gz", True)])
def test_compression_is_told_by_magic_bytes_not_by_name(name: str, gz: bool, tmp_path: Path, capsys) -> None:
    plain = _write(tmp_path / "plain.txt", spot_feed())
    assert main(["import", "binance-spot", str(plain), "--out", str(tmp_path / "ref")]) == 0
    src = _write(tmp_path / name, spot_feed(), gz=gz)
    assert main(["import", "binance-spot", str(src), "--out", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    ref, got = open_session(tmp_path / "ref"), open_session(tmp_path / "s")
    assert got.manifest["files"] == ref.manifest["files"]  # the same rows, byte for byte
    assert got.manifest["import"]["discarded"] == ref.manifest["import"]["discarded"]


def test_out_that_exists_or_is_a_file_is_refused_before_reading(tmp_path: Path, capsys) -> None:
    src = _write(tmp_path / "spot.txt", spot_feed())
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep me")
    assert main(["import", "binance-spot", str(src), "--out", str(full)]) == 2
    assert capsys.readouterr().err.startswith("dualhub import: error: ")
    assert (full / "x").read_text() == "keep me" and not (tmp_path / "full.tmp").exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert main(["import", "binance-spot", str(src), "--out", str(a_file / "s")]) == 2
    assert capsys.readouterr().err.startswith("dualhub import: error: ")
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    assert main(["import", "binance-spot", str(src), "--out", str(empty)]) == 0  # an empty dir is fine
    open_session(empty).verify()


def test_stale_tmp_of_an_interrupted_import_is_replaced(tmp_path: Path, capsys) -> None:
    src = _write(tmp_path / "spot.txt", spot_feed())
    stale = tmp_path / "s.tmp"
    stale.mkdir()
    (stale / "junk").write_text("x")
    assert main(["import", "binance-spot", str(src), "--out", str(tmp_path / "s")]) == 0
    assert not stale.exists() and not (tmp_path / "s" / "junk").exists()


@pytest.mark.parametrize("exc,rc", [(KeyboardInterrupt(), 130), (OSError(28, "No space left on device"), 2)])
def test_import_stopped_while_writing_leaves_nothing(exc, rc, tmp_path: Path, capsys, monkeypatch) -> None:
    from engine.store import SessionWriter

    def stopped(self: SessionWriter) -> None:
        raise exc

    monkeypatch.setattr(SessionWriter, "close", stopped)
    src = _write(tmp_path / "spot.txt", spot_feed())
    out = tmp_path / "s"
    assert main(["import", "binance-spot", str(src), "--out", str(out)]) == rc
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    if rc == 2:
        assert err.startswith("dualhub import: error: cannot write") and "No space left" in err
    assert not out.exists() and not (tmp_path / "s.tmp").exists()


# ---------------------------------------------------------------- gaps from faults in the data


def _v1_books_lines(path: Path) -> list[tuple[int, dict]]:
    """(index among the file's lines, frame) of every books push."""
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        ts, sep, text = line.partition(": ")
        if sep and not line.startswith("wss://"):
            f = orjson.loads(text)
            if "event" not in f and f["arg"]["channel"] == "books":
                out.append((i, f))
    return out


def test_bitget_v1_bad_checksum_is_a_gap_until_the_next_snapshot(tmp_path: Path, capsys) -> None:
    lines = BITGET_V1.read_text().splitlines()
    pushes = _v1_books_lines(BITGET_V1)
    sym = pushes[0][1]["arg"]["instId"]
    mine = [(i, f) for i, f in pushes if f["arg"]["instId"] == sym]
    k = len(mine) // 2
    bad_i, bad = mine[k]
    assert bad["action"] == "update"
    bad["data"][0]["checksum"] += 1
    lines[bad_i] = lines[bad_i].partition(": ")[0] + ": " + orjson.dumps(bad).decode()
    after = len(mine) - k - 1  # updates of this symbol that follow: no snapshot to apply them to
    # the true book at the end of the file (rebuilt from the untouched capture) as a fresh snapshot
    st = BooksState(BooksOptions(verify_snapshot_checksum=True))
    for c in iter_capture(BITGET_V1):
        if c.kind == "recv" and '"books"' in c.text and '"event"' not in c.text:
            f = to_v2(orjson.loads(c.text))
            for d in f["data"]:
                st.apply(f["arg"]["instId"], f["action"], d)
    book = st.book(sym)
    last_ts = lines[-1].partition(": ")[0]
    resync_ts = f"{float(last_ts) + 1:.6f}"
    snap = {
        "action": "snapshot",
        "arg": {"instType": "sp", "channel": "books", "instId": sym},
        "data": [
            {"asks": book.asks(), "bids": book.bids(), "checksum": book.checksum(), "ts": "1649290108000"}
        ],
    }
    src = tmp_path / "BITGET.ws.tampered"
    src.write_text("\n".join([*lines, f"{resync_ts}: {orjson.dumps(snap).decode()}"]) + "\n")
    out = tmp_path / "s"
    assert main(["import", "bitget-v1", str(src), "--out", str(out)]) == 0
    capsys.readouterr()
    s = open_session(out)
    s.verify()
    imp = s.manifest["import"]
    assert imp["discarded"] == {"books_checksum": 1, "books_no_snapshot": after}
    assert [f["reason"] for f in imp["book_faults"]] == ["checksum"] + ["no_snapshot"] * after
    (gap,) = s.read_events("gap")
    prev_ts = lines[mine[k - 1][0]].partition(": ")[0]
    assert (gap.channel, gap.symbol, gap.reason) == ("books", sym, "books_checksum")
    assert (gap.start_ns, gap.end_ns) == (seconds_to_ns(prev_ts), seconds_to_ns(resync_ts))
    # 443 pushes, less the broken one and those waiting for a snapshot, plus the resync snapshot
    assert s.manifest["streams"]["books15"]["rows"] == 443 - 1 - after + 1
    assert s.manifest["streams"]["quarantine"]["rows"] == 1 + after


def test_bitget_v1_bad_checksum_without_resync_runs_to_the_end(tmp_path: Path, capsys) -> None:
    lines = BITGET_V1.read_text().splitlines()
    (i, f), *_ = [(i, f) for i, f in _v1_books_lines(BITGET_V1) if f["action"] == "update"]
    f["data"][0]["checksum"] += 1
    lines[i] = lines[i].partition(": ")[0] + ": " + orjson.dumps(f).decode()
    src = tmp_path / "t.ws"
    src.write_text("\n".join(lines) + "\n")
    assert main(["import", "bitget-v1", str(src), "--out", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    (gap,) = open_session(tmp_path / "s").read_events("gap")
    assert gap.symbol == f["arg"]["instId"] and gap.reason == "books_checksum;unresolved_at_end_of_file"
    assert gap.end_ns > gap.start_ns


def test_bitget_v1_bad_trade_push_is_a_gap_and_counted(tmp_path: Path, capsys) -> None:
    lines = BITGET_V1.read_text().splitlines()
    idx = [i for i, x in enumerate(lines) if '"channel":"trade"' in x and '"action":"update"' in x]
    i = idx[len(idx) // 2]
    ts, _, text = lines[i].partition(": ")
    f = orjson.loads(text)
    f["data"][0][3] = "sideways"
    lines[i] = f"{ts}: {orjson.dumps(f).decode()}"
    lines.insert(i + 1, "this line is not a capture line")
    src = tmp_path / "t.ws"
    src.write_text("\n".join(lines) + "\n")
    assert main(["import", "bitget-v1", str(src), "--out", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    s = open_session(tmp_path / "s")
    assert s.manifest["import"]["discarded"] == {"trade_malformed": 1, "bad_line": 1}
    (gap,) = s.read_events("gap")
    sym = f["arg"]["instId"]
    prev = [x for x in lines[:i] if '"channel":"trade"' in x and f'"instId":"{sym}"' in x][-1]
    assert (gap.channel, gap.symbol, gap.reason) == ("trade", sym, "quarantined:trade_malformed")
    assert (gap.start_ns, gap.end_ns) == (seconds_to_ns(prev.partition(": ")[0]), seconds_to_ns(ts))


# ---------------------------------------------------------------- the recorder's quarantines


def test_recorder_quarantined_frame_that_names_its_arg_is_a_gap() -> None:
    """A truncated books15 / trade frame is data lost for that arg: a gap from the arg's previous frame.
    Garbage names nothing (quarantine only); a broken ``books`` push is the live connection's gap."""
    n = Normaliser({"symbols": ["BTCUSDT", "ETHUSDT"], "channels": ["books15", "trade"]}, fast=False)
    book = encode_books15("BTCUSDT", ts_ms=1, seq=1, bids=[("1.0", "1")], asks=[("2.0", "1")], push_ts_ms=1)
    trade = encode_trades(
        "ETHUSDT", [{"ts": "1", "price": "1", "size": "1", "side": "buy", "tradeId": "1"}], push_ts_ms=1
    )
    books_push = b'{"action":"update","arg":{"instType":"SPOT","channel":"books","instId":"BTCUSDT"},"data":['
    frames = [(100, book), (110, trade), (200, book[:120]), (210, trade[:110]), (220, b"\x00garbage"),
              (230, books_push), (300, book)]  # fmt: skip
    events = [e for ts, raw in frames for e in n.feed(Record(ts, 0, RECV, raw))]
    gaps = [e for e in events if isinstance(e, Gap)]
    assert [(g.channel, g.symbol, g.start_ns, g.end_ns) for g in gaps] == [
        ("books15", "BTCUSDT", 100, 200),
        ("trade", "ETHUSDT", 110, 210),
    ]
    assert all(g.reason == "quarantined:bad_json" for g in gaps)
    summary = n.summary()
    assert summary["quarantined"] == 4 and summary["discarded"] == {"bad_json": 4}
    assert [(g["channel"], g["start_ns"]) for g in summary["gaps"]] == [("books15", 100), ("trade", 110)]
    assert summary["events"]["Gap"] == 2
