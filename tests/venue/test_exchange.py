"""The simulated venue (``venue/kernel.py`` over :class:`SimExchange`'s arrays): what it reports for
orders, books and trades, and the bookkeeping it keeps (fills never exceed an order, the position is
the fills' sum, the resting list is what was acknowledged and not finished, in arrival order)."""

import json
import random

from engine.clock import ReplayClock
from engine.events import Trade
from engine.latency.models import ConstantLatency
from engine.risk import OrderIntent
from replay import kernel as K
from tests.helpers import as_plain_python, make_book
from venue.exchange import SimExchange
from venue.fills import FILL_MODELS

REASONS = {K.R_FILLED: "filled", K.R_IOC: "ioc_remainder_expired"}


def _trade(px, sz, side):
    return Trade(ts_event=1, ts_recv=1, seq=0, symbol="BTCUSDT", trade_id="t", px=px, sz=sz, side=side)


class _Sink:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a: self.calls.append((name, *a))


class _Sim:
    """SimExchange with no latency: each report reaches the sink as soon as the clock runs."""

    def __init__(self, model):
        self.clock = ReplayClock(0)
        zero = ConstantLatency(0)
        self.ex = SimExchange(
            self.clock,
            fill_model=FILL_MODELS[model](),
            entry_latency=zero,
            response_latency=zero,
            size_step=0.001,
            tick=0.1,
        )
        self.ex.engine = _Sink()

    def book(self, b):
        self.ex.on_book(b)
        self.clock.run_all()

    def trade(self, t):
        self.ex.on_trade(t)
        self.clock.run_all()

    def order(self, oid, side, px, qty):
        o = OrderIntent(
            client_oid=f"o{oid}",
            symbol="BTCUSDT",
            intent="new",
            side=side,
            order_type="limit",
            px=px,
            qty=qty,
        )
        self.ex.submit(o, self.clock.now_ns())
        self.clock.run_all()

    def reports(self):
        out = []
        for name, oid, *rest in self.ex.engine.calls:
            if name == "on_fill":
                out.append(("fill", int(oid[1:]), repr(float(rest[0])), repr(float(rest[1])), rest[2]))
            elif name == "on_done":
                out.append(("done", int(oid[1:]), rest[0]))
            else:
                out.append((name[3:], int(oid[1:])))
        return out

    def state(self):
        """Per resting order, in arrival order: (oid, filled, ahead, level, traded)."""
        out = []
        for st in self.ex.resting_orders():
            values = (st["filled"], st["ahead"], st["level_qty"], st["traded_at_px"])
            out.append((int(st["client_oid"][1:]), *(repr(float(x)) for x in values)))
        return out


def _book(rng, mid):
    b = make_book(mid, round(mid + 0.1, 10), levels=rng.choice([15, 4]))
    sizes = tuple(round(rng.uniform(0.0, 2.0), 3) for _ in range(15))
    return b.__class__(**{**{f: getattr(b, f) for f in b.__slots__}, "bid_sz": sizes, "ask_sz": sizes[::-1]})


def _steps(model, steps):
    """``steps`` (("book", b) / ("trade", t) / ("order", oid, side, px, qty)) through SimExchange: per
    step, (the reports it made, its resting orders' state after it), and the venue's position at the end."""
    venue = _Sim(model)
    per_step, made = [], 0
    for kind, *args in steps:
        getattr(venue, kind)(*args)
        reports = venue.reports()
        per_step.append((reports[made:], venue.state()))
        made = len(reports)
    return per_step, venue.ex.position


def _random_steps(seed):
    """Books, trades and new orders at a few prices around a wandering mid: several orders rest at once,
    trades at and through their prices fill them in part."""
    rng = random.Random(seed)
    mid = 100.0
    steps = [("book", _book(rng, mid))]
    oid = 0
    for _ in range(160):
        r = rng.random()
        if r < 0.3:
            mid = round(mid + 0.1 * rng.randint(-1, 1), 10)
            steps.append(("book", _book(rng, mid)))
        elif r < 0.75:
            px = round(mid + 0.1 * rng.randint(-2, 3), 10)
            steps.append(
                ("trade", _trade(px, rng.choice([0.05, 0.3, 0.7, 2.0]), rng.choice(["buy", "sell"])))
            )
        elif oid < 60:
            side = rng.choice(["buy", "sell"])
            away = rng.randint(0, 2)
            px = round(mid - 0.1 * away if side == "buy" else mid + 0.1 + 0.1 * away, 10)
            steps.append(("order", oid, side, px, rng.choice([0.1, 0.3, 0.45, 1.2])))
            oid += 1
    return steps


