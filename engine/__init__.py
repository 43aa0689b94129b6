"""The decision core and what it stands on: events, clock, store, latency models, risk, strategies, Laya, Kev.

Every other package of the project imports this one first (its ``__init__``), so what is set here
holds before any of them loads a library."""

import os
import sys

# Arrow's buffers from jemalloc, not its default, mimalloc: mimalloc keeps what a replay frees (its
# Parquet reads, its event log's columns) beside numpy's heap, out of reach of the rest of the run and
# of the next replay in the process (peak RSS: bench/HISTORY.md). Arrow reads the variable once, as
# pyarrow loads, and then uses the pool for its C++ internals too (Parquet's decoding, the writer's
# pages). A pool the user names stands. ARROW_POOL_SET_HERE: whether this module named it (a bench's
# peer tree, run as a child, must choose its own: bench/peer.py).
ARROW_POOL_SET_HERE = sys.platform != "win32" and "ARROW_DEFAULT_MEMORY_POOL" not in os.environ
if ARROW_POOL_SET_HERE:  # pyarrow's Windows wheels are built without jemalloc
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"
    _pa = sys.modules.get("pyarrow")
    if _pa is not None:  # loaded before the project (a notebook's first import): its own calls at least
        try:
            _pa.set_memory_pool(_pa.jemalloc_memory_pool())
        except NotImplementedError:  # built without it
            pass
    del _pa
