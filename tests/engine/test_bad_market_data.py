"""Bad market data at the door: a corpus of broken sessions, each either replayed without its invalid
rows (reported as quarantine events, in the manifest and on the console, the same events on both
engine paths) or refused with one line and nothing left behind."""

import dataclasses
import math
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from engine import validate as V
from engine.store import SessionWriter, blake3_file, open_session
from replay.config import ReplayConfig
from replay.driver import run_replay
from tests.helpers import make_book
from venue.simulator import simulate_session


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=1.0, seed=11)


def _set(table: pa.Table, column: str, rows: dict[int, object]) -> pa.Table:
    values = table.column(column).to_pylist()
    for i, v in rows.items():
        values[i] = v
    i = table.schema.get_field_index(column)
    return table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))


def _session(base: Path, out: Path, books=None, trades=None) -> Path:
    """``base`` with its books/trades replaced, written by the project's SessionWriter."""
    src = open_session(base)
    w = SessionWriter(out, source="test", symbols=["BTCUSDT"])
    w.add_table("books15", books if books is not None else src.read_table("books15"))
    w.add_table("trade", trades if trades is not None else src.read_table("trade"))
    w.close()
    return out


def _books(base):
    return open_session(base).read_table("books15")


def _trades(base):
    return open_session(base).read_table("trade")


def _crossed(t, i):
    return _set(t, "bid_px_0", {i: t.column("ask_px_0")[i].as_py() + 1.0})


def _case_rows(base):
    """name -> (books, trades, expected quarantine counts)."""
    b, t = _books(base), _trades(base)
    ask0 = b.column("ask_px_0").to_pylist()
    recv = b.column("ts_recv").to_pylist()
    one_sided = b
    for k in range(15):
        one_sided = _set(one_sided, f"ask_px_{k}", {21: None})
        one_sided = _set(one_sided, f"ask_sz_{k}", {21: None})
    swapped = _set(b, "bid_px_1", {22: b.column("bid_px_2")[22].as_py()})
    swapped = _set(swapped, "bid_px_2", {22: b.column("bid_px_1")[22].as_py()})
    trecv = t.column("ts_recv").to_pylist()
    mixed_b = _crossed(_set(b, "bid_sz_0", {40: -1.0}), 41)
    mixed_b = _set(mixed_b, "ts_recv", {42: recv[42] - 3_600_000_000_000})
    return {
        "nan_price": (_set(b, "bid_px_0", {10: math.nan}), None, {"books15": {"nan_price": 1}}),
        "inf_price": (_set(b, "ask_px_0", {11: math.inf}), None, {"books15": {"inf_price": 1}}),
        "negative_price": (_set(b, "bid_px_0", {12: -5.0}), None, {"books15": {"nonpositive_price": 1}}),
        "zero_price": (_set(b, "ask_px_3", {13: 0.0}), None, {"books15": {"nonpositive_price": 1}}),
        "negative_size": (_set(b, "bid_sz_3", {14: -1.0}), None, {"books15": {"negative_size": 1}}),
        "nan_size": (_set(b, "ask_sz_0", {14: math.nan}), None, {"books15": {"nonfinite_size": 1}}),
        "crossed": (_crossed(b, 15), None, {"books15": {"crossed_book": 1}}),
        "locked": (_set(b, "bid_px_0", {16: ask0[16]}), None, {"books15": {"locked_book": 1}}),
        "one_sided": (one_sided, None, {"books15": {"one_sided_book": 1}}),
        "unordered_levels": (swapped, None, {"books15": {"unordered_levels": 1}}),
        "time_back_1ms": (
            _set(b, "ts_recv", {30: recv[29] - 1_000_000}),
            None,
            {"books15": {"time_backwards": 1}},
        ),
        "time_back_1h": (
            _set(b, "ts_recv", {31: recv[31] - 3_600_000_000_000}),
            None,
            {"books15": {"time_backwards": 1}},
        ),
        "bad_trades": (
            None,
            _set(
                _set(_set(t, "px", {5: math.nan, 6: 0.0}), "sz", {7: -0.5, 8: math.inf}),
                "side",
                {9: "hold"},
            ),
            {
                "trade": {
                    "nan_price": 1,
                    "nonpositive_price": 1,
                    "nonfinite_size": 1,
                    "nonpositive_size": 1,
                    "bad_side": 1,
                }
            },
        ),
        "trade_time_back": (
            None,
            _set(t, "ts_recv", {50: trecv[49] - 5_000_000_000}),
            {"trade": {"time_backwards": 1}},
        ),
        "mixed": (
            mixed_b,
            _set(t, "px", {3: -1.0}),
            {
                "books15": {"negative_size": 1, "crossed_book": 1, "time_backwards": 1},
                "trade": {"nonpositive_price": 1},
            },
        ),
    }


