"""What the live dashboard shows, built on the engine's event loop at a fixed rate and published as one
immutable value.

:class:`SnapshotPublisher` runs as a task of the live run (``LiveRunner._start`` spawns it through
:class:`live.dashboard.Dashboard`). Every ``every_s`` it reads the runner between two events (a task of
the same loop: never inside a step, never under a lock), builds a plain dict and its JSON bytes, and
replaces :attr:`SnapshotPublisher.latest` with a new :class:`Snapshot`. Readers in other threads (the
HTTP server, the Prometheus collector) only ever load that one reference; nothing they do reaches the
engine. The engine's tick path does not know the publisher exists.

What it reads: the engines' own state (position, cash, fees, open orders, Kev queue and in-flight
requests, kill switch), the runner's (feed counts, venue links, kill source), and the rows each event
log gained since the last look (orders, fills, risk decisions, latency spans): resting orders are the
order stream's ``new`` rows not yet ended (``reject``/``cancel_ack``/``done``), refusals are the risk
stream's refused rows by rule, tick-to-order is the ``tick_to_order`` latency span. Rows a log wrote out
to Parquet between two looks (only when a stream passes a row-group boundary, 16 384 rows, within one
period) are counted in ``unseen_rows``, not guessed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from engine.eventlog import EventLog
    from live.runner import LiveRunner

log = logging.getLogger(__name__)

PUBLISH_EVERY_S: Final = 0.25
RECENT_FILLS: Final = 50
RESTING_SHOWN: Final = 100
LATENCY_WINDOW: Final = 2048  # the last tick-to-order spans the percentiles are of
RATE_WINDOW: Final = 9  # label rate over the last 9 snapshots (2 s at the default rate)
# Prometheus histogram bounds of tick-to-order, seconds (cumulative counts over the whole run)
T2O_BOUNDS_S: Final = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3)
_ENDED: Final = frozenset({"reject", "cancel_ack", "done"})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One published view. ``data`` is never changed after publishing; ``body`` is it as JSON."""

    seq: int
    data: dict[str, Any]
    body: bytes


class _Tail:
    """The rows one stream of one event log gained since the last look."""

    def __init__(self, evlog: EventLog, stream: str) -> None:
        self.log, self.stream = evlog, stream
        self.seen = 0
        self.unseen = 0

    def take(self, count: int) -> pa.Table | None:
        if count <= self.seen:
            return None
        # The log's rows not yet written out (with their seq), read without consuming them: the log has
        # no public reader of its pending rows, and asking it for event objects would build all of them.
        t = self.log._pending(self.stream, consume=False)
        new = None
        if t is not None and t.num_rows:
            skip = self.seen - int(t.column("seq")[0].as_py())
            if skip < 0:  # written out to Parquet between two looks: counted, not read back
                self.unseen -= skip
                skip = 0
            new = t.slice(skip) if skip < t.num_rows else None
        else:
            self.unseen += count - self.seen
        self.seen = count
        return new


def _quantiles(a: np.ndarray) -> dict[str, float | None]:
    """p50, p90, p99 and the max of ``a`` (nearest rank: one sort, no interpolation)."""
    if not len(a):
        return dict.fromkeys(("p50", "p90", "p99", "max"))
    s = np.sort(a)
    n = len(s)
    at = {k: s[min(n - 1, int(np.ceil(q * n)) - 1)] for k, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}
    return {**{k: float(v) for k, v in at.items()}, "max": float(s[-1])}


