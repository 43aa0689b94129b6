"""Arrow string columns the core's output rows need (an order's client id, a span's ref), written
by compiled code straight into Arrow's buffers. Its own module: the core's sources are stamped into
every compiled cache (``engine/jit.py``), so this stays out of ``engine/state.py``, whose edits would
otherwise recompile the whole core."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from engine.jit import njit


def prefixed(prefix: str | tuple[str, ...], n: np.ndarray, which: np.ndarray | None = None) -> pa.Array:
    """``prefix`` + each of ``n`` in decimal as an Arrow string array, its buffers written in one
    compiled pass (casting to strings and joining was a visible share of a trading replay's main thread).
    With several prefixes, ``which[i]`` picks row i's (a latency span's ref: "dh-" or "kev:")."""
    n = np.ascontiguousarray(n, dtype=np.int64)
    starts, words = _table((prefix,) if isinstance(prefix, str) else prefix)
    pick = _FIRST if which is None else np.ascontiguousarray(which, dtype=np.int64)
    if len(pick) and (len(pick) != len(n) or pick.min() < 0 or pick.max() >= len(starts) - 1):
        raise IndexError(f"{len(pick)} prefix choices for {len(n)} numbers of {len(starts) - 1} prefixes")
    offsets = np.empty(len(n) + 1, dtype=np.int32)
    size = _prefixed_offsets(starts, pick, n, offsets)
    data = _text_buffer(size, words)
    _prefixed_write(words, starts, pick, n, offsets, data)
    return _strings(offsets, data, size)


_FIRST = np.zeros(0, dtype=np.int64)  # prefixed: every row takes the first prefix


_POW10_U = np.array([10**k for k in range(20)], dtype=np.uint64)


@njit(inline="always")
def _magnitude(v):
    """|v| as an unsigned integer (so -2**63 has one too)."""
    return np.uint64(v) if v >= 0 else np.uint64(-(v + 1)) + np.uint64(1)


@njit(inline="always")
def _digits(u):
    """Decimal digits of the unsigned ``u``: by comparison, not division."""
    k = 1
    while k < 20 and u >= _POW10_U[k]:
        k += 1
    return k


@njit
def _prefixed_offsets(starts, pick, n, offsets):
    """Each string's start into ``offsets`` (and the end after the last); returns the bytes in all."""
    at = 0
    offsets[0] = 0
    for i in range(len(n)):
        v = n[i]
        c = pick[i] if len(pick) else 0
        at += starts[c + 1] - starts[c] + _digits(_magnitude(v)) + (1 if v < 0 else 0)
        offsets[i + 1] = at
    return at


@njit
def _prefixed_write(words, starts, pick, n, offsets, data):
    ten = np.uint64(10)
    for i in range(len(n)):
        at = offsets[i]
        plen = _put_text(words, starts, pick[i] if len(pick) else 0, data, at)
        if n[i] < 0:
            data[at + plen] = 45  # "-"
        u = _magnitude(n[i])
        end = offsets[i + 1]
        while True:  # digits from the last
            end -= 1
            q = u // ten
            data[end] = np.uint8(48 + (u - q * ten))
            u = q
            if u == 0:
                break


_TABLES: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}


def _table(values: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Where each text's UTF-8 bytes start among them all (one more: the end), and each text's bytes
    as whole 8-byte words, zero-padded ((texts x words) uint64, in the machine's byte order, so a word
    stored as it is writes the text's bytes in order)."""
    table = _TABLES.get(values)
    if table is None:
        encoded = [v.encode() for v in values]
        starts = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=starts[1:])
        n = max([1, *((len(e) + 7) // 8 for e in encoded)])
        padded = b"".join(e.ljust(8 * n, b"\0") for e in encoded)
        words = np.frombuffer(padded, dtype=np.uint64).reshape(len(values), n).copy()
        table = _TABLES[values] = (starts, words)
    return table


def _text_buffer(size: int, words: np.ndarray) -> np.ndarray:
    """Room for ``size`` bytes of strings, and for the whole words the last text's store writes."""
    return np.empty(size + 8 * words.shape[1], dtype=np.uint8)


def _strings(offsets: np.ndarray, data: np.ndarray, size: int) -> pa.Array:
    return pa.Array.from_buffers(
        pa.string(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data[:size])]
    )


def texts(values: tuple[str, ...], codes: np.ndarray) -> pa.Array:
    """``values[code]`` for each of ``codes`` as an Arrow string array (what ``take`` on the values
    gives, without its per-row gather of variable-width strings); a code out of range is an error."""
    starts, words = _table(values)
    codes = np.ascontiguousarray(codes, dtype=np.int64)
    offsets = np.empty(len(codes) + 1, dtype=np.int32)
    if _texts_offsets(starts, codes, offsets) < 0:
        raise IndexError(f"a code out of range of {len(values)} texts")
    size = int(offsets[-1])
    data = _text_buffer(size, words)
    _texts_write(words, starts, codes, offsets, data)
    return _strings(offsets, data, size)


@njit
def _texts_offsets(starts, codes, offsets):
    """Each text's start into ``offsets``; returns the bytes in all, or -1 at a code out of range."""
    at = 0
    offsets[0] = 0
    k = len(starts) - 1
    for i in range(len(codes)):
        c = codes[i]
        if c < 0 or c >= k:
            return -1
        at += starts[c + 1] - starts[c]
        offsets[i + 1] = at
    return at


@njit
def _texts_write(words, starts, codes, offsets, data):
    for i in range(len(codes)):
        _put_text(words, starts, codes[i], data, offsets[i])


@njit(inline="always")
def _put_text(words, starts, c, data, at):
    """Text ``c`` at byte ``at`` of ``data``, a whole word at a time (most texts are one word): a
    byte-by-byte copy was a visible share of a trading replay (bench/HISTORY.md). The bytes a word
    writes past the text's end are overwritten by what follows, or fall in the room after the last
    (:func:`_text_buffer`). Returns the text's length."""
    length = starts[c + 1] - starts[c]
    for k in range((length + 7) // 8):
        put8(data, at + 8 * k, words[c, k])
    return length


def put8(data: np.ndarray, at: int, word: np.uint64) -> None:
    """``data[at:at + 8]`` = the bytes of ``word`` as it sits in memory (the readable reference of the
    compiled store below, which the JIT uses instead)."""
    data[at : at + 8] = np.array([word], dtype=np.uint64).view(np.uint8)


@overload(put8)
def _put8_compiled(data, at, word):
    if not (isinstance(data, types.Array) and data.ndim == 1 and data.dtype == types.uint8):
        return None
    if data.layout != "C":
        return None

    def impl(data, at, word):
        if at < 0 or at + 8 > data.shape[0]:
            raise IndexError("put8 past the end of its buffer")
        _store8(data, at, word)

    return impl


@intrinsic
def _store8(typingctx, data, at, word):
    """One unaligned 8-byte store of ``word`` at byte ``at`` of ``data``."""
    sig = types.void(data, at, word)

    def codegen(context, builder, signature, args):
        data_v, at_v, word_v = args
        ty = signature.args
        base = context.make_array(ty[0])(context, builder, data_v).data
        ptr = builder.gep(base, [context.cast(builder, at_v, ty[1], types.int64)])
        i64 = ir.IntType(64)
        builder.store(
            context.cast(builder, word_v, ty[2], types.uint64),
            builder.bitcast(ptr, i64.as_pointer()),
            align=1,
        )
        return context.get_dummy_value()

    return sig, codegen
