"""Adversarial cases for command validation + strategy + risk gateway, and an independent oracle.

The oracle does not call the gateway's code: it states the invariants an accepted order must hold
(order size, worst-case position and net delta counting resting orders, price band, slippage over the
displayed depth, reduce-only, a valid two-sided book) from the raw numbers, so a rule that is switched
off by a NaN, or skipped by a wrong "reducing" shortcut, shows as a breach. Used by
tests/engine/test_risk_properties.py (a quick seeded run) and bench/fuzz_risk.py (millions of cases).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.contract import ContractConfig
from engine.events import BookSnapshot
from engine.kev.command import CommandFields, validate_command
from engine.risk import OrderIntent, RiskLimits, RiskState, check
from engine.strategies.quoter import desired_quotes
from engine.strategy import QuoteConfig

NOW = 10_000_000_000
EPS = 1e-9
CONTRACT = ContractConfig()
QUOTES = QuoteConfig()
# the defaults, with the portfolio rules bound (their defaults never bind: one instrument)
LIMITS = RiskLimits(
    portfolio_max_net_delta_usd=6_000.0, portfolio_max_gross_usd=9_000.0, portfolio_loss_stop_usd=200.0
)


def _valid_top(book: BookSnapshot) -> bool:
    b, a, bs, as_ = book.bid_px[0], book.ask_px[0], book.bid_sz[0], book.ask_sz[0]
    finite = all(math.isfinite(x) for x in (b, a, bs, as_))
    return finite and b > 0 and a > b and bs > 0 and as_ > 0


def _depth(book: BookSnapshot, side: str) -> list[tuple[float, float]]:
    """The displayed levels a taker on ``side`` can trust: from the best, while they are real."""
    px, sz = (book.ask_px, book.ask_sz) if side == "buy" else (book.bid_px, book.bid_sz)
    out: list[tuple[float, float]] = []
    for p, s in zip(px, sz, strict=True):
        if not (math.isfinite(p) and math.isfinite(s) and p > 0 and s >= 0):
            break
        if out and ((p <= out[-1][0]) if side == "buy" else (p >= out[-1][0])):
            break
        out.append((p, s))
    return out


def breaches(limits: RiskLimits, st: RiskState, it: OrderIntent, book: BookSnapshot | None) -> list[str]:
    """What an accepted new order ``it`` would violate; [] when it is safe to send."""
    if book is None or not _valid_top(book):
        return ["no_valid_book"]
    out = []
    qty, side = it.qty, it.side
    if not (math.isfinite(qty) and qty > 0) or side not in ("buy", "sell"):
        return ["bad_order"]
    if qty > limits.max_order_qty + EPS:
        out.append("order_size")
    signed = qty if side == "buy" else -qty
    same = st.open_buy_qty if side == "buy" else -st.open_sell_qty
    worst = st.position + same + signed
    grows = abs(worst) >= abs(st.position)  # only an order that shrinks the worst case may exceed
    mid = (book.bid_px[0] + book.ask_px[0]) / 2
    if grows and abs(worst) > limits.max_position + EPS:
        out.append("max_position")
    if grows and abs(worst) * mid > limits.max_net_delta_usd * (1 + EPS):
        out.append("max_net_delta")
    here = st.position * mid
    after = worst * mid + st.others_delta_usd
    if not (abs(after) <= limits.portfolio_max_net_delta_usd * (1 + EPS)) and not (
        abs(after) < abs(here + st.others_delta_usd)
    ):
        out.append("portfolio_net_delta")
    if grows and not (abs(worst) * mid + st.others_gross_usd <= limits.portfolio_max_gross_usd * (1 + EPS)):
        out.append("portfolio_gross")
    if grows and not (
        st.cash_units / 1e12 + here + st.others_pnl_usd > -limits.portfolio_loss_stop_usd * (1 + EPS)
    ):
        out.append("portfolio_loss_stop")
    if it.reduce_only and not (st.position * signed < 0 and qty <= abs(st.position) + EPS):
        out.append("reduce_only")
    if it.order_type == "limit":
        if (
            not (math.isfinite(it.px) and it.px > 0)
            or abs(it.px - mid) / mid * 1e4 > limits.price_band_bps + EPS
        ):
            out.append("price_band")
    else:
        left, cost = qty, 0.0
        for p, s in _depth(book, side):
            take = min(left, s)
            cost += p * take
            left -= take
            if left <= 1e-12:
                break
        cap = limits.max_slippage_bps
        if it.max_slippage_bps is not None and it.max_slippage_bps < cap:
            cap = it.max_slippage_bps
        if left > 1e-9 or abs(cost / qty - mid) / mid * 1e4 > cap + 1e-6:
            out.append("slippage")
    return out


# ------------------------------------------------------------------ adversarial generation

_BAD_PX = (math.nan, math.inf, -math.inf, 0.0, -1.0, 1e-300, 1e300, 1.7e308)
_BAD_QTY = (math.nan, math.inf, -math.inf, 0.0, -0.01, 1e-13, 1e12, 1.7e308)
_BAD_JSON: tuple[Any, ...] = (
    None, True, "x", [], {}, 10**400, -(10**400), 1e308, -0.0, 2**63, "0.01", math.nan, math.inf,
)  # fmt: skip


def gen_book(rng: random.Random) -> BookSnapshot:
    """A 15-level book, usually sane around a random price, often broken in one or more ways."""
    base = float(rng.choice([1e-6, 0.5, 100.0, 50_000.0, 3e9]))
    tick = CONTRACT.tick
    spread = tick * int(rng.randrange(1, 5))
    bid = round(base * (1 + rng.gauss(0, 0.01)), 1) or tick
    bid_px = [bid - i * tick for i in range(15)]
    ask_px = [bid + spread + i * tick for i in range(15)]
    bid_sz = [float(rng.choice([0.001, 0.01, 0.5, 3.0])) for _ in range(15)]
    ask_sz = [float(rng.choice([0.001, 0.01, 0.5, 3.0])) for _ in range(15)]
    n = int(rng.randrange(0, 4))  # how many things to break
    for _ in range(n):
        k = int(rng.randrange(0, 9))
        arr = (bid_px, ask_px, bid_sz, ask_sz)[int(rng.randrange(0, 4))]
        i = 0 if rng.random() < 0.6 else int(rng.randrange(0, 15))
        if k == 0:
            arr[i] = float(rng.choice(_BAD_PX if arr is bid_px or arr is ask_px else _BAD_QTY))
        elif k == 1:  # crossed or locked
            bid_px[0] = ask_px[0] + tick * int(rng.randrange(0, 3))
        elif k == 2:  # one-sided: a side missing (NaN padding)
            side = bid_px if rng.random() < 0.5 else ask_px
            for j in range(15):
                side[j] = math.nan
        elif k == 3:  # fewer levels
            m = int(rng.randrange(1, 15))
            for a in (bid_px, bid_sz, ask_px, ask_sz):
                for j in range(m, 15):
                    a[j] = math.nan
        elif k == 4:  # levels out of order
            j = int(rng.randrange(1, 15))
            arr[j], arr[j - 1] = arr[j - 1], arr[j]
        elif k == 5:
            arr[i] = -arr[i]
        elif k == 6:  # huge size at the top (a fat finger or a unit error)
            (bid_sz if rng.random() < 0.5 else ask_sz)[0] = 1e15
        else:
            pass
    return book_of(bid_px, bid_sz, ask_px, ask_sz, NOW - int(rng.choice([0, 1_000_000, 2_500_000_000])))


def book_of(
    bid_px: list[float], bid_sz: list[float], ask_px: list[float], ask_sz: list[float], ts: int
) -> BookSnapshot:
    """A BTCUSDT snapshot of these 15-level sides, received at ``ts``."""
    return BookSnapshot(
        ts_event=ts,
        ts_recv=ts,
        seq=1,
        symbol="BTCUSDT",
        exch_seq=1,
        bid_px=tuple(bid_px),
        bid_sz=tuple(bid_sz),
        ask_px=tuple(ask_px),
        ask_sz=tuple(ask_sz),
    )


def gen_state(rng: random.Random) -> RiskState:
    lot = 10**9  # 0.001 base units, in units of 1e-12
    return RiskState(
        position_units=rng.randrange(-120, 121) * lot,
        open_buy_qty=float(rng.choice([0, 0, 0.002, 0.02, 0.1])),
        open_sell_qty=float(rng.choice([0, 0, 0.002, 0.02, 0.1])),
        cash_units=rng.choice([0, 5, -50, -100, -1_000_000, 5_000, -5_000, 10**13]) * 10**12,
        recent_order_ns=tuple(
            sorted(NOW - rng.randrange(0, 2_000_000_000) for _ in range(rng.randrange(12)))
        ),
        kill_switch=bool(rng.random() < 0.02),
        # the other instruments of a portfolio (a NaN: one without a mark holds a position)
        others_delta_usd=float(rng.choice([0.0, 0.0, 2_000.0, -5_500.0, 9_000.0, math.nan])),
        others_gross_usd=float(rng.choice([0.0, 0.0, 4_000.0, 8_900.0, math.nan])),
        others_pnl_usd=float(rng.choice([0.0, 0.0, 50.0, -150.0, -250.0, math.nan])),
    )


def gen_command(rng: random.Random) -> Any:
    """A Kev command: usually well-formed, often with one field replaced by something hostile."""
    cmd: dict[Any, Any] = {
        "action": str(rng.choice(["HOLD", "LEAN_BUY", "LEAN_SELL", "EMERGENCY_FLATTEN"])),
        "target_position": float(rng.uniform(-0.2, 0.2)),
        "hedge_ratio": float(rng.uniform(0, 1)),
        "max_slippage_bps": float(rng.uniform(0, 100)),
        "reason": "fuzz",
    }
    r = rng.random()
    if r < 0.3:
        cmd[str(rng.choice(sorted(map(str, cmd))))] = _BAD_JSON[int(rng.randrange(0, len(_BAD_JSON)))]
    elif r < 0.35:
        cmd[1] = "non-string key"
    elif r < 0.4:
        cmd.pop(str(rng.choice(sorted(map(str, cmd)))))
    elif r < 0.42:
        return _BAD_JSON[int(rng.randrange(0, len(_BAD_JSON)))]
    return cmd


def _intent(side: str, otype: str, px: float, qty: float, **kw: Any) -> OrderIntent:
    return OrderIntent(
        client_oid="f", symbol="BTCUSDT", intent="new", side=side, order_type=otype, px=px, qty=qty, **kw
    )


def intents_for(rng: random.Random, book: BookSnapshot, st: RiskState, cmd: Any) -> list[OrderIntent]:
    """What the engine would send on this book with this command (quotes, a rebalance towards Kev's
    target, reduce-only when flattening), plus one raw hostile intent."""
    verdict = validate_command(cmd)  # must never raise
    out: list[OrderIntent] = []
    label = str(rng.choice(["HOLD", "LEAN_BUY", "LEAN_SELL", "EMERGENCY"]))
    target = 0.0
    if isinstance(verdict, CommandFields):
        m = LIMITS.max_position
        flatten = verdict.action == "EMERGENCY_FLATTEN"
        target = 0.0 if flatten else max(-m, min(m, verdict.target_position))
        diff = target - st.position
        qty = CONTRACT.round_qty(min(abs(diff), LIMITS.max_order_qty))
        if qty >= CONTRACT.min_qty:
            side = "buy" if diff > 0 else "sell"
            src = "flatten" if flatten else "kev"
            age = int(rng.choice([0, 1_000_000, 4_000_000_000]))
            out.append(
                _intent(
                    side,
                    "market",
                    math.nan,
                    qty,
                    reduce_only=flatten,
                    max_slippage_bps=verdict.max_slippage_bps,
                    source=src,
                    advice_age_ns=age,
                )
            )
    for q in desired_quotes(
        QUOTES,
        CONTRACT,
        book,
        label=label,
        position=st.position,
        target=target,
        max_position=LIMITS.max_position,
    ):
        out.append(_intent(q.side, "limit", q.px, q.qty))
    mid = (book.bid_px[0] + book.ask_px[0]) / 2
    px = float(rng.choice([mid, mid * 1.001, mid * 2, 1e9, *_BAD_PX])) if rng.random() < 0.9 else mid
    out.append(
        _intent(
            str(rng.choice(["buy", "sell"])),
            str(rng.choice(["limit", "market"])),
            px,
            float(rng.choice([0.001, 0.01, 0.02, 0.021, 0.5, *_BAD_QTY])),
            reduce_only=bool(rng.random() < 0.3),
            max_slippage_bps=None
            if rng.random() < 0.5
            else float(rng.choice([0.0, 1.0, 50.0, 1e6, math.nan])),
        )
    )
    return out


@dataclass
class FuzzStats:
    cases: int = 0
    intents: int = 0
    accepted: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    breaches: Counter[str] = field(default_factory=Counter)
    examples: list[tuple[Any, ...]] = field(default_factory=list)


def gen_cases(seed: int, n: int) -> Iterator[tuple[RiskState, list[OrderIntent], BookSnapshot]]:
    """``n`` cases (a state, what the engine and an adversary would send, a book) from ``seed``."""
    rng = random.Random(seed)
    for _ in range(n):
        book = gen_book(rng)
        st = gen_state(rng)
        yield st, intents_for(rng, book, st, gen_command(rng)), book


def run_fuzz(seed: int, n: int, stats: FuzzStats | None = None) -> FuzzStats:
    """``n`` cases from ``seed``; every accepted intent is audited by :func:`breaches`."""
    s = stats or FuzzStats()
    for st, its, book in gen_cases(seed, n):
        for it in its:
            ok, reason = check(LIMITS, st, it, book, NOW)
            s.intents += 1
            s.reasons[reason] += 1
            if ok:
                s.accepted += 1
                bad = breaches(LIMITS, st, it, book)
                for b in bad:
                    s.breaches[b] += 1
                if bad and len(s.examples) < 5:
                    s.examples.append((bad, st, it, book))
        s.cases += 1
    return s
