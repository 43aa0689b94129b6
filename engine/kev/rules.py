"""Rule-based Kev: the deterministic stand-in behind the same interface as the llama-server client."""

from __future__ import annotations

import hashlib

import orjson

from engine.kev.advisor import KevContext, KevReply, context_body

RULES_VERSION = "rules-v1"


class RuleKev:
    """Turns a label context into a portfolio command with fixed, readable rules.

    LEAN_BUY/LEAN_SELL with conviction move the target a step towards that side (capped at
    ``max_position``); EMERGENCY flattens; weak signals hold the current position.
    """

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
        body = {
            "rules": RULES_VERSION,
            "params": [self.step_fraction, self.min_prob],
            **context_body(ctx),
        }
        return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def decide(self, ctx: KevContext) -> dict[str, object]:
        step = ctx.max_position * self.step_fraction
        spread_bps = ctx.spread / ctx.mid * 1e4 if ctx.mid > 0 else 0.0
        slip = round(min(10.0, max(1.0, 2.0 * spread_bps)), 2)
        if ctx.label == "EMERGENCY":
            return _cmd("EMERGENCY_FLATTEN", 0.0, 1.0, slip, "emergency label: flatten")
        if ctx.p_label < self.min_prob:
            return _cmd("HOLD", ctx.position, 0.0, slip, f"weak {ctx.label} p={ctx.p_label:.2f}: hold")
        sign = 1.0 if ctx.label == "LEAN_BUY" else -1.0
        # Imbalance against the label halves the step: the book disagrees with the model.
        agree = sign * ctx.imbalance >= 0
        target = ctx.position + sign * step * (1.0 if agree else 0.5)
        target = max(-ctx.max_position, min(ctx.max_position, target))
        action = "LEAN_BUY" if sign > 0 else "LEAN_SELL"
        why = f"{ctx.label} p={ctx.p_label:.2f} imb={ctx.imbalance:+.2f}"
        return _cmd(action, round(target, 6), 0.0, slip, why)


def _cmd(action: str, target: float, hedge: float, slip: float, reason: str) -> dict[str, object]:
    return {
        "action": action,
        "target_position": target,
        "hedge_ratio": hedge,
        "max_slippage_bps": slip,
        "reason": reason[:120],
    }
