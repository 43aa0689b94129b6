"""``dualhub import binance-futures|binance-spot FILE --out DIR``: a Binance raw feed -> a dualhub session.

Input (``../shared/data/real/SOURCES.md``): gzip or plain text (told apart by the magic bytes), one
``<local_ts_ns> <raw JSON>`` per line; combined-stream frames ``{"stream": ..., "data": {...}}``
(``depth`` diffs, ``trade``, ``bookTicker``) and REST depth snapshot lines (``{"lastUpdateId": ...,
"bids", "asks"}``, no ``stream`` key).

Book sync, one implementation for both markets: diffs that arrive before a snapshot are buffered;
diffs with ``u <= lastUpdateId`` are stale; the first applied diff straddles the snapshot
(futures ``U <= lastUpdateId <= u``, spot ``U <= lastUpdateId + 1 <= u``); after that the continuity
rule is the only difference: futures ``pu == previous u``, spot ``U == previous u + 1``. A break opens
a ``Gap`` (channel ``depth``) at the last applied diff; diffs are buffered again and the gap ends at
the first diff applied after the next snapshot line (or at the last diff of the file). The market
is told by the diffs (futures diffs carry ``pu``): the wrong subcommand is refused.

Output: a 15-level ``BookSnapshot`` at every 100 ms of *exchange* time (the book as of that instant:
all diffs with ``E <= t`` applied), and every trade. ``ts_event`` is the exchange time, ``ts_recv``
the file's local receive time of the line that made the record known. The reference file's clock
runs ~1.27 s *behind* the exchange, so ``ts_recv < ts_event`` is normal; nothing assumes local >=
exchange. The offset is estimated (:func:`clock_estimate`) into the manifest's ``clock``, from which
replay puts exchange times on the local clock. A crossed book (best bid >= best ask) is counted and
not emitted. Every line not turned into an event is counted by reason in the manifest
(``import.skipped``: streams not imported; ``import.discarded``: data that could not be used).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson

from engine.events import BOOK_LEVELS, BookSnapshot, Trade
from engine.store import SessionWriter
from engine.validate import WireGuard
from recorder.importers.common import ImportInputError, contracts, count, read_lines, staged_dir
from recorder.normalise import GapLog
from wire.bitget.bitget_v2 import StreamCounters, wire_guard
from wire.bitget.bitget_v2_books import BookError, LocalBook

MS: Final = 1_000_000
MARKETS: Final = ("futures", "spot")
# The clock offset: this quantile of ts_recv - E over the depth diffs and trades is taken as the
# least one-way delay (a low quantile, not the minimum: one early stamp must not move it), which is
# assumed to be MIN_FEED_LATENCY_NS.
CLOCK_QUANTILE: Final = 0.01
MIN_FEED_LATENCY_NS: Final = 1_000_000
_BAD: Final = (KeyError, TypeError, ValueError)


def iter_lines(path: Path | str) -> Iterator[tuple[int, bytes]]:
    """``(local_ts_ns, json bytes)`` of every well-formed line (the rest: see :func:`import_binance`)."""
    for _n, line in read_lines(path):
        ts, sep, js = line.partition(b" ")
        if sep and ts.isdigit():
            yield int(ts), js


class BinanceBookBuilder:
    """One symbol's depth sync + local book + snapshots on an exchange-time grid."""

    def __init__(
        self,
        symbol: str,
        counters: StreamCounters,
        *,
        spot: bool = False,
        interval_ms: int = 100,
        gaps: GapLog | None = None,
        discarded: dict[str, int] | None = None,
        guard: WireGuard | None = None,
    ) -> None:
        self.symbol = symbol
        # the wire checks of the recorder and live mode (shared by a file's builders and its trades)
        self.guard = guard if guard is not None else wire_guard(inst_type=None)
        self.c = counters
        self.spot = spot
        self.interval_ms = interval_ms
        self.gaps = gaps if gaps is not None else GapLog(counters)
        self.discarded = discarded if discarded is not None else {}
        self.book = LocalBook()
        self.last_update_id: int | None = None  # the snapshot's; None: buffering (no snapshot / after a gap)
        self.prev_u: int | None = None  # last applied diff's u
        self.buffer: list[tuple[int, dict[str, Any]]] = []
        self.next_emit_ms: int | None = None
        self.last_e_ms: int | None = None  # last applied diff's E
        self.seen_e_ms: int | None = None  # last diff's E, applied or not
        self.crossed = 0
        self.applied = 0
        self.crossed_at: list[int] = []

    def on_snapshot(self, ts_recv: int, snap: dict[str, Any]) -> list[Any]:
        try:
            last_update_id = int(snap["lastUpdateId"])
            self.book.load_snapshot(snap.get("bids"), snap.get("asks"))
        except (*_BAD, BookError):
            count(self.discarded, "bad_snapshot")
            self.book.reset()
            self.last_update_id = self.prev_u = None  # buffer until a usable snapshot
            return []
        self.last_update_id = last_update_id
        self.prev_u = None
        out: list[Any] = []
        buffered, self.buffer = self.buffer, []
        for ts, d in buffered:
            out.extend(self.on_diff(ts, d))
        return out

    def on_diff(self, ts_recv: int, d: dict[str, Any]) -> list[Any]:
        try:
            big_u, u, e_ms = int(d["U"]), int(d["u"]), int(d["E"])
        except _BAD:
            count(self.discarded, "malformed_diff")  # lost: the continuity check of the next diff says so
            return []
        if why := self.guard.ts_reason(e_ms, ts_recv):
            # a diff at an impossible time is unusable (it would also stretch the snapshot grid to it):
            # lost, as a malformed one is
            count(self.discarded, f"diff_{why.partition(':')[0]}")
            return []
        self.seen_e_ms = e_ms
        if self.last_update_id is None:
            self.buffer.append((ts_recv, d))
            return []
        if self.prev_u is None:
            if u <= self.last_update_id:
                count(self.discarded, "stale_diff")
                return []
            if big_u > self.last_update_id + int(self.spot):
                first = "lastUpdateId+1" if self.spot else "lastUpdateId"
                return self._gap(ts_recv, d, f"first diff U={big_u} > {first} of {self.last_update_id}")
        elif broken := self._break(d, big_u):
            return self._gap(ts_recv, d, broken)
        # the book as of every grid instant strictly before this diff's exchange time
        out = self._emit_until(ts_recv, e_ms)
        try:
            self.book.apply_update(d.get("b"), d.get("a"))
        except BookError as e:
            count(self.discarded, "bad_diff")
            return out + self._gap(ts_recv, None, f"bad diff: {e}")
        if self.prev_u is None and (g := self.gaps.end("depth", self.symbol, e_ms * MS, ts_recv)):
            out.append(g)  # in sync again after a gap
        self.prev_u = u
        self.applied += 1
        self.last_e_ms = e_ms
        if self.next_emit_ms is None:
            self.next_emit_ms = (e_ms // self.interval_ms + 1) * self.interval_ms
        return out

    def _break(self, d: dict[str, Any], big_u: int) -> str:
        """The continuity rule, the one difference between the markets: ``""`` when ``d`` follows on."""
        assert self.prev_u is not None
        if self.spot:
            return "" if big_u == self.prev_u + 1 else f"U={big_u} != previous u+1={self.prev_u + 1}"
        pu = d.get("pu")
        return "" if pu == self.prev_u else f"pu={pu} != previous u={self.prev_u}"

    def finish(self, ts_recv: int) -> list[Any]:
        """End of input: diffs still waiting for a snapshot are discarded, an open gap ends here."""
        count(self.discarded, "no_snapshot", len(self.buffer))
        self.buffer = []
        g = self.gaps.end(
            "depth", self.symbol, (self.seen_e_ms or 0) * MS, ts_recv, "unresolved_at_end_of_file"
        )
        return [g] if g else []

    def _emit_until(self, ts_recv: int, e_ms: int) -> list[Any]:
        out: list[Any] = []
        if self.next_emit_ms is None:
            return out
        while self.next_emit_ms < e_ms:
            t = self.next_emit_ms
            self.next_emit_ms += self.interval_ms
            if self.book.crossed():
                self.crossed += 1
                self.crossed_at.append(t)
                continue
            bid_px, bid_sz, ask_px, ask_sz = self.book.top_levels(BOOK_LEVELS)
            if why := self.guard.book_reason(t, ts_recv, self.symbol, bid_px, bid_sz, ask_px, ask_sz):
                count(self.discarded, f"books15_{why.partition(':')[0]}")
                continue
            out.append(
                BookSnapshot(
                    ts_event=t * MS,
                    ts_recv=ts_recv,
                    seq=self.c.take("books15"),
                    symbol=self.symbol,
                    exch_seq=self.prev_u or 0,
                    bid_px=bid_px,
                    bid_sz=bid_sz,
                    ask_px=ask_px,
                    ask_sz=ask_sz,
                )
            )
        return out

    def _gap(self, ts_recv: int, keep: dict[str, Any] | None, reason: str) -> list[Any]:
        """Out of sync: no snapshot is emitted until a new snapshot line; ``keep`` waits for it."""
        assert self.seen_e_ms is not None
        self.gaps.start("depth", self.symbol, (self.last_e_ms or self.seen_e_ms) * MS, reason)
        self.last_update_id = self.prev_u = self.next_emit_ms = None
        if keep is not None:
            self.buffer.append((ts_recv, keep))
        return []


def import_binance(
    path: Path | str, out: Path | str, *, market: str = "futures", interval_ms: int = 100
) -> dict[str, Any]:
    """Import one Binance raw feed file (``market``: ``futures`` or ``spot``) into the session ``out``."""
    if market not in MARKETS:
        raise ValueError(f"market {market!r} is not one of {MARKETS}")
    with staged_dir(out) as tmp:
        return _import(Path(path), tmp, market == "spot", interval_ms)


def import_binance_usdm(path: Path | str, out: Path | str, *, interval_ms: int = 100) -> dict[str, Any]:
    return import_binance(path, out, market="futures", interval_ms=interval_ms)


def import_binance_spot(path: Path | str, out: Path | str, *, interval_ms: int = 100) -> dict[str, Any]:
    return import_binance(path, out, market="spot", interval_ms=interval_ms)


def _import(path: Path, out: Path, spot: bool, interval_ms: int) -> dict[str, Any]:
    market = "spot" if spot else "futures"
    counters = StreamCounters()
    gaps = GapLog(counters)
    builders: dict[str, BinanceBookBuilder] = {}
    skipped: dict[str, int] = {}
    discarded: dict[str, int] = {}
    # snapshot lines seen before any depth diff named the symbol
    pending: list[tuple[int, dict[str, Any]]] = []
    offsets_ms: list[float] = []
    lags_ns: list[int] = []  # ts_recv - E of every depth diff and trade: the clock estimate's sample
    events: list[Any] = []
    trades = lines = diffs = snapshots = 0
    ts_recv = 0
    guard = wire_guard(inst_type=None)

    def builder(sym: str) -> BinanceBookBuilder:
        b = builders.get(sym)
        if b is None:
            b = builders[sym] = BinanceBookBuilder(
                sym, counters, spot=spot, interval_ms=interval_ms, gaps=gaps, discarded=discarded, guard=guard
            )
        return b

    for lineno, line in read_lines(path):
        lines += 1
        ts, sep, js = line.partition(b" ")
        if not (sep and ts.isdigit() and js.startswith(b"{")):
            if lines == 1:
                raise ImportInputError(
                    f"{path}: not a Binance raw feed (line {lineno} is not '<local_ts_ns> <json>')"
                )
            count(discarded, "bad_line")
            continue
        ts_recv = int(ts)
        if b'@bookTicker"' in js[:64]:  # most of a feed and not imported: skipped before parsing
            count(skipped, "bookTicker")
            continue
        try:
            msg = orjson.loads(js)
        except orjson.JSONDecodeError:
            count(discarded, "bad_json")
            continue
        data = msg.get("data") if isinstance(msg, dict) else None
        if not isinstance(data, dict):
            if isinstance(msg, dict) and "lastUpdateId" in msg:
                snapshots += 1
                # the REST snapshot names no symbol: it belongs to the file's (first) depth stream
                if builders:
                    events.extend(next(iter(builders.values())).on_snapshot(ts_recv, msg))
                else:
                    pending.append((ts_recv, msg))
            else:
                count(discarded, "unknown_message")
            continue
        e = data.get("e")
        if e == "depthUpdate":
            if ("pu" in data) == spot:
                other = "futures" if spot else "spot"
                raise ImportInputError(
                    f"{path}: line {lineno} is a Binance {other} depth diff"
                    f" ({'with' if spot else 'no'} 'pu'), not {market}: use 'dualhub import binance-{other}'"
                )
            sym = data.get("s")
            if not isinstance(sym, str):
                count(discarded, "malformed_diff")
                continue
            diffs += 1
            b = builder(sym)
            for p_ts, p_snap in pending:
                events.extend(b.on_snapshot(p_ts, p_snap))
            pending = []
            if isinstance(data.get("E"), int):
                offsets_ms.append((ts_recv / MS) - data["E"])
                lags_ns.append(ts_recv - data["E"] * MS)
            events.extend(b.on_diff(ts_recv, data))
        elif e == "trade":
            if data.get("X", "MARKET") != "MARKET":
                count(skipped, f"trade_{data.get('X')}")
                continue
            try:
                t_ms, symbol, trade_id = int(data["T"]), str(data["s"]), str(data["t"])
                # m: the buyer is the maker -> the seller hit the bid
                px, sz, side = float(data["p"]), float(data["q"]), "sell" if data["m"] else "buy"
            except _BAD:
                count(discarded, "malformed_trade")
                continue
            if why := guard.trades_reason([(t_ms, trade_id, px, sz, side)], ts_recv, symbol):
                count(discarded, f"trade_{why.partition(':')[0]}")
                continue
            if not guard.fresh(symbol, trade_id):
                count(discarded, "trade_duplicate")
                continue
            ts_event = t_ms * MS
            trades += 1
            if isinstance(data.get("E"), int):
                lags_ns.append(ts_recv - data["E"] * MS)
            events.append(
                Trade(
                    ts_event=ts_event,
                    ts_recv=ts_recv,
                    seq=counters.take("trade"),
                    symbol=symbol,
                    trade_id=trade_id,
                    px=px,
                    sz=sz,
                    side=side,
                )
            )
        else:
            # some streams (spot partial depth) have no "e": the stream's name says what they are
            count(skipped, str(e or str(msg.get("stream", "")).partition("@")[2] or "unknown"))
    for b in builders.values():
        events.extend(b.finish(ts_recv))
    count(discarded, "snapshot_without_depth", len(pending))
    books = sum(isinstance(ev, BookSnapshot) for ev in events)
    if not books:
        if not diffs:
            why = "no depth diffs"
        elif not snapshots:
            why = f"{diffs} depth diffs but no REST depth snapshot line to start from"
        else:
            why = f"{diffs} depth diffs, none applicable: discarded {_fmt(discarded)}"
        raise ImportInputError(f"{path}: no order book could be rebuilt ({why})")
    w = SessionWriter(
        out,
        source=f"binance_{'spot' if spot else 'usdm'}:{path.name}",
        symbols=builders.keys(),
        extra={
            **({"clock": clock_estimate(lags_ns)} if lags_ns else {}),
            "contracts": contracts(
                events,
                venue="binance",
                contract_type="spot" if spot else "perpetual",
                origin=f"binance {'spot' if spot else 'usd-m'} exchangeInfo",
            ),
            "import": {
                "format": f"binance-{market}-raw",
                "market": market,
                "file": str(path),
                "interval_ms": interval_ms,
                "lines": lines,
                "gaps": len(gaps.closed),
                "gap_windows": gaps.closed[:1000],
                "crossed": sum(b.crossed for b in builders.values()),
                "depth_diffs": diffs,
                "depth_applied": sum(b.applied for b in builders.values()),
                "snapshot_lines": snapshots,
                "trades": trades,
                "skipped": dict(sorted(skipped.items())),
                "discarded": dict(sorted((k, v) for k, v in discarded.items() if v)),
                "local_minus_exchange_ms": {
                    "min": min(offsets_ms) if offsets_ms else None,
                    "median": statistics.median(offsets_ms) if offsets_ms else None,
                    "max": max(offsets_ms) if offsets_ms else None,
                },
            },
        },
    )
    events.sort(key=lambda ev: (ev.ts_recv, 0 if isinstance(ev, BookSnapshot) else 1))
    w.add_all(events)
    return w.close()


def clock_estimate(
    lags_ns: list[int], *, quantile: float = CLOCK_QUANTILE, min_latency_ns: int = MIN_FEED_LATENCY_NS
) -> dict[str, Any]:
    """The session manifest's ``clock`` from ``ts_recv - E`` per message (local minus exchange time:
    the clock offset plus that message's one-way delay).

    ``local_minus_exchange_ns`` = the ``quantile`` of those lags - ``min_latency_ns``: the fastest
    messages are taken to have had the least one-way delay, so the offset is as good as that
    assumption: a true least delay of 20 ms puts the offset, and every feed latency replay derives
    from it, 19 ms off."""
    lags = sorted(lags_ns)
    low = lags[int(quantile * (len(lags) - 1))]
    return {
        "local_minus_exchange_ns": low - min_latency_ns,
        "min_feed_latency_ns": min_latency_ns,
        "method": f"quantile {quantile:g} of ts_recv - exchange E over {len(lags)} depth diffs and trades, "
        "minus min_feed_latency_ns (the least one-way delay assumed)",
        "recv_minus_exchange_ns": {
            "min": lags[0],
            f"q{quantile:g}": low,
            "median": lags[len(lags) // 2],
            "max": lags[-1],
        },
    }


def _fmt(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()) if v) or "nothing"
