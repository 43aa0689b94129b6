"""The derived views of analysis/views.sql against a hand-built run whose answers are worked out
by hand: six decisions (three from Laya labels, one from a Kev reply, two requotes), two never filled.

Timeline (ms after T0; feed = book ts_recv - ts_event, Laya 0.2 ms, order entry 10 ms everywhere):
  book 0  event 0,   recv 5    (feed 5)  label 5.2    -> dh-1 sent 6.2 (decide 1),   ack 16.2, fill 46.2 (30)
  book 1  event 100, recv 107  (feed 7)  label 107.2  -> dh-2 sent 107.7 (0.5),     ack 117.7, never filled
  requote at 150                                       -> dh-4 sent 150 (0),        ack 160,  fill 210 (50)
  book 2  event 200, recv 204  (feed 4)  label 204.2  -> dh-3 sent 204.2 (0),      ack 214.2, fill 304.2 (90)
          the label goes to Kev: picked up 207.2 (queue 3), reply 457.2 (lag 250)
                                        -> dh-6 sent 459.2 (2), fill 467.2, ack 469.2 (fill 0: before its ack)
  book 3  event 300, recv 306  (feed 6)
  requote at 350                                       -> dh-5 sent 350 (0),        ack 360,  never filled
"""

from __future__ import annotations

from decimal import Decimal

import orjson
import pyarrow.parquet as pq
import pytest

from analysis.report import connect
from engine.eventlog import RUN_SCHEMA_VERSION, EventLog
from engine.events import (
    STREAMS,
    Fill,
    KevQueueEvent,
    KevRequest,
    KevResponse,
    LabelEvent,
    LatencySpan,
    OrderEvent,
    PortfolioCommand,
    events_to_table,
)
from engine.store import sha256_file
from tests.helpers import make_book

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
LAYA = 200_000  # 0.2 ms


def t(ms: float) -> int:
    return T0 + round(ms * MS)


BOOKS = [  # (event ms, recv ms, mid)
    (0, 5, 100.0),
    (100, 107, 101.0),
    (200, 204, 99.0),
    (300, 306, 98.0),
]


def _order(log: EventLog, oid: str, kind: str, ts: int, side: str, order_type: str, px: float, qty: float):
    log.emit(
        OrderEvent,
        ts_event=ts,
        ts_recv=ts,
        client_oid=oid,
        symbol="BTCUSDT",
        kind=kind,
        side=side,
        order_type=order_type,
        px=px,
        qty=qty,
        reason="",
    )


def _span(log: EventLog, name: str, ref: str, start: int, end: int) -> None:
    log.emit(
        LatencySpan,
        ts_event=start,
        ts_recv=end,
        name=name,
        ref=ref,
        start_ns=start,
        end_ns=end,
        dur_ns=end - start,
    )


def _new(log: EventLog, oid: str, origin: int, sent: int, ack: int, side: str, order_type: str = "limit"):
    _order(log, oid, "new", sent, side, order_type, 99.0, 0.01)
    _span(log, "tick_to_order", oid, origin, sent)
    _order(log, oid, "ack", ack, side, order_type, 99.0, 0.01)
    _span(log, "order_entry", oid, sent, ack)


