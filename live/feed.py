"""The public feed's side of a live run: the journal gate, the connection that hands every frame to the
runner (:meth:`live.runner.LiveRunner.deliver`, which stays on the runner: it is the tick path), the
quarantine of what must not reach the engine, and the venue watch's view of the links.

Everything here is off the tick path: a frame that decodes and passes the checks never calls into this
module.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from engine.events import BookSnapshot, InputQuarantined, Trade, VenueStatus
from engine.validate import book_reason, trade_reason
from live.health import Change, VenueHealth
from live.private_ws import PrivateStream
from live.symbol import SymbolRun
from recorder.normalise import discard_reason
from wire.connection import Connection
from wire.journal import RECV, JournalWriter

# the run's lines keep the one logger name users and the docs filter on, whichever module writes them
log = logging.getLogger("live.runner")

# (component, state, detail, since): one link as the venue watch saw it (live.health.VenueHealth.observe)
Link = tuple[str, str, str, int | None]


class GatedJournal:
    """The journal, closed to received frames once the feed stops: the session holds exactly the
    frames the engine saw."""

    def __init__(self, inner: JournalWriter) -> None:
        self.inner = inner
        self.open = True

    def append(self, ts_recv_ns: int, conn_id: int, payload: bytes, kind: int = RECV) -> None:
        if kind == RECV and not self.open:
            return
        self.inner.append(ts_recv_ns, conn_id, payload, kind)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FeedConnection(Connection):
    """The shared wire connection, also handing every frame (after the journal) to the runner; ``note``
    is its last disconnect, failed connect or giving up, in words (the venue watch's detail)."""

    def __init__(self, *args: Any, deliver: Callable[[bytes, int], None], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._deliver = deliver
        self.note = ""

    def _inspect(self, raw: bytes, ts: int) -> None:
        super()._inspect(raw, ts)
        self._deliver(raw, ts)

    def _meta(self, obj: dict[str, Any], ts_ns: int | None = None) -> None:
        super()._meta(obj, ts_ns)
        t = obj.get("t")
        if t == "disconnect":
            self.note = f"disconnected ({obj.get('reason')})"
        elif t == "connect_failed":
            self.note = f"reconnecting: {obj.get('error')}"
        elif t == "fatal":
            self.note = f"gave up: {obj.get('error')}"


def wire_quarantined(quarantined: dict[str, int], reason: str) -> None:
    """A frame the codec or the wire checks refused: counted by its tag (the session's quarantine
    stream, rebuilt from the journal, holds it with the reason and the raw text)."""
    key = f"wire:{discard_reason(reason)}"
    if key not in quarantined:
        log.warning("quarantined a frame: %s", reason[:300])
    quarantined[key] = quarantined.get(key, 0) + 1


def quarantine(quarantined: dict[str, int], st: SymbolRun, ev: BookSnapshot | Trade, is_book: bool) -> None:
    """A decoded event the engine must not see (the codec checks levels; this is the last guard): counted,
    and kept in its run's ``input_quarantine`` (journaled first)."""
    stream = "books15" if is_book else "trade"
    reason = book_reason(ev) if is_book else trade_reason(ev)  # type: ignore[arg-type]
    key = f"{stream}:{reason}"
    quarantined[key] = quarantined.get(key, 0) + 1
    log.warning("quarantined %s (%s seq %d)", key, ev.symbol, ev.seq)
    q = InputQuarantined(
        ts_event=ev.ts_event,
        ts_recv=ev.ts_recv,
        seq=len(st.quarantine),
        symbol=ev.symbol,
        stream=stream,
        row_seq=ev.seq,
        reason=reason,
    )
    st.quarantine.append(q)
    if st.wal is not None:
        st.wal.event("input_quarantine", q)


def links(
    now: int,
    stale_ns: int,
    feed: FeedConnection | None,
    last_frame_ns: int,
    private: PrivateStream | None,
    rest_error: str | None,
) -> list[Link]:
    """Every link as it stands at ``now``: the public feed (down, or stale after ``stale_ns`` without
    market data), the private WebSocket, and the REST gateway (``rest_error``: None where none is used)."""
    seen: list[Link] = []
    if feed is not None:
        age = now - last_frame_ns
        if not feed.stats.up and (feed.stats.connects or age > stale_ns):
            seen.append(("public_feed", "down", feed.note or "not connected", None))
        elif feed.stats.up and age > stale_ns:
            seen.append(("public_feed", "stale", f"no market data for {age / 1e9:.1f} s", last_frame_ns))
        else:
            seen.append(("public_feed", "up", "", None))
    if private is not None:
        up = private.connected.is_set()
        seen.append(("private_ws", "up" if up else "down", private.fatal or private.last_error, None))
    if rest_error is not None:
        seen.append(("rest", "down" if rest_error else "up", rest_error, None))
    return seen


def record_venue_change(syms: dict[str, SymbolRun], ch: Change, ts: int) -> None:
    """A link's change as a ``venue_status`` event in every run (journaled first)."""
    for sym, st in syms.items():
        vs = VenueStatus(
            ts_event=ts,
            ts_recv=ts,
            seq=len(st.venue),
            symbol=sym,
            component=ch.component,
            state=ch.state,
            detail=ch.detail[:300],
            age_ns=ch.age_ns,
        )
        st.venue.append(vs)
        if st.wal is not None:
            st.wal.event("venue_status", vs)


def status_line(
    mode: str, now: int, started_ns: int, last_frame_ns: int, health: VenueHealth, syms: dict[str, SymbolRun]
) -> str:
    """One line: uptime, market data age, each link, and per symbol position, open orders, fills
    and Kev (answers, in flight, queued)."""
    age = (now - last_frame_ns) / 1e9 if last_frame_ns else math.nan
    states = " ".join(f"{c} {state}" for c, state in health.states().items())
    parts = [f"live {mode} {(now - started_ns) / 1e9:.0f}s", f"feed age {age:.1f}s {states}"]
    for sym, st in syms.items():
        e, c = st.engine, st.log.counts()
        parts.append(
            f"{sym} pos {float(e.portfolio.position):g} open {e.open_orders} "
            f"orders {c.get('order', 0)} fills {c.get('fill', 0)} "
            f"kev {c.get('kev_response', 0)} answers {e.kev_in_flight} in flight "
            f"{e.kev_queued} queued" + (" KILLED" if e.kill_switch else "")
        )
    return " | ".join(parts)
