"""Journal -> typed events: the one path from raw frames to a session (used live and by ``recover``).

Everything the manifest says about a recording (what was received per arg, acks, errors, connects,
disconnects, gap windows, silent args) is derived here from the journal alone, so a session
finished by ``dualhub recover`` after a crash says the same things a cleanly stopped one does.

Speed: :meth:`Normaliser.feed_block` hands a whole journal block to the compiled scan
(:func:`wire.bitget.bitget_v2_fast.scan_block`), which writes canonical ``books15``/``trade``
frames straight into column buffers (:class:`recorder.columns.Columns`) and stops at every other
record; those are fed here one by one, in order. ``Normaliser(fast=False)`` forces the general path
for every record (the tests check both give the same session).

Books: ``books15`` pushes go through :func:`wire.bitget.bitget_v2.decode`; ``books`` pushes are
applied to a local book (:mod:`wire.bitget.bitget_v2_books`) and, for symbols recorded without
``books15``, their top 15 levels are emitted as ``BookSnapshot`` into the ``books15`` stream (one
stream per event type); a frame that breaks the book is quarantined with the reason.

Gaps: a window of known missing data per channel+symbol is one ``Gap`` event (:class:`GapLog`, shared
with the importers). The live connection journals ``gap_open``/``gap_close`` for disconnects and for
``books`` pushes that break the local book; here, a quarantined ``books15``/``trade`` frame that still
names its arg (:func:`frame_arg`, which reads a truncated frame too) is data lost for that arg: a gap
from the arg's previous frame to the lost one.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import numpy as np

from engine.events import BookSnapshot, Gap, Quarantined, Trade
from engine.validate import WIRE_TAGS, WireLimits
from recorder.columns import Columns
from wire.bitget.bitget_v2 import INST_TYPE, PARSERS, PONG, Control, StreamCounters, decode, wire_guard
from wire.bitget.bitget_v2_books import BookFault, BooksState, books_frame_events, parse_books_frame
from wire.bitget.bitget_v2_fast import (
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
from wire.journal import META, RECV, SENT, Record, record_at

Event = BookSnapshot | Trade | Quarantined | Gap
log = logging.getLogger(__name__)


def _arg_name(channel: str, inst_id: str) -> str:
    return f"{channel}:{inst_id}"


class GapLog:
    """Gap windows per (channel, symbol) -> ``Gap`` events (``seq`` from the feed's counters) and the
    manifest's ``gaps`` list. Used by the normaliser and the importers, so a gap means the same in both."""

    def __init__(self, counters: StreamCounters) -> None:
        self.counters = counters
        self.open: dict[tuple[str, str], tuple[int, str]] = {}
        self.closed: list[dict[str, Any]] = []

    def start(self, channel: str, symbol: str, start_ns: int, reason: str) -> None:
        """Open a window (a second start for an open one is part of it)."""
        self.open.setdefault((channel, symbol), (start_ns, reason))

    def end(self, channel: str, symbol: str, end_ns: int, ts_recv: int, how: str = "") -> Gap | None:
        g = self.open.pop((channel, symbol), None)
        if g is None:
            return None
        return self.gap(channel, symbol, g[0], end_ns, ts_recv, f"{g[1]};{how}" if how else g[1])

    def gap(self, channel: str, symbol: str, start_ns: int, end_ns: int, ts_recv: int, reason: str) -> Gap:
        gap = Gap(
            ts_event=start_ns,
            ts_recv=ts_recv,
            seq=self.counters.take("gap"),
            symbol=symbol,
            channel=channel,
            start_ns=start_ns,
            end_ns=max(end_ns, start_ns),
            reason=reason,
        )
        self.closed.append(
            {
                "symbol": symbol,
                "channel": channel,
                "start_ns": start_ns,
                "end_ns": gap.end_ns,
                "reason": reason,
            }
        )
        return gap

    def finish(self, end_ns: int, ts_recv: int, how: str) -> list[Gap]:
        """End every open window at ``end_ns`` (the input ended before the data came back)."""
        return [g for ch, sym in list(self.open) if (g := self.end(ch, sym, end_ns, ts_recv, how))]


_ARG: Final = re.compile(rb'"arg"\s*:\s*\{([^{}]*)')
_ARG_FIELD: Final = re.compile(rb'"(channel|instId)"\s*:\s*"([^"\\]{1,64})"')


def frame_arg(raw: bytes) -> tuple[str, str] | None:
    """``(channel, instId)`` named by a frame's ``arg``, read from the bytes (a truncated frame still
    names it when the cut falls after the arg); ``None`` when the frame does not name both."""
    m = _ARG.search(raw[:1024])
    if m is None:
        return None
    f = {k.decode(): v.decode("utf-8", "replace") for k, v in _ARG_FIELD.findall(m.group(1))}
    return (f["channel"], f["instId"]) if len(f) == 2 else None


_REASON_TAGS: Final = (
    ("not JSON", "bad_json"),
    ("frame is not a JSON object", "not_object"),
    ("frame has no arg", "no_arg"),
    ("unknown channel", "unknown_channel"),
)


WIRE_CHECKS: Final = frozenset(WIRE_TAGS[1:]) | {"inst_type"}

# the book channels a symbol's BookSnapshot rows come from, best first: one source per symbol, the others
# are decoded and checked but write no rows (one stream per event type, no row twice)
BOOK_SOURCES: Final = ("books15", "books", "books5", "books1")


def book_source(channels: Iterable[str]) -> str | None:
    have = set(channels)
    return next((c for c in BOOK_SOURCES if c in have), None)


def discard_reason(reason: str) -> str:
    """A quarantine reason -> the short tag it is counted under (``books: checksum: ...`` ->
    ``books_checksum``, ``trade: side ...`` -> ``trade_malformed``, ``trade: out_of_band: ...`` ->
    ``trade_out_of_band``, ``not JSON: ...`` -> ``bad_json``)."""
    head, _, rest = reason.partition(": ")
    if head == "books" and rest:
        return "books_" + rest.partition(":")[0].strip()
    if head in PARSERS:
        sub = rest.partition(":")[0]
        return f"{head}_{sub}" if sub in WIRE_CHECKS else f"{head}_malformed"
    tag = next((t for prefix, t in _REASON_TAGS if reason.startswith(prefix)), None)
    return tag or re.sub(r"\W+", "_", head.lower()).strip("_")[:40] or "other"


class Normaliser:
    """Feeds journal records in order; returns the typed events each produces."""

    def __init__(self, asked: Mapping[str, Any], *, fast: bool = True) -> None:
        self.asked = dict(asked)
        self.fast = fast
        self.columns = Columns() if fast else None
        self.scanned = 0  # records the compiled scan took (the rest went through feed)
        channels = set(asked.get("channels", ()))
        symbols = list(asked.get("symbols", ()))
        self.source = book_source(channels)
        self.emit_books = set(symbols) if self.source == "books" else set()
        self.counters = StreamCounters()
        self._checked = _CheckOnly(self.counters)  # books1/books5 pushes that are not the book source
        # one guard for both paths: the compiled scan and the general parser read and update the same
        # per-symbol slots, by the column buffers' symbol ids (looked up when needed: tests swap them)
        self.guard = wire_guard(
            WireLimits.from_json(asked.get("wire_limits")),
            inst_type=asked.get("inst_type", INST_TYPE),
            intern=(lambda s: self.columns.sym_id(s)) if fast else None,
        )
        self.books = BooksState()
        self.received: dict[str, dict[str, int]] = {}
        self.acked: dict[str, int] = {}
        self.errors: list[dict[str, Any]] = []
        self.gap_log = GapLog(self.counters)
        self.gaps = self.gap_log.closed
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
        self.discarded: dict[str, int] = {}
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
            try:
                return self._meta(rec.meta(), rec.ts_recv_ns)
            except Exception as e:  # a META record this code cannot read costs that record only
                log.warning("unreadable META record at %d: %r", rec.ts_recv_ns, e)
                self.discarded["bad_meta"] = self.discarded.get("bad_meta", 0) + 1
                return []
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
            status = cols.scan(buf, pos, self.guard)
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
        nt1 = cols.drop_seen_trades(nt0, int(st[S_NT]), self.guard)  # before seqs: the parser's order
        for stream, name, a, b, seq in (
            ("books15", "BookSnapshot", nb0, int(st[S_NB]), cols.b_seq),
            ("trade", "Trade", nt0, nt1, cols.t_seq),
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
        try:
            return self._decoded(raw, ts)
        except Exception as e:  # a decoder bug must cost one frame, never the recording or its recovery
            q = _quarantine(raw, ts, self.counters, f"internal: {type(e).__name__}: {str(e)[:200]}")
            self._quarantined(q.reason)
            self.events["Quarantined"] = self.events.get("Quarantined", 0) + 1
            return [q]

    def _quarantined(self, reason: str) -> str:
        self.quarantined += 1
        tag = discard_reason(reason)
        self.discarded[tag] = self.discarded.get(tag, 0) + 1
        return tag

    def _decoded(self, raw: bytes, ts: int) -> list[Event]:
        frame = parse_books_frame(raw)
        items: list[Any]
        channel = ""
        books_prev = ts
        if frame is not None:
            sym = frame["arg"]["instId"]
            if why := self.guard.inst_type_reason(frame["arg"].get("instType")):
                items = [_quarantine(raw, ts, self.counters, f"books: {why}")]
            else:
                r = self.received.get(_arg_name("books", sym))
                books_prev = r["last_ns"] if r else ts  # this symbol's previous push
                self._count("books", sym, ts)
                items = books_frame_events(
                    frame, raw, ts, self.counters, self.books, emit=sym in self.emit_books, guard=self.guard
                )
        else:
            a = frame_arg(raw)
            channel = a[0] if a is not None else ""
            # a fixed-depth channel that is not the book source is checked, and writes no rows
            counters = self._checked if channel in ("books1", "books5") and channel != self.source else None
            items = list(decode(raw, ts, counters or self.counters, self.guard))
            if counters is not None:
                items = [it for it in items if type(it) is not BookSnapshot]
                if not any(isinstance(it, Quarantined) for it in items) and channel:
                    self._count(channel, a[1], ts)  # type: ignore[index]
        out: list[Event] = []
        counted = False
        for it in items:
            if isinstance(it, BookSnapshot | Trade):
                if not counted and frame is None:
                    if channel not in PARSERS:
                        channel = "books15" if isinstance(it, BookSnapshot) else "trade"
                    self._count(channel, it.symbol, ts)
                    counted = True
                out.append(it)
            elif isinstance(it, Quarantined):
                tag = self._quarantined(it.reason)
                out.append(it)
                if tag.endswith("_inst_type"):
                    continue  # another market's frame: nothing of the subscription's was lost
                if frame is None and (a := frame_arg(raw)) is not None and a[0] in PARSERS:
                    # a books15/trade frame lost: nothing rebuilds it (a broken ``books`` push is the
                    # live connection's gap, journaled as gap_open)
                    r = self.received.get(_arg_name(*a))
                    start = r["last_ns"] if r else ts
                    out.append(self.gap_log.gap(*a, start, ts, ts, f"quarantined:{tag}"))
                elif frame is not None and tag.partition("_")[2] in WIRE_CHECKS:
                    # a ``books`` snapshot the wire checks refused: the local book is still right (no
                    # fault, no resubscribe), that instant of it is lost
                    sym = frame["arg"]["instId"]
                    out.append(self.gap_log.gap("books", sym, books_prev, ts, ts, f"quarantined:{tag}"))
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
        elif c.kind == "duplicate" and name:
            self._count(str(a.get("channel")), str(a.get("instId")), ts)  # received; nothing new in it
        elif c.kind == "error":
            self.errors.append({"ts_ns": ts, "code": c.code, "msg": c.msg, "arg": dict(a) if a else None})

    def _meta(self, m: Mapping[str, Any], ts: int) -> list[Event]:
        t = m.get("t")
        if t == "gap_open":
            self.gap_log.start(
                str(m["channel"]), str(m["instId"]), int(m["start_ns"]), str(m.get("reason", ""))
            )
        elif t == "gap_close":
            how = str(m.get("how", ""))
            g = self.gap_log.end(
                str(m["channel"]),
                str(m["instId"]),
                int(m["end_ns"]),
                ts,
                "" if how == "resubscribed" else how,
            )
            if g is not None:
                return [self._gap(g)]
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

    def _gap(self, gap: Gap) -> Gap:
        self.events["Gap"] = self.events.get("Gap", 0) + 1
        return gap

    def finish(self) -> list[Event]:
        """Close gaps the journal left open (a crash): they run to the last record."""
        end = self.last_ns or 0
        return [self._gap(g) for g in self.gap_log.finish(end, end, "unclosed_at_end_of_journal")]

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
            "discarded": dict(sorted(self.discarded.items())),
            "duplicate_trades": dict(sorted(self.guard.duplicates.items())),
            "wire_limits": self.guard.limits.to_json(),
            "events": dict(sorted(self.events.items())),
            "stops": self.stops,
            "journal_first_ns": self.first_ns,
            "journal_last_ns": self.last_ns,
        }

    def _n_connections(self) -> int:
        return int(self.asked.get("connections", 1))


class _CheckOnly(StreamCounters):
    """Counters for a push that is decoded and checked but writes no book row: it takes no books15
    seq (no hole in that stream); its quarantine rows take the feed's own."""

    def __init__(self, main: StreamCounters) -> None:
        super().__init__()
        self.main = main

    def take(self, stream: str) -> int:
        return -1 if stream == "books15" else self.main.take(stream)


def _quarantine(raw: bytes, ts: int, counters: StreamCounters, reason: str) -> Quarantined:
    return Quarantined(
        ts_event=ts,
        ts_recv=ts,
        seq=counters.take("quarantine"),
        source="bitget_v2",
        reason=reason,
        raw=raw[:4096].decode("utf-8", "replace"),
    )


_warm = False


def warm_up() -> None:
    """Load (or compile, once per machine: numba caches it) the block scan before the first segment:
    ~0.3 s of CPU on first use in a process, paid at startup instead of inside the recording."""
    global _warm
    if _warm:
        return
    from wire.bitget.bitget_v2 import encode_books15, encode_trades
    from wire.journal import _REC

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
