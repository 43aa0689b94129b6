"""The decision core and what it stands on: events, clock, store, risk, strategies, Laya, Kev.

Every other package of the project imports this one first (its ``__init__``), so what is set here
holds before any of them loads a library."""

import os
import sys

# Arrow's buffers from jemalloc, not its default, mimalloc: mimalloc keeps what a replay frees (its
# Parquet reads, its event log's columns) beside numpy's heap, out of reach of the next replay in the
# process (peak RSS: bench/HISTORY.md). Arrow reads the variable once, as pyarrow loads, and then
# uses the pool for its C++ internals too (Parquet's decoding, the writer's pages); a pool the user
# names stands. engine.store sets it for pyarrow's own calls where pyarrow was loaded first.
if sys.platform != "win32":  # pyarrow's Windows wheels are built without jemalloc
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
