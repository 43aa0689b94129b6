"""String columns of the event log made in one compiled pass: ids as a prefix and a decimal number
("dh-17", "kev:3") and codes as their names ("buy", "cancel_ack").

The core's rows hold numbers; the log holds strings. Arrow's own way (cast to string, join with the
prefix; or take from a small array of names) makes an intermediate array per step, and on a
trading replay those columns were a tenth of the run. Here each column's offsets and bytes are
written once, straight into the buffers of an Arrow string array: the same bytes, so the same files
and digests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from engine.jit import njit


@njit
def _digits(v: int) -> int:
    n = 1
    while v >= 10:
        v //= 10
        n += 1
    return n


@njit
def _ids(text, at, which, values):
    """Offsets and bytes of ``prefix[which[i]] + str(values[i])`` (prefix k: ``text[at[k]:at[k+1]]``)."""
    n = values.shape[0]
    offsets = np.empty(n + 1, dtype=np.int32)
    size = 0
    offsets[0] = 0
    for i in range(n):
        p = which[i]
        v = values[i]
        size += at[p + 1] - at[p] + _digits(abs(v)) + (1 if v < 0 else 0)
        offsets[i + 1] = size
    data = np.empty(size, dtype=np.uint8)
    for i in range(n):
        p = which[i]
        o = offsets[i]
        for c in range(at[p], at[p + 1]):
            data[o] = text[c]
            o += 1
        v = values[i]
        if v < 0:
            data[o] = 45  # "-"
            o += 1
            v = -v
        end = offsets[i + 1]
        while True:
            end -= 1
            data[end] = 48 + v % 10
            v //= 10
            if end == o:
                break
    return offsets, data


@njit
def _names(text, at, codes):
    """Offsets and bytes of ``names[codes[i]]`` (names as ``text[at[k]:at[k+1]]``)."""
    n = codes.shape[0]
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    size = 0
    for i in range(n):
        c = codes[i]
        size += at[c + 1] - at[c]
        offsets[i + 1] = size
    data = np.empty(size, dtype=np.uint8)
    for i in range(n):
        c = codes[i]
        o = offsets[i]
        for k in range(at[c], at[c + 1]):
            data[o] = text[k]
            o += 1
    return offsets, data


def _packed(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    raw = [s.encode() for s in names]
    at = np.zeros(len(raw) + 1, dtype=np.int64)
    at[1:] = np.cumsum([len(b) for b in raw])
    return np.frombuffer(b"".join(raw) or b"\0", dtype=np.uint8), at


_PACKED: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}


def _packed_cached(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    p = _PACKED.get(names)
    if p is None:
        p = _PACKED[names] = _packed(names)
    return p


def _array(n: int, offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def id_column(prefixes: tuple[str, ...], which: np.ndarray | None, values: np.ndarray) -> pa.Array:
    """``prefixes[which[i]] + str(values[i])`` for every row (``which`` None: the first prefix)."""
    # strided columns of the core's row buffers are read in place (numba takes any layout)
    values = np.asarray(values, dtype=np.int64)
    n = len(values)
    which = np.zeros(n, dtype=np.int64) if which is None else np.asarray(which, dtype=np.int64)
    if n and (which.min() < 0 or which.max() >= len(prefixes)):
        raise IndexError("a prefix code out of range")
    text, at = _packed_cached(prefixes)
    offsets, data = _ids(text, at, which, values)
    return _array(n, offsets, data)


def name_column(names: Sequence[str], codes: np.ndarray) -> pa.Array:
    """``names[codes[i]]`` for every row."""
    names = tuple(names)
    codes = np.asarray(codes, dtype=np.int64)
    n = len(codes)
    if n and (codes.min() < 0 or codes.max() >= len(names)):
        raise IndexError("a name code out of range")
    text, at = _packed_cached(names)
    offsets, data = _names(text, at, codes)
    return _array(n, offsets, data)