def _scenario():
    """Every fill model on seeded random steps: what the venue reported and held (as JSON reads it
    back), and the orders sent."""
    steps = _random_steps(7)
    orders = {s[1]: (s[2], s[4]) for s in steps if s[0] == "order"}
    runs = {model: _steps(model, steps) for model in sorted(FILL_MODELS)}
    return json.loads(json.dumps({"orders": orders, "runs": runs}))


def test_one_trade_is_shared_in_arrival_order_and_partly_fills_the_last_order_it_reaches():
    b = make_book(100.0, 100.1, size=1.0)
    steps = [
        ("book", b),
        ("order", 0, "buy", 99.9, 0.3),
        ("order", 1, "buy", 99.9, 0.2),
        ("order", 2, "buy", 99.9, 0.4),
        ("order", 3, "sell", 100.2, 0.5),
        # through all three bids: 0.3 and 0.2 fill in full, the last gets what is left of 0.6 (0.1,
        # rounded to 12 digits from 0.6 - 0.3 - 0.2); the sell is on the aggressor's side: nothing
        ("trade", _trade(99.8, 0.6, "sell")),
        ("trade", _trade(100.2, 0.2, "buy")),  # at the sell's price, 1.0 displayed ahead of it: nothing
        ("trade", _trade(100.2, 1.1, "buy")),  # eats the 0.8 still ahead, then 0.3 of ours
        ("book", make_book(99.8, 99.85, size=1.0)),  # the ask fell through the bid: order 2's 0.3 fills
    ]
    sim, _ = _steps("queue_power2", steps)
    made = [[(r[0], r[1], float(r[3])) if r[0] == "fill" else r[:2] for r in reps] for reps, _ in sim[5:]]
    assert made == [
        [("fill", 0, 0.3), ("done", 0), ("fill", 1, 0.2), ("done", 1), ("fill", 2, 0.1)],
        [],
        [("fill", 3, 0.3)],
        [("fill", 2, 0.3), ("done", 2)],
    ]
    assert [s[:2] for s in sim[-1][1]] == [(3, "0.3")]  # the sell rests on, 0.2 to go


def test_every_model_keeps_its_books_straight_on_random_steps():
    """Per model: no order fills beyond its size; an order is done exactly when it filled in full; the
    venue's position is the signed sum of the fills; after each step the resting orders are those
    acknowledged and not done, in arrival order, each with what it has filled so far."""
    sc = _scenario()
    orders = {int(k): v for k, v in sc["orders"].items()}
    for model, (per_step, position) in sc["runs"].items():
        filled = dict.fromkeys(orders, 0.0)
        acked, done = [], set()
        signed = 0.0
        for reps, resting in per_step:
            for r in reps:
                if r[0] == "ack":
                    acked.append(r[1])
                elif r[0] == "fill":
                    q = float(r[3])
                    filled[r[1]] += q
                    signed += q if orders[r[1]][0] == "buy" else -q
                    assert filled[r[1]] <= orders[r[1]][1] + 1e-9, (model, r)
                elif r[0] == "done":
                    assert r[2] == "filled" and abs(filled[r[1]] - orders[r[1]][1]) < 1e-9, (model, r)
                    done.add(r[1])
            assert [st[0] for st in resting] == [o for o in acked if o not in done], model
            assert all(abs(float(st[1]) - filled[st[0]]) < 1e-9 for st in resting), model
        assert abs(position - signed) < 1e-9, model
        assert done and len(acked) > len(done), model  # some orders filled in full, some rest on
    # the steps do what the test is for: one trade filling several resting orders, the last in part
    shared = 0
    for reps, _ in sc["runs"]["queue_power2"][0]:
        fills = [r for r in reps if r[0] == "fill" and r[4] == "maker"]
        finished = {r[1] for r in reps if r[0] == "done"}
        shared += len(fills) >= 2 and fills[-1][1] not in finished
    assert shared >= 2


def test_the_loops_read_as_plain_python_give_the_compiled_reports():
    assert as_plain_python("venue.matching.trade_fills", "tests.venue.test_exchange._scenario") == _scenario()
