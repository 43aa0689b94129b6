"""Kev cassettes: recorded answers keyed by request, replayed instead of calling the model.

A cassette holds, per request key (:func:`engine.kev.prompt.request_key`), the answers recorded in
order: the raw JSON text (or the error), the lag and the server timings. It is stored as
``kev_cassette.parquet`` (:data:`CASSETTE_SCHEMA`) or rebuilt from a run's ``kev_response`` events.

:class:`CassetteAdvisor` answers by key. The n-th request with a key gets the n-th recording of that
key (the last one once they run out), so a replay of the recorded run gets every answer and lag back
in order. A key that was never recorded follows an explicit miss policy:

``"fail"``  an error reply marked as a miss (``timings["cassette_miss"] == 1``);
``"sim"``   the fallback advisor answers (the rule-based stand-in): still deterministic;
``"live"``  the fallback advisor is a live client: the run is flagged non-deterministic
            (``advisor.deterministic`` turns False).

Counts: ``hits``, ``misses`` and ``fallbacks`` (misses the fallback answered). A fallback's answer says
so in its reply's ``advisor`` (and so in the ``kev_response.advisor`` column): ``cassette>rules`` or
``cassette>llm``, never plain ``cassette``, which is kept for recorded answers. A cache in front of a
live model (the replay's llm mode, where the advisor bears the model's own name) leaves its misses
under that name: they are the model's answers, not a stand-in's.

:class:`RecordingAdvisor` wraps any advisor and records what it returns.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import DualhubError
from engine.events import KevResponse, Nanos, table_to_events
from engine.kev.advisor import KevAdvisor, KevContext, KevReply
from engine.kev.failures import classify
from engine.store import atomic_write_parquet, first_line

CASSETTE_FILE: Final = "kev_cassette.parquet"
CASSETTE_VERSION: Final = "1"
CASSETTE_SCHEMA: Final = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("occurrence", pa.int64(), nullable=False),  # 0 for a key's first recording, then 1, ...
        pa.field("request_id", pa.int64(), nullable=False),
        pa.field("advisor", pa.string(), nullable=False),  # who answered when it was recorded
        pa.field("raw", pa.string(), nullable=False),  # the JSON object's text, "" for an error
        pa.field("error", pa.string(), nullable=False),
        pa.field("lag_ns", pa.int64(), nullable=False),
        pa.field("prompt_ms", pa.float64(), nullable=False),
        pa.field("predicted_ms", pa.float64(), nullable=False),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        # the error's kind (engine/kev/failures.py); files written before it existed lack the column
        pa.field("failure", pa.string(), nullable=False),
    ],
    metadata={"dualhub.kind": "kev_cassette", "dualhub.cassette_version": CASSETTE_VERSION},
)
_TIMING_FIELDS: Final = ("prompt_ms", "predicted_ms", "prompt_tokens", "completion_tokens")

MissPolicy = Literal["fail", "sim", "live"]
MISS_POLICIES: Final = ("fail", "sim", "live")
KeyFn = Callable[[KevContext], str]


class CassetteError(DualhubError):
    """A cassette file that is missing, of another kind or version, or inconsistent."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CassetteEntry:
    key: str
    raw: str
    error: str
    lag_ns: Nanos
    request_id: int = 0
    advisor: str = ""
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failure: str = ""

    @classmethod
    def from_reply(
        cls, key: str, reply: KevReply, *, lag_ns: Nanos, request_id: int = 0, advisor: str = ""
    ) -> CassetteEntry:
        t = reply.timings
        return cls(
            key=key,
            raw=orjson.dumps(reply.raw, option=orjson.OPT_SORT_KEYS).decode()
            if reply.raw is not None
            else "",
            error=reply.error,
            lag_ns=int(lag_ns),
            request_id=request_id,
            advisor=advisor,
            prompt_ms=float(t.get("prompt_ms", 0.0)),
            predicted_ms=float(t.get("predicted_ms", 0.0)),
            prompt_tokens=int(t.get("prompt_tokens", 0)),
            completion_tokens=int(t.get("completion_tokens", 0)),
            failure=reply.failure or (classify(reply.error) if reply.raw is None else ""),
        )

    def to_reply(self) -> KevReply:
        """The recorded answer: ``raw`` parsed back, or the recorded error."""
        timings = {
            "prompt_ms": self.prompt_ms,
            "predicted_ms": self.predicted_ms,
            "prompt_tokens": float(self.prompt_tokens),
            "completion_tokens": float(self.completion_tokens),
            "lag_ns": float(self.lag_ns),
            "cassette_hit": 1.0,
        }
        if self.raw:
            try:
                obj = orjson.loads(self.raw)
            except orjson.JSONDecodeError:
                obj = None
            if isinstance(obj, dict):
                return KevReply(raw=obj, error="", timings=timings, key=self.key)
        if self.error:
            return KevReply(
                raw=None,
                error=self.error,
                timings=timings,
                key=self.key,
                failure=self.failure or classify(self.error),
            )
        error = f"recorded answer is not a JSON object: {self.raw[:80]!r}"
        return KevReply(raw=None, error=error, timings=timings, key=self.key, failure="invalid_json")


