"""Typed events: the one vocabulary every component speaks.

Every event carries ``ts_event`` (exchange or cause time) and ``ts_recv`` (the time the event becomes
visible to the engine), both int64 nanoseconds, and ``seq``, a per-stream sequence number. Events are
frozen: a correction is a new event, never a mutation.

Each event type maps to one named stream and one Arrow schema (``STREAMS``). Book snapshots are
stored as wide typed columns (``bid_px_0..14`` ...), never list columns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from decimal import Decimal
from enum import IntEnum
from operator import attrgetter
from typing import Any, Final, TypeAlias

import numpy as np
import pyarrow as pa

Nanos: TypeAlias = int
BOOK_LEVELS: Final = 15
SCHEMA_VERSION: Final = 1

# Money (fees, notionals, PnL) is exact: Decimal in memory, decimal128 on disk.
MONEY_TYPE: Final = pa.decimal128(38, 12)


class Label(IntEnum):
    """Laya's output classes; the integer is the ONNX model's class index."""

    HOLD = 0
    LEAN_BUY = 1
    LEAN_SELL = 2
    EMERGENCY = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class BookSnapshot:
    """A 15-level L2 snapshot (Bitget ``books15``). Missing levels are NaN in memory, null on disk."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    symbol: str
    exch_seq: int
    bid_px: tuple[float, ...]
    bid_sz: tuple[float, ...]
    ask_px: tuple[float, ...]
    ask_sz: tuple[float, ...]

    @property
    def mid(self) -> float:
        return (self.bid_px[0] + self.ask_px[0]) / 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Trade:
    """A public taker trade; ``side`` is the aggressor side, ``buy`` or ``sell``."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    symbol: str
    trade_id: str
    px: float
    sz: float
    side: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Quarantined:
    """Input that could not be turned into a typed event, kept with the reason instead of dropped."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    source: str
    reason: str
    raw: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputQuarantined:
    """A session row replay kept from the engine (``engine/validate.py``): the row's own times, its
    ``stream`` and seq there (``row_seq``), and a short reason code (``crossed_book``, ``time_backwards``)."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    symbol: str
    stream: str
    row_seq: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Gap:
    """A window where data for ``symbol``/``channel`` is known to be missing (disconnect, seq gap)."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    symbol: str
    channel: str
    start_ns: Nanos
    end_ns: Nanos
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelEvent:
    """Laya's classification of one book snapshot (``book_seq``, seen at ``book_ts_recv``); visible at
    ``ts_recv``, so ``ts_recv - book_ts_recv`` is Laya's compute latency."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    symbol: str
    book_seq: int
    book_ts_recv: Nanos
    label: str
    p_hold: float
    p_lean_buy: float
    p_lean_sell: float
    p_emergency: float


@dataclass(frozen=True, slots=True, kw_only=True)
class KevQueueEvent:
    """Something happened to the Kev queue or its worker: ``enqueued``, ``dropped_overflow``,
    ``dropped_stale``, ``dropped_conflated``, ``timeout`` (no reply in time) or ``late_reply`` (a reply
    after its timeout, discarded)."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    request_id: int
    kind: str
    depth: int


@dataclass(frozen=True, slots=True, kw_only=True)
class KevRequest:
    """The context snapshot sent to Kev when the worker picks a queued request up."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    request_id: int
    symbol: str
    label: str
    label_seq: int
    mid: float
    spread: float
    imbalance: float
    position: float
    queue_wait_ns: Nanos


@dataclass(frozen=True, slots=True, kw_only=True)
class KevResponse:
    """Kev's answer; ``ok`` false carries ``error`` and ``failure``, the error's kind code (``timeout``,
    ``transport``, ``http_5xx``, ... :data:`engine.kev.failures.FAILURE_KINDS`; "" when ok). ``lag_ns``
    is request-to-response time.

    ``key`` identifies the request (prompt template, input, model, parameters) for cassettes; ``raw``
    is the advisor's JSON text; server timings are 0 where the advisor has none.
    """

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    request_id: int
    ok: bool
    error: str
    failure: str = ""
    lag_ns: Nanos
    advisor: str
    key: str
    raw: str
    prompt_ms: float
    predicted_ms: float
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class KevBreakerEvent:
    """Kev's circuit breaker changed ``state`` (``open``, ``half_open``, ``closed``) for ``reason``,
    after ``failures`` consecutive failures. The engine sees the change with the reply to
    ``request_id`` (``ts_recv``); ``breaker_ns`` is when it happened on the breaker's own clock (the
    replay clock in replay, the monotonic clock in live)."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    request_id: int
    state: str
    reason: str
    failures: int
    breaker_ns: Nanos


