"""How the core calls the configured strategy: through its compiled entry's address, so that the core
does not compile the strategies into itself.

Why: numba caches a function with everything it calls compiled in, and ``engine/jit.py`` stamps that
cache with every source the function's file imports. A core that called the strategies directly was
recompiled whole (30-56 s) after any edit to any strategy. Here the core imports no strategy: each
compiled strategy has a C entry of its own (``registry.entry``, cached beside the strategy's module
under its own stamp), the engine puts its address in the core's state (``C_STRATEGY_FN``), and
:func:`quote` calls it there. An edited strategy recompiles its entry alone, in a second or two.

With the JIT off (the readable reference), :func:`quote` calls the strategy's Python function by its
kind code instead; a Python strategy (``MODULE:FUNCTION``, kind codes from ``plugin.FIRST_KIND``) is
called through the interpreter either way (``engine/strategies/plugin.py``).
"""

from __future__ import annotations

import importlib

import numba as nb
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from engine.jit import njit
from engine.strategies import plugin

MAX_PARAMS = 8  # the length of the parameter array every strategy receives
BOOK_LEN = 60  # the engine's book (engine.book): bid px, bid sz, ask px, ask sz, 15 levels each

# The C entry's signature: (out int64[4], book float64[60], tick, qty lots, label, position lots,
# target lots, max_position lots, params float64[MAX_PARAMS]).
ENTRY_SIGNATURE = types.void(
    types.CPointer(types.int64),
    types.CPointer(types.float64),
    types.float64,
    types.int64,
    types.int64,
    types.int64,
    types.float64,
    types.int64,
    types.CPointer(types.float64),
)


@njit(nrt=True)  # its Python branch hands the book and parameters to the interpreter
def quote(fn, kind, book, tick, qty, label, position, target, max_position, params):
    """The strategy of ``kind`` (its compiled entry at address ``fn``) on the signature of
    :mod:`engine.strategies`: (bid lots, bid ticks, ask lots, ask ticks)."""
    if kind >= plugin.FIRST_KIND:  # a Python function: the interpreter runs it, the result comes back
        with nb.objmode(bid_lots="int64", bid_t="int64", ask_lots="int64", ask_t="int64"):
            bid_lots, bid_t, ask_lots, ask_t = plugin.call(
                kind, book, tick, qty, label, position, target, max_position, params
            )
        return bid_lots, bid_t, ask_lots, ask_t
    return _compiled(fn, kind, book, tick, qty, label, position, target, max_position, params)


def _compiled(fn, kind, book, tick, qty, label, position, target, max_position, params):
    """The JIT off: the registry's strategy of ``kind`` as Python. Compiled, the overload below calls
    the entry at ``fn``. (The registry is found by name: an import statement here would put every
    strategy back into the core's cache stamp.)"""
    strategies = importlib.import_module("engine.strategies.registry").STRATEGIES
    return strategies[kind].quote(book, tick, qty, label, position, target, max_position, params)


@overload(_compiled)
def _compiled_entry(fn, kind, book, tick, qty, label, position, target, max_position, params):
    def impl(fn, kind, book, tick, qty, label, position, target, max_position, params):
        # the entry reads BOOK_LEN and MAX_PARAMS values from the data pointers: shorter arrays would
        # be read past their end
        if book.shape[0] < BOOK_LEN or params.shape[0] < MAX_PARAMS:
            raise ValueError("a strategy takes the engine's 60-value book and 8 parameters")
        return _call_entry(fn, book, tick, qty, label, position, target, max_position, params)

    return impl


@intrinsic
def _call_entry(typingctx, fn, book, tick, qty, label, position, target, max_position, params):
    """Call the C entry at address ``fn`` (:data:`ENTRY_SIGNATURE`) and return its four integers. The
    book and the parameters go as their data pointers: only contiguous float64 arrays type here."""
    for a in (book, params):
        if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and a.dtype == types.float64):
            return None
    i64 = types.int64
    sig = types.UniTuple(i64, 4)(fn, book, tick, qty, label, position, target, max_position, params)

    def codegen(context, builder, signature, args):
        fn_v, book_v, tick_v, qty_v, label_v, pos_v, target_v, max_v, params_v = args
        ty = signature.args
        book_p = context.make_array(ty[1])(context, builder, book_v).data
        params_p = context.make_array(ty[8])(context, builder, params_v).data

        def cast(v, j, to):
            return context.cast(builder, v, ty[j], to)

        li64, lf64 = ir.IntType(64), ir.DoubleType()
        out = builder.alloca(ir.ArrayType(li64, 4))
        out_p = builder.bitcast(out, li64.as_pointer())
        fnty = ir.FunctionType(
            ir.VoidType(),
            [li64.as_pointer(), lf64.as_pointer(), lf64, li64, li64, li64, lf64, li64, lf64.as_pointer()],
        )
        entry = builder.inttoptr(cast(fn_v, 0, i64), fnty.as_pointer())
        builder.call(
            entry,
            [
                out_p,
                builder.bitcast(book_p, lf64.as_pointer()),
                cast(tick_v, 2, types.float64),
                cast(qty_v, 3, i64),
                cast(label_v, 4, i64),
                cast(pos_v, 5, i64),
                cast(target_v, 6, types.float64),
                cast(max_v, 7, i64),
                builder.bitcast(params_p, lf64.as_pointer()),
            ],
        )
        vals = [builder.load(builder.gep(out_p, [ir.Constant(li64, k)])) for k in range(4)]
        return context.make_tuple(builder, signature.return_type, vals)

    return sig, codegen
