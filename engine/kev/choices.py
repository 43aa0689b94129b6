"""The answers the portfolio prompt lets a model give: a few whole sets of targets, each one sensible.

A small model asked for free numbers writes targets that contradict its own hedge ratio (both legs
long, a flatten that keeps positions). Instead of hoping, the portfolio question offers the targets it
can act on and the request's schema and grammar (:mod:`engine.kev.prompt`) admit only those:

- ``flat``: every position 0 (the only targets an EMERGENCY_FLATTEN may carry);
- ``hold``: every position as it is (when that is not flat);
- per pair, entering it either way: the legs the pairs rule (:func:`engine.kev.pairs.pairs_decide`,
  the one sizing of a hedged entry) puts on when the spread is past its entry threshold on that side,
  every other instrument held.

Every choice is kept only if it passes the engine's own sense checks
(:func:`engine.kev.command.check_sense`) for the context as it is, so a model that picks any of them
gives a command the engine trades; the engine still checks every answer, whatever produced it. The
model's judgement is which choice (and which action, slippage and reason): what it reads the signal,
the z-scores and the positions as.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.kev.advisor import KevContextV2
from engine.kev.command import ACTIONS, CommandV2, PairHedge, check_sense
from engine.kev.pairs import pairs_decide

CHOICES_VERSION = "kev-choices-v1"  # in the v2 prompt's hash: a change to what is offered is a new prompt
FLATTEN = "EMERGENCY_FLATTEN"
TRADING_ACTIONS = tuple(a for a in ACTIONS if a != FLATTEN)
# an entry threshold any finite |z| passes: the choice is the entry's sizing, not its timing
_PAST_ENTRY = 1e300


@dataclass(frozen=True, slots=True)
class Choice:
    name: str  # what the prompt calls it
    targets: tuple[tuple[str, float], ...]  # in the context's instruments order


def pair_hedges(ctx: KevContextV2) -> tuple[PairHedge, ...]:
    """The hedge ratio each pair's answer carries: the fitted one as the pairs rule clips and rounds
    it (1.0 while there is none)."""
    return tuple(
        PairHedge(
            leader=p.leader, follower=p.follower, hedge_ratio=_decide(ctx, p.leader, p.follower, 0.0)[2]
        )
        for p in ctx.pairs
    )


def choices(ctx: KevContextV2) -> tuple[Choice, ...]:
    """The targets offered for ``ctx``, in a fixed order (flat, hold, then each pair's two entries),
    duplicates and those the sense checks refuse left out."""
    positions = {i.symbol: i.position for i in ctx.instruments}
    held = tuple((i.symbol, _clean(i.position)) for i in ctx.instruments)
    # flat first: with no positions, holding is going flat, and the flatten needs its choice
    out = [Choice("flat", tuple((s, 0.0) for s, _ in held)), Choice("hold", held)]
    for p in ctx.pairs:
        for side, z in (("sell", 1.0), ("buy", -1.0)):
            t_l, t_f, _, _ = _decide(ctx, p.leader, p.follower, z * _PAST_ENTRY)
            want = {p.leader: t_l, p.follower: t_f}
            targets = tuple((s, _clean(want.get(s, positions[s]))) for s, _ in held)
            other = "buy" if side == "sell" else "sell"
            out.append(Choice(f"{side} {p.follower}, {other} {p.leader}", targets))
    marks = {i.symbol: i.mark for i in ctx.instruments}
    limits = {i.symbol: i.max_position for i in ctx.instruments}
    hedges = pair_hedges(ctx)
    kept: list[Choice] = []
    for c in out:
        if any(c.targets == k.targets for k in kept) or not all(math.isfinite(t) for _, t in c.targets):
            continue
        cmd = CommandV2(
            schema_version=2,
            action=FLATTEN if c.name == "flat" else "HOLD",
            targets=c.targets,
            pairs=hedges,
            max_slippage_bps=5.0,
            reason="",
        )
        if c.name in ("hold", "flat") or not check_sense(cmd, positions, marks, limits):
            kept.append(c)
    return tuple(kept)


def _decide(ctx: KevContextV2, leader: str, follower: str, z: float) -> tuple[float, float, float, int]:
    inst = {i.symbol: i for i in ctx.instruments}
    pair = next(p for p in ctx.pairs if (p.leader, p.follower) == (leader, follower))
    lead, foll = inst[leader], inst[follower]
    return pairs_decide(
        z if math.isfinite(pair.z) else math.nan,
        lead.position,
        foll.position,
        pair.hedge_ratio,
        lead.mark,
        foll.mark,
        1.0,
        0.5,
        lead.max_position,
        foll.max_position,
    )


def _clean(x: float) -> float:
    return 0.0 if x == 0.0 else float(x)  # no -0.0 in a literal
