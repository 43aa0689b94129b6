"""Deterministic Bitget v2 market simulator for USDT-M perpetuals: ``books15`` and ``trade`` pushes.

Same seed, same bytes: every draw comes from ``numpy.random.default_rng([seed, component])``, one
stream per component, nothing reads the wall clock. Prices are integer ticks of 0.1 and sizes
integer lots of 0.001 internally (in a multi-symbol session, each contract's tick and size step);
they become exchange strings (``"90000.1"``, ``"0.250"``) only on the wire, through
:func:`wire.bitget.bitget_v2.encode_books15` / ``encode_trades``.

Model (exchange time, in chunks of 10 s on a 10 ms grid):

- **Latent state.** A two-state Markov regime (calm / bursty); an order-flow signal ``s`` (an
  Ornstein-Uhlenbeck process, stationary sd 1); a fair price ``f`` that diffuses with the regime's
  volatility, drifts with ``s`` and takes the permanent impact of trades and sweeps.
- **Flow.** Small taker orders arrive as a self-exciting (Hawkes-like) process whose base rate
  depends on the regime; their side leans with ``s``. Rare sweeps: blocks that walk several displayed
  levels, and liquidation-style orders that walk ~10 bps through the book (EMERGENCY-size moves);
  both excite the flow, widen the spread and often switch the regime to bursty.
- **Book.** Persistent levels (tick, a per-level lognormal size factor that wanders, quantity taken
  by trades that refills over time). Sizes are lognormal with a depth profile and tilted by ``s``
  (bids heavier when ``s > 0``), so displayed imbalance leads the mid. Makers keep ``f`` inside the
  spread: levels ``f`` has passed are lifted/hit by takers (trades) or cancelled, gaps are refilled
  towards a target spread that widens in bursts. Takers walk the same levels, so every trade is at
  the touch of the book as it stood, and a sweep prints one fill per level it consumed.
- **Wire.** A ``books15`` snapshot every 100-200 ms (jittered, median ~150 ms) with a rising ``seq``;
  a ``trade`` push per matching millisecond, newest first, rising ``tradeId``; the first trade push
  is a ``snapshot`` of recent trades (from a warm-up before ``start_ms``), then ``update``\\ s. Each
  push gets a receive time: push ts + lognormal feed latency, first in first out (one connection).
- **Several symbols** (:class:`MultiSim`): the first one leads; each other one's fair price follows
  it on a cointegrating relation, ``log F = alpha + beta * log L + spread``, the spread mean-reverting
  (Ornstein-Uhlenbeck) with regime changes of ``beta`` and of the spread's mean (:class:`PairConfig`).
  Every symbol has its own order flow, book and wire on its own contract (:data:`INSTRUMENTS`), and
  its own random streams. The true parameters go into the session's manifest.

The parts live by job: the parameters, random streams and latent processes in ``venue/sim_model.py``,
the book in ``venue/sim_book.py``, the contracts and their wire strings in ``venue/sim_contracts.py``,
a follower's price in ``venue/sim_pair.py``; this module runs them per symbol and writes the frames.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.bounds import check_seed
from engine.errors import DualhubError
from engine.store import SessionWriter
from venue.sim_book import (
    _Market,
)
from venue.sim_contracts import (
    _DEFAULT_UNITS,
    _SYMBOL_RE,
    INSTRUMENTS,
    Instrument,
    _instrument_config,
    _trade_rows,
    _Units,
)
from venue.sim_model import (
    _BURSTY,
    _CALM,
    _RNG_BOOK,
    _RNG_FEED,
    _RNG_FLOW,
    _RNG_LATENT,
    _RNG_PAIR,
    _RNG_SPREAD,
    _RNG_WIRE,
    CHUNK_STEPS,
    DEFAULT_START_MS,
    GRID_MS,
    PairConfig,  # noqa: F401 - read as venue.simulator's too (MultiSim's pair)
    SimConfig,
    _Latent,
    _latent_chunk,
    _rng,
    _Tape,
)
from venue.sim_pair import (
    _Pair,
)
from wire.bitget.bitget_v2 import MS, Control, StreamCounters, decode, encode_books15, encode_trades

# ---------------------------------------------------------------- one symbol's frames


# A frame before receive times: (push_ms, event_ms, kind, gen, raw). kind 0 trade, 1 book.
_Frame = tuple[int, int, int, int, bytes]


class _SymbolSim:
    """One symbol's market and wire, a 10 s chunk at a time (:meth:`chunks`).

    ``index`` 0 draws from ``[seed, component]`` (a single-symbol session's streams), symbol ``k`` of
    a multi-symbol session from ``[seed, component, k]``. A leader (``record_path``) keeps its fair
    price at the start of each grid step of the last chunk in :attr:`path`; a follower (``pair``) reads
    the leader's from :attr:`leader` before each chunk.
    """

    def __init__(
        self,
        symbol: str,
        cfg: SimConfig,
        *,
        seed: int,
        index: int,
        start_ms: int,
        end_ms: int,
        units: _Units,
        pair: _Pair | None = None,
        record_path: bool = False,
    ) -> None:
        self.symbol, self.cfg, self.seed, self.index = symbol, cfg, seed, index
        self.start_ms, self.end_ms, self.units = start_ms, end_ms, units
        self.pair = pair
        self.record_path = record_path
        self.path: list[float] = []
        self.leader: list[float] = []

    def chunks(self) -> Iterator[list[tuple[int, bytes]]]:
        """Per chunk, the (ts_recv_ns, raw) of the frames whose receive time is now known."""
        cfg, symbol, seed, k, units = self.cfg, self.symbol, self.seed, self.index, self.units
        start_ms, end_ms, pair = self.start_ms, self.end_ms, self.pair
        t0 = start_ms - cfg.warmup_ms
        latent_rng = _rng(seed, _RNG_LATENT, k)
        flow = _rng(seed, _RNG_FLOW, k)
        wire = _Tape(_rng(seed, _RNG_WIRE, k))
        feed = _Tape(_rng(seed, _RNG_FEED, k))
        book_tape = _Tape(_rng(seed, _RNG_BOOK, k))
        fair0 = cfg.initial_mid_px * units.ticks_per_px
        latent = _Latent(regime=_CALM, s=0.0, excite=0.0, stress=0.0, fair=fair0)
        mkt = _Market(
            cfg,
            book_tape,
            fair0,
            first_trade_id=1_390_000_000_000_000_000 + int(wire.u() * 1e15),
            first_seq=400_000_000_000 + int(wire.u() * 1e10),
        )
        recent: deque[tuple[int, int, int, bool, int]] = deque(maxlen=cfg.trade_snapshot_len)
        subscribed = False
        frames: list[_Frame] = []  # waiting for their receive time
        gen = 0
        last_trade_push = 0
        recv_ns = 0
        lat_mu = math.log(cfg.feed_latency_median_ms * MS)
        book_lo, book_hi = cfg.book_interval_ms
        next_book = t0 + book_lo
        last_book = t0
        group: list[tuple[int, int, int, bool, int]] = []
        gain, sgain = cfg.flow_side_gain, cfg.sweep_side_gain
        px, sz = units.px, units.sz
        # A follower's own impact fades (PairConfig.own_tau_s): the pair stays cointegrated.
        impact_decay_per_ms = 1.0 / (1000.0 * pair.pc.own_tau_s) if pair is not None else 0.0
        last_ms = t0

        def trade_frame(fills: list[tuple[int, int, int, bool, int]], action: str, push_ms: int) -> None:
            nonlocal gen
            raw = encode_trades(symbol, _trade_rows(fills, units), push_ts_ms=push_ms, action=action)
            frames.append((push_ms, fills[-1][0], 0, gen, raw))
            gen += 1

        def flush_group() -> None:
            nonlocal subscribed, last_trade_push
            if not group:
                return
            ms = group[0][0]
            push = max(last_trade_push, ms + int(wire.u() * (cfg.trade_push_delay_ms + 1)))
            last_trade_push = push
            trade_frame(group, "update" if subscribed else "snapshot", push)
            subscribed = True
            group.clear()

        chunk_start = t0
        done = False
        while not done:
            ch = _latent_chunk(cfg, latent_rng, latent, CHUNK_STEPS)
            base = ch.fair if pair is None else pair.chunk(chunk_start, ch, self.leader)
            impact_at = [0.0] * CHUNK_STEPS if self.record_path else None
            filled = 0
            chunk_end = chunk_start + CHUNK_STEPS * GRID_MS
            # Small taker orders: time within the grid step, side, size.
            counts = np.asarray(ch.trades, dtype=np.int64)
            steps = np.repeat(np.arange(CHUNK_STEPS, dtype=np.int64), counts)
            m = steps.size
            t_ms = chunk_start + steps * GRID_MS + flow.integers(0, GRID_MS, m)
            p_buy = 1.0 / (1.0 + np.exp(-gain * np.asarray(ch.s)[steps]))
            t_buy = (flow.random(m) < p_buy).tolist()
            t_lots = np.clip(
                np.rint(cfg.trade_median_lots * np.exp(cfg.trade_size_sigma * flow.standard_normal(m))),
                1,
                cfg.trade_max_lots,
            ).astype(np.int64)
            # Sweeps: time, side, kind and size.
            sw = np.asarray(ch.sweeps, dtype=np.int64)
            n_sw = sw.size
            sw_ms = chunk_start + sw * GRID_MS + flow.integers(0, GRID_MS, n_sw)
            sw_buy = (flow.random(n_sw) < 1.0 / (1.0 + np.exp(-sgain * np.asarray(ch.s)[sw]))).tolist()
            sw_liq = (flow.random(n_sw) < cfg.liquidation_share).tolist()
            sw_move = np.rint(
                cfg.liquidation_median_ticks * np.exp(cfg.liquidation_sigma * flow.standard_normal(n_sw))
            ).astype(np.int64)
            sw_levels = 1 + flow.geometric(cfg.block_levels_p, n_sw)
            sw_frac = flow.random(n_sw).tolist()
            # Book snapshot times.
            b_ms = []
            while next_book < chunk_end:
                b_ms.append(next_book)
                span = book_hi - book_lo + 1
                next_book += book_lo + int((wire.u() + wire.u()) * 0.5 * span)
            # All events of the chunk in time order; at equal ms trades, then sweeps, then the snapshot.
            ev_ms = np.concatenate([t_ms, sw_ms, np.asarray(b_ms, dtype=np.int64)])
            ev_kind = np.concatenate(
                [np.zeros(m, np.int64), np.ones(n_sw, np.int64), np.full(len(b_ms), 2, np.int64)]
            )
            ev_idx = np.concatenate([np.arange(m), np.arange(n_sw), np.arange(len(b_ms))]).astype(np.int64)
            order = np.lexsort((ev_idx, ev_kind, ev_ms))
            ev_ms_l, ev_kind_l, ev_idx_l = (
                ev_ms[order].tolist(),
                ev_kind[order].tolist(),
                ev_idx[order].tolist(),
            )
            t_lots_l, sw_move_l, sw_levels_l = t_lots.tolist(), sw_move.tolist(), sw_levels.tolist()

            for ms, kind, idx in zip(ev_ms_l, ev_kind_l, ev_idx_l, strict=True):
                if ms >= end_ms:
                    done = True
                    break
                if not subscribed and ms >= start_ms:
                    if recent:
                        trade_frame(list(recent), "snapshot", start_ms)
                        subscribed = True
                        last_trade_push = start_ms
                j = (ms - chunk_start) // GRID_MS
                if impact_at is not None and filled <= j:
                    impact_at[filled : j + 1] = [mkt.impact] * (j + 1 - filled)
                    filled = j + 1
                if impact_decay_per_ms:
                    mkt.impact *= math.exp(-impact_decay_per_ms * (ms - last_ms))
                    last_ms = ms
                fair = base[j] + mkt.impact
                bursty = ch.regime[j] == _BURSTY
                spread = 1 + int(cfg.spread_base[ch.regime[j]] + ch.stress[j] + book_tape.u())
                mkt.s = ch.s[j]
                mkt.sync(ms, fair, spread, bursty)
                if kind == 0:
                    buy = t_buy[idx]
                    emptied, _ = mkt.take(buy, t_lots_l[idx], ms)
                    d = 1.0 if buy else -1.0
                    mkt.impact += d * (cfg.trade_impact_ticks + cfg.level_impact_ticks * emptied)
                elif kind == 1:
                    buy = sw_buy[idx]
                    if sw_liq[idx]:
                        last = mkt.sweep_to(buy, sw_move_l[idx], ms)
                    else:
                        last = mkt.sweep_levels(buy, sw_levels_l[idx], sw_frac[idx], ms)
                    mkt.impact = last - base[j]  # the fair price moves to where the sweep stopped
                else:
                    bids, asks = mkt.snapshot(ms - last_book)
                    last_book = ms
                    if ms >= start_ms:
                        push = ms + int(wire.u() * (cfg.book_push_delay_ms + 1))
                        raw = encode_books15(
                            symbol,
                            ts_ms=ms,
                            seq=mkt.seq,
                            bids=[(px(t), sz(q)) for t, q in bids],
                            asks=[(px(t), sz(q)) for t, q in asks],
                            push_ts_ms=push,
                        )
                        frames.append((push, ms, 1, gen, raw))
                        gen += 1
                if mkt.fills:
                    new, mkt.fills = mkt.fills, []
                    if ms < start_ms:
                        recent.extend(new)
                    else:
                        if group and group[0][0] != ms:
                            flush_group()
                        group.extend(new)
            flush_group()  # a matching millisecond never spans two chunks
            if impact_at is not None:
                impact_at[filled:] = [mkt.impact] * (CHUNK_STEPS - filled)
                self.path = [f + i for f, i in zip(ch.fair, impact_at, strict=True)]
            chunk_start = chunk_end

            # Frames pushed before chunk_end can no longer be overtaken: give them receive times.
            frames.sort(key=lambda f: f[:4])
            cut = (
                len(frames)
                if done
                else next((i for i, f in enumerate(frames) if f[0] >= chunk_end), len(frames))
            )
            out = []
            for push_ms, _, _, _, raw in frames[:cut]:
                lat_ns = int(math.exp(lat_mu + cfg.feed_latency_sigma * feed.n()))
                recv_ns = max(recv_ns, push_ms * MS + lat_ns)
                out.append((recv_ns, raw))
            del frames[:cut]
            yield out


def _end_ms(start_ms: int, minutes: float) -> int:
    if not (minutes > 0 and math.isfinite(minutes)):
        raise ValueError(f"minutes must be a finite number > 0, got {minutes}")
    return start_ms + round(minutes * 60_000)


def generate_frames(
    *,
    symbol: str = "BTCUSDT",
    minutes: float = 10.0,
    seed: int = 7,
    start_ms: int = DEFAULT_START_MS,
    config: SimConfig | None = None,
) -> Iterator[tuple[int, bytes]]:
    """(ts_recv_ns, raw frame bytes) of one symbol, in receive order.

    Covers exchange time ``[start_ms, start_ms + minutes)``; the model runs ``config.warmup_ms``
    earlier so the first trade push can be the snapshot of recent trades Bitget sends after
    subscribing. Generated lazily in 10 s chunks (memory stays flat for long sessions), and a
    shorter session's frames are a prefix of a longer one's with the same seed and ``start_ms``.
    ``config`` (default :class:`SimConfig`) holds the model parameters, whose tick (0.1) and size step
    (0.001) hold whatever ``symbol`` is called. Several symbols, each on its own contract: :class:`MultiSim`.
    """
    cfg = config or SimConfig()
    end_ms = _end_ms(start_ms, minutes)
    sim = _SymbolSim(symbol, cfg, seed=seed, index=0, start_ms=start_ms, end_ms=end_ms, units=_DEFAULT_UNITS)
    for out in sim.chunks():
        yield from out


def check_symbols(
    symbols: Sequence[str], instruments: Mapping[str, Instrument] | None = None
) -> tuple[str, ...]:
    """The symbols of a simulated session, or a one-line :class:`DualhubError`: upper-case names, no
    repeats, and, for more than one, each a contract of ``instruments`` (default :data:`INSTRUMENTS`)."""
    syms = tuple(symbols)
    if not syms:
        raise DualhubError("no symbols given")
    for s in syms:
        if not isinstance(s, str) or not _SYMBOL_RE.match(s):
            raise DualhubError(f"bad symbol {s!r}: upper-case letters and digits, e.g. BTCUSDT")
    if dup := sorted({s for s in syms if syms.count(s) > 1}):
        raise DualhubError(f"symbol {dup[0]} is given twice")
    table = INSTRUMENTS if instruments is None else instruments
    if len(syms) > 1 and (unknown := [s for s in syms if s not in table]):
        raise DualhubError(
            f"no simulated contract for {', '.join(unknown)}; a multi-symbol session knows {', '.join(table)}"
        )
    return syms


class MultiSim:
    """Several symbols in one session: the first leads, each other one is cointegrated with it
    (:class:`PairConfig`, ``config.pair``), each on its own contract (tick, size step, price level from
    ``instruments``, default :data:`INSTRUMENTS`).

    :meth:`frames` yields every symbol's (ts_recv_ns, raw) merged by (ts_recv, symbol's place in
    ``symbols``, its own order): each symbol's feed has its own receive times, as on its own connection.
    One symbol is :func:`generate_frames` exactly (any name, SimConfig's contract); a BTCUSDT leader's
    frames are those of the single-symbol session with the same seed. :meth:`truth` holds each pair's
    true parameters and regime changes (complete once :meth:`frames` is exhausted).
    """

    def __init__(
        self,
        symbols: Sequence[str],
        *,
        minutes: float = 10.0,
        seed: int = 7,
        start_ms: int = DEFAULT_START_MS,
        config: SimConfig | None = None,
        instruments: Mapping[str, Instrument] | None = None,
    ) -> None:
        self.symbols = check_symbols(symbols, instruments)
        check_seed(seed)
        table = INSTRUMENTS if instruments is None else instruments
        cfg = config or SimConfig()
        self.seed, self.minutes, self.start_ms = seed, minutes, start_ms
        self.end_ms = _end_ms(start_ms, minutes)
        t0 = start_ms - cfg.warmup_ms
        common = {"seed": seed, "start_ms": start_ms, "end_ms": self.end_ms}
        if len(self.symbols) == 1:
            self.instruments: dict[str, Instrument] = {}
            self.sims = [_SymbolSim(self.symbols[0], cfg, index=0, units=_DEFAULT_UNITS, **common)]
            self.pairs: list[_Pair] = []
            return
        self.instruments = {s: table[s] for s in self.symbols}
        lead = self.instruments[self.symbols[0]]
        lead_units = _Units(lead.tick, lead.size_step)
        self.sims = [
            _SymbolSim(
                self.symbols[0],
                _instrument_config(cfg, lead, lead_units),
                index=0,
                units=lead_units,
                record_path=True,
                **common,
            )
        ]
        self.pairs = []
        for k, s in enumerate(self.symbols[1:], start=1):
            inst = self.instruments[s]
            units = _Units(inst.tick, inst.size_step)
            scfg = _instrument_config(cfg, inst, units)
            pair = _Pair(
                cfg.pair,
                scfg,
                units,
                lead_units,
                lead.price,
                _rng(seed, _RNG_SPREAD, k),
                _rng(seed, _RNG_PAIR, k),
                t0,
            )
            self.pairs.append(pair)
            self.sims.append(_SymbolSim(s, scfg, index=k, units=units, pair=pair, **common))

    def frames(self) -> Iterator[tuple[int, bytes]]:
        gens = [sim.chunks() for sim in self.sims]
        if len(gens) == 1:
            for out in gens[0]:
                yield from out
            return
        leader = self.sims[0]
        live = [True] * len(gens)
        heap: list[tuple[int, int, int, bytes]] = []
        seen = [0] * len(gens)
        chunk_end = self.start_ms - self.sims[0].cfg.warmup_ms
        while any(live):
            chunk_end += CHUNK_STEPS * GRID_MS
            for k, g in enumerate(gens):
                if not live[k]:
                    continue
                if k:
                    # Past the leader's last chunk every follower event is past the end: any path serves.
                    self.sims[k].leader = leader.path if live[0] else [leader.path[-1]] * CHUNK_STEPS
                try:
                    out = next(g)
                except StopIteration:
                    live[k] = False
                    continue
                for ts, raw in out:
                    heapq.heappush(heap, (ts, k, seen[k], raw))
                    seen[k] += 1
            # Every later frame is pushed at or after chunk_end, so received after it.
            bound = chunk_end * MS if any(live) else None
            while heap and (bound is None or heap[0][0] < bound):
                ts, _, _, raw = heapq.heappop(heap)
                yield ts, raw

    def truth(self) -> dict[str, Any]:
        """What the notebook compares estimates with: the contracts and each pair's true parameters."""
        if not self.pairs:
            return {}
        lead = self.symbols[0]
        return {
            "leader": lead,
            "instruments": {
                s: {"tick": i.tick, "size_step": i.size_step, "price": i.price}
                for s, i in self.instruments.items()
            },
            "pairs": [
                {"leader": lead, "follower": s, **p.truth(self.end_ms)}
                for s, p in zip(self.symbols[1:], self.pairs, strict=True)
            ],
        }


def simulate_session(
    out_dir: Path | str,
    *,
    symbol: str = "BTCUSDT",
    symbols: Sequence[str] | None = None,
    minutes: float = 10.0,
    seed: int = 7,
    start_ms: int = DEFAULT_START_MS,
    progress: bool = False,
    config: SimConfig | None = None,
) -> Path:
    """Write a finished session: frames -> wire.bitget.bitget_v2.decode (the same normalisation the
    recorder uses) -> engine.store.SessionWriter(source="simulator", symbols=...,
    extra={"simulator": {"seed", "minutes", "symbol", "start_ms"}}).

    ``symbols`` (two or more): a :class:`MultiSim` session; the ``simulator`` entry then has
    ``symbols`` instead of ``symbol``, plus :meth:`MultiSim.truth` (leader, instruments, pairs).
    Control frames returned by decode are ignored; Quarantined records are written too (there should
    be none). With progress=True show a rich progress bar. Returns out_dir."""
    syms = (symbol,) if symbols is None else tuple(symbols)
    sim = MultiSim(syms, minutes=minutes, seed=seed, start_ms=start_ms, config=config)
    if len(sim.symbols) == 1:
        meta: dict[str, Any] = {
            "seed": seed,
            "minutes": minutes,
            "symbol": sim.symbols[0],
            "start_ms": start_ms,
        }
    else:
        meta = {"seed": seed, "minutes": minutes, "symbols": list(sim.symbols), "start_ms": start_ms}
    out = Path(out_dir)
    writer = SessionWriter(out, source="simulator", symbols=sim.symbols, extra={"simulator": meta})
    counters = StreamCounters()
    bar: Any = None
    total_ms = round(minutes * 60_000)
    if progress and sys.stdout.isatty():  # piped, a bar draws nothing but a blank line
        from rich.progress import BarColumn, Progress, TimeRemainingColumn

        bar = Progress("[bold]simulate", BarColumn(), "{task.percentage:>3.0f}%", TimeRemainingColumn())
        bar.start()
        task = bar.add_task("simulate", total=total_ms)
    try:
        for i, (ts_recv, raw) in enumerate(sim.frames()):
            for ev in decode(raw, ts_recv, counters):
                if not isinstance(ev, Control):
                    writer.add(ev)
            if bar is not None and i % 256 == 0:
                bar.update(task, completed=min(total_ms, ts_recv // MS - start_ms))
        writer.extra["simulator"] = {**meta, **sim.truth()}
        writer.close()
    finally:
        if bar is not None:
            bar.update(task, completed=total_ms)
            bar.stop()
    return out
