"""The local Bitget exchange's records (``venue/bitget/exchange.py``): an order and a position as the
exchange keeps them, a symbol's matching venue, a private connection, the rows' number format, the
default contract of a symbol, and the paths, windows and accounts it serves with.
"""

from __future__ import annotations

import asyncio
import hmac
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from websockets.asyncio.server import ServerConnection

from engine.clock import ReplayClock
from engine.contract import ContractConfig
from engine.events import BookSnapshot
from venue.exchange import SimExchange
from venue.simulator import INSTRUMENTS
from wire.bitget.bitget_v2_rest import ContractSpec

PRIVATE_PATH: Final = "/v2/ws/private"
PUBLIC_PATH: Final = "/v2/ws/public"
TS_WINDOW_MS: Final = 30_000
LOGIN_WINDOW_S: Final = 30
DEFAULT_ACCOUNTS: Final = {"local-key": ("local-secret", "local-passphrase")}
ORDER_ENDPOINTS: Final = ("place-order", "cancel-order", "batch-cancel-orders", "cancel-all-orders")


def _same(given: str, want: str) -> bool:
    """Constant-time equality of a credential as sent and as expected. As bytes: compare_digest refuses
    str with non-ASCII characters (TypeError), which a client controls."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), want.encode("utf-8", "surrogatepass"))


@dataclass
class _Order:
    order_id: str
    client_oid: str
    uid: str
    symbol: str
    side: str
    order_type: str
    force: str
    price: str
    size: str
    px: float
    qty: float
    reduce_only: bool
    c_time: int
    u_time: int
    status: str = "new"  # new -> live | partially_filled | filled | canceled | rejected
    filled: float = 0.0
    notional: float = 0.0
    fee: float = 0.0  # negative: paid
    pnl: float = 0.0  # realized by this order's fills
    cancel_reason: str = ""
    reject_reason: str = ""
    fills: list[dict[str, Any]] = field(default_factory=list)  # its rows of the fills endpoint, in order

    @property
    def open(self) -> bool:
        return self.status in ("new", "live", "partially_filled")

    @property
    def price_avg(self) -> float:
        return self.notional / self.filled if self.filled > 0 else 0.0


@dataclass
class _Position:
    qty: float = 0.0  # signed, one-way mode
    avg: float = 0.0
    realized: float = 0.0
    c_time: int = 0
    u_time: int = 0

    def apply(self, side: str, px: float, q: float, ts: int) -> None:
        signed = q if side == "buy" else -q
        if self.qty == 0 or (self.qty > 0) == (signed > 0):
            total = abs(self.qty) + q
            self.avg = (self.avg * abs(self.qty) + px * q) / total
            if self.qty == 0:
                self.c_time = ts
        else:
            closing = min(abs(self.qty), q)
            self.realized += closing * (px - self.avg) * (1 if self.qty > 0 else -1)
            if q > abs(self.qty) + 1e-12:
                self.avg = px
                self.c_time = ts
        self.qty = round(self.qty + signed, 12)
        if abs(self.qty) < 1e-12:
            self.qty, self.avg = 0.0, 0.0
        self.u_time = ts


KEEP_MARGIN_RATE: Final = 0.004
LEVERAGE: Final = 20


def _liquidation_price(p: _Position) -> float:
    """A crossed position's liquidation price at the fixed leverage, ignoring the rest of the account
    (the local exchange keeps no wallet): where the loss eats the initial margin down to the
    maintenance rate."""
    move = 1.0 / LEVERAGE - KEEP_MARGIN_RATE
    return p.avg * (1 - move) if p.qty > 0 else p.avg * (1 + move)


def _rest_fill(row: Mapping[str, Any]) -> dict[str, Any]:
    """A fill row as the REST fills endpoint has it: ``totalDeductionFee`` null where the channel
    sends ``"0"``."""
    out = dict(row)
    out["feeDetail"] = [{**fd, "totalDeductionFee": None} for fd in row["feeDetail"]]
    return out


def _num(x: float) -> str:
    """A float as Bitget's plain decimal string (shortest round trip, no exponent)."""
    if x != x:
        return ""
    s = repr(float(x))
    return format(Decimal(s), "f") if "e" in s or "E" in s else s


@dataclass
class _Venue:
    symbol: str
    spec: ContractSpec
    clock: ReplayClock
    sim: SimExchange
    book: BookSnapshot | None = None
    last_px: float = math.nan  # the last trade applied (the ticker's lastPr)


@dataclass
class _PrivConn:
    ws: ServerConnection
    index: int
    queue: asyncio.Queue[bytes | str] = field(default_factory=asyncio.Queue)
    uid: str = ""
    subs: set[tuple[str, str]] = field(default_factory=set)  # (channel, instId)
    closed: bool = False


def default_contract(symbol: str) -> ContractConfig:
    """The contract a symbol gets when none is given: the simulator's (venue.simulator.INSTRUMENTS:
    tick and size step, the step also the minimum size) for a symbol it knows, else the engine's
    defaults."""
    inst = INSTRUMENTS.get(symbol)
    if inst is None:
        return ContractConfig(symbol=symbol)
    step = float(inst.size_step)
    return ContractConfig(symbol=symbol, tick=float(inst.tick), size_step=step, min_qty=step)
