"""Wire code shared by the recorder and live mode: the reconnecting Bitget WebSocket connection
(``connection``) and the raw journal every received frame is written to first (``journal``). It may
import ``engine``'s codecs (``engine.venues``) and ``engine.store``'s file helpers, nothing of
``replay``, ``live``, ``recorder``, ``venue`` or ``dualhub`` (``tests/test_layout.py``)."""

import engine.store  # noqa: F401 - first: what engine/__init__.py sets holds before any library loads
