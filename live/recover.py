"""``dualhub recover`` of a live session: a run killed without its shutdown (``kill -9``, a crash, a
power cut) rebuilt from its write-ahead journal (:mod:`live.wal`) into a complete run.

Given the session directory ``dualhub live`` wrote (or one of its ``runs/live-*.tmp``):

1. the market data: an unfinished session is recovered by the recorder (:func:`recorder.recover`);
2. every ``runs/<run>.tmp`` holding a journal: its intact records are read (a torn tail is ignored, a
   damaged record ends the read: one line says where), and the run is written as the runner writes
   one (event streams, reconcile/venue/quarantine events, recorded delays, Kev cassette, manifest of
   kind ``live``, its static part from the journal's header) into a staging directory, renamed into
   place when complete: an interrupted recovery leaves the ``.tmp`` as it was, to run again;
3. the venue (``--live`` runs, when keys are given and it answers): the orders the journal leaves open,
   the venue's open orders of the run's client-oid tag and the positions are compared, each difference
   a reconcile event; an unreachable venue is one line and the run is marked unreconciled. A paper
   run's venue died with its process: nothing to compare.

The manifest's ``recovered`` says what was rebuilt and to when (``durable_until_ns``: the last event
journaled, no later than the session's last frame): events after it were never durable.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.errors import DualhubError
from engine.eventlog import OUTPUT_STREAMS, EventLog
from engine.events import STREAMS, events_to_table
from engine.kev.cassette import CASSETTE_FILE, Cassette, CassetteEntry
from engine.kev.health import answer_times_ns, run_health
from engine.latency.recorded import RECORDED_FILE, LatencySink
from engine.store import MANIFEST, SessionError, atomic_write_parquet, open_session, sha256_file, write_json
from live.gateway import BitgetGateway, GatewayTransportError
from live.wal import EVENT_STREAMS, WAL_FILE, WalContent, load_wal
from recorder.record import RECORD_JSON
from recorder.recover import recover as recover_session
from wire.bitget.bitget_v2_rest import BitgetError, Credentials, net_position

LIVE_JSON = "live.json"  # live.config's; not imported: that module pulls in the engine
FINISHED_KINDS = ("done", "reject", "cancel_ack")  # an order the engine was told is over


@dataclass(frozen=True)
class Recovered:
    run_dir: Path
    counts: dict[str, int]
    orders: int  # orders the engine sent (order events of kind "new")
    wal_problem: str
    reconcile: dict[str, Any]


def is_live_target(path: Path | str) -> bool:
    """Whether ``dualhub recover PATH`` means a live session (or one of its unfinished runs)."""
    return bool(_unfinished_runs(Path(path))[1]) or (Path(path) / LIVE_JSON).is_file()


def _unfinished_runs(p: Path) -> tuple[Path, list[Path]]:
    """(session root, its runs in the making that hold a journal)."""
    if p.name.endswith(".tmp") and p.parent.name == "runs":
        return p.parent.parent, [p] if (p / WAL_FILE).is_file() else []
    runs = sorted(r for r in (p / "runs").glob("*.tmp") if (r / WAL_FILE).is_file())
    return p, runs


def recover_live(
    path: Path | str,
    *,
    credentials: Credentials | None = None,
    say: Callable[[str], None] = print,
) -> list[Recovered]:
    """Recover the session's market data if unfinished, then rebuild each unfinished run."""
    root, runs = _unfinished_runs(Path(path))
    if Path(path).name.endswith(".tmp") and not runs:
        raise DualhubError(f"{path} holds no {WAL_FILE}: not a live run in the making")
    journals = {}
    for tmp in runs:  # every journal read before anything is changed
        final = tmp.with_name(tmp.name.removesuffix(".tmp"))
        if final.exists():
            raise DualhubError(f"{final} exists already: move it away to rebuild {tmp.name} from its journal")
        content = journals[tmp] = load_wal(tmp / WAL_FILE)
        if not content.header:
            why = f" ({content.scan.problem})" if content.scan.problem else ""
            raise DualhubError(
                f"{tmp / WAL_FILE}: no journal header survived{why}: nothing to rebuild the run from"
            )
    if not (root / MANIFEST).is_file():
        if not (root / RECORD_JSON).is_file():
            raise DualhubError(f"{root} has neither a session manifest nor {RECORD_JSON}: not a live session")
        try:
            recover_session(root)
        except SessionError as e:
            raise DualhubError(str(e)) from None
        say(f"recover: the session's market data rebuilt from its journal ({root})")
    if not runs:
        say(f"recover: {root} holds no unfinished live run")
    out = [_rebuild(tmp, root, journals[tmp], credentials, say) for tmp in runs]
    _mark_live_json(root, out)
    return out


