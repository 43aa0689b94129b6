"""Python's cyclic garbage collector, run where live mode chooses instead of at any allocation.

Why: CPython starts a collection inside whatever allocation crosses the generation-0 threshold, so a
collection can land in the middle of a frame's label (measured in ``bench/bench_tick_path.py``: with Kev's
HTTP client allocating, label p99 rose ~3x). With :class:`IdleGC` the automatic collector is off while
trading and :meth:`IdleGC.collect_if_due` applies CPython's own generation thresholds at points the
runner picks (after a dispatch, when the frame's work is done), so memory is reclaimed as before, just
not on the tick path.
"""

from __future__ import annotations

import gc


class IdleGC:
    """``start()`` when trading starts, ``collect_if_due()`` between frames, ``stop()`` at the end."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self._was_enabled = True
        self.active = False

    def start(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()
        self.active = True

    def stop(self) -> None:
        if self.active and self._was_enabled:
            gc.enable()
        self.active = False

    def collect_if_due(self) -> None:
        """Collect the oldest generation whose threshold is crossed, as the automatic collector would."""
        c0, c1, c2 = gc.get_count()
        t0, t1, t2 = gc.get_threshold()
        if not self.active or t0 == 0 or c0 < t0:
            return
        gen = 2 if c1 >= t1 and c2 >= t2 else 1 if c1 >= t1 else 0
        gc.collect(gen)
        self.collections[gen] += 1
