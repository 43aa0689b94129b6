"""Journal -> typed events: the one path from raw frames to a session (used live and by ``recover``).

Everything the manifest says about a recording (what was received per arg, acks, errors, connects,
disconnects, gap windows, silent args) is derived here from the journal alone, so a session
finished by ``dualhub recover`` after a crash says the same things a cleanly stopped one does.

Speed: :meth:`Normaliser.feed_block` hands a whole journal block to the compiled scan
(:func:`engine.venues.bitget_v2_fast.scan_block`), which writes canonical ``books15``/``trade``
frames straight into column buffers (:class:`recorder.columns.Columns`) and stops at every other
record; those are fed here one by one, in order. ``Normaliser(fast=False)`` forces the general path
for every record (the tests check both give the same session).

Books: ``books15`` pushes go through :func:`engine.venues.bitget_v2.decode`; ``books`` pushes are
applied to a local book (:mod:`engine.venues.bitget_v2_books`) and, for symbols recorded without
``books15``, their top 15 levels are emitted as ``BookSnapshot`` into the ``books15`` stream (one
stream per event type); a frame that breaks the book is quarantined with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from engine.events import BookSnapshot, Gap, Quarantined, Trade
from engine.venues.bitget_v2 import PONG, Control, StreamCounters, decode
from engine.venues.bitget_v2_books import BookFault, BooksState, books_frame_events, parse_books_frame
from engine.venues.bitget_v2_fast import (
    CH_TRADE,
    END,
    FULL,
    S_FIRST,
    S_FRAMES,
    S_LAST,
    S_NB,
    S_NREC,
    S_NT,
    S_NTOUCHED,
    S_PONGS,
    S_POS,
)
from recorder.columns import Columns
from recorder.journal import META, RECV, SENT, Record, record_at

Event = BookSnapshot | Trade | Quarantined | Gap


def _arg_name(channel: str, inst_id: str) -> str:
    return f"{channel}:{inst_id}"


class Normaliser:
    """Feeds journal records in order; returns the typed events each produces."""

    def __init__(self, asked: Mapping[str, Any], *, fast: bool = True) -> None:
        self.asked = dict(asked)
        self.fast = fast
        self.columns = Columns() if fast else None
        self.scanned = 0  # records the compiled scan took (the rest went through feed)
        channels = set(asked.get("channels", ()))
        symbols = list(asked.get("symbols", ()))
        self.emit_books = {s for s in symbols if "books" in channels and "books15" not in channels}
        self.counters = StreamCounters()
        self.books = BooksState()
        self.received: dict[str, dict[str, int]] = {}
        self.acked: dict[str, int] = {}
        self.errors: list[dict[str, Any]] = []
        self.open_gaps: dict[str, dict[str, Any]] = {}
        self.gaps: list[dict[str, Any]] = []
        self.connects = 0
        self.disconnects: list[dict[str, Any]] = []
        self.failed_connects = 0
        self.fatal: list[dict[str, Any]] = []
        self.silent: set[str] = set()
        self.resubscribes = 0
        self.book_faults: dict[str, int] = {}
        self.stops: list[dict[str, Any]] = []
        self.frames = 0
        self.pongs = 0
        self.sent = 0
        self.quarantined = 0
        self.events: dict[str, int] = {}
        self.first_ns: int | None = None
        self.last_ns: int | None = None

    # ------------------------------------------------------------ records

    def feed(self, rec: Record) -> list[Event]:
        if self.first_ns is None:
            self.first_ns = rec.ts_recv_ns
        self.last_ns = rec.ts_recv_ns
        if rec.kind == RECV:
            return self._frame(rec.payload, rec.ts_recv_ns)
        if rec.kind == META:
            return self._meta(rec.meta(), rec.ts_recv_ns)
        if rec.kind == SENT:
            self.sent += 1
        return []

    def feed_all(self, records: Iterable[Record]) -> list[Event]:
        out: list[Event] = []
        for r in records:
            out.extend(self.feed(r))
        return out

    def feed_block(self, raw: bytes, other: list[Event]) -> int:
        """Feed every record of one journal block (its decompressed bytes); returns the record count.
        ``books15``/``trade`` rows go to :attr:`columns`, every other event is appended to ``other``."""
        cols = self.columns
        assert cols is not None, "feed_block needs Normaliser(fast=True)"
        buf = np.frombuffer(raw, dtype=np.uint8)
        st = cols.st
        pos = records = 0
        while True:
            nb0, nt0 = int(st[S_NB]), int(st[S_NT])
            status = cols.scan(buf, pos)
            self.scanned += int(st[S_NREC])
            records += int(st[S_NREC])
            self._take_run(cols, nb0, nt0)
            pos = int(st[S_POS])
            if status == END:
                return records
            if status == FULL:
                cols.grow()
                continue
            # a record the scan does not own: the general path, in journal order
            rec, pos = record_at(raw, pos)
            records += 1
            for e in self.feed(rec):
                if type(e) is BookSnapshot or type(e) is Trade:
                    cols.add_event(e)
                else:
                    other.append(e)

    def _take_run(self, cols: Columns, nb0: int, nt0: int) -> None:
        """Account for the records one compiled scan took, exactly as :meth:`feed` would have."""
        st = cols.st
        frames = int(st[S_FRAMES])
        if not frames:
            return
        self.frames += frames
        self.pongs += int(st[S_PONGS])
        if self.first_ns is None:
            self.first_ns = int(st[S_FIRST])
        self.last_ns = int(st[S_LAST])
        for stream, name, a, b, seq in (
            ("books15", "BookSnapshot", nb0, int(st[S_NB]), cols.b_seq),
            ("trade", "Trade", nt0, int(st[S_NT]), cols.t_seq),
        ):
            if b > a:
                n0 = self.counters.next_seq.get(stream, 0)
                seq[a:b] = np.arange(n0, n0 + b - a)
                self.counters.next_seq[stream] = n0 + b - a
                self.events[name] = self.events.get(name, 0) + b - a
        names = cols.names()
        n_args, first, last = cols.agg
        for a in cols.touched[: int(st[S_NTOUCHED])].tolist():
            key = _arg_name("trade" if a % 2 == CH_TRADE else "books15", names[a // 2])  # a = sym * 2 + ch
            self._received(key, int(n_args[a]), int(first[a]), int(last[a]))

    def _count(self, channel: str, inst_id: str, ts: int) -> None:
        self._received(_arg_name(channel, inst_id), 1, ts, ts)

    def _received(self, key: str, frames: int, first_ns: int, last_ns: int) -> None:
        """``frames`` more frames of one arg, received from ``first_ns`` to ``last_ns``."""
        r = self.received.get(key)
        if r is None:
            self.received[key] = {"frames": frames, "first_ns": first_ns, "last_ns": last_ns}
        else:
            r["frames"] += frames
            r["last_ns"] = last_ns

    def _frame(self, raw: bytes, ts: int) -> list[Event]:
        self.frames += 1
        if raw == PONG:
            self.pongs += 1
            return []
        frame = parse_books_frame(raw)
        items: list[Any]
        if frame is not None:
            sym = frame["arg"]["instId"]
            self._count("books", sym, ts)
            items = books_frame_events(frame, raw, ts, self.counters, self.books, emit=sym in self.emit_books)
        else:
            items = list(decode(raw, ts, self.counters))
        out: list[Event] = []
        counted = False
        for it in items:
            if isinstance(it, BookSnapshot | Trade):
                if not counted and frame is None:
                    self._count("books15" if isinstance(it, BookSnapshot) else "trade", it.symbol, ts)
                    counted = True
                out.append(it)
            elif isinstance(it, Quarantined):
                self.quarantined += 1
                out.append(it)
            elif isinstance(it, BookFault):
                self.book_faults[it.reason] = self.book_faults.get(it.reason, 0) + 1
            elif isinstance(it, Control):
                self._control(it, ts)
        for e in out:
            k = type(e).__name__
            self.events[k] = self.events.get(k, 0) + 1
        return out

    def _control(self, c: Control, ts: int) -> None:
        a = c.arg if isinstance(c.arg, Mapping) else {}
        name = _arg_name(str(a.get("channel", "")), str(a.get("instId", ""))) if a else ""
        if c.kind == "subscribe" and name:
            self.acked.setdefault(name, ts)
        elif c.kind == "error":
            self.errors.append({"ts_ns": ts, "code": c.code, "msg": c.msg, "arg": dict(a) if a else None})

    def _meta(self, m: Mapping[str, Any], ts: int) -> list[Event]:
        t = m.get("t")
        if t == "gap_open":
            name = _arg_name(m["channel"], m["instId"])
            self.open_gaps.setdefault(name, dict(m))
        elif t == "gap_close":
            name = _arg_name(m["channel"], m["instId"])
            g = self.open_gaps.pop(name, None)
            if g is not None:
                return [self._gap(g, int(m["end_ns"]), ts, str(m.get("how", "")))]
        elif t == "connect":
            self.connects += 1
        elif t == "disconnect":
            self.disconnects.append({"ts_ns": ts, "reason": m.get("reason", "")})
        elif t == "connect_failed":
            self.failed_connects += 1
        elif t == "fatal":
            self.fatal.append({"ts_ns": ts, "error": m.get("error", "")})
        elif t == "silent":
            self.silent.add(_arg_name(m["channel"], m["instId"]))
        elif t == "resubscribe":
            self.resubscribes += 1
        elif t == "stop":
            self.stops.append({"ts_ns": ts, "reason": m.get("reason", "")})
        return []

    def _gap(self, g: Mapping[str, Any], end_ns: int, ts_recv: int, how: str) -> Gap:
        start = int(g["start_ns"])
        reason = str(g.get("reason", ""))
        if how and how != "resubscribed":
            reason = f"{reason};{how}"
        gap = Gap(
            ts_event=start,
            ts_recv=ts_recv,
            seq=self.counters.take("gap"),
            symbol=str(g["instId"]),
            channel=str(g["channel"]),
            start_ns=start,
            end_ns=max(end_ns, start),
            reason=reason,
        )
        self.gaps.append(
            {
                "symbol": gap.symbol,
                "channel": gap.channel,
                "start_ns": gap.start_ns,
                "end_ns": gap.end_ns,
                "reason": gap.reason,
            }
        )
        self.events["Gap"] = self.events.get("Gap", 0) + 1
        return gap

    def finish(self) -> list[Event]:
        """Close gaps the journal left open (a crash): they run to the last record."""
        end = self.last_ns or 0
        out: list[Event] = [
            self._gap(g, end, end, "unclosed_at_end_of_journal") for g in self.open_gaps.values()
        ]
        self.open_gaps.clear()
        return out

    # ------------------------------------------------------------ summary

    def summary(self) -> dict[str, Any]:
        asked_args = [
            _arg_name(ch, s) for s in self.asked.get("symbols", ()) for ch in self.asked.get("channels", ())
        ]
        rejected = {
            _arg_name(str(e["arg"].get("channel")), str(e["arg"].get("instId")))
            for e in self.errors
            if e["arg"] and e["code"] in (30001, 30016)
        }
        never = [a for a in asked_args if a not in self.received]
        return {
            "asked": self.asked,
            "received": dict(sorted(self.received.items())),
            "acked": sorted(self.acked),
            "never_received": never,
            "acked_but_silent": [a for a in never if a in self.acked],
            "silent_flagged": sorted(self.silent),
            "rejected": sorted(rejected),
            "errors": self.errors[:1000],
            "gaps": self.gaps,
            "connects": self.connects,
            "reconnects": max(0, self.connects - self._n_connections()),
            "failed_connects": self.failed_connects,
            "disconnects": self.disconnects[:10_000],
            "fatal": self.fatal,
            "resubscribes": self.resubscribes,
            "book_faults": self.book_faults,
            "frames": self.frames,
            "pongs": self.pongs,
            "sent": self.sent,
            "quarantined": self.quarantined,
            "events": dict(sorted(self.events.items())),
            "stops": self.stops,
            "journal_first_ns": self.first_ns,
            "journal_last_ns": self.last_ns,
        }

    def _n_connections(self) -> int:
        return int(self.asked.get("connections", 1))


_warm = False


def warm_up() -> None:
    """Load (or compile, once per machine: numba caches it) the block scan before the first segment:
    ~0.3 s of CPU on first use in a process, paid at startup instead of inside the recording."""
    global _warm
    if _warm:
        return
    from engine.venues.bitget_v2 import encode_books15, encode_trades
    from recorder.journal import _REC

    frames = [
        encode_books15("WARMUP", ts_ms=1, seq=1, bids=[("1.0", "1")], asks=[("2.0", "1")], push_ts_ms=1),
        encode_trades(
            "WARMUP", [{"ts": "1", "price": "1", "size": "1", "side": "buy", "tradeId": "1"}], push_ts_ms=1
        ),
        PONG,
        b'{"event":"subscribe","arg":{"instType":"USDT-FUTURES","channel":"books15","instId":"WARMUP"}}',
    ]
    raw = b"".join(_REC.pack(1, 0, RECV, len(f)) + f for f in frames)
    Normaliser({"symbols": ["WARMUP"], "channels": ["books15", "trade"]}).feed_block(raw, [])
    Columns().sym_id("WARMUP")  # the general path's lookup is its own compiled specialisation
    _warm = True
