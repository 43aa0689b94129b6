"""The simulated venue: everything that stands in for Bitget when no real exchange is involved.

Matching and queue-position fills (``exchange``, ``fills``), latency models (``latency``,
``recorded_latency``, ``batch_latency``), the seeded market simulator (``simulator``) and the local
Bitget v2 servers (``bitget/``). Replay, live paper mode and the tests all use this one copy. It may
import ``engine`` (events, clock, risk's order intents, codecs) but never ``replay``, ``live``,
``recorder``, ``wire`` or ``dualhub``, which is what lets ``engine`` import its latency models
(``tests/test_layout.py``).
"""

import engine  # noqa: F401 - first: what engine/__init__.py sets holds before any library loads
