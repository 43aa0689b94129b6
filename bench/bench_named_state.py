#!/usr/bin/env python3
"""Named state for the compiled core: which way of passing it to numba keeps the speed (run by hand).

One hot pattern, the shape of the core's steps (read and write ~10 scalars of the state ``S``/``SF``,
read the constants ``C``, write a row of the order table ``OI``/``OF``, push a timer onto ``HI``/``HF``
and write an output row into ``OUTI``/``OUTF``/``NOUT``), written five ways:

- ``arrays``: today's, each array a parameter, scalars by slot constant (``S[S_NOW]``);
- ``tuple``: one NamedTuple of every array (``core.S[S_NOW]``);
- ``groups``: the arrays grouped by owner into NamedTuples (orders, heap, out), scalars arrays as today;
- ``record``: the scalars as one numpy record (structured dtype, ``st[0].now``), the tables as today;
- ``structref``: one numba structref holding the arrays (``core.S[S_NOW]``).

Each process (numba's cache off) compiles every variant, timing its first call (the step and its
driving loop; the shared heap push compiles with the first), then alternates their timed loops of ``-n``
steps ``--repeat`` times: warm ns per step, median and best. Compiled as the core is, without numba's
reference counting (``engine.jit.njit``; ``--nrt`` turns it on): a structref (and a jitclass) cannot
be compiled so, as reading a field takes a reference. ``--rounds`` processes, the variants' order
rotated; medians over them are printed.

    python bench/bench_named_state.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

VARIANTS = ("arrays", "tuple", "groups", "record", "structref")

CHILD = r"""
import sys, time
import numpy as np
import numba as nb
from typing import NamedTuple

variants, n, repeat, nrt = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
S_NOW, S_OID, S_POS, S_CASH, S_HEAP_SEQ, S_HEAP_N, S_SENT, S_LAST, S_BID, S_ASK = range(10)
SF_EDGE, SF_MID = 0, 1
C_MASK, C_LAT = 0, 1
OI_COLS, HI_COLS = 8, 7
ORDER = 0

S = np.zeros(64, np.int64); SF = np.zeros(16); C = np.zeros(16, np.int64); CF = np.zeros(16)
C[C_LAT] = 1000
OI = np.zeros((1024, OI_COLS), np.int64); OF = np.zeros((1024, 2))
HI = np.zeros((4096, HI_COLS), np.int64); HF = np.zeros((4096, 2))
OUTI = np.zeros((8, 8, 4096), np.int64); OUTF = np.zeros((8, 2, 4096)); NOUT = np.zeros(8, np.int64)
nj = nb.njit(_nrt=nrt)  # the core compiles without reference counting (engine.jit.njit)

# the heap pops what the step pushed so the loop stays in bounds: the same code in every variant
@nj
def heap_push(HI, HF, n, ts, seq, kind, a, f):
    i = n
    while i > 0:
        p = (i - 1) >> 1
        if HI[p, 0] < ts or (HI[p, 0] == ts and HI[p, 2] < seq):
            break
        for c in range(HI_COLS):
            HI[i, c] = HI[p, c]
        HF[i, 0] = HF[p, 0]
        i = p
    HI[i, 0] = ts; HI[i, 1] = 0; HI[i, 2] = seq; HI[i, 3] = kind; HI[i, 4] = a
    HF[i, 0] = f

