"""``dualhub diff RUN_A RUN_B``: the first event where two runs' decisions differ, with its context.

Both runs' decision streams (by default ``command``, ``risk``, ``order``, ``fill``) are merged in the
replay's total order ``(ts_recv, stream priority from engine.events.STREAMS, seq)`` and walked side by
side. The first position where the two merged sequences disagree (another stream, another value in
any compared field, or one run running out of events) is *the* divergence: everything before it is
identical in both runs. The report gives the field-by-field difference, the ``context`` decision
events before it from both runs, and the Laya labels and Kev responses leading up to it (what the
engine saw when it decided), plus a summary: digests, counts per stream, and how the runs'
provenance (config, session, model, seeds) differs.

Decision digests are compared first: when both manifests carry the same ``decision_digest`` (the run
digest without wall-time columns, ``engine/eventlog.py``) and the compared files are the ones the
manifests describe (sha256), the runs decided the same and the walk is skipped.

Comparison is exact, except that NaN equals NaN (market orders carry ``px`` NaN) and the fields in
:data:`IGNORED_FIELDS` are skipped: they record *who* produced an event or a wall-clock measurement,
which legitimately differs between a run and its replay from another source (a live run, a cassette,
a cached LLM) without any decision being different.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import DualhubError
from engine.events import NON_DECISION_COLUMNS, STREAMS
from engine.store import FILE_HASHES, file_hash, first_line, read_regular, sha256_file

DECISION_STREAMS: Final = ("command", "risk", "order", "fill")
# Streams shown around the divergence (what the engine saw), whether or not they are compared.
CONTEXT_STREAMS: Final = ("label", "kev_response")
COMPARABLE_STREAMS: Final = ("label", "kev_queue", "kev_request", "kev_response", *DECISION_STREAMS)

# Fields never compared, per stream, and why. Everything not listed here is compared exactly.
IGNORED_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    # Who answered ("rules", "cassette", "llm") is provenance: a cassette replay of a run answers with
    # the recorded replies under another name. Server timings are wall-clock measurements of the
    # llama-server, not decisions (the lag that matters for timing is ``lag_ns``, compared).
    "kev_response": frozenset({"advisor"}) | NON_DECISION_COLUMNS["kev_response"],
}

_COMMON: Final = ("ts_event", "ts_recv", "seq", "symbol")  # fields every event stream has
_NAN: Final = "NaN"  # stands for a NaN float in comparison tuples (NaN != NaN otherwise)


@dataclass(frozen=True)
class EventRef:
    """One event of one run: its stream, its row in ``events/<stream>.parquet`` and all its fields."""

    stream: str
    index: int
    fields: dict[str, Any]

    @property
    def ts_recv(self) -> int:
        return int(self.fields["ts_recv"])

    def to_json(self) -> dict[str, Any]:
        return {"stream": self.stream, "index": self.index, "fields": self.fields}


@dataclass(frozen=True)
class FieldDiff:
    field: str
    a: Any
    b: Any


@dataclass(frozen=True)
class Divergence:
    """The first differing position of the merged walk. ``a``/``b`` is None where that run had ended."""

    position: int
    a: EventRef | None
    b: EventRef | None
    differences: list[FieldDiff]
    context_a: list[EventRef]
    context_b: list[EventRef]
    around_a: list[EventRef]  # labels and Kev responses up to the divergence time, run A
    around_b: list[EventRef]

    @property
    def ts_recv(self) -> int:
        """When the runs parted: the earlier of the two differing events."""
        return min(e.ts_recv for e in (self.a, self.b) if e is not None)


@dataclass(frozen=True)
class DiffResult:
    run_a: Path
    run_b: Path
    digest_a: str
    digest_b: str
    streams: tuple[str, ...]
    ignored: dict[str, list[str]]
    counts_a: dict[str, int]
    counts_b: dict[str, int]
    compared_a: int  # events of the compared streams in run A
    compared_b: int
    identical_prefix: int  # merged events equal in both runs before the divergence
    provenance: list[FieldDiff]  # config / session / model / seed differences between the manifests
    divergence: Divergence | None
    warnings: list[str] = field(default_factory=list)
    decision_digest_a: str = ""  # "" when the manifest has none (a run from before decision digests)
    decision_digest_b: str = ""

    @property
    def same_digest(self) -> bool:
        return self.digest_a == self.digest_b

    @property
    def same_decision_digest(self) -> bool | None:
        """Whether the runs' decision digests agree; None when a manifest lacks one."""
        a, b = self.decision_digest_a, self.decision_digest_b
        return a == b if a and b else None

    @property
    def diverged(self) -> bool:
        return self.divergence is not None

    def to_json(self) -> dict[str, Any]:
        d = self.divergence
        return {
            "run_a": str(self.run_a),
            "run_b": str(self.run_b),
            "diverged": self.diverged,
            "same_decision_digest": self.same_decision_digest,
            "decision_digest_a": self.decision_digest_a,
            "decision_digest_b": self.decision_digest_b,
            "same_digest": self.same_digest,
            "digest_a": self.digest_a,
            "digest_b": self.digest_b,
            "streams": list(self.streams),
            "ignored": self.ignored,
            "counts_a": self.counts_a,
            "counts_b": self.counts_b,
            "compared_a": self.compared_a,
            "compared_b": self.compared_b,
            "identical_prefix": self.identical_prefix,
            "provenance": [{"field": f.field, "a": f.a, "b": f.b} for f in self.provenance],
            "warnings": self.warnings,
            "divergence": None
            if d is None
            else {
                "position": d.position,
                "ts_recv": d.ts_recv,
                "a": d.a.to_json() if d.a else None,
                "b": d.b.to_json() if d.b else None,
                "differences": [{"field": f.field, "a": f.a, "b": f.b} for f in d.differences],
                "context_a": [e.to_json() for e in d.context_a],
                "context_b": [e.to_json() for e in d.context_b],
                "around_a": [e.to_json() for e in d.around_a],
                "around_b": [e.to_json() for e in d.around_b],
            },
        }


