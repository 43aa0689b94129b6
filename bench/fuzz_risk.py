"""Fuzz Kev command validation + the quoting strategy + the risk gateway over adversarial cases.

Every accepted order is audited by an exact oracle that does not use the gateway's code
(tests/risk_fuzz.py, Fraction arithmetic on prices and sizes read as the exchange's decimals): every
rule of the gateway, with flips through zero, resting orders on the order's side, positions between
whole lots, short books, missing or absurd times and unknown sources among the cases. The goal is 0
breaches.

    .venv/bin/python bench/fuzz_risk.py --cases 1000000 [--seed 16] [--workers 2]

Cases are split into seeded blocks, so a run is reproducible for any number of workers.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.risk_fuzz import FuzzStats, run_fuzz  # noqa: E402

BLOCK = 50_000


def _block(args: tuple[int, int]) -> FuzzStats:
    seed, n = args
    return run_fuzz(seed, n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    blocks = [(a.seed * 1_000_003 + i, min(BLOCK, a.cases - i * BLOCK)) for i in range(-(-a.cases // BLOCK))]
    total = FuzzStats()
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.workers) as pool:
        for i, s in enumerate(pool.map(_block, blocks), 1):
            total.cases += s.cases
            total.intents += s.intents
            total.accepted += s.accepted
            total.reasons.update(s.reasons)
            total.breaches.update(s.breaches)
            total.families.update(s.families)
            total.examples += s.examples[: 5 - len(total.examples)]
            print(
                f"\r{total.cases:>10,} cases  {i}/{len(blocks)} blocks", end="", file=sys.stderr, flush=True
            )
    wall = time.perf_counter() - t0
    print(file=sys.stderr)
    print(f"cases {total.cases:,}  intents {total.intents:,}  accepted {total.accepted:,}  ", end="")
    print(f"breaches {sum(total.breaches.values())}  ({wall:.0f} s, {a.workers} workers)")
    print(f"{'verdict':<16}{'intents':>12}")
    for reason, n in total.reasons.most_common():
        print(f"{reason:<16}{n:>12,}")
    print(f"{'hostile family':<52}{'intents':>12}{'accepted':>12}")
    for fam in sorted({k.rsplit(' ', 1)[0] for k in total.families}):
        print(f"{fam:<52}{total.families[fam + ' seen']:>12,}{total.families[fam + ' accepted']:>12,}")
    for b, n in total.breaches.most_common():
        print(f"BREACH {b}: {n}")
    for ex in total.examples:
        print("example:", ex)
    return 1 if total.breaches else 0


if __name__ == "__main__":
    raise SystemExit(main())
