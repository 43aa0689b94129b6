"""The run's files: the session directory made at the start (``record.json``, ``live.json``), the
manifest's static part (in each run's journal header from the first event on), and at the end the
session finished as ``dualhub record`` finishes one, every run's files and manifest, ``live.json``'s
summary and the run's result. Each takes the run's state (:class:`live.state.RunState`) as it stands.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from engine.contract import ContractConfig
from engine.core import EngineConfig, engine_identity
from engine.errors import DualhubError
from engine.eventlog import RUN_SCHEMA_VERSION
from engine.events import events_to_table
from engine.kev.cassette import CASSETTE_FILE
from engine.kev.health import answer_times_ns, run_health
from engine.latency.recorded import RECORDED_FILE
from engine.laya.model import Laya
from engine.store import MANIFEST, atomic_write_parquet, open_session, sha256_file, write_json
from live.config import LIVE_JSON
from live.private_ws import describe
from live.state import RunState
from live.symbol import SymbolRun
from live.wal import LiveWal
from recorder.record import RECORD_JSON, finish, normalise_segment
from wire.bitget.bitget_v2 import INST_TYPE

log = logging.getLogger("live.runner")  # the run's one logger name (live/feed.py says why)

EXIT_OK, EXIT_KILLED, EXIT_FAILED = 0, 3, 1


@dataclass(frozen=True)
class LiveResult:
    session_dir: Path
    run_dirs: dict[str, Path]
    stopped_by: str
    killed: str
    exit_code: int
    counts: dict[str, dict[str, int]]
    summary: dict[str, Any]


def prepare_dirs(r: RunState) -> None:
    """The session directory, refused where a session, a recording or the kill file is already there:
    ``record.json`` (what ``dualhub recover`` needs) and ``live.json`` (how to reach the run)."""
    if (r.root / MANIFEST).exists():
        raise DualhubError(f"{r.root} already holds a finished session")
    if (r.root / RECORD_JSON).exists():
        raise DualhubError(f"{r.root} holds an unfinished recording; `dualhub recover {r.root}` it")
    if r.kill_file.exists():
        raise DualhubError(f"kill file {r.kill_file} exists: remove it to trade")
    parent = r.kill_file.parent  # the switch must be reachable (the default's is the run's own)
    if parent != r.root and not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
        raise DualhubError(
            f"kill file {r.kill_file} could never be created: {parent} is not a writable directory"
        )
    r._made_root = not r.root.exists()
    r.root.mkdir(parents=True, exist_ok=True)
    cfg_json = r.cfg.to_json()
    r._asked = {
        "url": r.public_url,
        "inst_type": INST_TYPE,
        "symbols": list(r.cfg.symbols),
        "channels": ["books15", "trade"],
        "connections": 1,
        "config": cfg_json,
        "config_sha256": r.cfg.sha256(),
    }
    r.started_ns = time.time_ns()
    write_json(r.root / RECORD_JSON, {**r._asked, "started_ns": r.started_ns})
    r._prepared = True
    write_json(
        r.root / LIVE_JSON,
        {
            "pid": os.getpid(),
            "mode": r.cfg.mode,
            "started_ns": r.started_ns,
            "rest_url": r.rest_url,
            "public_url": r.public_url,
            "private_url": r.private_url if r.cfg.mode == "live" else "",
            "kill_file": str(r.kill_file),
            "running": True,
        },
    )


def static_manifest(r: RunState, symbol: str, contracts: dict[str, ContractConfig]) -> dict[str, Any]:
    """What a run's manifest says of how the run was set up: in its journal's header from the start
    (``dualhub recover`` builds a killed run's manifest from it) and in the manifest at the end."""
    info = r.laya.describe()
    return {
        "run_schema_version": RUN_SCHEMA_VERSION,
        "kind": "live",
        "model": {
            "file": Path(r.cfg.model_path).name,
            "path": str(Path(r.cfg.model_path).resolve()),
            "sha256": info["model_sha256"],
            "feature_version": info["feature_version"],
        },
        "seeds": {"live": r.cfg.seed},
        "symbol": symbol if not r.cfg.portfolio else "",
        "symbols": list(r.cfg.symbols),
        "config": r.cfg.to_json(),
        "config_sha256": r.cfg.sha256(),
        "engine_config": _engine_config_json(r.engine_configs[symbol]),
        # every instrument's as resolved at the start (a portfolio's first is engine_config): what
        # `dualhub parity` replays them with
        "engine_configs": {s: _engine_config_json(r.engine_configs[s]) for s in contracts},
        # the tickers' mids a portfolio's sizes were scaled by (none asked: every size was named)
        **({"reference_mids": dict(r.ref_mids)} if r.ref_mids else {}),
        "contract_source": r.contract_source,
    }


def runtime(laya: Laya) -> dict[str, Any]:
    """The run's runtime: where Laya ran, and the engine's build."""
    info = laya.describe()
    return {
        **{k: info.get(k) for k in ("requested_providers", "active_provider", "fallback_reason")},
        **engine_identity(),
    }


def wal_header(
    r: RunState,
    run_dir: Path,
    symbol: str,
    contracts: dict[str, ContractConfig],
    advisor: str,
    run_tag: str,
) -> dict[str, Any]:
    return {
        "run": run_dir.name,
        "session": str(r.root.resolve()),
        "mode": r.cfg.mode,
        "rest_url": r.rest_url,
        "run_tag": run_tag,  # the venue's client oid of engine order dh-N is run_tag + "dh-N"
        "started_ns": r.started_ns,
        "advisor": advisor,
        "kev_timeout_ms": r.cfg.kev_timeout_ms,
        "manifest": static_manifest(r, symbol, contracts),
        "runtime": runtime(r.laya),
    }


def finish_files(r: RunState) -> None:
    session_manifest: dict[str, Any] | None = None
    if r._journal is None:  # never started (refused at setup): leave nothing half-made behind
        close_wals(r._wals, r.errors)
        for tmp in r._tmp_runs:  # an instrument refused mid-build has a directory, no engine
            shutil.rmtree(tmp, ignore_errors=True)
        r.syms.clear()
        for made in (r.root / RECORD_JSON, r.root / LIVE_JSON):
            made.unlink(missing_ok=True)
        _rmdir_if_empty(r.root / "runs")
        if r._made_root:
            _rmdir_if_empty(r.root)
        return
    else:
        j = r._journal.inner
        end = time.time_ns()
        if r._feed is not None:
            for key in list(r._feed.open_gaps):
                r._feed.close_gap(key, end, how="shutdown")
        j.meta(end, 0xFFFF, {"t": "stop", "reason": r.stop_reason or "stopped"})
        last = j.close()
        assert r._norm is not None
        if last is not None:
            normalise_segment(last, r._norm, r._writer)
            r._segments.append(last)
        extra = {
            "recovered": False,
            "stopped_by": r.stop_reason,
            "journal": {
                "segments": [p.name for p in j.finished],
                "records": j.records,
                "frames": j.frames,
            },
            "live": {
                "mode": r.cfg.mode,
                "runs": sorted({f"runs/{st.run_dir.name}" for st in r.syms.values()}),
            },
        }
        session_manifest = finish(r._writer, r._norm, extra)
    finished: set[Path] = set()
    for st in r.syms.values():
        if st.run_dir in finished:  # a portfolio's instruments share one run
            continue
        finished.add(st.run_dir)
        try:
            finish_run(r, st, session_manifest is not None)
        except Exception as e:
            r.errors.append(f"{st.symbol}: finishing the run failed: {type(e).__name__}: {e}")
            log.error("%s: finishing the run failed: %s", st.symbol, e)
    close_wals(r._wals, r.errors)  # a run that could not be finished keeps its journal: `dualhub recover` it
    write_json(r.root / LIVE_JSON, {**_live_json(r.root), "running": False, "summary": summary(r)})


def close_wals(wals: list[LiveWal], errors: list[str]) -> None:
    for wal in wals:
        try:
            wal.close()
        except OSError as e:
            errors.append(f"write-ahead journal: {type(e).__name__}: {e}")


def _live_json(root: Path) -> dict[str, Any]:
    try:
        return orjson.loads((root / LIVE_JSON).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}


def finish_run(r: RunState, st: SymbolRun, have_session: bool) -> None:
    files = st.log.write()
    rec_path = st.tmp / "events" / "reconcile.parquet"
    atomic_write_parquet(events_to_table(st.reconcile, "reconcile"), rec_path)
    files["events/reconcile.parquet"] = {"rows": len(st.reconcile), "sha256": sha256_file(rec_path)}
    ven_path = st.tmp / "events" / "venue_status.parquet"
    atomic_write_parquet(events_to_table(st.venue, "venue_status"), ven_path)
    files["events/venue_status.parquet"] = {"rows": len(st.venue), "sha256": sha256_file(ven_path)}
    # the same file a replay writes for the session rows it kept out (outside the digest)
    q_path = st.tmp / "events" / "input_quarantine.parquet"
    atomic_write_parquet(events_to_table(st.quarantine, "input_quarantine"), q_path)
    files["events/input_quarantine.parquet"] = {"rows": len(st.quarantine), "sha256": sha256_file(q_path)}
    if r.portfolio is not None:  # a hub's legging episodes (engine/legs.py), as a replay writes them
        r.portfolio.legs.finish(r.clock.now_ns())
        files.update(r.portfolio.legs.write(st.tmp / "events"))
    lat = st.sink.write(st.tmp)
    files[RECORDED_FILE] = {"rows": len(st.sink), "sha256": sha256_file(lat)}
    cassette = st.kev.cassette()
    cas = cassette.write(st.tmp / CASSETTE_FILE)
    files[CASSETTE_FILE] = {"rows": len(cassette), "sha256": sha256_file(cas)}
    answers = answer_times_ns(cassette)
    health = r.kev_health[st.symbol] = run_health(
        st.tmp / "events", r.cfg.kev_timeout_ms, answers, answers_only=True
    )
    if health["warning"]:
        log.warning("%s: %s", st.symbol, health["warning"])
    session: dict[str, Any] = {"path": str(r.root.resolve())}
    if have_session:
        s = open_session(r.root)
        session.update(digest=s.digest(), files=s.manifest["files"])
    contracts = {x.symbol: x.contract for x in r.syms.values() if x.run_dir == st.run_dir}
    # everything is in the journal now (the log's write handed the core's last rows over)
    wal = st.wal.close() if st.wal is not None else {}
    manifest = {
        **static_manifest(r, st.symbol, contracts),
        "digest": st.log.digest,
        "decision_digest": st.log.decision_digest,
        "session": session,
        "inputs": {"books15": r.books, "trade": r.trades},
        "advisor": {"mode": "live", "name": st.advisor.name, "recorded": len(cassette), "health": health},
        "counts": st.log.counts(),
        "reconcile": len(st.reconcile),
        "venue_status": len(st.venue),
        "stopped_by": r.stop_reason,
        "killed": r.killed,
        "killed_at_ns": r.killed_at_ns,
        "crash": r._redact(f"{type(r.crash).__name__}: {r.crash}") if r.crash else "",
        "shutdown": r.shutdown_info,
        "files": files,
        "wal": wal,
        "recovered": False,  # `dualhub recover` writes what it rebuilt from the journal here
    }
    write_json(st.tmp / "manifest.json", manifest)
    write_json(st.tmp / "runtime.json", runtime(r.laya))
    if st.run_dir.exists():
        shutil.rmtree(st.run_dir)
    st.tmp.rename(st.run_dir)


def summary(r: RunState) -> dict[str, Any]:
    return {
        "stopped_by": r.stop_reason,
        "killed": r.killed,
        "crash": r._redact(f"{type(r.crash).__name__}: {r.crash}") if r.crash else "",
        "frames": r.frames,
        "books": r.books,
        "trades": r.trades,
        "quarantined": dict(sorted(r.quarantined.items())),
        "counts": {s: st.log.counts() for s, st in r.syms.items()},
        "reconcile": {s: len(st.reconcile) for s, st in r.syms.items()},
        "periodic_reconciles": r.reconciler.count if r.reconciler is not None else 0,
        "venue": {
            "lost": r.venue_lost,
            "at_exit": r.venue_at_exit,
            "links": r.venue_health.states(),
        },
        "tasks_failed": r.tasks_failed,
        "flatten": r.flatten,
        "shutdown": r.shutdown_info,
        "private_ws": describe(r.private),
        "gateway": {"requests": r.gateway.requests, "errors": r.gateway.errors}
        if r.gateway is not None
        else {},
        "errors": [r._redact(e) for e in r.errors[-20:]],
        "kev_health": r.kev_health,
    }


def result(r: RunState) -> LiveResult:
    # a run that lost the venue, or ended while a link was out, did not end well, whatever stopped it
    failed = r.crash is not None or r.feed_failed or r.venue_lost or r.venue_at_exit or r.tasks_failed
    code = EXIT_FAILED if failed else EXIT_KILLED if r.killed else EXIT_OK
    return LiveResult(
        session_dir=r.root,
        run_dirs={s: st.run_dir for s, st in r.syms.items()},
        stopped_by=r.stop_reason,
        killed=r.killed,
        exit_code=code,
        counts={s: st.log.counts() for s, st in r.syms.items()},
        summary=summary(r),
    )


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:  # not there, or holds what this run did not make
        pass


def _engine_config_json(ec: EngineConfig) -> dict[str, Any]:
    def conv(o: Any) -> Any:
        if isinstance(o, Decimal):
            return str(o)
        raise TypeError(type(o).__name__)

    return orjson.loads(orjson.dumps(dataclasses.asdict(ec), default=conv))
