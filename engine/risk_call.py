"""How the core calls the risk gateway's rules: through the address of their compiled entry, so that
the core does not compile the rules into itself.

Why: numba caches a function with everything it calls compiled in, and ``engine/jit.py`` stamps that
cache with every source the function's file imports. A core that called ``engine.risk.verdict``
directly was recompiled whole, the replay loop with it (~40 s), after any edit to any rule. Here the
core imports only the gateway's codes (``engine/risk_codes.py``): the rules' C entry
(``engine.risk.entry``) is compiled and cached beside ``engine/risk.py`` under its own stamp, the
engine puts its address in the core's state (``C_RISK_FN``), and :func:`verdict` calls it there, as
``engine/strategies/call.py`` calls a strategy.

With the JIT off (the readable reference), :func:`verdict` calls ``engine.risk.verdict_packed`` as
Python instead.
"""

from __future__ import annotations

import importlib

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from engine.book import LEVELS, WIDTH
from engine.risk_codes import N_RULES, VF_SIZE, VI_SIZE


def verdict(fn, vi, vf, C, at, bk, lpx, lq):
    """The reason code (R_OK: accepted) of the rules whose entry is at address ``fn``, on ``vi`` and
    ``vf`` (tuples in ``engine.risk_codes``' VI_* and VF_* places), the rule codes ``C[at:at +
    N_RULES]``, the book ``bk`` and the walk scratch ``lpx``/``lq``. This body is the JIT off's:
    compiled, the overload below calls the entry."""
    risk = importlib.import_module("engine.risk")  # by name: an import would stamp the core with the rules
    return risk.verdict_packed(
        np.array(vi, dtype=np.int64), np.array(vf, dtype=np.float64), C[at : at + N_RULES], bk, lpx, lq
    )


@overload(verdict)
def _verdict_entry(fn, vi, vf, C, at, bk, lpx, lq):
    def impl(fn, vi, vf, C, at, bk, lpx, lq):
        # the entry reads N_RULES codes, the WIDTH-value book and LEVELS values of each scratch: shorter
        # arrays would be read past their end; an address of 0 is an engine built without the entry
        if fn == 0 or at < 0 or at + N_RULES > C.shape[0] or bk.shape[0] < WIDTH:
            raise ValueError("the risk rules' entry needs its address, the rule codes and the 60-value book")
        if lpx.shape[0] < LEVELS or lq.shape[0] < LEVELS:
            raise ValueError("the risk rules' entry needs 15 values of walk scratch each")
        return _call_entry(fn, vi, vf, C, at, bk, lpx, lq)

    return impl


@intrinsic
def _call_entry(typingctx, fn, vi, vf, C, at, bk, lpx, lq):
    """Call the C entry at ``fn`` (``engine.risk_codes.ENTRY_SIGNATURE``): the tuples ``vi`` and ``vf``
    go as stack arrays of int64 and float64, the arrays as their data pointers (only contiguous ones
    type here)."""
    if not (isinstance(vi, types.BaseTuple) and len(vi) == VI_SIZE):
        return None
    if not (isinstance(vf, types.BaseTuple) and len(vf) == VF_SIZE):
        return None
    for a, dt in ((C, types.int64), (bk, types.float64), (lpx, types.float64), (lq, types.float64)):
        if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and a.dtype == dt):
            return None
    sig = types.int64(fn, vi, vf, C, at, bk, lpx, lq)

    def codegen(context, builder, signature, args):
        fn_v, vi_v, vf_v, C_v, at_v, bk_v, lpx_v, lq_v = args
        ty = signature.args
        li64, lf64 = ir.IntType(64), ir.DoubleType()

        def packed(tup_v, tup_t, to, lty, n):
            # in the function's entry block: a call inside a loop reuses the same slots
            arr = cgutils.alloca_once(builder, lty, size=n)
            for k in range(n):
                v = context.cast(builder, builder.extract_value(tup_v, k), tup_t.types[k], to)
                builder.store(v, builder.gep(arr, [ir.Constant(li64, k)]))
            return arr

        vi_p = packed(vi_v, ty[1], types.int64, li64, VI_SIZE)
        vf_p = packed(vf_v, ty[2], types.float64, lf64, VF_SIZE)
        C_data = context.make_array(ty[3])(context, builder, C_v).data
        rules_p = builder.gep(C_data, [context.cast(builder, at_v, ty[4], types.int64)])

        def data(j, v):
            return builder.bitcast(context.make_array(ty[j])(context, builder, v).data, lf64.as_pointer())

        fnty = ir.FunctionType(
            li64,
            [li64.as_pointer(), lf64.as_pointer(), li64.as_pointer()] + [lf64.as_pointer()] * 3,
        )
        entry = builder.inttoptr(context.cast(builder, fn_v, ty[0], types.int64), fnty.as_pointer())
        rules_p = builder.bitcast(rules_p, li64.as_pointer())
        return builder.call(entry, [vi_p, vf_p, rules_p, data(5, bk_v), data(6, lpx_v), data(7, lq_v)])

    return sig, codegen
