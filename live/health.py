"""The state of each link to the venue, from the live runner's observations: what changed, and when a
link has been out long enough to call it lost.

Links: ``public_feed`` (market data), ``private_ws`` (order reports) and ``rest`` (orders; live mode).
Each is ``up``, ``stale`` (connected, silent), ``down`` (disconnected or failing) or ``lost`` (not up
for ``lost_after_ns``; sticky: the run ends). :meth:`VenueHealth.observe` is pure bookkeeping (the
caller passes the time); every change it returns becomes a WARNING and a ``venue_status`` event
(:class:`engine.events.VenueStatus`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from engine.events import Nanos

UP: Final = "up"
LOST: Final = "lost"


@dataclass(frozen=True)
class Change:
    component: str
    state: str
    detail: str
    age_ns: Nanos  # how long the link has not been up (for ``up``: how long it had been out)


@dataclass
class _Link:
    state: str = UP
    since_ns: Nanos = 0  # when it was last up (valid while not up)
    detail: str = ""


class VenueHealth:
    def __init__(self, lost_after_ns: Nanos) -> None:
        self.lost_after_ns = lost_after_ns
        self.links: dict[str, _Link] = {}

    def observe(
        self, component: str, state: str, detail: str, now_ns: Nanos, since_ns: Nanos | None = None
    ) -> Change | None:
        """What the runner sees of ``component`` now; ``since_ns``: when it was last up, if known
        better than "now" (a silent feed: its last frame). Returns the change, if any."""
        link = self.links.setdefault(component, _Link())
        if link.state == LOST:
            return None
        if state == UP:
            if link.state == UP:
                return None
            out_ns = now_ns - link.since_ns
            link.state, link.detail = UP, ""
            return Change(component, UP, f"back after {out_ns / 1e9:.1f} s", out_ns)
        if link.state == UP:
            link.since_ns = now_ns if since_ns is None else since_ns
        age = now_ns - link.since_ns
        if age >= self.lost_after_ns:
            link.state, link.detail = LOST, detail
            return Change(component, LOST, f"not up for {age / 1e9:.1f} s: {detail}", age)
        if state != link.state:
            link.state, link.detail = state, detail
            return Change(component, state, detail, age)
        link.detail = detail
        return None

    def degraded(self, now_ns: Nanos) -> dict[str, str]:
        """Every link that is not up, with how long and why."""
        return {
            c: f"{link.state} for {(now_ns - link.since_ns) / 1e9:.1f} s: {link.detail}"
            for c, link in self.links.items()
            if link.state != UP
        }

    def states(self) -> dict[str, str]:
        return {c: link.state for c, link in self.links.items()}