@dataclass(frozen=True, slots=True, kw_only=True)
class PortfolioCommand:
    """A schema-checked portfolio command from Kev (or, later, a human)."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    command_id: int
    request_id: int
    symbol: str
    action: str
    target_position: float
    hedge_ratio: float
    max_slippage_bps: float
    reason: str
    valid_until: Nanos


@dataclass(frozen=True, slots=True, kw_only=True)
class RiskDecision:
    """The gateway's verdict on one order intent; every intent gets exactly one.

    ``source`` says what asked for the order (``quote``, ``kev``, ``flatten``, ``cancel``);
    ``advice_age_ns`` is the age of the Kev command it acts on (-1 when none).
    """

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    client_oid: str
    symbol: str
    intent: str
    side: str
    order_type: str
    px: float
    qty: float
    source: str
    advice_age_ns: Nanos
    accepted: bool
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderEvent:
    """Order lifecycle: ``new``, ``ack``, ``cancel``, ``cancel_ack``, ``reject``, ``done``."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    client_oid: str
    symbol: str
    kind: str
    side: str
    order_type: str
    px: float
    qty: float
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Fill:
    """One execution. ``notional`` and ``fee`` are exact decimals; ``fee`` > 0 is a cost."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    client_oid: str
    symbol: str
    side: str
    px: float
    qty: float
    liquidity: str
    notional: Decimal
    fee: Decimal
    position_after: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencySpan:
    """A measured or modelled interval on the decision path (``name`` e.g. ``laya``, ``kev``)."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    name: str
    ref: str
    start_ns: Nanos
    end_ns: Nanos
    dur_ns: Nanos


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileEvent:
    """Live mode: a difference between the exchange (REST, after a private WebSocket reconnect) and the
    engine's view. ``kind``: ``missed_fill``, ``missed_done``, ``missing_on_exchange``,
    ``unknown_order``, ``foreign_order``, ``position_mismatch``; ``action`` what was done about it."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    symbol: str
    kind: str
    client_oid: str
    order_id: str
    engine_value: float
    exchange_value: float
    action: str


@dataclass(frozen=True, slots=True, kw_only=True)
class VenueStatus:
    """Live mode: the health of a link to the venue changed. ``component``: ``public_feed``,
    ``private_ws`` or ``rest``; ``state``: ``up``, ``stale`` (connected, no data for ``feed_stale_s``),
    ``down`` (disconnected or failing) or ``lost`` (not up for ``venue_lost_s``: the run ends);
    ``age_ns``: how long since the link was last up (for ``up``: how long it had been out)."""

    ts_event: Nanos
    ts_recv: Nanos
    seq: int
    symbol: str
    component: str
    state: str
    detail: str
    age_ns: Nanos


Event: TypeAlias = (
    BookSnapshot
    | Trade
    | Quarantined
    | InputQuarantined
    | Gap
    | LabelEvent
    | KevQueueEvent
    | KevRequest
    | KevResponse
    | KevBreakerEvent
    | PortfolioCommand
    | RiskDecision
    | OrderEvent
    | Fill
    | LatencySpan
    | ReconcileEvent
    | VenueStatus
)

_PA_TYPES: Final[dict[Any, pa.DataType]] = {
    "Nanos": pa.int64(),
    "int": pa.int64(),
    "float": pa.float64(),
    "str": pa.string(),
    "bool": pa.bool_(),
    "Decimal": MONEY_TYPE,
}
_BOOK_SIDES: Final = ("bid_px", "bid_sz", "ask_px", "ask_sz")


def _schema_for(cls: type) -> pa.Schema:
    fields: list[pa.Field] = []
    for f in dataclasses.fields(cls):
        if f.name in _BOOK_SIDES:
            fields.extend(pa.field(f"{f.name}_{i}", pa.float64()) for i in range(BOOK_LEVELS))
        else:
            fields.append(pa.field(f.name, _PA_TYPES[f.type], nullable=False))
    return pa.schema(fields, metadata={"dualhub.event": cls.__name__, "dualhub.schema_version": "1"})


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A named stream: its event type, Arrow schema and merge priority (lower wins ties)."""

    name: str
    event_type: type
    schema: pa.Schema
    priority: int


