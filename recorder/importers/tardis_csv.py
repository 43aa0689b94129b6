"""``dualhub import tardis-csv FILE... --out DIR``: Tardis.dev CSV datasets -> a session.

Tardis sells normalised history as daily CSV files (https://docs.tardis.dev/downloadable-csv-files);
three of its datasets are read, each told by its header line (plain or gzip):

* ``trades``: ``exchange,symbol,timestamp,local_timestamp,id,side,price,amount`` -> ``Trade``;
* ``book_snapshot_25``: ``exchange,symbol,timestamp,local_timestamp,asks[0].price,asks[0].amount,
  bids[0].price,bids[0].amount,...`` (25 levels a side) -> ``BookSnapshot`` of the top 15;
* ``incremental_book_L2``: ``exchange,symbol,timestamp,local_timestamp,is_snapshot,side,price,amount``
  (``amount`` the new absolute size, 0 deletes; a run of ``is_snapshot`` rows is a new book) -> the
  book is rebuilt and its top 15 is a ``BookSnapshot`` after each message (the rows of one
  ``local_timestamp``).

``timestamp`` (exchange) and ``local_timestamp`` (Tardis's receive time) are microseconds since the
epoch. Every row goes through the wire checks of the recorder and live mode (``engine.validate``:
timestamps, price and size ranges, the band around the current book, trade ids seen before); a row that
fails, or does not parse, is counted by reason in ``import.discarded`` and, for a book message, the book
stays as it was. With both book datasets for a symbol, the snapshots come from ``book_snapshot_25``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from engine.events import BOOK_LEVELS, BookSnapshot, Trade
from engine.store import SessionWriter
from recorder.importers.common import ImportInputError, contracts, count, read_lines, staged_dir
from wire.bitget.bitget_v2 import StreamCounters, wire_guard
from wire.bitget.bitget_v2_books import BookError, LocalBook

US: Final = 1_000
HEAD: Final = ("exchange", "symbol", "timestamp", "local_timestamp")
TRADES: Final = (*HEAD, "id", "side", "price", "amount")
INCREMENTAL: Final = (*HEAD, "is_snapshot", "side", "price", "amount")
SNAPSHOT_LEVELS: Final = 25
SNAPSHOT: Final = (
    *HEAD,
    *(f"{s}[{i}].{f}" for i in range(SNAPSHOT_LEVELS) for s in ("asks", "bids") for f in ("price", "amount")),
)
DATASETS: Final = {TRADES: "trades", INCREMENTAL: "incremental_book_L2", SNAPSHOT: "book_snapshot_25"}


def _rows(path: Path) -> tuple[str, Iterator[list[str]]]:
    """The dataset of ``path`` (by its header) and its data rows."""
    lines = read_lines(path)
    _, head = next(lines)
    cols = tuple(next(csv.reader([head.decode("utf-8", "replace")])))
    kind = DATASETS.get(cols)
    if kind is None:
        raise ImportInputError(
            f"{path}: not a Tardis CSV dataset this importer reads (trades, book_snapshot_25,"
            f" incremental_book_L2): the header starts {','.join(cols[:6])!r}"
        )

    def rows() -> Iterator[list[str]]:
        for _, line in lines:
            yield next(csv.reader(io.StringIO(line.decode("utf-8", "replace"))))

    return kind, rows()


def _us(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 16):
        raise ValueError(text)
    return int(text)


def _level(p: str, q: str) -> tuple[float, float] | None:
    """A present level (empty cells: fewer levels than 25 on that side)."""
    if not p and not q:
        return None
    px, sz = float(p), float(q)
    if not (math.isfinite(px) and math.isfinite(sz)) or px <= 0 or sz < 0:
        raise ValueError(f"{p}/{q}")
    return px, sz


class _Import:
    def __init__(self) -> None:
        self.counters = StreamCounters()
        # the recorder's wire checks; Tardis trade ids are the venue's, so seen ones are dropped
        self.guard = wire_guard(inst_type=None)
        self.discarded: dict[str, int] = {}
        self.events: list[Any] = []
        self.snapshot_symbols: set[str] = set()
        self.rows: dict[str, int] = {}

    def book(self, symbol: str, ts_us: int, recv_us: int, bids: Sequence[tuple[float, float]],
             asks: Sequence[tuple[float, float]], what: str) -> None:  # fmt: skip
        """One top-of-book (levels best first) as a ``BookSnapshot`` if it is a usable one."""
        nan = math.nan
        b, a = list(bids)[:BOOK_LEVELS], list(asks)[:BOOK_LEVELS]
        if not b or not a or b[0][0] >= a[0][0]:
            count(self.discarded, f"{what}_{'crossed' if b and a else 'one_sided'}")
            return
        pad_b, pad_a = (nan,) * (BOOK_LEVELS - len(b)), (nan,) * (BOOK_LEVELS - len(a))
        bid_px, bid_sz = tuple(p for p, _ in b) + pad_b, tuple(q for _, q in b) + pad_b
        ask_px, ask_sz = tuple(p for p, _ in a) + pad_a, tuple(q for _, q in a) + pad_a
        ts_ms, ts_recv = ts_us // US, recv_us * US
        if why := self.guard.book_reason(ts_ms, ts_recv, symbol, bid_px, bid_sz, ask_px, ask_sz):
            count(self.discarded, f"{what}_{why.partition(':')[0]}")
            return
        self.events.append(
            BookSnapshot(
                ts_event=ts_us * US,
                ts_recv=ts_recv,
                seq=self.counters.take("books15"),
                symbol=symbol,
                exch_seq=0,
                bid_px=bid_px,
                bid_sz=bid_sz,
                ask_px=ask_px,
                ask_sz=ask_sz,
            )
        )

    def trades(self, rows: Iterator[list[str]]) -> None:
        for r in rows:
            try:
                _, symbol, ts, recv, tid, side, price, amount = r
                ts_us, recv_us, px, sz = _us(ts), _us(recv), float(price), float(amount)
            except ValueError:
                count(self.discarded, "trade_bad_row")
                continue
            if side not in ("buy", "sell"):
                count(self.discarded, "trade_bad_side")  # Tardis writes "unknown" where it was not said
                continue
            ts_recv = recv_us * US
            if why := self.guard.trades_reason([(ts_us // US, tid, px, sz, side)], ts_recv, symbol):
                count(self.discarded, f"trade_{why.partition(':')[0]}")
                continue
            if not tid or not self.guard.fresh(symbol, tid):
                count(self.discarded, "trade_duplicate")
                continue
            self.events.append(
                Trade(
                    ts_event=ts_us * US,
                    ts_recv=ts_recv,
                    seq=self.counters.take("trade"),
                    symbol=symbol,
                    trade_id=tid,
                    px=px,
                    sz=sz,
                    side=side,
                )
            )

    def snapshots(self, rows: Iterator[list[str]]) -> None:
        for r in rows:
            try:
                if len(r) != len(SNAPSHOT):
                    raise ValueError("columns")
                symbol, ts_us, recv_us = r[1], _us(r[2]), _us(r[3])
                asks, bids = [], []
                for i in range(SNAPSHOT_LEVELS):
                    k = 4 + 4 * i
                    if (lv := _level(r[k], r[k + 1])) is not None:
                        asks.append(lv)
                    if (lv := _level(r[k + 2], r[k + 3])) is not None:
                        bids.append(lv)
            except ValueError:
                count(self.discarded, "book_snapshot_bad_row")
                continue
            self.snapshot_symbols.add(symbol)
            self.book(symbol, ts_us, recv_us, bids, asks, "book_snapshot")

    def incremental(self, rows: Iterator[list[str]]) -> None:
        """Rebuild each symbol's book; a message is the rows of one (symbol, local_timestamp)."""
        books: dict[str, LocalBook] = {}
        pending: dict[str, tuple[int, int]] = {}  # symbol -> the (timestamp, local_timestamp) not emitted
        in_snapshot: dict[str, bool] = {}

        def emit(symbol: str) -> None:
            ts_us, recv_us = pending.pop(symbol)
            if symbol in self.snapshot_symbols:
                return  # book_snapshot_25 is the source of this symbol's snapshots
            b = books[symbol]
            levels = b.top_levels(BOOK_LEVELS)
            bids = [(p, q) for p, q in zip(levels[0], levels[1], strict=True) if p == p]
            asks = [(p, q) for p, q in zip(levels[2], levels[3], strict=True) if p == p]
            self.book(symbol, ts_us, recv_us, bids, asks, "incremental")

        for r in rows:
            try:
                _, symbol, ts, recv, snap, side, price, amount = r
                ts_us, recv_us = _us(ts), _us(recv)
                if side not in ("bid", "ask") or snap not in ("true", "false"):
                    raise ValueError(side)
                float(price), float(amount)
            except ValueError:
                count(self.discarded, "incremental_bad_row")
                continue
            if symbol in pending and pending[symbol][1] != recv_us:
                emit(symbol)
            book = books.setdefault(symbol, LocalBook())
            if snap == "true" and not in_snapshot.get(symbol):
                book.reset()  # a new snapshot starts
            in_snapshot[symbol] = snap == "true"
            try:
                level = [[price, amount]]
                book.apply_update(level if side == "bid" else None, level if side == "ask" else None)
            except BookError:
                count(self.discarded, "incremental_bad_level")
                continue
            book.ready = True
            pending[symbol] = (ts_us, recv_us)
        for symbol in list(pending):
            emit(symbol)