CASES = [
    "nan_price",
    "inf_price",
    "negative_price",
    "zero_price",
    "negative_size",
    "nan_size",
    "crossed",
    "locked",
    "one_sided",
    "unordered_levels",
    "time_back_1ms",
    "time_back_1h",
    "bad_trades",
    "trade_time_back",
    "mixed",
]


def test_labels_per_tick_on_the_whole_tables_of_a_quarantined_session(base, tmp_path):
    """Rows quarantined: the kernel runs on whole tables, and its labels per tick (each row through the
    tick path before the walk) are the ones the per-event engine computes book by book."""
    books, trades, _ = _case_rows(base)["mixed"]
    s = _session(base, tmp_path / "s", books, trades)
    cfg = ReplayConfig(seed=2, laya_mode="tick")
    kn = run_replay(s, cfg, out_dir=tmp_path / "k")
    py = run_replay(s, cfg, out_dir=tmp_path / "p", kernel=False)
    assert kn.path.startswith("kernel (tape whole: "), kn.path
    assert py.path.startswith("python"), py.path
    assert kn.digest == py.digest and kn.counts == py.counts
    labels = pq.read_table(kn.run_dir / "events" / "label.parquet")
    assert labels.num_rows == kn.books and len(set(labels.column("label").to_pylist())) > 1


@pytest.mark.parametrize("case", CASES)
def test_invalid_rows_are_quarantined_and_both_paths_agree(base, tmp_path, case):
    books, trades, want = _case_rows(base)[case]
    s = _session(base, tmp_path / "s", books, trades)
    cfg = ReplayConfig(seed=2)
    kn = run_replay(s, cfg, out_dir=tmp_path / "k")
    py = run_replay(s, cfg, out_dir=tmp_path / "p", kernel=False)
    assert kn.path.startswith("kernel") and py.path.startswith("python"), (kn.path, py.path)
    assert kn.path.startswith("kernel (tape whole: "), kn.path  # found while streaming: whole tables
    assert kn.quarantine == py.quarantine == want
    assert kn.digest == py.digest and kn.counts == py.counts
    n_bad = {k: sum(v.values()) for k, v in want.items()}
    total = open_session(s).manifest["streams"]
    assert kn.books == total["books15"]["rows"] - n_bad.get("books15", 0)
    assert kn.trades == total["trade"]["rows"] - n_bad.get("trade", 0)
    for run in (kn, py):
        manifest = orjson.loads((run.run_dir / "manifest.json").read_bytes())
        assert manifest["quarantine"] == want
        q = pq.read_table(run.run_dir / "events" / "input_quarantine.parquet")
        assert (
            manifest["files"]["events/input_quarantine.parquet"]["rows"] == q.num_rows == sum(n_bad.values())
        )
        assert q.column("seq").to_pylist() == list(range(q.num_rows))
        got: dict[str, dict[str, int]] = {}
        for stream, reason in zip(
            q.column("stream").to_pylist(), q.column("reason").to_pylist(), strict=True
        ):
            got.setdefault(stream, {}).setdefault(reason, 0)
            got[stream][reason] += 1
        assert got == want
    # the engine never saw a quarantined book: no label names one
    labelled = set(pq.read_table(kn.run_dir / "events" / "label.parquet").column("book_seq").to_pylist())
    quarantined = set(
        pq.read_table(kn.run_dir / "events" / "input_quarantine.parquet")
        .filter(pa.compute.equal(pa.compute.field("stream"), "books15"))
        .column("row_seq")
        .to_pylist()
    )
    assert not labelled & quarantined


def test_a_clean_session_stays_streamed_with_nothing_quarantined(base, tmp_path):
    run = run_replay(base, ReplayConfig(seed=2), out_dir=tmp_path / "r")
    assert run.path.startswith("kernel (books and tape streamed"), run.path
    assert run.quarantine == {}
    manifest = orjson.loads((run.run_dir / "manifest.json").read_bytes())
    assert manifest["quarantine"] == {}
    assert manifest["files"]["events/input_quarantine.parquet"]["rows"] == 0