def _spec(name: str, cls: type, priority: int) -> StreamSpec:
    return StreamSpec(name, cls, _schema_for(cls), priority)


# Priority breaks ties between streams at the same ts_recv. Market data first (book before
# trade: the book a trade was printed against is the older state), then engine-internal events.
STREAMS: Final[dict[str, StreamSpec]] = {
    s.name: s
    for s in (
        _spec("books15", BookSnapshot, 10),
        _spec("trade", Trade, 20),
        _spec("quarantine", Quarantined, 30),
        _spec("input_quarantine", InputQuarantined, 31),  # a run's log: session rows kept from the engine
        _spec("gap", Gap, 35),
        _spec("label", LabelEvent, 40),
        _spec("kev_queue", KevQueueEvent, 50),
        _spec("kev_request", KevRequest, 51),
        _spec("kev_response", KevResponse, 52),
        _spec("command", PortfolioCommand, 53),
        _spec("kev_breaker", KevBreakerEvent, 54),
        _spec("risk", RiskDecision, 60),
        _spec("order", OrderEvent, 61),
        _spec("fill", Fill, 62),
        _spec("latency", LatencySpan, 70),
        _spec("reconcile", ReconcileEvent, 75),  # live mode only; written beside the engine's log
        _spec("venue_status", VenueStatus, 76),  # live mode only; beside the engine's log
    )
}
# Columns that measure how a server worked (wall time, token counts) rather than record a decision: left
# out of a run's decision digest (engine/eventlog.py), so two runs that decided the same share it
# whatever the timings. (A Kev reply's effect on timing is ``lag_ns``, a decision input: kept.)
NON_DECISION_COLUMNS: Final[dict[str, frozenset[str]]] = {
    # llama-server's timings and token counts for an answer (the answer itself is ``raw``)
    "kev_response": frozenset({"prompt_ms", "predicted_ms", "prompt_tokens", "completion_tokens"}),
}
STREAM_OF_TYPE: Final[dict[type, str]] = {s.event_type: s.name for s in STREAMS.values()}
_FIELD_NAMES: Final[dict[type, tuple[str, ...]]] = {
    s.event_type: tuple(f.name for f in dataclasses.fields(s.event_type)) for s in STREAMS.values()
}


def stream_of(event: Event) -> str:
    return STREAM_OF_TYPE[type(event)]


def event_values(event: Event) -> tuple[Any, ...]:
    """The event's field values in declaration order (cheap; no deep copy like ``astuple``)."""
    return tuple(getattr(event, n) for n in _FIELD_NAMES[type(event)])


def events_to_table(events: list[Any], stream: str) -> pa.Table:
    """Column-wise conversion of same-typed events into the stream's Arrow table."""
    spec = STREAMS[stream]
    cols: dict[str, list[Any]] = {}
    for name in _FIELD_NAMES[spec.event_type]:
        values = list(map(attrgetter(name), events))
        if name in _BOOK_SIDES:
            for i in range(BOOK_LEVELS):
                cols[f"{name}_{i}"] = [None if v[i] != v[i] else v[i] for v in values]
        else:
            cols[name] = values
    return pa.Table.from_pydict(cols, schema=spec.schema)


def table_to_events(table: pa.Table, stream: str) -> list[Any]:
    """Inverse of :func:`events_to_table` (nulls in book levels become NaN)."""
    spec = STREAMS[stream]
    cls = spec.event_type
    names = _FIELD_NAMES[cls]
    n = table.num_rows
    columns: list[list[Any]] = []
    for name in names:
        if name in _BOOK_SIDES:
            levels = [
                table.column(f"{name}_{i}").to_numpy(zero_copy_only=False).astype("float64")
                for i in range(BOOK_LEVELS)
            ]
            columns.append([tuple(row) for row in np.column_stack(levels).tolist()])
        else:
            columns.append(table.column(name).to_pylist())
    return [cls(**dict(zip(names, row, strict=True))) for row in zip(*columns, strict=True)] if n else []
