"""The bounded Kev queue and its explicit policy. Pure: no I/O, no clock reads.

Policies, when a request arrives and the queue is full:

- ``drop_oldest`` (default): the oldest waiting request is dropped (``dropped_overflow``);
- ``fifo``: the new request is refused (``dropped_overflow`` of the new one), order kept;
- ``conflate``: only the latest snapshot waits; a new one replaces it (``dropped_conflated``),
  whatever ``maxsize`` says.

In every policy, when a worker takes a request, waiting requests older than ``stale_after_ns`` are
dropped (``dropped_stale``). Every drop is reported so the caller can log it as an event.

The policy's decisions are :func:`offer_plan` and :func:`is_stale`, compiled over codes and numbers:
the replay kernel runs them on its own table of request ids, :class:`KevQueue` on its deque.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

from engine.events import Nanos
from engine.jit import njit
from engine.kev.advisor import KevContext

POLICIES: Final = ("drop_oldest", "fifo", "conflate")
POLICY_DROP_OLDEST, POLICY_FIFO, POLICY_CONFLATE = range(3)
# What a QueueNote says happened, by code (the replay kernel writes codes, the event log these names).
QUEUE_KINDS: Final = (
    "enqueued",
    "dropped_overflow",
    "dropped_stale",
    "dropped_conflated",
    "timeout",
    "late_reply",
)
Q_ENQUEUED, Q_OVERFLOW, Q_STALE, Q_CONFLATED, Q_TIMEOUT, Q_LATE = range(6)


@njit
def offer_plan(policy: int, waiting: int, maxsize: int) -> tuple[int, int, bool]:
    """What a request arriving at a queue of ``waiting`` requests does under ``policy`` (a POLICIES
    index): (how many of the oldest to drop, the kind of their notes and of a refusal's, whether the
    new one is enqueued; if not, it is refused and noted)."""
    if policy == POLICY_CONFLATE:
        return waiting, Q_CONFLATED, True
    if waiting < maxsize:
        return 0, Q_OVERFLOW, True
    if policy == POLICY_FIFO:
        return 0, Q_OVERFLOW, False
    return 1, Q_OVERFLOW, True


@njit
def is_stale(now_ns: int, ts_ns: int, stale_after_ns: int) -> bool:
    """A request waiting since ``ts_ns`` is dropped when a worker reaches it after ``stale_after_ns``."""
    return now_ns - ts_ns > stale_after_ns


@dataclass(frozen=True, slots=True)
class QueueNote:
    """One thing that happened to the queue: ``enqueued``, ``dropped_overflow``, ``dropped_stale``."""

    request_id: int
    kind: str
    depth: int


@dataclass
class KevQueue:
    maxsize: int = 4
    stale_after_ns: Nanos = 1_000_000_000
    policy: str = "drop_oldest"
    _items: deque[KevContext] = field(default_factory=deque)
    drops: dict[str, int] = field(
        default_factory=lambda: {"dropped_overflow": 0, "dropped_stale": 0, "dropped_conflated": 0}
    )

    def __post_init__(self) -> None:
        if self.maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {self.maxsize}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown Kev queue policy {self.policy!r}; known: {', '.join(POLICIES)}")

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, ctx: KevContext) -> list[QueueNote]:
        """Enqueue without ever blocking; returns what happened (drops first)."""
        items = self._items
        drop, code, enqueue = offer_plan(POLICIES.index(self.policy), len(items), self.maxsize)
        kind = QUEUE_KINDS[code]
        notes = []
        for _ in range(drop):
            old = items.popleft()
            self.drops[kind] += 1
            notes.append(QueueNote(old.request_id, kind, len(items)))
        if not enqueue:
            self.drops[kind] += 1
            notes.append(QueueNote(ctx.request_id, kind, len(items)))
            return notes
        items.append(ctx)
        notes.append(QueueNote(ctx.request_id, "enqueued", len(items)))
        return notes

    def take(self, now_ns: Nanos) -> tuple[KevContext | None, list[QueueNote]]:
        """Next request that is still fresh (oldest first), and the stale ones dropped on the way."""
        notes = []
        while self._items:
            ctx = self._items.popleft()
            if is_stale(now_ns, ctx.ts_ns, self.stale_after_ns):
                self.drops["dropped_stale"] += 1
                notes.append(QueueNote(ctx.request_id, "dropped_stale", len(self._items)))
                continue
            return ctx, notes
        return None, notes