# ---------------------------------------------------------------------------------------------------
# loading


@dataclass
class _Run:
    path: Path
    manifest: dict[str, Any]
    tables: dict[str, pa.Table]
    order: list[tuple[str, int]]  # the compared streams' events in merged order: (stream, row)
    keys: list[tuple[Any, ...]]  # comparison tuple per merged event


def _read_manifest(run: Path) -> dict[str, Any]:
    if not run.is_dir():
        raise DualhubError(f"{run} is not a run directory")
    mpath = run / "manifest.json"
    if not mpath.exists():
        raise DualhubError(f"{run} is not a finished run (no manifest.json)")
    try:
        manifest = orjson.loads(read_regular(mpath, "run manifest"))
    except orjson.JSONDecodeError as e:
        raise DualhubError(f"{mpath} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict):
        raise DualhubError(f"{mpath} is not a run manifest (a JSON object)")
    return manifest


def tampered(run: Path | str) -> list[str]:
    """What in ``run`` no longer matches its manifest: each listed file that is missing, is not a
    regular file, or whose hash differs (truncated, edited). ``dualhub diff`` refuses such a run, as
    ``report`` and ``sql`` do: comparing it would report on events its digest does not describe, and a
    damaged context stream (labels) could not even change the verdict."""
    run = Path(run)
    manifest = _read_manifest(run)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return [f"{run / 'manifest.json'} lists no files"]
    problems = []
    for rel, meta in sorted(files.items()):
        p = run / rel
        entry = file_hash(meta)
        if p.is_symlink() or not p.is_file():
            problems.append(f"{rel} is missing or not a regular file")
        elif entry is not None and FILE_HASHES[entry[0]](p) != entry[1]:
            problems.append(f"{rel} does not match its manifest's {entry[0]}")
        elif rel.endswith(".parquet") and isinstance(meta, dict) and "rows" in meta:
            try:
                rows = pq.read_metadata(p).num_rows
            except (pa.ArrowException, OSError):
                rows = None
            if rows != meta["rows"]:  # the hash covers the file, not the manifest's count
                problems.append(f"{rel} holds {rows} rows, its manifest says {meta['rows']!r}")
    return problems


def _read_stream(run: Path, stream: str, *, required: bool) -> pa.Table | None:
    path = run / "events" / f"{stream}.parquet"
    if not path.exists():
        if required:
            raise DualhubError(f"{run} has no events/{stream}.parquet")
        return None
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DualhubError(f"{path}: cannot read it ({first_line(e)})") from None
    missing = [n for n in ("ts_recv", "seq") if n not in table.column_names]
    if missing:
        raise DualhubError(f"{path} lacks columns {missing}: not a dualhub event file")
    return table


def _comparable(col: pa.ChunkedArray) -> list[Any]:
    """Column values as Python objects, NaN floats replaced by a marker so that NaN equals NaN."""
    if pa.types.is_floating(col.type):
        return [_NAN if v is not None and v != v else v for v in col.to_pylist()]
    return col.to_pylist()


def _merge_order(tables: Mapping[str, pa.Table], streams: Sequence[str]) -> list[tuple[str, int]]:
    """``(stream, row)`` of every event of ``streams`` sorted by ``(ts_recv, priority, seq)``."""
    present = [s for s in streams if s in tables and tables[s].num_rows]
    if not present:
        return []
    ts = np.concatenate([tables[s].column("ts_recv").to_numpy() for s in present])
    prio = np.concatenate([np.full(tables[s].num_rows, STREAMS[s].priority) for s in present])
    seq = np.concatenate([tables[s].column("seq").to_numpy() for s in present])
    sid = np.concatenate([np.full(tables[s].num_rows, i) for i, s in enumerate(present)])
    row = np.concatenate([np.arange(tables[s].num_rows) for s in present])
    idx = np.lexsort((sid, seq, prio, ts))
    return [(present[i], r) for i, r in zip(sid[idx].tolist(), row[idx].tolist(), strict=True)]


def _compared_fields(
    a: _Run, b: _Run, streams: Sequence[str], ignored: Mapping[str, Iterable[str]], warnings: list[str]
) -> dict[str, list[str]]:
    """Per stream, the columns both runs have, minus the ignored ones (in run A's column order).

    Runs written by different schema versions are compared on their common columns, with a warning.
    """
    out = {}
    for s in streams:
        ca, cb = a.tables[s].column_names, b.tables[s].column_names
        only = sorted(set(ca) ^ set(cb))
        if only:
            warnings.append(f"{s}: columns {only} exist in one run only and are not compared")
        skip = set(ignored.get(s, ()))
        out[s] = [n for n in ca if n in cb and n not in skip]
    return out


def _keys(run: _Run, fields: Mapping[str, list[str]]) -> list[tuple[Any, ...]]:
    rows: dict[str, list[tuple[Any, ...]]] = {}
    for s, names in fields.items():
        cols = [_comparable(run.tables[s].column(n)) for n in names]
        rows[s] = list(zip(*cols, strict=True))
    return [(s, *rows[s][r]) for s, r in run.order]


def _as_written(run: Path, manifest: dict[str, Any], streams: Sequence[str]) -> bool:
    """Are ``streams``' event files the ones the manifest lists (same sha256)?"""
    files = manifest.get("files", {})
    for s in streams:
        meta = files.get(f"events/{s}.parquet") if isinstance(files, dict) else None
        path = run / "events" / f"{s}.parquet"
        if not isinstance(meta, dict) or not path.is_file() or sha256_file(path) != meta.get("sha256"):
            return False
    return True


def _load(run: Path, manifest: dict[str, Any], streams: Sequence[str], warnings: list[str]) -> _Run:
    tables: dict[str, pa.Table] = {}
    for s in dict.fromkeys((*streams, *CONTEXT_STREAMS)):
        t = _read_stream(run, s, required=s in streams)
        if t is not None:
            tables[s] = t
            meta = manifest.get("files", {}).get(f"events/{s}.parquet")
            if meta and sha256_file(run / "events" / f"{s}.parquet") != meta.get("sha256"):
                warnings.append(
                    f"{run}/events/{s}.parquet does not match the sha256 in its manifest "
                    "(changed after the run was written; its digest does not describe it)"
                )
    return _Run(run, manifest, tables, _merge_order(tables, streams), [])


# ---------------------------------------------------------------------------------------------------
# comparing


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _event(run: _Run, stream: str, row: int) -> EventRef:
    return EventRef(stream, row, run.tables[stream].slice(row, 1).to_pylist()[0])


def _field_diffs(a: EventRef | None, b: EventRef | None, fields: Mapping[str, list[str]]) -> list[FieldDiff]:
    if a is None or b is None:
        return [FieldDiff("stream", a.stream if a else None, b.stream if b else None)]
    if a.stream != b.stream:  # other fields of unrelated events would only be noise: when, and which
        out = [FieldDiff("stream", a.stream, b.stream)]
        return out + [FieldDiff(n, a.fields[n], b.fields[n]) for n in _COMMON if a.fields[n] != b.fields[n]]
    out = []
    for n in fields[a.stream]:
        if not _same(a.fields[n], b.fields[n]):
            out.append(FieldDiff(n, a.fields[n], b.fields[n]))
    return out


def _around(run: _Run, ts: int, n: int) -> list[EventRef]:
    """The last ``n`` labels and last ``n`` Kev responses with ``ts_recv <= ts``, in merged order."""
    out: list[EventRef] = []
    for s in CONTEXT_STREAMS:
        t = run.tables.get(s)
        if t is None or n == 0:
            continue
        recv, seq = t.column("ts_recv").to_numpy(), t.column("seq").to_numpy()
        rows = np.nonzero(recv <= ts)[0]
        rows = rows[np.lexsort((seq[rows], recv[rows]))][-n:]
        out.extend(_event(run, s, int(r)) for r in rows)
    out.sort(key=lambda e: (e.ts_recv, STREAMS[e.stream].priority, e.fields["seq"]))
    return out


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _provenance(ma: dict[str, Any], mb: dict[str, Any]) -> list[FieldDiff]:
    def facts(m: dict[str, Any]) -> dict[str, Any]:
        return _flatten(
            {
                "session": {"digest": m.get("session", {}).get("digest")},
                "model": {"sha256": m.get("model", {}).get("sha256")},
                "seeds": m.get("seeds", {}),
                "config": m.get("config", {}),
            }
        )

    fa, fb = facts(ma), facts(mb)
    keys = sorted(fa.keys() | fb.keys())
    return [FieldDiff(k, fa.get(k), fb.get(k)) for k in keys if fa.get(k) != fb.get(k)]


def diff_runs(
    run_a: Path | str,
    run_b: Path | str,
    *,
    streams: Sequence[str] = DECISION_STREAMS,
    context: int = 5,
    ignored: Mapping[str, Iterable[str]] = IGNORED_FIELDS,
) -> DiffResult:
    """Walk both runs' ``streams`` in merged order and report the first event where they differ."""
    streams = tuple(dict.fromkeys(streams))
    unknown = [s for s in streams if s not in COMPARABLE_STREAMS]
    if unknown or not streams:
        raise DualhubError(
            f"cannot compare streams {unknown or '(none)'}; choose from {', '.join(COMPARABLE_STREAMS)}"
        )
    if context < 0:
        raise DualhubError(f"context must be >= 0, not {context}")
    warnings: list[str] = []
    pa_, pb = Path(run_a), Path(run_b)
    ma, mb = _read_manifest(pa_), _read_manifest(pb)
    dda, ddb = str(ma.get("decision_digest", "")), str(mb.get("decision_digest", ""))
    summary = {
        "run_a": pa_,
        "run_b": pb,
        "digest_a": str(ma.get("digest", "")),
        "digest_b": str(mb.get("digest", "")),
        "decision_digest_a": dda,
        "decision_digest_b": ddb,
        "streams": streams,
        "ignored": {s: sorted(v) for s, v in ignored.items()},
        "provenance": _provenance(ma, mb),
    }
    # Digests of two run layouts (another hash, other columns) say nothing about each other.
    va, vb = ma.get("run_schema_version"), mb.get("run_schema_version")
    if va != vb:
        warnings.append(
            f"the runs have different layouts (run schema {va} and {vb}): their digests are not comparable, "
            "so the events are compared one by one"
        )
        dda = ddb = ""
    # The decision digest covers every compared field unless a non-decision column is to be compared.
    covered = all(NON_DECISION_COLUMNS.get(s, frozenset()) <= set(ignored.get(s, ())) for s in streams)
    if covered and dda and dda == ddb and _as_written(pa_, ma, streams) and _as_written(pb, mb, streams):
        # Same decisions, and the files are the ones digested: nothing to walk.
        counts_a, counts_b = dict(ma.get("counts", {})), dict(mb.get("counts", {}))
        n = sum(int(counts_a.get(s, 0)) for s in streams)
        return DiffResult(
            **summary,
            counts_a=counts_a,
            counts_b=counts_b,
            compared_a=n,
            compared_b=n,
            identical_prefix=n,
            divergence=None,
            warnings=warnings,
        )
    a = _load(pa_, ma, streams, warnings)
    b = _load(pb, mb, streams, warnings)
    fields = _compared_fields(a, b, streams, ignored, warnings)
    a.keys, b.keys = _keys(a, fields), _keys(b, fields)

    pos = next((i for i, (x, y) in enumerate(zip(a.keys, b.keys, strict=False)) if x != y), None)
    if pos is None and len(a.keys) != len(b.keys):
        pos = min(len(a.keys), len(b.keys))
    divergence = None
    if pos is not None:
        ea = _event(a, *a.order[pos]) if pos < len(a.order) else None
        eb = _event(b, *b.order[pos]) if pos < len(b.order) else None
        lo = max(0, pos - context)
        ts = max(e.ts_recv for e in (ea, eb) if e is not None)
        divergence = Divergence(
            position=pos,
            a=ea,
            b=eb,
            differences=_field_diffs(ea, eb, fields),
            context_a=[_event(a, *k) for k in a.order[lo:pos]],
            context_b=[_event(b, *k) for k in b.order[lo:pos]],
            around_a=_around(a, ts, context),
            around_b=_around(b, ts, context),
        )
    if divergence is not None and va == vb and ma.get("digest") == mb.get("digest"):
        warnings.append("the manifests report the same digest, yet the events differ")
    elif divergence is not None and dda and dda == ddb:
        warnings.append("the manifests report the same decision digest, yet the decisions differ")
    elif divergence is None and dda and ddb and dda != ddb:
        warnings.append(
            "the decision digests differ: the runs decided differently in streams or fields not compared "
            f"here (compared: {', '.join(streams)}; try --streams {','.join(COMPARABLE_STREAMS)})"
        )
    return DiffResult(
        **summary,
        counts_a={s: t.num_rows for s, t in a.tables.items()} | dict(ma.get("counts", {})),
        counts_b={s: t.num_rows for s, t in b.tables.items()} | dict(mb.get("counts", {})),
        compared_a=len(a.keys),
        compared_b=len(b.keys),
        identical_prefix=len(a.keys) if pos is None else pos,
        divergence=divergence,
        warnings=warnings,
    )


# ---------------------------------------------------------------------------------------------------
# printing


def _fmt(v: Any, digits: int | None = None) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else repr(v) if digits is None else format(v, f".{digits}g")
    if isinstance(v, Decimal):
        return format(v.normalize(), "f")
    return str(v)


def _brief(e: EventRef) -> str:
    return " ".join(f"{k}={_fmt(v, 8)}" for k, v in e.fields.items() if k not in _COMMON)


def _dt_ms(ts: int, ref: int) -> str:
    return f"{(ts - ref) / 1e6:+.3f}"


def _events_table(title: str, events: Sequence[EventRef], ref: int, mark: EventRef | None = None) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_lines=False)
    t.add_column("Δt ms", justify="right")
    t.add_column("stream")
    t.add_column("#", justify="right")
    t.add_column("event", overflow="fold")
    for e in (*events, *([mark] if mark else [])):
        style = "bold red" if e is mark else None
        t.add_row(_dt_ms(e.ts_recv, ref), e.stream, str(e.index), _brief(e), style=style)
    return t


