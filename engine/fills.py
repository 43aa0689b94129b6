"""Fill models: how much of a resting order a public trade fills. Behind an interface so queue-aware
models (hftbacktest-style) can replace the baseline without touching the exchange simulator."""

from __future__ import annotations

from typing import Protocol

from engine.events import Trade


class FillModel(Protocol):
    name: str

    def fill_qty(self, side: str, px: float, remaining: float, trade: Trade, trade_left: float) -> float:
        """Quantity of our resting order (``side`` at ``px``) filled by ``trade`` (``trade_left`` unused)."""
        ...


class TouchFillModel:
    """Baseline: a trade at or through our price fills us, up to the trade's size.

    Optimistic at the touch (no queue ahead); the realism issue adds queue position.
    """

    name = "touch"

    def fill_qty(self, side: str, px: float, remaining: float, trade: Trade, trade_left: float) -> float:
        crosses = (side == "buy" and trade.side == "sell" and trade.px <= px) or (
            side == "sell" and trade.side == "buy" and trade.px >= px
        )
        return min(remaining, trade_left) if crosses else 0.0


class ThroughFillModel:
    """Conservative: only a trade strictly through our price fills us (we were last in the queue)."""

    name = "through"

    def fill_qty(self, side: str, px: float, remaining: float, trade: Trade, trade_left: float) -> float:
        crosses = (side == "buy" and trade.side == "sell" and trade.px < px) or (
            side == "sell" and trade.side == "buy" and trade.px > px
        )
        return min(remaining, trade_left) if crosses else 0.0


FILL_MODELS = {"touch": TouchFillModel, "through": ThroughFillModel}
