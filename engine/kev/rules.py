"""Rule-based Kev: the deterministic stand-in behind the same interface as the llama-server client.

The rule itself is :func:`rule_decide`, compiled over codes and numbers: the replay kernel calls it as
it is, :class:`RuleKev` turns its result into the JSON command an advisor returns."""

from __future__ import annotations

import hashlib

import orjson

from engine.contract import round_exact
from engine.events import Label
from engine.exact import pmax, pmin
from engine.jit import njit
from engine.kev.advisor import CONTEXT_FIELDS, KevContext, KevReply
from engine.kev.command import ACTIONS

RULES_VERSION = "rules-v1"
# Actions by their index in engine.kev.command.ACTIONS, and the rule that chose one (WHY_TEXT's row).
A_HOLD, A_LEAN_BUY, A_LEAN_SELL, A_FLATTEN = (
    ACTIONS.index(a) for a in ("HOLD", "LEAN_BUY", "LEAN_SELL", "EMERGENCY_FLATTEN")
)
WHY_EMERGENCY, WHY_WEAK, WHY_LEAN = 0, 1, 2
WHY_TEXT = ("emergency label: flatten", "weak {label} p={p:.2f}: hold", "{label} p={p:.2f} imb={imb:+.2f}")
_LABEL_CODE = {x.name: int(x) for x in Label}
_LEAN_BUY, _EMERGENCY = int(Label.LEAN_BUY), int(Label.EMERGENCY)


@njit(inline="always")
def slippage_bps(mid: float, spread: float) -> float:
    """The slippage a rule allows: twice the spread in bps, 1 to 10 bps, to 2 decimals."""
    spread_bps = spread / mid * 1e4 if mid > 0 else 0.0
    return round_exact(pmin(10.0, pmax(1.0, 2.0 * spread_bps)), 2)


@njit
def rule_decide(
    label: int,
    p_label: float,
    mid: float,
    spread: float,
    imbalance: float,
    position: float,
    max_position: float,
    step_fraction: float,
    min_prob: float,
) -> tuple[int, float, float, float, int]:
    """(action, target position, hedge ratio, max slippage bps, why) for a label (its class index).

    EMERGENCY flattens; a label weaker than ``min_prob`` holds the position; otherwise the target moves
    ``step_fraction`` of ``max_position`` towards the label's side (half that when the book's imbalance
    disagrees with it), within +-``max_position``. Any label but LEAN_BUY leans to sell. The slippage
    allowed is twice the spread, 1 to 10 bps."""
    slip = slippage_bps(mid, spread)
    if label == _EMERGENCY:
        return A_FLATTEN, 0.0, 1.0, slip, WHY_EMERGENCY
    if p_label < min_prob:
        return A_HOLD, position, 0.0, slip, WHY_WEAK
    sign = 1.0 if label == _LEAN_BUY else -1.0
    agree = sign * imbalance >= 0
    target = position + sign * (max_position * step_fraction) * (1.0 if agree else 0.5)
    target = pmax(-max_position, pmin(max_position, target))
    return (A_LEAN_BUY if sign > 0 else A_LEAN_SELL), round_exact(target, 6), 0.0, slip, WHY_LEAN


def _key(params: list[float], symbol, label, p_label, mid, spread, imbalance, position, max_position) -> str:
    """A request key: sha256 of the rule version, its parameters and the context's fields as JSON with
    sorted keys. The dict is built in the order OPT_SORT_KEYS writes, so its plain dump is those bytes
    without a sort per request."""
    body = {
        "imbalance": imbalance,
        "label": label,
        "max_position": max_position,
        "mid": mid,
        "p_label": p_label,
        "params": params,
        "position": position,
        "rules": RULES_VERSION,
        "spread": spread,
        "symbol": symbol,
    }
    return hashlib.sha256(orjson.dumps(body)).hexdigest()


class RuleKev:
    """Turns a label context into a portfolio command with :func:`rule_decide`'s fixed, readable rules."""

    name = "rules"

    def __init__(self, *, step_fraction: float = 0.5, min_prob: float = 0.4) -> None:
        self.step_fraction = step_fraction
        self.min_prob = min_prob

    async def advise(self, ctx: KevContext) -> KevReply:
        return self.advise_now(ctx)

    def advise_now(self, ctx: KevContext) -> KevReply:
        """Synchronous form, for the replay backend (no event loop needed)."""
        return KevReply(raw=self.decide(ctx), key=self.key(ctx))

    def key(self, ctx: KevContext) -> str:
        """Request key: the rule version, its parameters and the context minus ids and times."""
        return self.key_of(*(getattr(ctx, k) for k in CONTEXT_FIELDS))

    def key_of(self, *fields: object) -> str:
        """:meth:`key` of a context with these fields (its ``CONTEXT_FIELDS``, in that order)."""
        return _key([self.step_fraction, self.min_prob], *fields)

    def texts_of(
        self, contexts: list[tuple], answers: list[tuple[int, float, float, float, int]]
    ) -> list[tuple[str, str, str]]:
        """(key, command JSON, reason) of each row: ``contexts`` the fields of a context each (its
        ``CONTEXT_FIELDS``, in that order), ``answers`` :func:`rule_decide`'s answer to it (action,
        target, hedge, slippage, why). The replay's drain makes its texts from the kernel's rows this
        way, a batch without a context per row."""
        params = [self.step_fraction, self.min_prob]
        out = []
        for ctx, answer in zip(contexts, answers, strict=True):
            raw = self.reply_of(ctx[1], ctx[2], ctx[5], *answer)  # label, p_label, imbalance
            out.append((_key(params, *ctx), orjson.dumps(raw).decode(), raw["reason"]))
        return out

    def decide(self, ctx: KevContext) -> dict[str, object]:
        action, target, hedge, slip, why = rule_decide(
            _LABEL_CODE.get(ctx.label, -1),
            ctx.p_label,
            ctx.mid,
            ctx.spread,
            ctx.imbalance,
            ctx.position,
            ctx.max_position,
            self.step_fraction,
            self.min_prob,
        )
        return self.reply(ctx, action, target, hedge, slip, why)

    @staticmethod
    def reply(
        ctx: KevContext, action: int, target: float, hedge: float, slip: float, why: int
    ) -> dict[str, object]:
        """The command JSON of :func:`rule_decide`'s answer to ``ctx`` (the compiled loop decides in
        the kernel and writes the texts from its row with :meth:`reply_of`)."""
        return RuleKev.reply_of(ctx.label, ctx.p_label, ctx.imbalance, action, target, hedge, slip, why)

    @staticmethod
    def reply_of(
        label: str,
        p_label: float,
        imbalance: float,
        action: int,
        target: float,
        hedge: float,
        slip: float,
        why: int,
    ) -> dict[str, object]:
        return {  # keys in sorted order: a plain dump is the sorted one (texts_of)
            "action": ACTIONS[action],
            "hedge_ratio": hedge,
            "max_slippage_bps": slip,
            "reason": WHY_TEXT[why].format(label=label, p=p_label, imb=imbalance)[:120],
            "target_position": target,
        }