def _mark_live_json(root: Path, runs: list[Recovered]) -> None:
    p = root / LIVE_JSON
    try:
        live = orjson.loads(p.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        live = {}
    if not isinstance(live, dict):
        live = {}
    live.update(
        running=False,
        recovered={
            "at_ns": time.time_ns(),
            "runs": [f"runs/{r.run_dir.name}" for r in runs],
        },
    )
    write_json(p, live)


class _Columns:
    """A stream's journaled tables handed to an :class:`EventLog` as columns (the core's way in)."""

    def __init__(self, stream: str, tables: list[pa.Table]) -> None:
        self.schema = STREAMS[stream].schema
        self.table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        self.off = 0

    def pending(self) -> int:
        return self.table.num_rows - self.off

    def rows(self, first_seq: int, n: int, consume: bool) -> pa.Table:
        head = self.table.slice(self.off, n)
        if consume:
            self.off += n
        cols = [c.combine_chunks() for c in head.columns]
        seq = pa.array(range(first_seq, first_seq + n), type=pa.int64())
        cols.insert(2, seq)  # every output schema is (ts_event, ts_recv, seq, ...)
        return pa.Table.from_arrays(cols, schema=self.schema)


def _session_span(root: Path, until_ns: int) -> tuple[dict[str, Any], int, int]:
    """The session's digest and files, its last frame's receive time and its trades up to ``until_ns``
    (the receive times alone are read: a session of hours holds millions of books)."""
    s = open_session(root)
    last, trades = 0, 0
    for stream in ("books15", "trade"):
        for f in s.files(stream):
            try:
                t = pq.read_table(f, columns=["ts_recv"]).column("ts_recv")
            except (pa.ArrowException, OSError) as e:
                raise DualhubError(f"{f}: cannot read it ({type(e).__name__})") from None
            if len(t):
                last = max(last, int(pc.max(t).as_py()))
            if stream == "trade":
                trades += int(pc.sum(pc.less_equal(t, until_ns)).as_py() or 0)
    return {"path": str(root.resolve()), "digest": s.digest(), "files": s.manifest["files"]}, last, trades


def _rebuild(
    tmp: Path, root: Path, content: WalContent, creds: Credentials | None, say: Callable[[str], None]
) -> Recovered:
    final = tmp.with_name(tmp.name.removesuffix(".tmp"))
    if content.scan.problem:
        say(f"recover: {content.scan.problem}")
    stage = tmp.with_name(tmp.name.removesuffix(".tmp") + ".recovering")
    shutil.rmtree(stage, ignore_errors=True)
    try:
        result = _write_run(stage, root, content, creds, say)
        shutil.copy2(tmp / WAL_FILE, stage / WAL_FILE)  # the journal stays with the run it made
        stage.rename(final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)  # the .tmp is untouched: recover can run again
        raise
    shutil.rmtree(tmp)
    return Recovered(final, result["counts"], result["orders"], content.scan.problem, result["reconcile"])


def _write_run(
    stage: Path, root: Path, c: WalContent, creds: Credentials | None, say: Callable[[str], None]
) -> dict[str, Any]:
    h = c.header
    (stage / "events").mkdir(parents=True)
    log = EventLog(stage / "events")
    for stream in OUTPUT_STREAMS:  # the core's streams as columns first, then the appended rows
        tables = c.tables.get(stream)
        if tables:
            if c.rows.get(stream):
                raise DualhubError(f"{WAL_FILE}: stream {stream} journaled both as rows and as tables")
            cols = _Columns(stream, tables)
            log.attach_columns(stream, cols.rows, cols.pending)
    for stream, rows in c.rows.items():
        for row in rows:
            log.append(stream, row)
    files = log.write()

    session, last_frame_ns, trades = _session_span(root, c.last_ts_ns)
    durable_until = min(c.last_ts_ns, last_frame_ns) if last_frame_ns else c.last_ts_ns
    reconcile = [STREAMS["reconcile"].event_type(**e) for e in c.events.get("reconcile", [])]
    venue_state = _reconcile_with_venue(stage, h, c, creds, reconcile)
    say(f"recover: {h['run']}: {venue_state['line']}")

    for stream in EVENT_STREAMS:
        events = (
            reconcile
            if stream == "reconcile"
            else [STREAMS[stream].event_type(**e) for e in c.events.get(stream, [])]
        )
        path = stage / "events" / f"{stream}.parquet"
        atomic_write_parquet(events_to_table(events, stream), path)
        files[f"events/{stream}.parquet"] = {"rows": len(events), "sha256": sha256_file(path)}
    sink = LatencySink()
    for kind, ts, dur in c.latency:
        sink.add(kind, ts, dur)
    lat = sink.write(stage)
    files[RECORDED_FILE] = {"rows": len(sink), "sha256": sha256_file(lat)}
    cassette = Cassette(meta={"recorded_by": "dualhub live", "lag": "engine-observed", "recovered": "true"})
    for slot in sorted(c.cassette):
        cassette.add(CassetteEntry(**c.cassette[slot]))
    cas = cassette.write(stage / CASSETTE_FILE)
    files[CASSETTE_FILE] = {"rows": len(cassette), "sha256": sha256_file(cas)}
    answers = answer_times_ns(cassette)
    health = run_health(stage / "events", int(h.get("kev_timeout_ms", 2000)), answers, answers_only=True)

    counts = log.counts()
    orders = pq.read_table(stage / "events" / "order.parquet", columns=["kind"]).column("kind")
    n_new = int(pc.sum(pc.equal(orders, "new")).as_py() or 0)
    manifest = {
        **h["manifest"],
        "digest": log.digest,
        "decision_digest": log.decision_digest,
        "session": session,
        "inputs": {"books15": counts.get("label", 0), "trade": trades},
        "advisor": {
            "mode": "live",
            "name": h.get("advisor", ""),
            "recorded": len(cassette),
            "health": health,
        },
        "counts": counts,
        "reconcile": len(reconcile),
        "venue_status": len(c.events.get("venue_status", [])),
        "stopped_by": "crash",
        "killed": "",
        "killed_at_ns": 0,
        "crash": "the process ended without its shutdown (kill -9, a crash or a power cut): "
        "rebuilt from its write-ahead journal by `dualhub recover`",
        "shutdown": {},
        "files": files,
        "wal": {"file": WAL_FILE, "records": len(c.scan.records), "bytes": c.scan.good_bytes},
        "recovered": {
            "at_ns": time.time_ns(),
            "durable_until_ns": durable_until,
            "last_journaled_ns": c.last_ts_ns,
            "wal_problem": c.scan.problem,
            "cut_bytes": c.scan.total_bytes - c.scan.good_bytes,
            "reconciled": venue_state["state"] == "reconciled",
            "venue": venue_state,
        },
    }
    write_json(stage / MANIFEST, manifest)
    write_json(stage / "runtime.json", h.get("runtime", {}))
    return {"counts": counts, "orders": n_new, "reconcile": venue_state}


# ---------------------------------------------------------------------------------------- the venue


def _journal_orders(c: WalContent) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Per client oid: symbol, size, filled, finished (what the journal says); last position per symbol."""
    orders: dict[str, dict[str, Any]] = {}
    for t in c.tables.get("order", []):
        for r in t.select(["client_oid", "symbol", "kind", "qty"]).to_pylist():
            o = orders.setdefault(
                r["client_oid"], {"symbol": r["symbol"], "qty": 0.0, "filled": 0.0, "done": ""}
            )
            if r["kind"] == "new":
                o["qty"] = float(r["qty"])
            elif r["kind"] in FINISHED_KINDS:
                o["done"] = r["kind"]
    positions: dict[str, float] = {}
    for t in c.tables.get("fill", []):
        for r in t.select(["client_oid", "symbol", "qty", "position_after"]).to_pylist():
            if r["client_oid"] in orders:
                orders[r["client_oid"]]["filled"] += float(r["qty"])
            positions[r["symbol"]] = float(r["position_after"])
    return orders, positions


def _reconcile_with_venue(
    stage: Path, h: dict[str, Any], c: WalContent, creds: Credentials | None, events: list[Any]
) -> dict[str, Any]:
    """Compare the venue with the journal (live runs); new differences are appended to ``events``."""
    if h.get("mode") != "live":
        return {
            "state": "no_venue",
            "line": "paper run: its simulated venue ended with the process; nothing to reconcile",
        }
    url = h.get("rest_url", "")
    if creds is None:
        return {
            "state": "unreconciled",
            "line": f"venue {url} not asked: no API keys in the environment (BITGET_API_KEY, "
            "BITGET_API_SECRET, BITGET_API_PASSPHRASE); the run is marked unreconciled",
        }
    try:
        diffs = asyncio.run(_compare(url, creds, h, c))
    except (BitgetError, GatewayTransportError, OSError) as e:
        why = creds.redact(f"{type(e).__name__}: {e}")[:300]
        return {
            "state": "unreconciled",
            "line": f"venue {url} not reachable ({why}); the run is marked unreconciled",
        }
    ts = time.time_ns()
    cls = STREAMS["reconcile"].event_type
    for d in diffs:
        events.append(cls(ts_event=ts, ts_recv=ts, seq=len(events), **d))
    return {
        "state": "reconciled",
        "line": f"reconciled with {url}: {len(diffs)} differences between the venue and the journal",
        "differences": len(diffs),
    }


async def _compare(url: str, creds: Credentials, h: dict[str, Any], c: WalContent) -> list[dict[str, Any]]:
    tag = str(h.get("run_tag", ""))
    symbols = list(h["manifest"].get("symbols") or [])
    orders, positions = _journal_orders(c)
    out: list[dict[str, Any]] = []

    def diff(sym: str, kind: str, coid: str, oid: str, mine: float, theirs: float, action: str) -> None:
        out.append(
            {
                "symbol": sym,
                "kind": kind,
                "client_oid": coid,
                "order_id": oid,
                "engine_value": mine,
                "exchange_value": theirs,
                "action": action,
            }  # fmt: skip
        )

    gw = BitgetGateway(url, creds, timeout_s=5.0)
    try:
        await gw.sync_time()
        pending = {r.client_oid: r for r in await gw.pending_orders() if r.client_oid.startswith(tag)}
        for coid, o in orders.items():
            sym, venue_oid = o["symbol"], tag + coid
            row = pending.get(venue_oid)
            if o["done"]:
                if row is not None:  # the journal says over, the venue still works it
                    diff(sym, "unknown_order", coid, row.order_id, 0.0, row.size - row.filled, "left_open")
                continue
            if row is None:
                try:
                    row = await gw.order_detail(sym, client_oid=venue_oid)
                except BitgetError:  # the intent was journaled, the venue never took it
                    diff(sym, "missing_on_exchange", coid, "", o["qty"] - o["filled"], 0.0, "recorded")
                    continue
            if row.filled - o["filled"] > 1e-12:
                diff(sym, "missed_fill", coid, row.order_id, o["filled"], row.filled, "recorded")
            if row.status in ("filled", "canceled"):
                diff(sym, "missed_done", coid, row.order_id, 0.0, 1.0, row.status)
            else:  # still working at the venue after the engine died: the watchdog's to cancel
                diff(sym, "open_after_crash", coid, row.order_id, 0.0, row.size - row.filled, "left_open")
        for venue_oid, row in pending.items():
            coid = venue_oid.removeprefix(tag)
            if coid not in orders:
                diff(row.symbol, "unknown_order", coid, row.order_id, 0.0, row.size, "left_open")
        venue_pos = await gw.positions()
        for symbol in symbols:
            mine, theirs = positions.get(symbol, 0.0), net_position(venue_pos, symbol)
            if abs(mine - theirs) > 1e-9:
                diff(symbol, "position_mismatch", "", "", mine, theirs, "recorded")
    finally:
        await gw.aclose()
    return out
