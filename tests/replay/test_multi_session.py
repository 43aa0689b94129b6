"""Several consecutive sessions replayed as one run (replay/sessions.py), through the real CLI: the gaps
between them are declared, the range holds its members' rows in time order, the run equals each
session's own replay where no state crosses, state carries where it does, and inputs that are not one
market's consecutive sessions are refused in one line.

What "equal where no state crosses" compares, precisely:
- until the second session's first row reaches the run (on the engine's clock or the simulated
  exchange's: the exchange sees a row at its event time), every event stream of the range run (every
  column, seqs and ids included) equals the first session's own replay, whole: nothing precedes the
  first session, and the timers its run left pending fire inside the gap at the same times;
- for every session, the label events (Laya's, which depend on each book alone) between its first row
  and the next session's equal that session's own replay's, the book seqs shifted by the offset the
  range declares for the session (the log's own ``seq`` counts on over the run, so it is left out);
- in a configuration where no state crosses a boundary (nothing trades: every order is refused by a
  tiny max_order_qty, so no position and no resting order; Kev's lag scaled to 0, so no request is in
  flight at a boundary and no lag draw matters), every stream of every session's portion (from its
  first row on either clock to the next session's) equals that session's own replay, every column,
  once the counters that run on over a run are rebased to the portion's first (the log's seqs, order,
  Kev request and command ids, label seqs) and book seqs shifted back by the declared offset.
What crosses (the position, resting orders, order ids, Kev's request counter, the latency models'
draws) is checked to carry, not to be equal: a quote resting at the end of one session can fill on the
next session's first trades."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from engine.store import open_session
from replay.sessions import Member, build_range, range_key
from venue.simulator import DEFAULT_START_MS, simulate_session

DAY_MS = 86_400_000
STREAMS = ("label", "kev_queue", "kev_request", "kev_response", "command", "risk", "order", "fill", "latency")


def _simulate(out: Path, day: int, seed: int, symbol: str = "BTCUSDT") -> Path:
    return simulate_session(
        out, symbol=symbol, minutes=1.0, seed=seed, start_ms=DEFAULT_START_MS + day * DAY_MS
    )


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three one-minute BTCUSDT sessions on three consecutive days."""
    root = tmp_path_factory.mktemp("catalog")
    for k in range(3):
        _simulate(root / f"day{k}", k, 11 + k)
    return root