def _utc(ts_ns: int) -> str:
    """A nanosecond timestamp as a UTC time a reader can place (the raw integer stays beside it)."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts_ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def run_pnl(run: Path) -> str:
    """The run's PnL in USDT (every instrument, marked at its last mid), or why there is none."""
    import duckdb

    from analysis.report import connect

    try:
        con = connect(run)
    except DualhubError:
        return "n/a (not a verified run)"
    try:
        [(pnl,)] = con.sql("SELECT sum(pnl) FROM symbol_pnl WHERE mark_px IS NOT NULL").fetchall()
    except duckdb.Error:
        return "n/a"
    finally:
        con.close()
    return "n/a (no fills)" if pnl is None else f"{float(pnl):.4f}"


def print_diff(result: DiffResult, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    summary = Table(title="Runs", title_justify="left")
    summary.add_column("")
    summary.add_column("A", overflow="fold")
    summary.add_column("B", overflow="fold")
    summary.add_row("run", str(result.run_a), str(result.run_b))
    same_dd = result.same_decision_digest
    verdict = {
        True: "[green]same decisions[/]",
        False: "[yellow]different decisions[/]",
        None: "not recorded",
    }
    summary.add_row(
        f"decision digest ({verdict[same_dd]})",
        result.decision_digest_a or "(none)",
        result.decision_digest_b or "(none)",
    )
    same = "[green]same digest[/]" if result.same_digest else "[yellow]different digests[/]"
    summary.add_row(f"digest ({same})", result.digest_a, result.digest_b)
    pnl_a, pnl_b = run_pnl(Path(result.run_a)), run_pnl(Path(result.run_b))
    summary.add_row("PnL (USDT)", pnl_a, pnl_b, style=None if pnl_a == pnl_b else "yellow")
    for s in sorted(result.counts_a.keys() | result.counts_b.keys(), key=lambda s: STREAMS[s].priority):
        ca, cb = result.counts_a.get(s), result.counts_b.get(s)
        style = None if ca == cb else "yellow"
        marker = " *" if s in result.streams else ""
        summary.add_row(f"{s}{marker}", _fmt(ca), _fmt(cb), style=style)
    console.print(summary)
    console.print(
        f"compared (*): {', '.join(result.streams)}; ignored fields: "
        + (", ".join(f"{s}.{f}" for s, fs in result.ignored.items() for f in fs) or "none")
    )
    if result.provenance:
        prov = Table(title="Provenance differences (manifests)", title_justify="left")
        for c in ("field", "A", "B"):
            prov.add_column(c, overflow="fold")
        for f in result.provenance:
            prov.add_row(f.field, _fmt(f.a), _fmt(f.b))
        console.print(prov)
    for w in result.warnings:
        console.print(f"[bold yellow]warning:[/] {w}")

    d = result.divergence
    if d is None:
        console.print(
            f"[bold green]no divergence[/]: {result.identical_prefix} decision events identical in both runs"
        )
        return
    console.print(
        f"[bold red]first divergence[/] at merged event {d.position} "
        f"(after {result.identical_prefix} identical events), at {_utc(d.ts_recv)} (ts_recv {d.ts_recv})"
    )
    where = Table(title="Divergence", title_justify="left")
    for c in ("field", "A", "B"):
        where.add_column(c, overflow="fold")
    where.add_row("event", *(f"{e.stream} #{e.index}" if e else "(run ended)" for e in (d.a, d.b)))
    for f in d.differences:
        where.add_row(f.field, _fmt(f.a), _fmt(f.b), style="red")
    console.print(where)
    ref = d.ts_recv
    console.print(_events_table("Run A: decisions before (last row: divergent)", d.context_a, ref, d.a))
    console.print(_events_table("Run B: decisions before (last row: divergent)", d.context_b, ref, d.b))
    if d.around_a or d.around_b:
        console.print(_events_table("Run A: labels and Kev responses up to then", d.around_a, ref))
        console.print(_events_table("Run B: labels and Kev responses up to then", d.around_b, ref))