def build(variant):
    if variant == "arrays":
        @nj
        def step(S, SF, C, CF, OI, OF, HI, HF, OUTI, OUTF, NOUT, ts, px):
            S[S_NOW] = ts
            oid = S[S_OID] + 1
            S[S_OID] = oid
            r = oid & (OI.shape[0] - 1)
            OI[r, 0] = oid; OI[r, 1] = px; OI[r, 2] = 1 if px > S[S_LAST] else -1; OI[r, 3] = ts
            OF[r, 0] = px * 0.5 + SF[SF_EDGE]
            S[S_POS] += OI[r, 2]
            S[S_CASH] -= OI[r, 2] * px
            S[S_LAST] = px
            if px > S[S_ASK]:
                S[S_ASK] = px
            if px < S[S_BID] or S[S_BID] == 0:
                S[S_BID] = px
            SF[SF_MID] = 0.5 * (S[S_BID] + S[S_ASK])
            seq = S[S_HEAP_SEQ]; S[S_HEAP_SEQ] = seq + 1
            heap_push(HI, HF, S[S_HEAP_N] & 2047, ts + C[C_LAT], seq, 1, oid, SF[SF_MID])
            k = NOUT[ORDER] & 4095; NOUT[ORDER] += 1
            OUTI[ORDER, 0, k] = ts; OUTI[ORDER, 1, k] = oid; OUTI[ORDER, 2, k] = S[S_POS]
            OUTF[ORDER, 0, k] = OF[r, 0]
            S[S_SENT] += 1
            return oid

        @nj
        def loop(S, SF, C, CF, OI, OF, HI, HF, OUTI, OUTF, NOUT, n):
            t = 0
            for i in range(n):
                t += step(S, SF, C, CF, OI, OF, HI, HF, OUTI, OUTF, NOUT, i, 100 + (i * 7919) % 13)
            return t

        return loop, (S, SF, C, CF, OI, OF, HI, HF, OUTI, OUTF, NOUT)

    elif variant in ("tuple", "structref"):
        if variant == "tuple":
            class Core(NamedTuple):
                S: np.ndarray; SF: np.ndarray; C: np.ndarray; CF: np.ndarray; OI: np.ndarray; OF: np.ndarray
                HI: np.ndarray; HF: np.ndarray; OUTI: np.ndarray; OUTF: np.ndarray; NOUT: np.ndarray
            core = Core(S, SF, C, CF, OI, OF, HI, HF, OUTI, OUTF, NOUT)
        else:
            from numba.experimental import structref
            from numba.core import types

            @structref.register
            class CoreType(types.StructRef):
                def preprocess_fields(self, fields):
                    return tuple((name, types.unliteral(typ)) for name, typ in fields)

            class Core(structref.StructRefProxy):
                pass

            names = ("S", "SF", "C", "CF", "OI", "OF", "HI", "HF", "OUTI", "OUTF", "NOUT")
            structref.define_proxy(Core, CoreType, list(names))
            core = Core(S, SF, C, CF, OI, OF, HI, HF, OUTI, OUTF, NOUT)

        @nj
        def step(core, ts, px):
            S, SF = core.S, core.SF
            S[S_NOW] = ts
            oid = S[S_OID] + 1
            S[S_OID] = oid
            OI, OF = core.OI, core.OF
            r = oid & (OI.shape[0] - 1)
            OI[r, 0] = oid; OI[r, 1] = px; OI[r, 2] = 1 if px > S[S_LAST] else -1; OI[r, 3] = ts
            OF[r, 0] = px * 0.5 + SF[SF_EDGE]
            S[S_POS] += OI[r, 2]
            S[S_CASH] -= OI[r, 2] * px
            S[S_LAST] = px
            if px > S[S_ASK]:
                S[S_ASK] = px
            if px < S[S_BID] or S[S_BID] == 0:
                S[S_BID] = px
            SF[SF_MID] = 0.5 * (S[S_BID] + S[S_ASK])
            seq = S[S_HEAP_SEQ]; S[S_HEAP_SEQ] = seq + 1
            heap_push(core.HI, core.HF, S[S_HEAP_N] & 2047, ts + core.C[C_LAT], seq, 1, oid, SF[SF_MID])
            NOUT = core.NOUT
            k = NOUT[ORDER] & 4095; NOUT[ORDER] += 1
            core.OUTI[ORDER, 0, k] = ts; core.OUTI[ORDER, 1, k] = oid; core.OUTI[ORDER, 2, k] = S[S_POS]
            core.OUTF[ORDER, 0, k] = OF[r, 0]
            S[S_SENT] += 1
            return oid

        @nj
        def loop(core, n):
            t = 0
            for i in range(n):
                t += step(core, i, 100 + (i * 7919) % 13)
            return t

        return loop, (core,)

    elif variant == "groups":
        class Orders(NamedTuple):
            OI: np.ndarray; OF: np.ndarray
        class Heap(NamedTuple):
            HI: np.ndarray; HF: np.ndarray
        class Out(NamedTuple):
            OUTI: np.ndarray; OUTF: np.ndarray; NOUT: np.ndarray

        @nj
        def step(S, SF, C, CF, orders, heap, out, ts, px):
            S[S_NOW] = ts
            oid = S[S_OID] + 1
            S[S_OID] = oid
            OI, OF = orders.OI, orders.OF
            r = oid & (OI.shape[0] - 1)
            OI[r, 0] = oid; OI[r, 1] = px; OI[r, 2] = 1 if px > S[S_LAST] else -1; OI[r, 3] = ts
            OF[r, 0] = px * 0.5 + SF[SF_EDGE]
            S[S_POS] += OI[r, 2]
            S[S_CASH] -= OI[r, 2] * px
            S[S_LAST] = px
            if px > S[S_ASK]:
                S[S_ASK] = px
            if px < S[S_BID] or S[S_BID] == 0:
                S[S_BID] = px
            SF[SF_MID] = 0.5 * (S[S_BID] + S[S_ASK])
            seq = S[S_HEAP_SEQ]; S[S_HEAP_SEQ] = seq + 1
            heap_push(heap.HI, heap.HF, S[S_HEAP_N] & 2047, ts + C[C_LAT], seq, 1, oid, SF[SF_MID])
            NOUT = out.NOUT
            k = NOUT[ORDER] & 4095; NOUT[ORDER] += 1
            out.OUTI[ORDER, 0, k] = ts; out.OUTI[ORDER, 1, k] = oid; out.OUTI[ORDER, 2, k] = S[S_POS]
            out.OUTF[ORDER, 0, k] = OF[r, 0]
            S[S_SENT] += 1
            return oid

        @nj
        def loop(S, SF, C, CF, orders, heap, out, n):
            t = 0
            for i in range(n):
                t += step(S, SF, C, CF, orders, heap, out, i, 100 + (i * 7919) % 13)
            return t

        return loop, (S, SF, C, CF, Orders(OI, OF), Heap(HI, HF), Out(OUTI, OUTF, NOUT))

    elif variant == "record":
        ints = ("now", "oid", "pos", "cash", "heap_seq", "heap_n", "sent", "last", "bid", "ask")
        dt = np.dtype([(f, np.int64) for f in ints] + [("edge", np.float64), ("mid", np.float64)])
        st = np.zeros(1, dt)

        @nj
        def step(st, C, CF, OI, OF, HI, HF, OUTI, OUTF, NOUT, ts, px):
            s = st[0]
            s.now = ts
            oid = s.oid + 1
            s.oid = oid
            r = oid & (OI.shape[0] - 1)
            OI[r, 0] = oid; OI[r, 1] = px; OI[r, 2] = 1 if px > s.last else -1; OI[r, 3] = ts
            OF[r, 0] = px * 0.5 + s.edge
            s.pos += OI[r, 2]
            s.cash -= OI[r, 2] * px
            s.last = px
            if px > s.ask:
                s.ask = px
            if px < s.bid or s.bid == 0:
                s.bid = px
            s.mid = 0.5 * (s.bid + s.ask)
            seq = s.heap_seq; s.heap_seq = seq + 1
            heap_push(HI, HF, s.heap_n & 2047, ts + C[C_LAT], seq, 1, oid, s.mid)
            k = NOUT[ORDER] & 4095; NOUT[ORDER] += 1
            OUTI[ORDER, 0, k] = ts; OUTI[ORDER, 1, k] = oid; OUTI[ORDER, 2, k] = s.pos
            OUTF[ORDER, 0, k] = OF[r, 0]
            s.sent += 1
            return oid

        @nj
        def loop(st, C, CF, OI, OF, HI, HF, OUTI, OUTF, NOUT, n):
            t = 0
            for i in range(n):
                t += step(st, C, CF, OI, OF, HI, HF, OUTI, OUTF, NOUT, i, 100 + (i * 7919) % 13)
            return t

        return loop, (st, C, CF, OI, OF, HI, HF, OUTI, OUTF, NOUT)


