"""A hub's Kev command traded as one unit (engine/legs.py), through ``dualhub replay`` on a simulated
pair: the legs go out together and the portfolio rules judge the portfolio after them; an unwind is
never refused by a portfolio rule; a leg that lags is hedged ``leg_timeout_ms`` later and recorded."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from dualhub.cli import main
from venue.simulator import simulate_session


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pair") / "session"
    simulate_session(out, symbols=("BTCUSDT", "ETHUSDT"), minutes=1.5, seed=11)
    return out


def _replay(pair: Path, out: Path, *flags: str) -> Path:
    argv = ["replay", str(pair), "--symbols", "ALL", "--kev-hub", "pairs", "--out", str(out), *flags]
    assert main(argv) == 0
    return out


def _q(run: Path, sql: str) -> list[tuple]:
    return duckdb.sql(sql.replace("EV/", f"{run}/events/")).fetchall()


# Each instrument's position just before ``t``: the last fill the engine had taken by then.
_POS_BEFORE = """coalesce((select position_after from 'EV/fill.parquet' f where f.symbol = r.symbol
    and f.ts_recv {op} r.ts_event order by f.ts_recv desc, f.seq desc limit 1), 0)"""


def test_a_hedged_entry_passes_where_its_legs_alone_would_not(pair, tmp_path):
    limit = 1000.0
    run = _replay(pair, tmp_path / "r", "--portfolio", f"net_delta_usd={limit:g}")
    # a unit: Kev legs of both instruments in one step, at one time
    legs = _q(
        run,
        f"""select r.ts_event, r.symbol, r.side, r.qty, r.accepted, r.reason, {_POS_BEFORE.format(op="<")},
            (select px from 'EV/fill.parquet' f where f.client_oid = r.client_oid limit 1)
        from 'EV/risk.parquet' r where r.source = 'kev' and r.intent = 'new'
        and r.ts_event in (select ts_event from 'EV/risk.parquet' where source = 'kev' and intent = 'new'
                           group by 1 having count(distinct symbol) = 2)
        order by r.ts_event, r.symbol""",
    )
    units: dict[int, list[tuple]] = {}
    for row in legs:
        units.setdefault(row[0], []).append(row)
    assert len(units) >= 3 and all(len(u) == 2 for u in units.values())
    hedged = 0
    for btc, eth in units.values():
        if not (btc[4] and eth[4] and btc[2] != eth[2] and btc[7] and eth[7]):
            continue
        sign = {"buy": 1.0, "sell": -1.0}
        before = [leg[6] * leg[7] for leg in (btc, eth)]  # each position at its leg's fill price
        after = [b + sign[leg[2]] * leg[3] * leg[7] for b, leg in zip(before, (btc, eth), strict=True)]
        alone = (abs(after[0] + before[1]), abs(before[0] + after[1]))  # one leg traded, the other not
        if min(alone) > limit and abs(sum(after)) <= limit:
            hedged += 1
    # a hedged entry each of whose legs would breach net delta alone went out, both legs accepted
    assert hedged >= 1
    risk = json.loads((run / "manifest.json").read_text())["config"]
    assert (risk["leg_timeout_ms"], risk["leg_hedge"]) == (1000, "cross")


def test_an_unwind_is_never_refused_by_a_portfolio_rule(pair, tmp_path):
    run = _replay(pair, tmp_path / "r", "--portfolio", "net_delta_usd=300,gross_usd=1500,loss_stop_usd=2")
    refused = _q(
        run,
        f"""select r.symbol, r.side, r.qty, r.reason, {_POS_BEFORE.format(op="<")} p0, {_POS_BEFORE.format(op="<=")} p1
        from 'EV/risk.parquet' r where r.intent = 'new' and r.reason like 'portfolio_%'""",
    )
    assert len(refused) > 10  # the limits bind
    assert {r[3] for r in refused} >= {"portfolio_net_delta", "portfolio_gross"}

    def unwinds(side: str, qty: float, pos: float) -> bool:
        signed = qty if side == "buy" else -qty
        return pos * signed < 0 and qty <= abs(pos) + 1e-12

    bad = [r for r in refused if unwinds(r[1], r[2], r[4]) and unwinds(r[1], r[2], r[5])]
    assert bad == []
    # unwinds did go out while the limits bound (the exemption is used, not vacuous)
    accepted = _q(
        run,
        f"""select r.side, r.qty, {_POS_BEFORE.format(op="<")} from 'EV/risk.parquet' r
        where r.intent = 'new' and r.accepted and r.source in ('kev', 'flatten')""",
    )
    assert sum(unwinds(*a) for a in accepted) >= 5


@pytest.mark.parametrize("hedge", ["reprice", "cross"])
def test_a_legging_residual_is_hedged_within_leg_timeout(pair, tmp_path, hedge):
    """ETH's market orders are refused for slippage (a limit below its half spread), BTC's are not: a
    unit's BTC leg fills and its ETH leg does not. ``leg_timeout_ms`` later the ETH residual is hedged:
    reprice sends a limit order at the far touch (not a market order: the slippage rule does not
    apply) and closes it; cross sends a market order, which the gateway refuses, and the episode is
    reported as refused."""
    timeout_ms = 400
    params = json.dumps({"risk.max_slippage_bps": 0.01, "leg_timeout_ms": timeout_ms})  # a sweep's keys
    run = _replay(pair, tmp_path / "k", "--params", params, "--leg-hedge", hedge)
    rows = _q(run, "select symbol, residual_qty, residual_notional_usd, start_ns, end_ns, closed, hedges "
                   "from 'EV/legging.parquet' order by seq")  # fmt: skip
    assert rows and all(r[0] == "ETHUSDT" and r[1] != 0 and r[2] > 0 for r in rows)
    timeout = timeout_ms * 1_000_000
    for sym, qty, _, start, end, closed, hedges in rows:
        # the legs went out together at start: BTC's accepted, ETH's refused
        legs = _q(run, f"select symbol, accepted from 'EV/risk.parquet' where ts_event = {start} "
                       "and source in ('kev', 'flatten') and intent = 'new' order by symbol")  # fmt: skip
        assert legs == [("BTCUSDT", True), ("ETHUSDT", False)]
        hedge_rows = _q(
            run,
            f"select order_type, side, qty, accepted, reason from 'EV/risk.parquet' where ts_event = {start + timeout} "
            f"and symbol = '{sym}' and source in ('kev', 'flatten') and intent = 'new'",
        )
        side = "buy" if qty > 0 else "sell"
        if hedge == "reprice":
            assert hedge_rows == [("limit", side, abs(qty), True, "ok")]
            assert (closed, hedges) == ("repriced", 1) and start + timeout < end <= start + 2 * timeout
        else:
            # refused: for slippage, or as acting on advice older than the gateway allows
            assert [r[:4] for r in hedge_rows] == [("market", side, abs(qty), False)]
            assert hedge_rows[0][4] in ("max_slippage", "stale_advice")
            assert (closed, hedges, end) == ("refused", 0, start + timeout)
    # the per-event engine takes the same decisions and records the same episodes
    per_event = _replay(pair, tmp_path / "p", "--params", params, "--leg-hedge", hedge, "--python-engine")
    m = [json.loads((r / "manifest.json").read_text()) for r in (run, per_event)]
    assert m[0]["digest"] == m[1]["digest"]
    assert _q(per_event, "select * from 'EV/legging.parquet' order by seq") == _q(
        run, "select * from 'EV/legging.parquet' order by seq"
    )


def test_leg_settings_out_of_range_are_one_error_line(pair, tmp_path, capsys):
    for flags, why in (
        (["--leg-timeout-ms", "0"], "--leg-timeout-ms must be a finite number > 0"),
        (["--params", '{"leg_timeout_ms": -5}'], "leg_timeout_ms"),
        (["--params", '{"leg_hedge": "wait"}'], "leg_hedge"),
    ):
        out = tmp_path / "bad"
        argv = ["replay", str(pair), "--symbols", "ALL", "--kev-hub", "pairs", "--out", str(out), *flags]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("dualhub replay: error: ") and why in err[0]
        assert not out.exists()


def test_the_report_gives_the_residuals_time_weighted_notional_and_longest_episode(pair, tmp_path, capsys):
    from analysis.portfolio import legging, legging_lines

    params = json.dumps({"risk.max_slippage_bps": 0.01, "leg_timeout_ms": 400})
    run = _replay(pair, tmp_path / "r", "--params", params, "--leg-hedge", "reprice")
    rows = _q(run, "select residual_notional_usd, start_ns, end_ns, symbol from 'EV/legging.parquet'")
    span = (min(r[1] for r in rows) - 10**9, max(r[2] for r in rows) + 10**9)
    s = legging(run, span)
    assert s is not None and s["episodes"] == len(rows) and s["closed"] == {"repriced": len(rows)}
    expected = sum(n * (e - b) for n, b, e, _ in rows) / (span[1] - span[0])
    assert s["time_weighted_notional_usd"] == pytest.approx(expected) and expected > 0
    longest = max(rows, key=lambda r: r[2] - r[1])
    assert s["longest_s"] == (longest[2] - longest[1]) / 1e9 and s["longest_symbol"] == longest[3]
    assert legging_lines(s)[0].startswith(f"legging: {len(rows)} episodes (repriced {len(rows)})")
    # `dualhub report` shows it after the loss stops, as the run's own span gives it
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "Legging: a hub command's leg left unfilled" in printed
    assert printed.index("Loss stops") < printed.index("Legging:")
    whole = legging(run)
    assert f"repriced {len(rows)}" in printed and f"{whole['time_weighted_notional_usd']:.2f}" in printed  # type: ignore[index]
    # a run without hub legs: an empty file, no episodes; a single-instrument run: no legging at all
    flat = tmp_path / "flat"
    assert main(["replay", str(pair), "--symbols", "ALL", "--out", str(flat)]) == 0
    assert legging(flat)["episodes"] == 0  # type: ignore[index]
    one = tmp_path / "one"
    assert main(["replay", str(pair), "--symbol", "BTCUSDT", "--out", str(one)]) == 0
    assert legging(one) is None and legging_lines(None) == []
