"""Small builders shared by tests."""

import math
from pathlib import Path

from engine.events import BookSnapshot

# The repository root. Tests sit at different depths (tests/ mirrors the package tree), so every path
# into the tree is computed from here, never by counting a test file's own parents.
REPO = Path(__file__).resolve().parents[1]


def make_book(
    bid: float = 100.0,
    ask: float = 100.1,
    *,
    ts: int = 1_000_000_000,
    seq: int = 0,
    size: float = 1.0,
    levels: int = 15,
    tick: float = 0.1,
    symbol: str = "BTCUSDT",
) -> BookSnapshot:
    nan = math.nan
    pad = (nan,) * (15 - levels)
    nd = max(10, 2 - math.floor(math.log10(tick)))  # float noise off, a tick of 1e-12 kept
    return BookSnapshot(
        ts_event=ts,
        ts_recv=ts,
        seq=seq,
        symbol=symbol,
        exch_seq=seq,
        bid_px=tuple(round(bid - i * tick, nd) for i in range(levels)) + pad,
        bid_sz=(size,) * levels + pad,
        ask_px=tuple(round(ask + i * tick, nd) for i in range(levels)) + pad,
        ask_sz=(size,) * levels + pad,
    )


def as_plain_python(compiled: str, producer: str):
    """``producer()`` (``"tests.module.function"``) run in a subprocess with ``NUMBA_DISABLE_JIT=1``,
    its JSON result parsed: the compiled source read as plain Python. ``compiled`` names a compiled
    function (``"module.function"``) the subprocess checks is really not compiled there."""
    import json
    import os
    import subprocess
    import sys

    mod, fn = compiled.rsplit(".", 1)
    pmod, pfn = producer.rsplit(".", 1)
    code = (
        f"import json, {mod} as m, {pmod} as t\n"
        f"assert not hasattr(m.{fn}, 'py_func'), 'still compiled'\n"
        f"print(json.dumps(t.{pfn}()))"
    )
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)