# every variant compiled (its first call timed), then their timed loops alternate in this process, so
# that a neighbour's load falls on all of them alike
built, compile_s = {}, {}
for v in variants:
    try:
        loop, args = build(v)
        t0 = time.perf_counter()
        loop(*args, 10)
        compile_s[v] = time.perf_counter() - t0
        built[v] = (loop, args)
    except Exception as e:
        why = [w for w in str(e).splitlines() if "NRT" in w] or str(e).strip().splitlines()[:1]
        print(f"{v} failed {type(e).__name__}: {why[0].strip()}")
times = {v: [] for v in built}
checks = {v: set() for v in built}
for _ in range(repeat):
    for v, (loop, args) in built.items():
        for a in (S, SF, OI, OF, HI, HF, OUTI, OUTF, NOUT):  # each variant from the same state
            a[...] = 0
        if v == "record":
            args[0][...] = 0
        t0 = time.perf_counter()
        checks[v].add(loop(*args, n))
        times[v].append((time.perf_counter() - t0) / n * 1e9)
for v in built:
    t = sorted(times[v])
    print(f"{v} {compile_s[v]:.3f} {t[len(t) // 2]:.2f} {t[0]:.2f} {','.join(map(str, sorted(checks[v])))}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=2_000_000, help="steps per timed loop")
    ap.add_argument("--repeat", type=int, default=9, help="timed loops of each variant per process")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes (the variants' order rotated)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--nrt", action="store_true", help="compile with reference counting (the core does not)")
    a = ap.parse_args()
    names = a.variants.split(",")
    got: dict[str, list[tuple[float, float, float]]] = {v: [] for v in names}
    checks: set[str] = set()
    env = {"NUMBA_DISABLE_CACHE": "1", "PATH": "/usr/bin:/bin"}
    for r in range(a.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        out = subprocess.run(
            [sys.executable, "-c", CHILD, ",".join(order), str(a.n), str(a.repeat), "1" if a.nrt else "0"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        for line in out.splitlines():
            v, *rest = line.split()
            if rest[0] == "failed":
                print(f"  round {r} {line}", flush=True)
                continue
            c, med, best, check = float(rest[0]), float(rest[1]), float(rest[2]), rest[3]
            got[v].append((c, med, best))
            checks.add(check)
            print(
                f"  round {r} {v:9s} compile {c:.2f} s, warm {med:.2f} ns/step (best {best:.2f})", flush=True
            )
    names = [v for v in names if got[v]]
    base = statistics.median(m for _, m, _ in got[names[0]])
    print(
        f"\n{'variant':10s} {'compile s':>10s} {'warm ns/step':>13s} {'best ns':>8s} {'vs ' + names[0]:>10s}"
    )
    for v in names:
        c = statistics.median(x[0] for x in got[v])
        m = statistics.median(x[1] for x in got[v])
        b = statistics.median(x[2] for x in got[v])
        print(f"{v:10s} {c:10.2f} {m:13.2f} {b:8.2f} {m / base:9.2f}x")
    if len(checks) != 1:
        raise SystemExit(f"the variants disagree: {checks}")


if __name__ == "__main__":
    main()