def _fill(log: EventLog, oid: str, ts: int, side: str, px: str, qty: str, liquidity: str, rate: str):
    notional = Decimal(px) * Decimal(qty)
    log.emit(
        Fill,
        ts_event=ts,
        ts_recv=ts,
        client_oid=oid,
        symbol="BTCUSDT",
        side=side,
        px=float(px),
        qty=float(qty),
        liquidity=liquidity,
        notional=notional,
        fee=notional * Decimal(rate),
        position_after=0.0,
    )


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("handmade")
    session, run = root / "session", root / "run"
    (session / "books15").mkdir(parents=True)
    (run / "events").mkdir(parents=True)
    books = []
    for seq, (ev, recv, mid) in enumerate(BOOKS):
        b = make_book(mid - 0.5, mid + 0.5, ts=t(ev), seq=seq)
        books.append(type(b)(**{**{f: getattr(b, f) for f in b.__slots__}, "ts_recv": t(recv)}))
    book_file = session / "books15" / "part-00000.parquet"
    pq.write_table(events_to_table(books, "books15"), book_file)

    log = EventLog(run / "events")
    for seq, label in enumerate(("LEAN_BUY", "LEAN_SELL", "LEAN_SELL")):
        ev, recv, _ = BOOKS[seq]
        log.emit(
            LabelEvent,
            ts_event=t(ev),
            ts_recv=t(recv) + LAYA,
            symbol="BTCUSDT",
            book_seq=seq,
            book_ts_recv=t(recv),
            label=label,
            p_hold=0.1,
            p_lean_buy=0.1,
            p_lean_sell=0.8,
            p_emergency=0.0,
        )
    # Laya-driven: the tick_to_order span starts at the book's receipt
    _new(log, "dh-1", t(5), t(6.2), t(16.2), "buy")
    _fill(log, "dh-1", t(46.2), "buy", "99.5", "0.01", "maker", "0.0002")
    _new(log, "dh-2", t(107), t(107.7), t(117.7), "sell")
    _new(log, "dh-4", t(150), t(150), t(160), "buy")  # a requote: its origin is its own send time
    _fill(log, "dh-4", t(210), "buy", "98.5", "0.02", "maker", "0.0002")
    _new(log, "dh-3", t(204), t(204.2), t(214.2), "sell")
    _fill(log, "dh-3", t(304.2), "sell", "99.5", "0.01", "maker", "0.0002")
    # Kev: label 2 offered at 204.2, picked up at 207.2, answered at 457.2
    offered, picked, answered = t(204.2), t(207.2), t(457.2)
    log.emit(KevQueueEvent, ts_event=offered, ts_recv=offered, request_id=1, kind="offered", depth=1)
    log.emit(
        KevRequest,
        ts_event=offered,
        ts_recv=picked,
        request_id=1,
        symbol="BTCUSDT",
        label="LEAN_SELL",
        label_seq=2,
        mid=99.0,
        spread=1.0,
        imbalance=0.0,
        position=0.03,
        queue_wait_ns=picked - offered,
    )
    _span(log, "kev_queue", "kev:1", offered, picked)
    log.emit(
        KevResponse,
        ts_event=answered,
        ts_recv=answered,
        request_id=1,
        ok=True,
        error="",
        failure="",
        lag_ns=answered - picked,
        advisor="rules",
        key="k",
        raw="{}",
        prompt_ms=0.0,
        predicted_ms=0.0,
        prompt_tokens=0,
        completion_tokens=0,
    )
    _span(log, "kev", "kev:1", picked, answered)
    log.emit(
        PortfolioCommand,
        ts_event=offered,
        ts_recv=answered,
        command_id=1,
        request_id=1,
        symbol="BTCUSDT",
        action="LEAN_SELL",
        target_position=0.01,
        hedge_ratio=0.0,
        max_slippage_bps=5.0,
        reason="",
        valid_until=answered + 5000 * MS,
    )
    _order(log, "dh-6", "new", t(459.2), "sell", "market", float("nan"), 0.01)
    _span(log, "tick_to_order", "dh-6", offered, t(459.2))  # a Kev-driven order starts at the offer
    _fill(log, "dh-6", t(467.2), "sell", "97.9", "0.01", "taker", "0.0006")
    _order(log, "dh-6", "ack", t(469.2), "sell", "market", float("nan"), 0.01)
    _new(log, "dh-5", t(350), t(350), t(360), "sell")
    files = log.write()
    pq.write_table(
        STREAMS["input_quarantine"].schema.empty_table(), run / "events" / "input_quarantine.parquet"
    )
    files["events/input_quarantine.parquet"] = {
        "rows": 0,
        "sha256": sha256_file(run / "events" / "input_quarantine.parquet"),
    }
    manifest = {
        "run_schema_version": RUN_SCHEMA_VERSION,
        "digest": log.digest,
        "config": {"symbol": "BTCUSDT"},
        "files": files,
        "session": {
            "path": str(session),
            "files": {"books15/part-00000.parquet": {"rows": 4, "sha256": sha256_file(book_file)}},
        },
    }
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    c = connect(run)
    yield c
    c.close()


def _rows(con, sql: str) -> list[dict]:
    rel = con.sql(sql)
    return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]


