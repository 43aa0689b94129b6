"""What-if sweeps: --scale-latency, grid expansion, one results row per run, --resume."""

import duckdb
import orjson
import pyarrow.parquet as pq
import pytest

from analysis.report import run_report
from dualhub.cli import main
from engine.errors import DualhubError
from engine.risk import RiskLimits
from replay.config import ReplayConfig
from replay.driver import run_replay
from replay.sweep import apply_scales, build_config, parse_grid, parse_scale_latency
from venue.simulator import simulate_session

GRID = """
[base]
seed = 3
laya_provider = "cpu"

[grid]
"risk.max_position" = [0.02, 0.05]
scale_kev = [1, 2]
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=0.5, seed=11)


def test_parse_scale_latency():
    assert parse_scale_latency("kev=2,laya=1,order=0.5,feed=1") == {
        "kev": 2.0,
        "laya": 1.0,
        "order": 0.5,
        "feed": 1.0,
    }
    assert parse_scale_latency(" kev = 3 ") == {"kev": 3.0}
    for spec, msg in [
        ("kev=2,foo=1", "unknown latency 'foo'"),
        ("kev=fast", "is not a number"),
        ("kev=-1", ">= 0"),
        ("kev=nan", "finite"),
        ("kev=1,kev=2", "given twice"),
        ("kev", "KEY=NUMBER"),
        ("", "empty"),
    ]:
        with pytest.raises(DualhubError, match=msg):
            parse_scale_latency(spec)


def test_apply_scales_sets_the_scale_fields():
    cfg = apply_scales(ReplayConfig(seed=2), parse_scale_latency("kev=2,order=0.5"))
    assert (cfg.scale_kev, cfg.scale_order, cfg.scale_laya, cfg.scale_feed) == (2.0, 0.5, 1.0, 1.0)
    assert cfg.seed == 2
    assert cfg.sha256() != ReplayConfig(seed=2).sha256()


def test_replay_cli_takes_scale_latency(session, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["replay", str(session), "--provider", "cpu", "--out", str(out)]
    assert main([*args, "--scale-latency", "kev=2,laya=0.5"]) == 0
    config = orjson.loads((out / "manifest.json").read_bytes())["config"]
    assert (config["scale_kev"], config["scale_laya"], config["scale_order"]) == (2.0, 0.5, 1.0)
    assert main([*args, "--overwrite", "--scale-latency", "kev=x"]) == 2
    assert "not a number" in capsys.readouterr().err


def test_grid_expansion_is_stable_and_checked():
    grid = parse_grid(
        {"base": {"seed": 1}, "grid": {"scale_kev": [0.5, 1], "fill_model": ["touch", "through"]}}
    )
    assert list(grid.axes) == ["fill_model", "scale_kev"]
    assert [(p["fill_model"], p["scale_kev"]) for p in grid.points()] == [
        ("touch", 0.5),
        ("touch", 1),
        ("through", 0.5),
        ("through", 1),
    ]
    assert all(p["seed"] == 1 for p in grid.points())
    # unquoted dotted TOML keys arrive as nested tables
    assert list(parse_grid({"grid": {"risk": {"max_position": [0.1]}}}).axes) == ["risk.max_position"]
    for doc, msg in [
        ({"grid": {"nope": [1]}}, "unknown parameter 'nope'"),
        ({"grid": {"risk.nope": [1]}}, "unknown parameter 'risk.nope'"),
        ({"grid": {"risk": [1]}}, "is a group"),
        ({"grid": {"seed": 1}}, "non-empty list"),
        ({"grid": {}}, "no axes"),
        ({"base": {"seed": 1}, "grid": {"seed": [2]}}, "both"),
        ({"grid": {"seed": [1]}, "extra": {}}, "unknown tables"),
    ]:
        with pytest.raises(DualhubError, match=msg):
            parse_grid(doc)
    cfg = build_config({"scale_kev": 2, "risk.max_position": 0.01, "scale_latency": "order=0.5"})
    assert (cfg.scale_kev, cfg.risk.max_position, cfg.scale_order) == (2.0, 0.01, 0.5)
    assert isinstance(cfg.scale_kev, float)
    with pytest.raises(DualhubError, match="not a valid float"):
        build_config({"scale_kev": "2"})


def test_sweep_grid_rows_match_direct_runs_and_resume_skips(session, tmp_path, capsys):
    (tmp_path / "grid.toml").write_text(GRID)
    out = tmp_path / "sweep" / "results.parquet"
    cmd = [
        "sweep",
        str(tmp_path / "grid.toml"),
        "--sessions",
        str(session.parent / "*"),
        "--out",
        str(out),
        "--serial",
        "--keep-logs",
        "all",
    ]
    assert main([*cmd, "--no-progress"]) == 0
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 4
    assert [(r["p_risk_max_position"], r["p_scale_kev"]) for r in rows] == [
        (0.02, 1),
        (0.02, 2),
        (0.05, 1),
        (0.05, 2),
    ]
    for i, r in enumerate(rows):
        assert r["error"] == ""
        cfg = ReplayConfig(
            seed=3,
            laya_provider="cpu",
            scale_kev=float(r["p_scale_kev"]),
            risk=RiskLimits(max_position=r["p_risk_max_position"]),
        )
        direct = run_replay(session, cfg, out_dir=tmp_path / f"direct{i}")
        assert r["digest"] == direct.digest
        assert r["config_sha256"] == cfg.sha256()
        assert (r["books"], r["trades"], r["fills"]) == (direct.books, direct.trades, direct.counts["fill"])
        assert r["kev_requests"] == direct.counts["kev_request"]
        assert r["run_dir"].startswith(str(out.parent / "runs"))
        pnl = next(s for s in run_report(r["run_dir"]) if s.name == "pnl")
        assert r["pnl_usdt"] == pnl.rows[0][pnl.columns.index("pnl_usdt")]
        assert r["peak_rss_mb"] > 0 and r["wall_s"] > 0

    # DuckDB reads the results table; PnL is an exact decimal
    con = duckdb.connect()
    n, labels, typ = con.execute(
        "SELECT count(*), sum(labels_hold + labels_lean_buy + labels_lean_sell + labels_emergency), "
        "any_value(typeof(pnl_usdt)) FROM read_parquet(?) WHERE error = ''",
        [str(out)],
    ).fetchall()[0]
    assert (n, labels, typ) == (4, 4 * rows[0]["books"], "DECIMAL(18,4)")

    # a second call with --resume runs nothing; without it the existing table is not clobbered
    capsys.readouterr()
    mtimes = {p: p.stat().st_mtime_ns for p in (out.parent / "runs").iterdir()}
    assert main([*cmd, "--no-progress", "--resume"]) == 0
    assert "0 run, 4 skipped" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (out.parent / "runs").iterdir()} == mtimes
    assert pq.read_table(out).to_pylist() == rows
    assert main([*cmd, "--no-progress"]) == 2
    assert "--resume" in capsys.readouterr().err


def test_a_run_that_fails_becomes_an_error_row_not_a_crash(session, tmp_path, capsys):
    from engine.laya.model import DEFAULT_MODEL

    # a model that is not there is only found when the run loads it: the run fails, the sweep goes on
    grid = tmp_path / "grid.toml"
    missing = tmp_path / "nope.onnx"
    grid.write_text(f'[base]\nlaya_provider = "cpu"\n[grid]\nmodel_path = ["{DEFAULT_MODEL}", "{missing}"]\n')
    out = tmp_path / "results.parquet"
    cmd = ["sweep", str(grid), "--sessions", str(session), "--out", str(out), "--no-progress", "--serial"]
    assert main(cmd) == 1
    rows = pq.read_table(out).to_pylist()
    assert [r["p_model_path"] for r in rows] == [str(DEFAULT_MODEL), str(missing)]
    assert rows[0]["error"] == "" and rows[0]["digest"]
    assert "nope.onnx" in rows[1]["error"] and rows[1]["digest"] is None
    assert rows[1]["session_digest"] == rows[0]["session_digest"]
    capsys.readouterr()
    assert main([*cmd, "--resume"]) == 1  # the failed run is retried, the good one skipped
    assert "1 run, 1 skipped (--resume), 1 failed" in capsys.readouterr().out
    assert len(pq.read_table(out)) == 2


def test_an_invalid_grid_value_is_refused_before_any_run(session, tmp_path, capsys):
    # values meet the command line's bounds up front (issue 58): one line, exit 2, nothing written
    grid = tmp_path / "grid.toml"
    out = tmp_path / "results.parquet"
    cmd = ["sweep", str(grid), "--sessions", str(session), "--out", str(out), "--no-progress", "--serial"]
    for text, said in (
        ('[grid]\nfill_model = ["touch", "nope"]\n', "unknown fill model 'nope'"),
        ('[grid]\n"risk.max_position" = [0.01, 1e400]\n', "must be a finite number"),
        ("[grid]\nfill_modle = [1]\n", "unknown parameter 'fill_modle'"),
    ):
        grid.write_text(text)
        assert main(cmd) == 2
        assert said in capsys.readouterr().err
        assert not out.exists()


def test_strategy_parameters_are_grid_axes():
    grid = parse_grid(
        {"grid": {"strategy": ["baseline", "imbalance_lean"], "strategy_params": {"offset_ticks": [0, 2]}}}
    )
    assert list(grid.axes) == ["strategy", "strategy_params.offset_ticks"]
    cfgs = [build_config(p) for p in grid.points()]
    assert [(c.strategy, c.strategy_params) for c in cfgs] == [
        ("baseline", {"offset_ticks": 0.0}),
        ("baseline", {"offset_ticks": 2.0}),
        ("imbalance_lean", {"offset_ticks": 0.0}),
        ("imbalance_lean", {"offset_ticks": 2.0}),
    ]
    assert len({c.sha256() for c in cfgs}) == 4
    base = build_config({"strategy_params.lean_ticks": 1}, ReplayConfig(strategy="imbalance_lean"))
    assert base.strategy_params == {"lean_ticks": 1.0}
    lean = {"strategy": "imbalance_lean"}
    for doc, msg in [
        (
            {"grid": {"strategy": ["baseline", "imbalance_lean"], "strategy_params.lean_ticks": [1]}},
            "grid: strategy baseline has no parameter 'lean_ticks'",
        ),
        (
            {"base": lean, "grid": {"strategy_params.depth_levels": [5, 40]}},
            r"depth_levels must be .* got 40",
        ),
        (
            {"grid": {"strategy_params.offset_ticks": ["far"]}},
            "strategy_params.offset_ticks wants NAME=NUMBER",
        ),
        ({"grid": {"strategy_params.offset_ticks": [True]}}, "wants NAME=NUMBER"),
        ({"grid": {"strategy_params.offset_ticks": [float("inf")]}}, "wants NAME=NUMBER"),
        ({"grid": {"strategy": ["baseline", "nope"]}}, "unknown strategy 'nope'"),
        ({"grid": {"strategy": [3]}}, "unknown strategy"),
        ({"grid": {"strategy_params": [1]}}, "is a group"),
    ]:
        with pytest.raises(DualhubError, match=msg):
            parse_grid(doc)


def test_sweep_over_strategy_parameters(session, tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(
        '[base]\nseed = 3\nlaya_provider = "cpu"\nstrategy = "imbalance_lean"\n'
        '[grid]\n"strategy_params.lean_ticks" = [0, 8]\n'
    )
    out = tmp_path / "results.parquet"
    cmd = ["sweep", str(grid), "--sessions", str(session), "--out", str(out), "--no-progress", "--serial"]
    assert main(cmd) == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["p_strategy_params_lean_ticks"] for r in rows] == [0, 8]
    for i, r in enumerate(rows):
        assert r["error"] == ""
        cfg = ReplayConfig(
            seed=3,
            laya_provider="cpu",
            strategy="imbalance_lean",
            strategy_params={"lean_ticks": float(r["p_strategy_params_lean_ticks"])},
        )
        assert r["config_sha256"] == cfg.sha256()
        assert r["digest"] == run_replay(session, cfg, out_dir=tmp_path / f"direct{i}").digest
    assert rows[0]["digest"] != rows[1]["digest"]  # the parameter reached the strategy
    # a parameter the strategy lacks: one line, nothing run
    grid.write_text('[base]\nstrategy = "imbalance_lean"\n[grid]\n"strategy_params.label_skew_ticks" = [1]\n')
    capsys.readouterr()
    assert main([*cmd, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "strategy imbalance_lean has no parameter 'label_skew_ticks'" in err
    assert err.startswith("dualhub sweep: error: ")
    assert pq.read_table(out).to_pylist() == rows


def test_portfolio_keys_in_a_grid_set_the_portfolio_limits_through_the_same_bounds():
    """``portfolio.net_delta_usd`` etc. (the keys of ``--portfolio``) set the RiskLimits fields; a
    value of 1e400 (TOML's inf) or an unknown key is one error, as on the command line."""
    from replay.sweep import build_config

    cfg = build_config(
        {"portfolio.net_delta_usd": 3000, "portfolio.gross_usd": 9000.5, "portfolio.loss_stop_usd": 150}
    )
    assert (
        cfg.risk.portfolio_max_net_delta_usd,
        cfg.risk.portfolio_max_gross_usd,
        cfg.risk.portfolio_loss_stop_usd,
    ) == (
        3000.0,
        9000.5,
        150.0,
    )
    with pytest.raises(DualhubError, match="must be a finite number"):
        build_config({"portfolio.gross_usd": float("inf")})
    with pytest.raises(DualhubError, match="portfolio keys: net_delta_usd, gross_usd, loss_stop_usd"):
        build_config({"portfolio.delta": 5.0})