class SnapshotPublisher:
    def __init__(self, runner: LiveRunner, every_s: float = PUBLISH_EVERY_S) -> None:
        self.runner = runner
        self.every_s = every_s
        self.latest: Snapshot | None = None
        self._seq = 0
        self._logs: list[tuple[EventLog, dict[str, _Tail]]] = []
        self._resting: dict[str, dict[str, Any]] = {}
        self._fills: deque[dict[str, Any]] = deque(maxlen=RECENT_FILLS)
        self._refused: dict[str, int] = {}
        self._decisions = self._accepted = 0
        self._t2o = np.zeros(0, dtype=np.int64)
        self._kev_lag = np.zeros(0, dtype=np.int64)
        # their quantiles, worked out again only when new spans came (a sort: not every snapshot)
        self._t2o_q: dict[str, float | None] = _quantiles(self._t2o)
        self._kev_q: dict[str, float | None] = _quantiles(self._kev_lag)
        self._t2o_buckets = np.zeros(len(T2O_BOUNDS_S) + 1, dtype=np.int64)  # last: above every bound
        self._t2o_sum_ns = 0
        self._labels: deque[tuple[int, int]] = deque(maxlen=RATE_WINDOW)
        self._failed = ""

    async def run(self) -> None:
        try:
            while True:
                self.publish()
                await asyncio.sleep(self.every_s)
        except asyncio.CancelledError:
            self.publish()  # the run is stopping: the page shows how it stood
            raise

    def publish(self) -> Snapshot:
        """Build and publish one snapshot. A failure is logged once and shown on the page; it never
        ends the run (the dashboard watches, it does not trade)."""
        try:
            data = self._build()
            self._failed = ""
        except Exception as e:
            text = f"{type(e).__name__}: {e}"[:300]
            if text != self._failed:
                log.error("dashboard snapshot failed: %s", text)
                self._failed = text
            prev = self.latest.data if self.latest is not None else {}
            data = {**prev, "error": text}
        self._seq += 1
        data["seq"] = self._seq
        snap = Snapshot(self._seq, data, orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY))
        self.latest = snap  # one reference store: readers see the old snapshot or this one, whole
        return snap

    # ------------------------------------------------------------------ building

    def _build(self) -> dict[str, Any]:
        # The runner's own fields are read as its status line reads them (this is its companion, on
        # its loop): its redaction of link details and its last frame's receive time among them.
        r = self.runner
        now = time.time_ns()
        if not self._logs:
            seen: dict[int, EventLog] = {}
            for st in r.syms.values():  # a portfolio's instruments share one log
                seen.setdefault(id(st.log), st.log)
            self._logs = [
                (lg, {s: _Tail(lg, s) for s in ("order", "fill", "risk", "latency")}) for lg in seen.values()
            ]
        counts: dict[str, int] = {}
        for lg, tails in self._logs:
            c = lg.counts()  # hands the engine's buffered rows to the log first
            for k, v in c.items():
                counts[k] = counts.get(k, 0) + v
            self._orders(tails["order"].take(c["order"]))
            self._on_fills(tails["fill"].take(c["fill"]))
            self._risk(tails["risk"].take(c["risk"]))
            self._latency(tails["latency"].take(c["latency"]))
        self._labels.append((now, counts.get("label", 0)))
        t0, n0 = self._labels[0]
        rate = (counts.get("label", 0) - n0) / ((now - t0) / 1e9) if now > t0 else 0.0

        instruments: dict[str, Any] = {}
        total_pnl = total_fees = gross = net = 0.0
        for sym, st in r.syms.items():
            e = st.engine
            pv = e.portfolio
            book = e.book
            mid = (book.bid_px[0] + book.ask_px[0]) / 2 if book is not None and book.bid_px else None
            pos = float(pv.position)
            # as Portfolio.pnl: cash, plus the position at its mark (an instrument never priced: cash)
            pnl = float(pv.cash if mid is None or pv.position == 0 else pv.pnl(mid))
            total_pnl += pnl
            total_fees += float(pv.fees)
            if mid is not None:
                gross += abs(pos * mid)
                net += pos * mid
            instruments[sym] = {
                "position": pos,
                "mid": mid,
                "cash": float(pv.cash),
                "fees": float(pv.fees),
                "pnl": pnl,
                "open_orders": e.open_orders,
                "label": e.label,
                "kev_queue": e.kev_queued,
                "kev_in_flight": e.kev_in_flight,
                "kill_switch": e.kill_switch,
            }
        t2o, lag, tq, kq = self._t2o, self._kev_lag, self._t2o_q, self._kev_q
        links = {
            c: {"state": link.state, "detail": r._redact(link.detail)[:200]}
            for c, link in r.venue_health.links.items()
        }
        resting = sorted(self._resting.values(), key=lambda o: o["ts_ns"], reverse=True)[:RESTING_SHOWN]
        return {
            "ts_ns": now,
            "mode": r.cfg.mode,
            "symbols": list(r.cfg.symbols),
            "uptime_s": (now - r.started_ns) / 1e9 if r.started_ns else 0.0,
            "running": not r.stopping,
            "stop_reason": r.stop_reason,
            "kill": {
                "engaged": bool(r.killed) or any(i["kill_switch"] for i in instruments.values()),
                "source": r.killed,
            },  # fmt: skip
            "instruments": instruments,
            "portfolio": {"pnl": total_pnl, "fees": total_fees, "gross_usd": gross, "net_usd": net},
            "resting": [{**o, "age_s": (now - o["ts_ns"]) / 1e9} for o in resting],
            "resting_total": len(self._resting),
            "fills": list(reversed(self._fills)),
            "risk": {
                "decisions": self._decisions,
                "accepted": self._accepted,
                "by_rule": dict(self._refused),
            },
            "kev": {
                "queue_depth": sum(i["kev_queue"] for i in instruments.values()),
                "in_flight": sum(i["kev_in_flight"] for i in instruments.values()),
                "answers": counts.get("kev_response", 0),
                "requests": counts.get("kev_request", 0),
                "lag_ms": {
                    "last": float(lag[-1]) / 1e6 if len(lag) else None,
                    "p50": _ms(kq["p50"]),
                    "p99": _ms(kq["p99"]),
                },
            },
            "labels": {"total": counts.get("label", 0), "rate_per_s": rate},
            "tick_to_order_us": {
                "window": len(t2o),
                "p50": _us(tq["p50"]),
                "p90": _us(tq["p90"]),
                "p99": _us(tq["p99"]),
                "max": _us(tq["max"]),
            },
            "tick_to_order_hist": {
                "bounds_s": list(T2O_BOUNDS_S),
                "counts": self._t2o_buckets.tolist(),
                "sum_s": self._t2o_sum_ns / 1e9,
            },
            "venue": links,
            "feed": {
                "frames": r.frames,
                "books": r.books,
                "trades": r.trades,
                "quarantined": sum(r.quarantined.values()),
                "age_s": (now - r._last_frame_ns) / 1e9 if r._last_frame_ns else None,
            },
            "counts": counts,
            "unseen_rows": {
                f"{t.stream}": t.unseen for _, tails in self._logs for t in tails.values() if t.unseen
            },
            "error": "",
        }

    def _orders(self, t: pa.Table | None) -> None:
        if t is None:
            return
        cols = [
            t.column(c).to_pylist() for c in ("ts_event", "client_oid", "symbol", "kind", "side", "px", "qty")
        ]
        for ts, oid, sym, kind, side, px, qty in zip(*cols, strict=True):
            if kind == "new":
                self._resting[oid] = {
                    "ts_ns": ts, "client_oid": oid, "symbol": sym, "side": side, "px": px, "qty": qty,
                    "filled": 0.0, "state": "sent",
                }  # fmt: skip
            elif kind in _ENDED:
                self._resting.pop(oid, None)
            elif (o := self._resting.get(oid)) is not None:
                o["state"] = "working" if kind == "ack" else "cancelling"

    def _on_fills(self, t: pa.Table | None) -> None:
        if t is None:
            return
        oids = t.column("client_oid").to_pylist()
        qtys = t.column("qty").to_pylist()
        for oid, q in zip(oids, qtys, strict=True):
            if (o := self._resting.get(oid)) is not None:
                o["filled"] += q
        last = t.slice(max(0, t.num_rows - RECENT_FILLS))
        names = ("ts_event", "client_oid", "symbol", "side", "px", "qty", "liquidity", "position_after")
        cols = [last.column(c).to_pylist() for c in names]
        fees = [float(x) for x in last.column("fee").to_pylist()]
        for row in zip(*cols, fees, strict=True):
            self._fills.append(dict(zip((*names, "fee"), row, strict=True)))

    def _risk(self, t: pa.Table | None) -> None:
        if t is None:
            return
        accepted = t.column("accepted")
        n_ok = int(pc.sum(accepted).as_py() or 0)
        self._decisions += t.num_rows
        self._accepted += n_ok
        if n_ok < t.num_rows:
            refused = pc.filter(t.column("reason"), pc.invert(accepted))
            for item in pc.value_counts(refused).to_pylist():
                rule = item["values"] or "?"
                self._refused[rule] = self._refused.get(rule, 0) + item["counts"]

    def _latency(self, t: pa.Table | None) -> None:
        if t is None:
            return
        names = t.column("name")
        durs = t.column("dur_ns")
        t2o = pc.filter(durs, pc.equal(names, "tick_to_order")).to_numpy()
        if len(t2o):
            self._t2o = np.concatenate((self._t2o, t2o))[-LATENCY_WINDOW:]
            self._t2o_buckets += np.bincount(
                np.searchsorted(np.asarray(T2O_BOUNDS_S) * 1e9, t2o, side="left"),
                minlength=len(T2O_BOUNDS_S) + 1,
            )
            self._t2o_sum_ns += int(t2o.sum())
            self._t2o_q = _quantiles(self._t2o)
        kev = pc.filter(durs, pc.equal(names, "kev")).to_numpy()
        if len(kev):
            self._kev_lag = np.concatenate((self._kev_lag, kev))[-LATENCY_WINDOW:]
            self._kev_q = _quantiles(self._kev_lag)


def _us(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e3


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6