@pytest.fixture(scope="module")
def runs(catalog: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three sessions as one run, and each one's own run."""
    out = tmp_path_factory.mktemp("runs")
    got = {"range": out / "range"}
    assert main(["replay", str(catalog), "--out", str(got["range"])]) == 0
    for k in range(3):
        got[f"day{k}"] = out / f"day{k}"
        assert main(["replay", str(catalog / f"day{k}"), "--out", str(got[f"day{k}"])]) == 0
    return got


def _manifest(path: Path) -> dict:
    return orjson.loads((path / "manifest.json").read_bytes())


def _range_manifest(run: Path) -> dict:
    return _manifest(Path(_manifest(run)["session"]["path"]))


def _events(run: Path, stream: str) -> pa.Table:
    return pq.read_table(run / "events" / f"{stream}.parquet")


def _window(t: pa.Table, lo: int | None, hi: int | None) -> pa.Table:
    """Rows with ``lo <= ts_recv < hi`` (None: unbounded)."""
    mask = pa.array([True] * t.num_rows, pa.bool_())
    if lo is not None:
        mask = pc.and_(mask, pc.greater_equal(t.column("ts_recv"), lo))
    if hi is not None:
        mask = pc.and_(mask, pc.less(t.column("ts_recv"), hi))
    return t.filter(mask)


def _rows(t: pa.Table, drop: tuple[str, ...] = ()) -> list[dict]:
    """Plain rows, NaN as a marker (NaN != NaN would fail two equal rows: a market order's price)."""
    keep = [c for c in t.column_names if c not in drop]
    return [
        {k: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        for row in t.select(keep).to_pylist()
    ]


def test_the_range_declares_its_gaps(runs: dict[str, Path], catalog: Path, capsys) -> None:
    m = _range_manifest(runs["range"])
    spans = [
        (_manifest(catalog / f"day{k}")["ts_recv_min"], _manifest(catalog / f"day{k}")["ts_recv_max"])
        for k in range(3)
    ]
    assert [s["name"] for s in m["range"]["sessions"]] == ["day0", "day1", "day2"]
    assert m["range"]["gaps"] == [
        {
            "from_ns": spans[k][1],
            "to_ns": spans[k + 1][0],
            "before_session": f"day{k}",
            "after_session": f"day{k + 1}",
        }
        for k in range(2)
    ]
    assert (m["ts_recv_min"], m["ts_recv_max"]) == (spans[0][0], spans[2][1])
    # the gap stream: one row per boundary (one symbol), as the recorder declares a feed's gap
    gaps = open_session(_manifest(runs["range"])["session"]["path"]).read_table("gap").to_pylist()
    assert [(g["channel"], g["start_ns"], g["end_ns"], g["ts_recv"]) for g in gaps] == [
        ("session", spans[k][1], spans[k + 1][0], spans[k + 1][0]) for k in range(2)
    ]
    assert [w["channel"] for w in m["gaps"]] == ["session", "session"]
    capsys.readouterr()
    assert main(["report", str(runs["range"])]) == 0
    out = capsys.readouterr().out
    assert "sessions: 3 replayed as one run (day0, day1, day2)" in out
    assert "gap: day0 -> day1" in out and "gap: day1 -> day2" in out


def test_the_range_holds_its_sessions_rows_in_order(runs: dict[str, Path], catalog: Path) -> None:
    session = open_session(_manifest(runs["range"])["session"]["path"])
    session.verify()
    offsets = [s["seq_offsets"] for s in session.manifest["range"]["sessions"]]
    for stream in ("books15", "trade"):
        parts = []
        for k in range(3):
            t = open_session(catalog / f"day{k}").read_table(stream)
            i = t.schema.get_field_index("seq")
            parts.append(t.set_column(i, t.schema.field(i), pc.add(t.column("seq"), offsets[k][stream])))
        assert session.read_table(stream).equals(pa.concat_tables(parts)), stream
    seqs = session.read_table("books15").column("seq").to_numpy()
    assert (seqs[1:] > seqs[:-1]).all()  # one rising stream over the run


def _first_row_ns(session: Path) -> int:
    """When a session's first row reaches the run on either clock: the engine's (``ts_recv``) or the
    simulated exchange's (``ts_event``: it sees a row at its event time, before the engine does)."""
    s = open_session(session)
    return min(
        pc.min(s.read_table(st).column(c)).as_py()
        for st in ("books15", "trade")
        for c in ("ts_event", "ts_recv")
    )


def test_the_run_equals_the_first_sessions_replay_until_the_second_begins(
    runs: dict[str, Path], catalog: Path
) -> None:
    second = _first_row_ns(catalog / "day1")
    compared = 0
    for stream in STREAMS:
        own = _events(runs["day0"], stream)
        assert _rows(_window(_events(runs["range"], stream), None, second)) == _rows(own), stream
        compared += own.num_rows
    assert compared > 1000  # a run that traded, not two empty logs


def test_every_sessions_labels_equal_its_own_replay(runs: dict[str, Path]) -> None:
    sessions = _range_manifest(runs["range"])["range"]["sessions"]
    labels = _events(runs["range"], "label")
    for k, s in enumerate(sessions):
        nxt = sessions[k + 1]["ts_recv_min"] if k + 1 < len(sessions) else None
        mine = _window(labels, s["ts_recv_min"], nxt)
        shifted = mine.set_column(
            mine.schema.get_field_index("book_seq"),
            "book_seq",
            pc.subtract(mine.column("book_seq"), s["seq_offsets"]["books15"]),
        )
        own = _events(runs[s["name"]], "label")
        assert own.num_rows == s["streams"]["books15"]
        assert _rows(shifted, drop=("seq",)) == _rows(own, drop=("seq",)), s["name"]
    assert sessions[1]["seq_offsets"]["books15"] == sessions[0]["streams"]["books15"]  # renumbered on


def test_state_carries_across_the_gap(runs: dict[str, Path]) -> None:
    sessions = _range_manifest(runs["range"])["range"]["sessions"]
    second = sessions[1]["ts_recv_min"]
    fills = _events(runs["range"], "fill")
    before, after = _window(fills, None, second).to_pylist(), _window(fills, second, None).to_pylist()
    held = before[-1]["position_after"]
    assert held != 0  # the first session ends holding a position: the case that carries
    first = after[0]
    signed = first["qty"] if first["side"] == "buy" else -first["qty"]
    assert first["position_after"] == pytest.approx(held + signed)  # from the position held, not from 0
    own = _events(runs["day1"], "fill").to_pylist()[0]
    assert own["position_after"] == pytest.approx(signed)  # the session alone starts flat
    # order ids count on over the run
    orders = _events(runs["range"], "order")
    last_id = int(_window(orders, None, second).column("client_oid")[-1].as_py().rsplit("-", 1)[1])
    next_id = int(_window(orders, second, None).column("client_oid")[0].as_py().rsplit("-", 1)[1])
    assert next_id > last_id


def test_a_day_range_over_the_catalog_and_its_views(catalog: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    argv = ["replay", str(catalog), "--from", "2026-01-02", "--to", "2026-01-03", "--out", str(run)]
    assert main(argv) == 0
    assert [s["name"] for s in _range_manifest(run)["range"]["sessions"]] == ["day1", "day2"]
    # a glob names the same sessions: the same range directory, reused
    assert main(["replay", str(catalog / "day[12]"), "--out", str(tmp_path / "again")]) == 0
    assert _manifest(tmp_path / "again")["session"] == _manifest(run)["session"]
    assert _manifest(tmp_path / "again")["digest"] == _manifest(run)["digest"]
    capsys.readouterr()
    q = (
        "SELECT day, count(*) AS n FROM books15 WHERE day BETWEEN '2026-01-01' AND '2026-01-02' "
        "GROUP BY day ORDER BY day"
    )
    assert main(["sql", str(catalog), q, "--raw"]) == 0
    out = capsys.readouterr().out
    rows = [open_session(catalog / f"day{k}").manifest["streams"]["books15"]["rows"] for k in range(2)]
    assert f"2026-01-01\t{rows[0]}" in out and f"2026-01-02\t{rows[1]}" in out
    assert "2026-01-03" not in out
    assert (catalog / "catalog.sql").is_file()


def test_the_range_key_covers_every_members_digest(catalog: Path, tmp_path: Path) -> None:
    other = _simulate(tmp_path / "day1", 1, 99)  # the same day, another market

    def members(paths: list[Path]) -> list[Member]:
        out = []
        for p in paths:
            s = open_session(p)
            out.append(Member(s, s.manifest["ts_recv_min"], s.manifest["ts_recv_max"]))
        return out

    a, b = members([catalog / "day0", catalog / "day1"]), members([catalog / "day0", other])
    assert range_key(a) != range_key(b)
    assert build_range(a) != build_range(b)
    assert build_range(a) == build_range(a)  # built once, reused


def _refused(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("dualhub replay: error: ")
    return err[0]


def test_different_instruments_are_refused(catalog: Path, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "mixed"
    _simulate(folder / "a", 0, 11)
    _simulate(folder / "b", 1, 12, symbol="ETHUSDT")
    line = _refused(["replay", str(folder), "--out", str(tmp_path / "r")], capsys)
    assert "not the same instruments" in line
    assert not (tmp_path / "r").exists() and not (folder / ".ranges").exists()


def test_overlapping_sessions_are_refused(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "overlap"
    _simulate(folder / "a", 0, 11)
    _simulate(folder / "b", 0, 12)  # the same minute
    line = _refused(["replay", str(folder), "--out", str(tmp_path / "r")], capsys)
    assert "overlap in time" in line


def test_an_empty_day_range_is_refused(catalog: Path, tmp_path: Path, capsys) -> None:
    line = _refused(["replay", str(catalog), "--from", "2027-01-01", "--out", str(tmp_path / "r")], capsys)
    assert "no session under" in line


def test_a_sweep_runs_over_a_range(runs: dict[str, Path], catalog: Path, tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text("[grid]\nseed = [1]\n")
    out = tmp_path / "results.parquet"
    assert (
        main(["sweep", str(grid), "--range", str(catalog), "--serial", "--out", str(out), "--no-progress"])
        == 0
    )
    (row,) = pq.read_table(out).to_pylist()
    assert not row["error"]
    range_session = _manifest(runs["range"])["session"]
    assert row["session"] == range_session["path"] and row["session_digest"] == range_session["digest"]


def test_a_ranges_market_cache_gives_the_same_run(
    runs: dict[str, Path], catalog: Path, tmp_path: Path, capsys
) -> None:
    """The range's market cache (beside the range directory, keyed by its digest: every member's file
    hashes) is built by one run and read by the next, with the run's digest unchanged."""
    digests = []
    # built by this test's first run, or already by the sweep over the same range (sweeps use it)
    for k, states in enumerate((("built", "reused"), ("reused",))):
        out = tmp_path / f"cached{k}"
        capsys.readouterr()
        assert main(["replay", str(catalog), "--market-cache", "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        assert any(f"market cache: {state}\n" in printed for state in states), printed
        digests.append(_manifest(out)["digest"])
    assert digests == [_manifest(runs["range"])["digest"]] * 2
    assert any((Path(_manifest(runs["range"])["session"]["path"]) / "cache" / "market").iterdir())


def test_a_damaged_member_is_refused_before_anything_is_written(
    catalog: Path, tmp_path: Path, capsys
) -> None:
    import shutil

    folder = tmp_path / "damaged"
    for k in range(2):
        shutil.copytree(
            catalog / f"day{k}", folder / f"day{k}", ignore=shutil.ignore_patterns("runs", "cache")
        )
    part = next((folder / "day1" / "books15").glob("part-*.parquet"))
    part.write_bytes(part.read_bytes()[:-100])  # truncated
    line = _refused(["replay", str(folder), "--out", str(tmp_path / "r")], capsys)
    assert "does not match its manifest" in line
    assert not (folder / ".ranges").exists()  # checked before the range directory is begun


QUIET = '{"risk.max_order_qty": 1e-06, "scale_kev": 0.0}'  # nothing trades; Kev answers at once


def _oid(v: str) -> int:
    return int(v.rsplit("-", 1)[1])


def _rebased(tables: dict[str, pa.Table], book_offset: int) -> dict[str, list[dict]]:
    """Each stream's rows with the counters that run on over a run rebased to the portion's first."""
    risk = [_oid(x) for x in tables["risk"].column("client_oid").to_pylist() if x]
    base = {
        "client_oid": min(risk, default=0),
        "request_id": min(tables["kev_queue"].column("request_id").to_pylist(), default=0),
        "command_id": min(tables["command"].column("command_id").to_pylist(), default=0),
        "label_seq": min(tables["label"].column("seq").to_pylist(), default=0),
    }
    out = {}
    for stream, t in tables.items():
        rows = _rows(t, drop=("seq",))
        for r in rows:
            if r.get("client_oid"):
                r["client_oid"] = _oid(r["client_oid"]) - base["client_oid"]
            for k in ("request_id", "command_id", "label_seq"):
                if isinstance(r.get(k), int):
                    r[k] -= base[k]
            if isinstance(r.get("ref"), str) and r["ref"].startswith("kev:"):
                r["ref"] = int(r["ref"][4:]) - base["request_id"] - 1
            if "book_seq" in r:
                r["book_seq"] -= book_offset
        out[stream] = rows
    return out


def test_where_no_state_crosses_the_run_is_the_sessions_runs_end_to_end(
    catalog: Path, tmp_path: Path
) -> None:
    assert main(["replay", str(catalog), "--params", QUIET, "--out", str(tmp_path / "range")]) == 0
    sessions = _range_manifest(tmp_path / "range")["range"]["sessions"]
    bounds = [None] + [_first_row_ns(catalog / s["name"]) for s in sessions[1:]] + [None]
    compared = 0
    for k, s in enumerate(sessions):
        own = tmp_path / s["name"]
        assert main(["replay", str(catalog / s["name"]), "--params", QUIET, "--out", str(own)]) == 0
        mine = {st: _window(_events(tmp_path / "range", st), bounds[k], bounds[k + 1]) for st in STREAMS}
        alone = {st: _events(own, st) for st in STREAMS}
        got, want = _rebased(mine, s["seq_offsets"]["books15"]), _rebased(alone, 0)
        for st in STREAMS:
            assert got[st] == want[st], (s["name"], st)
            compared += len(want[st])
        assert want["risk"] and want["kev_request"]  # it decided (and refused), and asked Kev
    assert compared > 2000
