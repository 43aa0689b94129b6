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
from decimal import Decimal
from fractions import Fraction
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine.contract import ContractConfig
from engine.events import BookSnapshot
from engine.kev.command import CommandFields, validate_command
from engine.risk import OrderIntent, RiskLimits, RiskState, check
from engine.strategies.quoter import desired_quotes
from engine.strategy import QuoteConfig

NOW = 10_000_000_000
CONTRACT = ContractConfig()
QUOTES = QuoteConfig()
# the defaults, with the portfolio rules bound (their defaults never bind: one instrument)
LIMITS = RiskLimits(
    portfolio_max_net_delta_usd=6_000.0, portfolio_max_gross_usd=9_000.0, portfolio_loss_stop_usd=200.0
)


# ------------------------------------------------------------------ the exact oracle
#
# Prices and sizes are what the exchange's strings say: a price is the decimal of fewest places (up to
# 12) whose double it is, when every price of a comparison is such a decimal, and otherwise every one is
# the exact binary value of its double; a size of whole lots is ``n * step`` exactly. Limits, bps and USD
# amounts are the numbers given (exact binary values); a size limit allows the lots whose size reads
# (rounds) as at most it. Everything below is Fraction arithmetic: nothing rounds.

_INF = math.inf


def _dec(x: float) -> Fraction | None:
    """The decimal of fewest places (<= 12) whose double is ``x``, if any (positive ``x``)."""
    if not (0.0 < x < _INF):
        return None
    for d in range(13):
        k = round(Fraction(x) * 10**d)
        if 1 <= k < 2**53 and float(Fraction(k, 10**d)) == x:
            return Fraction(k, 10**d)
    return None


def read_prices(*xs: float) -> list[Fraction] | None:
    """The prices of one comparison as the rules read them; None if one is not a positive number."""
    if not all(isinstance(x, float) and 0.0 < x < _INF for x in xs):
        return None
    decs = [_dec(x) for x in xs]
    if all(d is not None for d in decs):
        return decs  # type: ignore[return-value]
    return [Fraction(x) for x in xs]


def _step(step: float) -> Fraction:
    return Fraction(Decimal(repr(step)))


def lots_in(q: float, step: float) -> int | None:
    """The whole lots an order size is (``n`` with ``n * step`` reading as ``q``), or None."""
    if not (isinstance(q, float) and 0.0 < q < _INF):
        return None
    n = round(Fraction(q) / _step(step))
    return n if n >= 1 and float(n * _step(step)) == q else None


def lots_allowed(limit: float, step: float) -> int | float:
    """The most whole lots whose size reads as at most the size limit ``limit``."""
    if limit == _INF:
        return _INF
    n = math.floor(Fraction(limit) / _step(step)) + 1
    while n > 0 and float(n * _step(step)) > limit:
        n -= 1
    return n


def level_lots(s: float, step: float) -> int:
    """The whole lots of ``step`` a displayed size holds (those whose size reads as at most it)."""
    return int(lots_allowed(s, step)) if s < _INF else 0


def size_of(q: float) -> Fraction:
    """An open size as the decimal it reads as (an exposure: a size that is no number is unbounded)."""
    return Fraction(Decimal(repr(q)))


def _valid_top(book: BookSnapshot) -> bool:
    if any(len(x) != 15 for x in (book.bid_px, book.bid_sz, book.ask_px, book.ask_sz)):
        return False
    b, a, bs, as_ = book.bid_px[0], book.ask_px[0], book.bid_sz[0], book.ask_sz[0]
    finite = all(isinstance(x, float) and math.isfinite(x) for x in (b, a, bs, as_))
    return finite and 0 < b < a and bs > 0 and as_ > 0


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


def _num(x: object) -> Fraction | None:
    return Fraction(x) if isinstance(x, float | int) and not isinstance(x, bool) and math.isfinite(x) else None