def import_tardis_csv(paths: Sequence[Path | str], out: Path | str) -> dict[str, Any]:
    """Import Tardis CSV files (any mix of the three datasets, any symbols) into one session."""
    with staged_dir(out) as tmp:
        return _import([Path(p) for p in paths], tmp)


def _import(paths: list[Path], out: Path) -> dict[str, Any]:
    imp = _Import()
    opened = [(p, *_rows(p)) for p in paths]
    # snapshots first: a symbol with book_snapshot_25 takes its books from there
    order = {"book_snapshot_25": 0, "incremental_book_L2": 1, "trades": 2}
    read = {"book_snapshot_25": imp.snapshots, "incremental_book_L2": imp.incremental, "trades": imp.trades}
    for _, kind, rows in sorted(opened, key=lambda t: order[t[1]]):
        read[kind](rows)
    books = sum(isinstance(e, BookSnapshot) for e in imp.events)
    if not books:
        why = ", ".join(f"{k} {v}" for k, v in sorted(imp.discarded.items())) or "no book dataset given"
        raise ImportInputError(f"no order book could be built from {', '.join(map(str, paths))} ({why})")
    # one clock: the receive time, books before trades at a tie; seqs then follow that order (the
    # datasets were read one after the other)
    imp.events.sort(key=lambda e: (e.ts_recv, 0 if isinstance(e, BookSnapshot) else 1, e.seq))
    counters = StreamCounters()
    imp.events = [
        dataclasses.replace(e, seq=counters.take("books15" if isinstance(e, BookSnapshot) else "trade"))
        for e in imp.events
    ]
    w = SessionWriter(
        out,
        source="tardis_csv:" + ",".join(p.name for p in paths),
        symbols=sorted({e.symbol for e in imp.events}),
        extra={
            # the datasets read are bitget-futures': Bitget's USDT-M perpetuals
            "contracts": contracts(
                imp.events, venue="bitget", contract_type="perpetual", origin="bitget v2 contracts"
            ),
            "import": {
                "format": "tardis-csv",
                "files": {str(p): kind for p, kind, _ in opened},
                "discarded": dict(sorted(imp.discarded.items())),
                "duplicate_trades": dict(sorted(imp.guard.duplicates.items())),
                "wire_limits": imp.guard.limits.to_json(),
            },
        },
    )
    w.add_all(imp.events)
    return w.close()
