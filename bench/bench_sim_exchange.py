"""The simulated exchange driven one event at a time (``venue.exchange.SimExchange``: the per-event
replay, paper live, the local Bitget exchange), against a peer given as a git revision of the same file.

    .venv/bin/python bench/bench_sim_exchange.py --peer 6443394 -n 200000 --repeat 5

Both run the same seeded event stream: books (a wandering mid), public trades at and through the
touch, limit orders placed a few ticks away and cancelled later, and now and then a marketable one;
a few orders rest most of the time, as under the baseline strategy. Reports go to a sink that counts
them. The two alternate, one warm-up each first; each figure is the median of the warm runs. Both must
report the same calls (else the script stops): the peer is an older venue, not another workload.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peer import module_at  # noqa: E402

from engine.clock import ReplayClock  # noqa: E402
from engine.events import BookSnapshot, Trade  # noqa: E402
from engine.latency.models import ConstantLatency  # noqa: E402
from engine.risk import OrderIntent  # noqa: E402
from venue.fills import FILL_MODELS  # noqa: E402


class _Sink:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def _add(self, *a):
        self.calls.append(a)

    def on_ack(self, oid, ts):
        self._add("ack", oid, ts)

    def on_reject(self, oid, reason, ts):
        self._add("reject", oid, reason, ts)

    def on_cancel_ack(self, oid, ts):
        self._add("cancel_ack", oid, ts)

    def on_done(self, oid, reason, ts):
        self._add("done", oid, reason, ts)

    def on_fill(self, oid, px, qty, liq, ts):
        self._add("fill", oid, px, qty, liq, ts)


def _book(ts: int, mid: float, rng: random.Random) -> BookSnapshot:
    bid = round(mid, 1)
    ask = round(bid + 0.1, 1)
    sizes = tuple(round(rng.uniform(0.1, 2.0), 3) for _ in range(15))
    return BookSnapshot(
        ts_event=ts,
        ts_recv=ts,
        seq=ts,
        symbol="BTCUSDT",
        exch_seq=ts,
        bid_px=tuple(round(bid - 0.1 * i, 1) for i in range(15)),
        bid_sz=sizes,
        ask_px=tuple(round(ask + 0.1 * i, 1) for i in range(15)),
        ask_sz=sizes[::-1],
    )


def _events(n: int, seed: int = 7) -> list[tuple]:
    rng = random.Random(seed)
    mid, out, oid, live = 100.0, [], 0, []
    for i in range(n):
        ts = (i + 1) * 1_000_000
        mid += 0.1 * rng.choice((-1, 0, 0, 1))
        out.append(("book", _book(ts, mid, rng)))
        if rng.random() < 0.5:
            side = rng.choice(("buy", "sell"))
            px = round(mid + (-0.1 if side == "sell" else 0.2) * rng.randint(0, 2), 1)
            sz = rng.choice((0.05, 0.4, 1.5))
            out.append(
                (
                    "trade",
                    Trade(
                        ts_event=ts,
                        ts_recv=ts,
                        seq=ts,
                        symbol="BTCUSDT",
                        trade_id="t",
                        px=px,
                        sz=sz,
                        side=side,
                    ),
                )
            )
        r = rng.random()
        if r < 0.04 or not live:
            side = rng.choice(("buy", "sell"))
            market = r < 0.004
            px = math.nan if market else round(mid + (-0.1 if side == "buy" else 0.2) * rng.randint(0, 3), 1)
            oid += 1
            o = OrderIntent(
                client_oid=f"o{oid}",
                symbol="BTCUSDT",
                intent="new",
                side=side,
                order_type="market" if market else "limit",
                px=px,
                qty=0.3,
            )
            out.append(("submit", o, ts))
            live.append(o.client_oid)
        elif r < 0.07:
            out.append(("cancel", live.pop(0), ts))
    return out


def _load(rev: str):
    return module_at(rev, "venue/exchange.py").SimExchange


def _run(cls, events) -> tuple[float, list]:
    clock = ReplayClock(0)
    lat = ConstantLatency(300_000)
    ex = cls(clock, fill_model=FILL_MODELS["queue_power2"](), entry_latency=lat, response_latency=lat)
    ex.engine = sink = _Sink()
    t0 = time.perf_counter()
    for kind, a, *b in events:
        if kind == "book":
            clock.run_before(a.ts_event, 0)
            ex.on_book(a)
        elif kind == "trade":
            ex.on_trade(a)
        elif kind == "submit":
            ex.submit(a, b[0])
        else:
            ex.cancel(a, "BTCUSDT", b[0])
    clock.run_all()
    return time.perf_counter() - t0, sink.calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", required=True, help="git revision whose venue/exchange.py is the peer")
    ap.add_argument("-n", type=int, default=200_000, help="books (with trades and orders among them)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from venue.exchange import SimExchange

    peer = _load(args.peer)
    events = _events(args.n)
    runs = {"this tree": SimExchange, f"peer {args.peer}": peer}
    times: dict[str, list[float]] = {k: [] for k in runs}
    calls = {}
    for k, cls in runs.items():  # warm-up (compiles)
        _, calls[k] = _run(cls, events)
    a, b = calls.values()
    if a != b:
        sys.exit("the two venues reported different calls: not the same workload")
    print(f"{args.n} books, {len(events)} events, {len(a)} reports; queue_power2, 0.3 ms latencies")
    for i in range(args.repeat):
        for k, cls in runs.items():
            dt, _ = _run(cls, events)
            times[k].append(dt)
            print(f"  run {i + 1} {k:>16}: {dt:.2f} s", flush=True)
    print("\n| venue | median warm s | events/s |")
    print("|---|---|---|")
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"| {k} | {m:.2f} | {len(events) / m:,.0f} |")


if __name__ == "__main__":
    main()
