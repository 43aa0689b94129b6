"""engine.strategies.call: the core reaches a compiled strategy through its entry's address, with the
same answers as the strategy's own function, and refuses arrays the entry would read past."""

import numba
import numpy as np
import pytest

from engine.strategies import baseline, call, imbalance_lean, registry
from engine.strategies.call import MAX_PARAMS


def _book(bid: float, ask: float, bid_sz: float = 3.0, ask_sz: float = 1.0) -> np.ndarray:
    book = np.full(call.BOOK_LEN, np.nan)
    book[0], book[15], book[30], book[45] = bid, bid_sz, ask, ask_sz
    return book


def test_an_entry_answers_as_the_strategy_itself():
    rng = np.random.default_rng(3)
    for module in (baseline, imbalance_lean):
        kind, params = registry.resolve(module.NAME, {})
        assert registry.entry(kind) != 0
        for _ in range(200):
            bid = float(rng.integers(900, 1100)) / 10
            book = _book(bid, bid + float(rng.integers(1, 5)) / 10, *rng.uniform(0.1, 9, 2))
            args = (0.1, int(rng.integers(1, 5)), int(rng.integers(0, 4)), int(rng.integers(-20, 20)))
            target, limit = float(rng.normal(0, 5)), int(rng.integers(5, 50))
            got = call.quote(registry.entry(kind), kind, book, *args, target, limit, params)
            assert got == module.quote(book, *args, target, limit, params)


def test_short_or_strided_arrays_are_refused():
    kind, params = registry.resolve("baseline", {})
    fn = registry.entry(kind)
    book = _book(100.0, 100.5)
    with pytest.raises(ValueError, match="60-value book"):
        call.quote(fn, kind, book[:30], 0.1, 2, 0, 0, 0.0, 50, params)
    with pytest.raises(ValueError, match="8 parameters"):
        call.quote(fn, kind, book, 0.1, 2, 0, 0, 0.0, 50, params[: MAX_PARAMS - 1])
    with pytest.raises(numba.core.errors.TypingError):  # a strided view has no one data pointer
        call.quote(fn, kind, np.repeat(book, 2)[::2], 0.1, 2, 0, 0, 0.0, 50, params)