def test_the_console_reports_quarantined_rows(base, tmp_path, capsys):
    books, trades, _ = _case_rows(base)["mixed"]
    s = _session(base, tmp_path / "s", books, trades)
    assert main(["replay", str(s), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "quarantined books15: 3 rows (negative_size 1, crossed_book 1, time_backwards 1)" in out
    assert "quarantined trade: 1 rows (nonpositive_price 1)" in out


# -- refused: one line, exit 2, nothing left behind ------------------------------------------------


def _rewrite(session: Path, rel: str, data: bytes | None = None, table: pa.Table | None = None) -> None:
    """Replace a data file and give the manifest its new hash: damage a hash check cannot see."""
    path = session / rel
    if table is not None:
        pq.write_table(table, path)
    else:
        path.write_bytes(data or b"")
    mpath = session / "manifest.json"
    m = orjson.loads(mpath.read_bytes())
    m["files"][rel] = {"rows": m["files"][rel]["rows"], "blake3": blake3_file(path)}
    mpath.write_bytes(orjson.dumps(m))


def _refused(session: Path, tmp_path: Path, capsys, *, kernel: bool = True) -> str:
    out = tmp_path / "run"
    argv = ["replay", str(session), "--out", str(out)] + ([] if kernel else ["--python-engine"])
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dualhub replay: error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not out.exists() and not out.with_name("run.tmp").exists()
    return lines[0]


def _part(session: Path, stream: str) -> str:
    return next(rel for rel in open_session(session).manifest["files"] if rel.startswith(stream + "/"))


@pytest.mark.parametrize("kernel", [True, False])
def test_truncated_data_file_with_a_matching_hash_is_refused(base, tmp_path, capsys, kernel):
    s = _session(base, tmp_path / "s")
    rel = _part(s, "books15")
    _rewrite(s, rel, (s / rel).read_bytes()[:-200])
    assert rel in _refused(s, tmp_path, capsys, kernel=kernel)


def test_empty_data_file_with_a_matching_hash_is_refused(base, tmp_path, capsys):
    s = _session(base, tmp_path / "s")
    rel = _part(s, "trade")
    _rewrite(s, rel, b"")
    assert rel in _refused(s, tmp_path, capsys)


@pytest.mark.parametrize(
    "manifest",
    [
        b'{"schema_version": 1}',
        b"[]",
        b'"x"',
        b'{"schema_version": 1, "streams": {}, "files": {"../../etc/passwd": {"sha256": "0"}}}',
    ],
)
def test_malformed_manifests_are_refused(base, tmp_path, capsys, manifest):
    s = _session(base, tmp_path / "s")
    (s / "manifest.json").write_bytes(manifest)
    assert "manifest.json" in _refused(s, tmp_path, capsys)


@pytest.mark.parametrize("kernel", [True, False])
def test_duplicate_book_seqs_are_refused(base, tmp_path, capsys, kernel):
    b = _books(base)
    seq = b.column("seq").to_pylist()
    s = _session(base, tmp_path / "s", books=_set(b, "seq", {40: seq[39]}))
    assert "book seqs must be strictly increasing" in _refused(s, tmp_path, capsys, kernel=kernel)


@pytest.mark.parametrize("stream", ["books15", "trade"])
def test_a_missing_column_is_refused_naming_file_and_column(base, tmp_path, capsys, stream):
    s = _session(base, tmp_path / "s")
    rel = _part(s, stream)
    _rewrite(s, rel, table=pq.read_table(s / rel).drop_columns(["ts_recv"]))
    line = _refused(s, tmp_path, capsys)
    assert rel in line and "'ts_recv' is missing" in line


@pytest.mark.parametrize("kernel", [True, False])
def test_text_timestamps_are_refused_naming_file_and_column(base, tmp_path, capsys, kernel):
    s = _session(base, tmp_path / "s")
    rel = _part(s, "books15")
    t = pq.read_table(s / rel)
    i = t.schema.get_field_index("ts_recv")
    t = t.set_column(i, "ts_recv", pa.array([str(v) for v in t.column(i).to_pylist()]))
    _rewrite(s, rel, table=t)
    line = _refused(s, tmp_path, capsys, kernel=kernel)
    assert rel in line and "'ts_recv' is string, expected int64" in line


@pytest.mark.parametrize("kernel", [True, False])
def test_a_session_mostly_invalid_is_refused(base, tmp_path, capsys, kernel):
    b = _books(base)
    ask0 = b.column("ask_px_0").to_pylist()
    crossed = _set(b, "bid_px_0", {i: ask0[i] + 1.0 for i in range(0, b.num_rows, 2)} | {1: ask0[1] + 1.0})
    s = _session(base, tmp_path / "s", books=crossed)
    line = _refused(s, tmp_path, capsys, kernel=kernel)
    assert "books15 rows for BTCUSDT are invalid (crossed_book" in line and "mostly bad data" in line


# -- the validator itself ------------------------------------------------------------------------


def test_per_event_validator_names_each_fault_and_agrees_with_the_columns():
    good = make_book()
    nan = math.nan
    books = {
        "": good,
        "crossed_book": make_book(bid=100.3),
        "locked_book": make_book(bid=100.1),
        "nonpositive_price": make_book(bid=0.0),
        "nan_price": dataclasses.replace(good, ask_px=(nan, *good.ask_px[1:])),
        "inf_price": make_book(ask=math.inf),
        "negative_size": dataclasses.replace(good, ask_sz=(*good.ask_sz[:5], -2.0, *good.ask_sz[6:])),
        "nonfinite_size": dataclasses.replace(good, bid_sz=(math.inf, *good.bid_sz[1:])),
        "one_sided_book": dataclasses.replace(good, bid_px=(nan,) * 15, bid_sz=(nan,) * 15),
        "empty_book": dataclasses.replace(
            good, bid_px=(nan,) * 15, bid_sz=(nan,) * 15, ask_px=(nan,) * 15, ask_sz=(nan,) * 15
        ),
        "unordered_levels": dataclasses.replace(
            good,
            bid_px=(*good.bid_px[:3], nan, *good.bid_px[4:])[:15],
            bid_sz=(*good.bid_sz[:3], nan, *good.bid_sz[4:])[:15],
        ),
    }
    rows = np.array([b.bid_px + b.bid_sz + b.ask_px + b.ask_sz for b in books.values()])
    codes = V.book_codes(rows)
    for (want, book), code in zip(books.items(), codes, strict=True):
        assert V.book_reason(book) == want == V.REASONS[code]
        assert V.top_ok(book) == (want in ("", "negative_size", "unordered_levels")), want
    assert make_book(levels=3).bid_px[3] != make_book(levels=3).bid_px[3]  # padded: still valid
    assert V.book_reason(make_book(levels=3)) == ""
    trade = dict(ts_event=1, ts_recv=1, seq=0, symbol="X", trade_id="1", px=100.0, sz=1.0, side="buy")
    from engine.events import Trade

    assert V.trade_reason(Trade(**trade)) == "" and V.trade_ok(Trade(**trade))
    for field, value, reason in [
        ("px", nan, "nan_price"),
        ("px", -1.0, "nonpositive_price"),
        ("sz", 0.0, "nonpositive_size"),
        ("side", "both", "bad_side"),
    ]:
        bad = Trade(**(trade | {field: value}))
        assert V.trade_reason(bad) == reason and not V.trade_ok(bad)
    ts = np.array([5, 6, 6, 4, 7, 1, 8])
    assert V.time_codes(ts).tolist() == [0, 0, 0, V.BACKWARDS, 0, V.BACKWARDS, 0]
    # across blocks: the previous block's latest time carries over
    assert V.time_codes(ts[3:], last=6).tolist() == [V.BACKWARDS, 0, V.BACKWARDS, 0]


def test_live_delivery_quarantines_a_bad_decoded_book_and_trade(tmp_path):
    """The live runner's last guard: a decoded book or trade failing the top-of-book check is counted
    and never reaches the paper exchange or the engine (the codec rejects such frames before it)."""
    from types import SimpleNamespace

    from engine.events import Trade
    from live.runner import LiveConfig, LiveRunner

    runner = LiveRunner(LiveConfig(out=str(tmp_path / "live"), mode="paper"))
    seen: list[object] = []
    engine = SimpleNamespace(on_book=seen.append, on_trade=seen.append, keep_warm=lambda: None)
    st = SimpleNamespace(
        paper=None, engine=engine, log=SimpleNamespace(counts=dict), reconcile=[], quarantine=[], wal=None
    )
    runner.syms = {"BTCUSDT": st}  # type: ignore[dict-item]
    trade = Trade(ts_event=1, ts_recv=1, seq=0, symbol="BTCUSDT", trade_id="t", px=100.0, sz=1.0, side="buy")
    events = [make_book(bid=100.3), make_book(), dataclasses.replace(trade, sz=-1.0), trade]
    runner.tick = SimpleNamespace(decode=lambda raw, ts, counters: events, keep_warm=lambda: None)
    runner.feeding = True
    runner.deliver(b"frame", runner.clock.stamp())
    assert seen == [events[1], events[3]]
    assert runner.quarantined == {"books15:crossed_book": 1, "trade:nonpositive_size": 1}
    assert runner.books == 1 and runner.trades == 1
    assert runner._summary()["quarantined"] == runner.quarantined
    # each is an input_quarantine event of the live run, as replay writes for session rows
    assert [(q.stream, q.reason, q.row_seq) for q in st.quarantine] == [
        ("books15", "crossed_book", events[0].seq),
        ("trade", "nonpositive_size", 0),
    ]
