"""The bounded Kev queue and its explicit policy. Pure: no I/O, no clock reads.

Policies, when a request arrives and the queue is full:

- ``drop_oldest`` (default): the oldest waiting request is dropped (``dropped_overflow``);
- ``fifo``: the new request is refused (``dropped_overflow`` of the new one), order kept;
- ``conflate``: only the latest snapshot waits; a new one replaces it (``dropped_conflated``),
  whatever ``maxsize`` says.

In every policy, when a worker takes a request, waiting requests older than ``stale_after_ns`` are
dropped (``dropped_stale``). Every drop is reported so the caller can log it as an event.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

from engine.events import Nanos
from engine.kev.advisor import KevContext

POLICIES: Final = ("drop_oldest", "fifo", "conflate")


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
        notes = []
        if self.policy == "conflate":
            while self._items:
                old = self._items.popleft()
                self.drops["dropped_conflated"] += 1
                notes.append(QueueNote(old.request_id, "dropped_conflated", len(self._items)))
        elif len(self._items) >= self.maxsize:
            if self.policy == "fifo":
                self.drops["dropped_overflow"] += 1
                return [QueueNote(ctx.request_id, "dropped_overflow", len(self._items))]
            old = self._items.popleft()
            self.drops["dropped_overflow"] += 1
            notes.append(QueueNote(old.request_id, "dropped_overflow", len(self._items)))
        self._items.append(ctx)
        notes.append(QueueNote(ctx.request_id, "enqueued", len(self._items)))
        return notes

    def take(self, now_ns: Nanos) -> tuple[KevContext | None, list[QueueNote]]:
        """Next request that is still fresh (oldest first), and the stale ones dropped on the way."""
        notes = []
        while self._items:
            ctx = self._items.popleft()
            if now_ns - ctx.ts_ns > self.stale_after_ns:
                self.drops["dropped_stale"] += 1
                notes.append(QueueNote(ctx.request_id, "dropped_stale", len(self._items)))
                continue
            return ctx, notes
        return None, notes
