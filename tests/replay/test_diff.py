"""`dualhub diff`: the first event where two runs' decisions differ, checked against brute force."""

import math
import shutil

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from engine.errors import DualhubError
from engine.events import STREAMS
from replay.config import ReplayConfig
from replay.diff import DECISION_STREAMS, IGNORED_FIELDS, FieldDiff, diff_runs
from replay.driver import run_replay
from venue.simulator import simulate_session


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=0.5, seed=11)


@pytest.fixture(scope="module")
def runs(session, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    cfg = ReplayConfig(seed=5, laya_provider="cpu")
    return {
        "a": run_replay(session, cfg, out_dir=root / "a").run_dir,
        "a2": run_replay(session, cfg, out_dir=root / "a2").run_dir,
        "seed6": run_replay(session, ReplayConfig(seed=6, laya_provider="cpu"), out_dir=root / "c").run_dir,
    }


def _merged(run, streams=DECISION_STREAMS):
    """Brute force: every event as a dict, sorted by (ts_recv, stream priority, seq)."""
    out = []
    for s in streams:
        for i, row in enumerate(pq.read_table(run / "events" / f"{s}.parquet").to_pylist()):
            out.append(((row["ts_recv"], STREAMS[s].priority, row["seq"]), s, i, row))
    return sorted(out, key=lambda e: e[0])


def _norm(row):
    return {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def _first_difference(a, b):
    for i, (ea, eb) in enumerate(zip(a, b, strict=False)):
        if ea[1] != eb[1] or _norm(ea[3]) != _norm(eb[3]):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def test_same_config_twice_has_no_divergence_nan_prices_included(runs):
    r = diff_runs(runs["a"], runs["a2"])
    assert not r.diverged and r.divergence is None and r.same_digest
    merged = _merged(runs["a"])
    assert r.identical_prefix == r.compared_a == r.compared_b == len(merged)
    # market orders carry px NaN: NaN must compare equal to NaN
    assert any(e[1] == "risk" and math.isnan(e[3]["px"]) for e in merged)


def test_different_seeds_report_the_true_first_divergence(runs):
    r = diff_runs(runs["a"], runs["seed6"], context=4)
    a, b = _merged(runs["a"]), _merged(runs["seed6"])
    want = _first_difference(a, b)
    assert want is not None and r.diverged and not r.same_digest
    d = r.divergence
    assert d.position == want == r.identical_prefix
    assert (d.a.stream, d.a.index) == (a[want][1], a[want][2])
    assert (d.b.stream, d.b.index) == (b[want][1], b[want][2])
    assert d.differences
    # everything before it is identical, and the context is the 4 events just before it
    assert [(e.stream, e.index) for e in d.context_a] == [(e[1], e[2]) for e in a[max(0, want - 4) : want]]
    assert [(e.stream, e.index) for e in d.context_b] == [(e[1], e[2]) for e in b[max(0, want - 4) : want]]
    assert {e.stream for e in d.around_a} <= {"label", "kev_response"} and d.around_a
    assert all(e.ts_recv <= max(d.a.ts_recv, d.b.ts_recv) for e in d.around_a + d.around_b)
    assert any(p.field == "seeds.replay" and (p.a, p.b) == (5, 6) for p in r.provenance)


def test_planted_fill_difference_is_found_at_that_event(runs, tmp_path):
    planted = tmp_path / "planted"
    shutil.copytree(runs["a"], planted)
    path = planted / "events" / "fill.parquet"
    table = pq.read_table(path)
    k = table.num_rows // 2
    qty = table.column("qty").to_pylist()
    old, qty[k] = qty[k], qty[k] + 0.001
    i = table.schema.get_field_index("qty")
    pq.write_table(table.set_column(i, table.schema.field("qty"), pa.array(qty, pa.float64())), path)

    r = diff_runs(runs["a"], planted)
    d = r.divergence
    assert d is not None
    assert (d.a.stream, d.a.index, d.b.stream, d.b.index) == ("fill", k, "fill", k)
    assert d.differences == [FieldDiff("qty", old, old + 0.001)]
    want = next(j for j, e in enumerate(_merged(runs["a"])) if e[1] == "fill" and e[2] == k)
    assert d.position == want
    assert r.same_digest  # the manifest was not touched ...
    assert any("fill.parquet does not match the sha256" in w for w in r.warnings)  # ... and that is said


def test_a_run_of_another_layout_is_compared_event_by_event(runs, tmp_path):
    # A run written before the digests were BLAKE3 (run schema 2) has sha256 digests: they differ from
    # this run's for the same events, and say nothing about it.
    older = tmp_path / "older"
    shutil.copytree(runs["a"], older)
    m = orjson.loads((older / "manifest.json").read_bytes())
    m["run_schema_version"] = 2
    m["digest"], m["decision_digest"] = "1" * 64, "2" * 64
    (older / "manifest.json").write_bytes(orjson.dumps(m))

    r = diff_runs(runs["a"], older)
    assert not r.diverged and r.identical_prefix == len(_merged(runs["a"]))
    assert any("different layouts (run schema 3 and 2)" in w for w in r.warnings)
    assert not any("decision digests differ" in w for w in r.warnings)


def test_cassette_replay_of_a_sim_run_does_not_diverge(session, runs, tmp_path):
    cfg = ReplayConfig(seed=5, laya_provider="cpu", kev_mode="cassette", kev_cassette=str(runs["a"]))
    cas = run_replay(session, cfg, out_dir=tmp_path / "cas").run_dir
    all_streams = ("label", "kev_response", *DECISION_STREAMS)
    r = diff_runs(runs["a"], cas, streams=all_streams)
    assert not r.diverged, r.divergence
    assert "advisor" in IGNORED_FIELDS["kev_response"]
    assert any(p.field == "config.kev_mode" for p in r.provenance)
    # the only difference is the advisor's name: without the ignore list it is the divergence
    strict = diff_runs(runs["a"], cas, streams=all_streams, ignored={})
    assert strict.divergence.a.stream == "kev_response"
    assert [f.field for f in strict.divergence.differences] == ["advisor"]


def test_user_errors(runs, tmp_path):
    with pytest.raises(DualhubError, match="not a run directory"):
        diff_runs(runs["a"], tmp_path / "nope")
    with pytest.raises(DualhubError, match="cannot compare streams"):
        diff_runs(runs["a"], runs["a2"], streams=["books15"])
    with pytest.raises(DualhubError, match="context"):
        diff_runs(runs["a"], runs["a2"], context=-1)


def test_a_truncated_event_file_is_one_error_naming_it(runs, tmp_path):
    """diff compares an edited run (with a warning) but cannot read a truncated file: one DualhubError
    naming it, not pyarrow's traceback."""
    bad = tmp_path / "bad"
    shutil.copytree(runs["a"], bad)
    order = bad / "events" / "order.parquet"
    order.write_bytes(order.read_bytes()[:100])
    for a, b in ((runs["a"], bad), (bad, runs["a"])):
        with pytest.raises(DualhubError, match=r"order\.parquet: cannot read it"):
            diff_runs(a, b)


def test_cli_exit_codes_and_json(runs, tmp_path, capsys):
    assert main(["diff", str(runs["a"]), str(runs["a2"])]) == 0
    assert "no divergence" in capsys.readouterr().out
    assert main(["diff", str(runs["a"]), str(runs["seed6"]), "--context", "3"]) == 1
    out = capsys.readouterr().out
    assert "first divergence" in out and "Run B: decisions before" in out
    assert main(["diff", str(runs["a"]), str(runs["seed6"]), "--json"]) == 1
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["diverged"] and doc["divergence"]["position"] == doc["identical_prefix"]
    assert len(doc["divergence"]["context_a"]) == 5
    assert main(["diff", str(runs["a"]), str(tmp_path / "missing")]) == 2
    assert "dualhub diff: error:" in capsys.readouterr().err
