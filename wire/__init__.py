"""Wire code shared by the recorder and live mode: the reconnecting Bitget WebSocket connection
(``connection``), the raw journal every received frame is written to first (``journal``) and the
Bitget v2 codecs (``bitget``). It may import ``engine``'s foundations (events, validation, contract,
store), nothing of the decision core and no package above it (``tests/test_layout.py``)."""

import engine.store  # noqa: F401 - first: what engine/__init__.py sets holds before any library loads