def _with_failure(table: pa.Table) -> pa.Table:
    """``table`` (cassette or kev_response rows) with a ``failure`` column: a file written before failure
    kinds existed gets them from its error texts."""
    if "failure" in table.column_names:
        return table
    kinds = [classify(e) if e else "" for e in table.column("error").to_pylist()]
    return table.append_column("failure", pa.array(kinds, pa.string()))


@dataclass(slots=True)
class Cassette:
    """Recorded answers by key, each key's in recording order. ``meta`` goes into the file's metadata."""

    entries: dict[str, list[CassetteEntry]] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    skipped: int = 0  # rows that had no key (e.g. recorded from an advisor that sets none)

    def add(self, entry: CassetteEntry) -> None:
        if not entry.key:
            self.skipped += 1
            return
        self.entries.setdefault(entry.key, []).append(entry)

    def get(self, key: str, occurrence: int = 0) -> CassetteEntry | None:
        """The ``occurrence``-th recording of ``key`` (the last one past the end); None if never recorded."""
        got = self.entries.get(key)
        if not got:
            return None
        return got[min(occurrence, len(got) - 1)]

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return sum(len(v) for v in self.entries.values())

    @property
    def keys(self) -> list[str]:
        return sorted(self.entries)

    # -- Arrow / Parquet -----------------------------------------------------------------------------

    def to_table(self) -> pa.Table:
        rows = [(occ, e) for key in sorted(self.entries) for occ, e in enumerate(self.entries[key])]
        cols: dict[str, list[Any]] = {
            "key": [e.key for _, e in rows],
            "occurrence": [occ for occ, _ in rows],
            "request_id": [e.request_id for _, e in rows],
            "advisor": [e.advisor for _, e in rows],
            "raw": [e.raw for _, e in rows],
            "error": [e.error for _, e in rows],
            "lag_ns": [e.lag_ns for _, e in rows],
            **{name: [getattr(e, name) for _, e in rows] for name in _TIMING_FIELDS},
            "failure": [e.failure for _, e in rows],
        }
        meta = {**(CASSETTE_SCHEMA.metadata or {}), **{k.encode(): v.encode() for k, v in self.meta.items()}}
        return pa.Table.from_pydict(cols, schema=CASSETTE_SCHEMA.with_metadata(meta))

    @classmethod
    def from_table(cls, table: pa.Table) -> Cassette:
        kind = (table.schema.metadata or {}).get(b"dualhub.kind")
        if kind != b"kev_cassette":
            raise CassetteError(f"not a Kev cassette (dualhub.kind={kind!r})")
        version = (table.schema.metadata or {}).get(b"dualhub.cassette_version")
        if version != CASSETTE_VERSION.encode():
            raise CassetteError(f"cassette version {version!r} != supported {CASSETTE_VERSION}")
        base = set(CASSETTE_SCHEMA.metadata or {})
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items() if k not in base}
        try:
            table = _with_failure(table).select(CASSETTE_SCHEMA.names).cast(CASSETTE_SCHEMA.remove_metadata())
        except (KeyError, pa.ArrowException) as e:
            raise CassetteError(f"a Kev cassette without its columns ({first_line(e)})") from None
        table = table.sort_by([("key", "ascending"), ("occurrence", "ascending")])
        cas = cls(meta=meta)
        names = CASSETTE_SCHEMA.names
        for row in zip(*(table.column(n).to_pylist() for n in names), strict=True):
            d = dict(zip(names, row, strict=True))
            d.pop("occurrence")
            cas.add(CassetteEntry(**d))
        return cas

    def write(self, path: Path | str) -> Path:
        """Write atomically (tmp + fsync + rename); a directory gets ``kev_cassette.parquet`` inside."""
        path = Path(path)
        if path.is_dir():
            path = path / CASSETTE_FILE
        atomic_write_parquet(self.to_table(), path)
        return path

    @classmethod
    def read(cls, path: Path | str) -> Cassette:
        path = Path(path)
        if path.is_dir():
            path = path / CASSETTE_FILE
        if not path.exists():
            raise CassetteError(f"no cassette at {path}")
        table = _read(path)
        try:
            return cls.from_table(table)
        except CassetteError as e:
            raise CassetteError(f"{path}: {e}") from None

    # -- from a run's event log ----------------------------------------------------------------------

    @classmethod
    def from_events(cls, responses: Iterable[KevResponse], meta: dict[str, str] | None = None) -> Cassette:
        """Build from ``kev_response`` events (in ``seq`` order); events without a key are skipped."""
        cas = cls(meta=dict(meta or {}))
        for ev in sorted(responses, key=lambda e: e.seq):
            cas.add(
                CassetteEntry(
                    key=ev.key,
                    raw=ev.raw,
                    error=ev.error,
                    lag_ns=ev.lag_ns,
                    request_id=ev.request_id,
                    advisor=ev.advisor,
                    prompt_ms=ev.prompt_ms,
                    predicted_ms=ev.predicted_ms,
                    prompt_tokens=ev.prompt_tokens,
                    completion_tokens=ev.completion_tokens,
                    failure=ev.failure if ev.error else "",
                )
            )
        return cas

    @classmethod
    def from_run(cls, run_dir: Path | str) -> Cassette:
        """Build from ``<run_dir>/events/kev_response.parquet``."""
        path = Path(run_dir) / "events" / "kev_response.parquet"
        if not path.exists():
            raise CassetteError(f"{run_dir} has no events/kev_response.parquet")
        try:
            events = table_to_events(_with_failure(_read(path)), "kev_response")
        except (KeyError, pa.ArrowException) as e:
            raise CassetteError(f"{path}: not a run's Kev responses ({first_line(e)})") from None
        return cls.from_events(events, meta={"source_run": str(run_dir)})