def breaches(
    limits: RiskLimits,
    st: RiskState,
    it: OrderIntent,
    book: BookSnapshot | None,
    now: int = NOW,
    step: float = CONTRACT.size_step,
    tick: float = CONTRACT.tick,
) -> list[str]:
    """What an accepted new order ``it`` would violate, decided exactly; [] when it is safe to send."""
    if it.intent != "new":
        return ["bad_order"]
    if book is None or not _valid_top(book):
        return ["no_valid_book"]
    side, otype, src = it.side, it.order_type, it.source
    n = lots_in(it.qty, step)
    if side not in ("buy", "sell") or otype not in ("limit", "market") or n is None:
        return ["bad_order"]
    if src not in ("quote", "kev", "flatten"):
        return ["bad_source"]
    if otype == "limit" and (lots_in(it.px, tick) is None):
        return ["bad_order"]  # a limit price is whole ticks
    out = []
    if st.kill_switch and not (it.reduce_only and src == "flatten"):
        out.append("kill_switch")
    age = it.advice_age_ns
    if src == "kev" and not (isinstance(age, int) and 0 <= age <= limits.max_advice_age_ns):
        out.append("stale_advice")
    ts = book.ts_recv
    if not (isinstance(ts, int) and isinstance(now, int) and 0 <= ts <= now and now - ts <= limits.stale_book_ns):
        out.append("stale_book")
    stepf = _step(step)
    if n > lots_allowed(limits.max_order_qty, step):
        out.append("order_size")
    sign = 1 if side == "buy" else -1
    pos = Fraction(st.position_units, 10**12)
    ob, os_ = st.open_buy_qty, st.open_sell_qty
    same_q = ob if side == "buy" else os_
    if not (isinstance(same_q, float | int) and 0 <= same_q < _INF):
        return out + ["unknown_resting"]  # nothing can be known of the worst case
    same = sign * size_of(float(same_q))
    order = sign * n * stepf
    worst = pos + same + order
    # reducing: the order with the resting orders on its side shrinks the position, never through zero
    reducing = pos != 0 and (same + order) * pos < 0 and abs(same + order) <= abs(pos)
    # unwinding: the order alone shrinks the position held, never through zero (resting orders were
    # judged when they were sent): the portfolio rules never refuse it, whatever the portfolio's state
    unwinding = pos != 0 and order * pos < 0 and abs(order) <= abs(pos)
    if it.reduce_only and not reducing:
        out.append("reduce_only")
    mid2 = read_prices(book.bid_px[0], book.ask_px[0])
    assert mid2 is not None
    mid = (mid2[0] + mid2[1]) / 2
    if not reducing and abs(worst) > lots_allowed(limits.max_position, step) * stepf:
        out.append("max_position")
    if not reducing and abs(worst) * mid > Fraction(limits.max_net_delta_usd) and limits.max_net_delta_usd < _INF:
        out.append("max_net_delta")
    if otype == "limit":
        pr = read_prices(it.px, book.bid_px[0], book.ask_px[0])
        assert pr is not None
        m = (pr[1] + pr[2]) / 2
        if limits.price_band_bps < _INF and abs(pr[0] - m) / m * 10_000 > Fraction(limits.price_band_bps):
            out.append("price_band")
    else:
        levels = []
        left = n
        for p, sz in _depth(book, side):
            take = min(left, level_lots(sz, step))
            if take > 0:
                levels.append((p, take))
                left -= take
            if left == 0:
                break
        cap = Fraction(limits.max_slippage_bps)
        oc = it.max_slippage_bps
        if oc is not None and not (isinstance(oc, float | int) and not math.isnan(oc)):
            oc = None
        if oc is not None:
            if oc == -_INF:
                cap = Fraction(-1)
            elif oc < _INF and Fraction(oc) < cap:
                cap = Fraction(oc)
        if left > 0:
            out.append("slippage")
        else:
            pr = read_prices(*[p for p, _ in levels], book.bid_px[0], book.ask_px[0])
            assert pr is not None
            m = (pr[-2] + pr[-1]) / 2
            avg = sum(pr[j] * q for j, (_, q) in enumerate(levels)) / n
            if abs(avg - m) / m * 10_000 > cap:
                out.append("slippage")
    recent = sum(1 for t in st.recent_order_ns if t > now - 1_000_000_000)
    if recent + 1 > limits.max_orders_per_s:
        out.append("order_rate")
    cash = Fraction(st.cash_units, 10**12)
    pnl = cash + pos * mid
    if not reducing and not (limits.daily_loss_stop_usd == _INF or pnl > -Fraction(limits.daily_loss_stop_usd)):
        out.append("loss_stop")
    od, og, op = _num(st.others_delta_usd), _num(st.others_gross_usd), _num(st.others_pnl_usd)
    pf_d = limits.portfolio_max_net_delta_usd
    if unwinding:
        pass  # an unwinding leg is never refused by a portfolio rule
    elif od is None:
        out.append("portfolio_net_delta")
    else:
        after, before = worst * mid + od, pos * mid + od
        if not ((pf_d == _INF or abs(after) <= Fraction(pf_d)) or abs(after) < abs(before)):
            out.append("portfolio_net_delta")
    pf_g = limits.portfolio_max_gross_usd
    if not unwinding and (og is None or og < 0 or (pf_g < _INF and abs(worst) * mid + og > Fraction(pf_g))):
        out.append("portfolio_gross")
    pf_l = limits.portfolio_loss_stop_usd
    if not unwinding and (op is None or (pf_l < _INF and not pnl + op > -Fraction(pf_l))):
        out.append("portfolio_loss_stop")
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
        elif k == 7:  # prices off the tick grid (a quarter tick), or with no short decimal at all
            f = float(rng.choice([0.25, 0.75, 1 / 3]))
            arr = bid_px if rng.random() < 0.5 else ask_px
            for j in range(15):
                arr[j] = arr[j] + (f if arr is ask_px else -f) * tick
        else:
            pass
    ts = NOW - int(rng.choice([0, 1_000_000, 2_500_000_000]))
    r = rng.random()
    if r < 0.03:  # a missing or absurd time: NaT, the far future, past int64
        ts = int(rng.choice([-(2**63), -1, NOW + 3_600_000_000_000, 2**63 - 1, 2**64, -(2**70)]))
    book = book_of(bid_px, bid_sz, ask_px, ask_sz, ts)
    if rng.random() < 0.03:  # a short book: fewer than 15 levels a side
        m = int(rng.randrange(0, 15))
        book = BookSnapshot(
            ts_event=0,
            ts_recv=ts,
            seq=1,
            symbol="BTCUSDT",
            exch_seq=1,
            bid_px=tuple(bid_px[:m]),
            bid_sz=tuple(bid_sz[:m]),
            ask_px=tuple(ask_px[: int(rng.randrange(m, 16))]),
            ask_sz=tuple(ask_sz[:m]),
        )
    return book


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
    position = rng.randrange(-120, 121) * lot
    if rng.random() < 0.1:  # between whole lots (0.0494, 0.0005): no rounding may favour the order
        position += int(rng.choice([1, lot // 2, lot - 1, 4 * lot // 10, -(lot // 2)]))
    return RiskState(
        position_units=position,
        open_buy_qty=float(rng.choice([0, 0, 0.002, 0.02, 0.1, 0.0015, 0.01])),
        open_sell_qty=float(rng.choice([0, 0, 0.002, 0.02, 0.1, 0.0015, 0.01])),
        cash_units=rng.choice([0, 5, -50, -100, -1_000_000, 5_000, -5_000, 10**13]) * 10**12,
        recent_order_ns=tuple(
            sorted(NOW - rng.randrange(0, 2_000_000_000) for _ in range(rng.randrange(12)))
        ),
        kill_switch=bool(rng.random() < 0.05),
        # the other instruments of a portfolio (a NaN: one without a mark holds a position)
        others_delta_usd=float(rng.choice([0.0, 0.0, 2_000.0, -5_500.0, 9_000.0, math.nan])),
        others_gross_usd=float(rng.choice([0.0, 0.0, 4_000.0, 8_900.0, -3_000.0, math.nan])),
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
    deep = all(len(x) == 15 for x in (book.bid_px, book.bid_sz, book.ask_px, book.ask_sz))
    quotes = desired_quotes(
        QUOTES,
        CONTRACT,
        book,
        label=label,
        position=st.position,
        target=target,
        max_position=LIMITS.max_position,
    ) if deep else []  # the strategy is handed full books only; the gateway is tried on short ones
    for q in quotes:
        out.append(_intent(q.side, "limit", q.px, q.qty))
    mid = (book.bid_px[0] + book.ask_px[0]) / 2 if book.bid_px and book.ask_px else 100.0
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
            source=str(rng.choice(["quote"] * 6 + ["kev", "flatten", "cancel", "QUOTE", ""])),
            advice_age_ns=int(rng.choice([-1, 0, 1_000_000, 2**63, -(2**64)])),
        )
    )
    # against the position: a flip through zero, or flattening beside resting orders of its side
    p = st.position
    if p != 0.0:
        side = "sell" if p > 0 else "buy"
        lots_now = abs(st.position_units) // 10**9
        k = int(rng.choice([max(lots_now, 1), lots_now + 1, 2 * lots_now - 1, lots_now - 1, 1, 20]))
        qty = CONTRACT.round_qty(max(k, 1) / 1000)
        flat = rng.random() < 0.5
        out.append(
            _intent(
                side,
                str(rng.choice(["limit", "market"])),
                float(rng.choice([book.bid_px[0], book.ask_px[0]])) if deep else mid,
                qty,
                reduce_only=flat,
                source="flatten" if flat else "quote",
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
    families: Counter[str] = field(default_factory=Counter)  # intents of each hostile family: "seen", "accepted"
    examples: list[tuple[Any, ...]] = field(default_factory=list)


def gen_cases(seed: int, n: int) -> Iterator[tuple[RiskState, list[OrderIntent], BookSnapshot]]:
    """``n`` cases (a state, what the engine and an adversary would send, a book) from ``seed``."""
    rng = random.Random(seed)
    for _ in range(n):
        book = gen_book(rng)
        st = gen_state(rng)
        yield st, intents_for(rng, book, st, gen_command(rng)), book


def families(st: RiskState, it: OrderIntent, book: BookSnapshot) -> list[str]:
    """The hostile families an intent belongs to, for the fuzz's coverage table."""
    out = []
    p = st.position_units
    q = it.qty if isinstance(it.qty, float) and math.isfinite(it.qty) else 0.0
    signed = q if it.side == "buy" else -q
    if p != 0 and (p / 1e12 + signed) * p < 0:
        out.append("flip through zero")
    same = st.open_buy_qty if it.side == "buy" else st.open_sell_qty
    if p != 0 and signed * p < 0 and same > 0:
        out.append("against the position, resting orders on its side")
    if p % 10**9:
        out.append("position between lots")
    if any(len(x) != 15 for x in (book.bid_px, book.bid_sz, book.ask_px, book.ask_sz)):
        out.append("short book")
    if not (0 <= book.ts_recv <= NOW):
        out.append("book time missing or absurd")
    if it.source not in ("quote", "kev", "flatten"):
        out.append("unknown source")
    elif it.source == "kev" and not 0 <= it.advice_age_ns < 2**63:
        out.append("Kev order with no or absurd advice age")
    return out


# the limits cases take turns with: the defaults (portfolio bound), a size limit just under a whole
# number of lots, a fractional order rate, tight and odd limits
LIMIT_SETS = (
    LIMITS,
    replace(LIMITS, max_order_qty=0.0199999999999, max_position=0.0499999999, max_orders_per_s=2.5),
    replace(LIMITS, max_net_delta_usd=1_000.05, price_band_bps=7.3, max_slippage_bps=0.5, daily_loss_stop_usd=0.01),
    replace(LIMITS, max_position=0.013, portfolio_max_net_delta_usd=100.0, portfolio_loss_stop_usd=1e-6),
)


def run_fuzz(seed: int, n: int, stats: FuzzStats | None = None) -> FuzzStats:
    """``n`` cases from ``seed``; every accepted intent is audited by :func:`breaches`."""
    s = stats or FuzzStats()
    for i, (st, its, book) in enumerate(gen_cases(seed, n)):
        limits = LIMIT_SETS[i % len(LIMIT_SETS)]
        for it in its:
            ok, reason = check(limits, st, it, book, NOW)
            s.intents += 1
            s.reasons[reason] += 1
            for fam in families(st, it, book):
                s.families[f"{fam} seen"] += 1
                s.families[f"{fam} accepted"] += ok
            if ok:
                s.accepted += 1
                bad = breaches(limits, st, it, book)
                for b in bad:
                    s.breaches[b] += 1
                if bad and len(s.examples) < 5:
                    s.examples.append((bad, st, it, book))
        s.cases += 1
    return s