def test_each_decision_traced_to_its_driver_with_its_stages(con) -> None:
    d = {r["client_oid"]: r for r in _rows(con, "SELECT * FROM decisions")}
    assert {k: v["driver"] for k, v in d.items()} == {
        "dh-1": "label",
        "dh-2": "label",
        "dh-3": "label",
        "dh-4": "requote",
        "dh-5": "requote",
        "dh-6": "kev",
    }
    ms = {
        k: {
            s: None if v[f"{s}_ns"] is None else v[f"{s}_ns"] / MS
            for s in ("feed", "laya", "kev_queue", "kev", "decide", "order_entry", "fill")
        }
        for k, v in d.items()
    }
    assert ms["dh-1"] == dict(feed=5, laya=0.2, kev_queue=None, kev=None, decide=1, order_entry=10, fill=30)
    assert ms["dh-2"] == dict(
        feed=7, laya=0.2, kev_queue=None, kev=None, decide=0.5, order_entry=10, fill=None
    )
    assert ms["dh-3"]["fill"] == 90 and ms["dh-3"]["feed"] == 4
    assert ms["dh-4"] == dict(
        feed=None, laya=None, kev_queue=None, kev=None, decide=0, order_entry=10, fill=50
    )
    assert ms["dh-5"]["fill"] is None and ms["dh-5"]["order_entry"] == 10
    # the Kev path: the label it was offered (book 2), its queue wait and lag; filled before its ack: 0
    assert ms["dh-6"] == dict(feed=4, laya=0.2, kev_queue=3, kev=250, decide=2, order_entry=10, fill=0)
    assert d["dh-6"]["request_id"] == 1 and d["dh-6"]["label"] == "LEAN_SELL"
    assert [k for k, v in sorted(d.items()) if not v["filled"]] == ["dh-2", "dh-5"]


def test_unfilled_orders_are_counted_apart_not_as_zero_ms_fills(con) -> None:
    counts = {
        r["driver"]: (r["decisions"], r["filled"], r["unfilled"]) for r in _rows(con, "FROM decision_counts")
    }
    assert counts == {"label": (3, 2, 1), "kev": (1, 1, 0), "requote": (2, 1, 1), "all": (6, 4, 2)}
    fills = _rows(con, "SELECT dur_ns / 1e6 AS ms FROM latency_stages WHERE stage = 'fill' ORDER BY 1")
    assert [r["ms"] for r in fills] == [0, 30, 50, 90]  # dh-2 and dh-5 have no fill stage at all


def test_stage_medians_over_measured_decisions_only(con) -> None:
    s = {(r["driver"], r["stage"]): r for r in _rows(con, "FROM latency_stage_stats")}
    # fill, all drivers: 0, 30, 50, 90 -> median (30 + 50) / 2 = 40; p90 at rank 0.9 * 3 = 2.7:
    # 50 + 0.7 * (90 - 50) = 78. Counting the two unfilled orders as 0 ms would give a median of 15.
    assert (s["all", "fill"]["n"], s["all", "fill"]["p50_ms"], s["all", "fill"]["p90_ms"]) == (4, 40.0, 78.0)
    assert (s["label", "fill"]["n"], s["label", "fill"]["p50_ms"]) == (2, 60.0)  # 30, 90 (not 0, 30, 90)
    assert (s["requote", "fill"]["n"], s["requote", "fill"]["p50_ms"]) == (1, 50.0)
    assert s["kev", "fill"]["p50_ms"] == 0.0
    assert (s["label", "feed"]["n"], s["label", "feed"]["p50_ms"]) == (3, 5.0)  # 5, 7, 4
    assert (s["all", "decide"]["n"], s["all", "decide"]["p50_ms"]) == (6, 0.25)  # 0, 0, 0, 0.5, 1, 2
    assert s["kev", "kev"]["p50_ms"] == 250.0 and s["kev", "kev_queue"]["p50_ms"] == 3.0
    assert ("label", "kev") not in s and ("requote", "feed") not in s  # stages off the path: no rows
    order = [r["stage"] for r in _rows(con, "FROM latency_stage_stats WHERE driver = 'kev'")]
    assert order == ["feed", "laya", "kev_queue", "kev", "decide", "order_entry", "fill"]


def test_fills_pnl_position_cash_mid_and_edge(con) -> None:
    rows = _rows(con, "SELECT client_oid, position, cash, mid, pnl, edge FROM fills_pnl ORDER BY ts_recv")
    assert [r["client_oid"] for r in rows] == ["dh-1", "dh-4", "dh-3", "dh-6"]
    assert [r["position"] for r in rows] == [0.01, 0.03, 0.02, 0.01]
    # cash: -0.995 - 0.000199; -1.97 - 0.000394; +0.995 - 0.000199; +0.979 - 0.0005874 (exact decimals)
    assert [r["cash"] for r in rows] == [
        Decimal("-0.995199"),
        Decimal("-2.965593"),
        Decimal("-1.970792"),
        Decimal("-0.9923794"),
    ]
    assert [r["mid"] for r in rows] == [100.0, 99.0, 99.0, 98.0]  # the last book at or before each fill
    assert rows[-1]["pnl"] == pytest.approx(-0.9923794 + 0.01 * 98.0)
    assert [r["edge"] for r in rows] == pytest.approx([0.005, 0.01, 0.005, -0.001])