def _read(path: Path) -> pa.Table:
    """A cassette's (or a run's responses') Parquet file; a damaged one is one CassetteError naming it."""
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise CassetteError(f"{path}: cannot read it ({first_line(e)})") from None


class CassetteAdvisor:
    """Replays a :class:`Cassette` by request key (``name = "cassette"``); misses follow ``miss_policy``.

    ``key_fn`` must compute keys the way the recording did (e.g. ``LlamaConfig(...).key``).
    ``fallback`` answers misses under ``"sim"`` and ``"live"``; with ``record_misses`` its answers are
    added to the cassette, so the next identical request is a hit (the ``llm`` mode's cache by key).
    """

    name = "cassette"

    def __init__(
        self,
        cassette: Cassette,
        *,
        key_fn: KeyFn,
        miss_policy: MissPolicy = "fail",
        fallback: KevAdvisor | None = None,
        record_misses: bool = False,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if miss_policy not in MISS_POLICIES:
            raise ValueError(f"miss_policy {miss_policy!r} not one of {MISS_POLICIES}")
        if miss_policy != "fail" and fallback is None:
            raise ValueError(f"miss_policy {miss_policy!r} needs a fallback advisor")
        self.cassette = cassette
        self.key_fn = key_fn
        self.miss_policy: MissPolicy = miss_policy
        self.fallback = fallback
        self.record_misses = record_misses
        self._clock_ns = clock_ns
        self._seen: dict[str, int] = {}
        self.hits = 0
        self.misses = 0
        self.fallbacks = 0  # misses answered by the fallback advisor
        self.live_calls = 0
        # False once a live model answered a miss: the run is no longer a pure replay.
        self.deterministic = True
        if fallback is None or hasattr(fallback, "advise_now"):
            self.advise_now = self._advise_now

    def key(self, ctx: KevContext) -> str:
        return self.key_fn(ctx)

    async def advise(self, ctx: KevContext) -> KevReply:
        key, reply = self._recorded(ctx)
        if reply is not None:
            return reply
        assert self.fallback is not None
        t0 = self._clock_ns()
        reply = await self.fallback.advise(ctx)
        return self._answered(ctx, key, reply, self._clock_ns() - t0)

    def _advise_now(self, ctx: KevContext) -> KevReply:
        """:meth:`advise` without an event loop (``advise_now`` where the fallback has one too: the
        replay backend then skips the loop's round trip per request)."""
        key, reply = self._recorded(ctx)
        if reply is not None:
            return reply
        t0 = self._clock_ns()
        reply = self.fallback.advise_now(ctx)  # type: ignore[union-attr]
        return self._answered(ctx, key, reply, self._clock_ns() - t0)

    def _recorded(self, ctx: KevContext) -> tuple[str, KevReply | None]:
        """The request's key and the cassette's reply (a recording, or a miss under policy fail); None
        when the fallback answers."""
        key = self.key_fn(ctx)
        n = self._seen.get(key, 0)
        self._seen[key] = n + 1
        entry = self.cassette.get(key, n)
        if entry is not None:
            self.hits += 1
            return key, entry.to_reply()
        self.misses += 1
        if self.miss_policy == "fail" or self.fallback is None:
            return key, KevReply(
                raw=None,
                error=f"cassette miss: key {key[:16]} was not recorded (miss policy fail)",
                timings={"cassette_miss": 1.0},
                key=key,
                failure="cassette_miss",
            )
        if self.miss_policy == "live":
            self.live_calls += 1
            self.deterministic = False
        self.fallbacks += 1
        return key, None

    def _answered(self, ctx: KevContext, key: str, reply: KevReply, lag_ns: int) -> KevReply:
        """The fallback's ``reply`` to a miss (it took ``lag_ns``), marked as such, and recorded."""
        assert self.fallback is not None
        if self.record_misses:
            self.cassette.add(
                CassetteEntry.from_reply(
                    key, reply, lag_ns=lag_ns, request_id=ctx.request_id, advisor=self.fallback.name
                )
            )
        timings = {**reply.timings, "cassette_miss": 1.0}
        if self.miss_policy == "live":
            timings["live"] = 1.0
        who = self.fallback.name
        advisor = "" if who == self.name else f"{self.name}>{who}"
        return dataclasses.replace(reply, timings=timings, key=key, advisor=advisor)


def answered_by(advisor: str) -> str:
    """The advisor that produced a recorded answer: ``rules`` for ``cassette>rules``."""
    return advisor.rpartition(">")[2]


class RecordingAdvisor:
    """Wraps an advisor and records every answer into ``cassette`` (lag = wall time of the call).

    ``name`` is the wrapped advisor's, so events still say who answered. ``key_fn`` defaults to the
    wrapped advisor's ``key`` method.
    """

    def __init__(
        self,
        inner: KevAdvisor,
        *,
        key_fn: KeyFn | None = None,
        cassette: Cassette | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        fn = key_fn or getattr(inner, "key", None)
        if fn is None:
            raise ValueError(f"{type(inner).__name__} has no key() method; pass key_fn")
        self.inner = inner
        self.name = inner.name
        self.key_fn: KeyFn = fn
        self.cassette = cassette if cassette is not None else Cassette()
        self._clock_ns = clock_ns

    def key(self, ctx: KevContext) -> str:
        return self.key_fn(ctx)

    async def advise(self, ctx: KevContext) -> KevReply:
        t0 = self._clock_ns()
        reply = await self.inner.advise(ctx)
        lag_ns = self._clock_ns() - t0
        key = reply.key or self.key_fn(ctx)
        self.cassette.add(
            CassetteEntry.from_reply(
                key, reply, lag_ns=lag_ns, request_id=ctx.request_id, advisor=self.inner.name
            )
        )
        return reply if reply.key else dataclasses.replace(reply, key=key)
