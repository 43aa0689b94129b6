"""A replay's end: the event log's last rows, the manifest and runtime.json written and the run renamed
into place (nothing half-written is left), the warnings a reader needs, and the run directory's rules."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from engine.core import engine_identity
from engine.errors import DualhubError, check_output_path
from engine.eventlog import RUN_SCHEMA_VERSION, EventLog
from engine.kev.health import run_health
from engine.kev.sim import SimKevBackend
from engine.laya.model import Laya, training_sessions
from engine.store import (
    sha256_file,
    write_json,
)
from replay.config import ReplayConfig, RunResult
from replay.kev_setup import _ADVISOR_COUNTS, _kev_lag_info
from replay.run_metrics import MetricsLog
from replay.tape import _Quarantine, _Tape
from replay.tape_stream import (
    FeedClock,
    StreamedTape,
)

CLOCK_WARN_NS = 100_000_000  # a session whose clocks disagree by more than this is warned about


def _finish(
    tmp: Path | None,
    run_dir: Path,
    log: EventLog,
    session: Any,
    cfg: ReplayConfig,
    laya: Laya,
    n_books: int,
    n_trades: int,
    advisor: Any,
    t0: float,
    path: str,
    quarantine: _Quarantine,
    tape: _Tape | StreamedTape,
    kev: SimKevBackend,
) -> RunResult:
    """Write the event log's last rows, the manifest and runtime.json; rename the run into place. A
    metrics-only run (``tmp`` None) writes nothing: its summary is computed from the same manifest."""
    wall = time.perf_counter() - t0
    advisor_info = {
        "mode": cfg.kev_mode,
        "name": advisor.name,
        "deterministic": bool(getattr(advisor, "deterministic", True)),
        **{k: getattr(advisor, k) for k in _ADVISOR_COUNTS if hasattr(advisor, k)},
        "lag": _kev_lag_info(cfg),
    }
    files = log.write()
    if tmp is not None:
        files.update(quarantine.write(tmp / "events"))
        if cfg.kev_mode == "llm" and cfg.kev_lag_source == "measured":  # every answer's time, late ones too
            lat = kev.recorded.write(tmp)
            files[lat.name] = {"rows": len(kev.recorded), "sha256": sha256_file(lat)}
        advisor_info["health"] = run_health(tmp / "events", cfg.kev_timeout_ms, kev.recorded.dur)
    info = laya.describe()
    in_sample = _in_sample(laya, session)
    feed = _feed_info(cfg, session.manifest, tape.clamped)
    manifest = {
        "run_schema_version": RUN_SCHEMA_VERSION,
        "digest": log.digest,
        "decision_digest": log.decision_digest,  # the digest without wall-time columns
        "session": {
            "path": str(session.root.resolve()),
            "digest": session.digest(),
            "files": session.manifest["files"],
        },
        "inputs": {"books15": n_books, "trade": n_trades},
        "model": {
            "file": Path(cfg.model_path).name,
            "sha256": info["model_sha256"],
            "feature_version": info["feature_version"],
        },
        "in_sample": in_sample,
        "feed": feed,
        "seeds": {"replay": cfg.seed, "kev_lag": [cfg.seed, 1]},
        "config": cfg.to_json(),
        "config_sha256": cfg.sha256(),
        "advisor": advisor_info,
        "counts": log.counts(),
        "quarantine": quarantine.counts,
        "files": files,
    }
    summary = None
    if tmp is None:  # metrics only: nothing is written
        assert isinstance(log, MetricsLog)
        wall, summary = time.perf_counter() - t0, log.tally.summary(manifest)
    else:
        write_json(tmp / "manifest.json", manifest)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(run_dir)
        # The provider and the engine path are facts about this run's machine and code path, not about
        # its inputs (both paths give the same events): kept beside the manifest.
        write_json(
            run_dir / "runtime.json",
            {
                **{k: info.get(k) for k in ("requested_providers", "active_provider", "fallback_reason")},
                **engine_identity(),
                "engine_path": path,  # the compiled loop (how it read the books), or per event
                "risk_rules": list(cfg.risk.rules),  # the gateway's rules, in the order they ran
            },
        )
    return RunResult(
        run_dir,
        log.digest,
        log.counts(),
        n_books,
        n_trades,
        wall,
        info,
        advisor_info,
        path,
        quarantine.counts,
        log.decision_digest,
        in_sample,
        feed,
        _warnings(in_sample, feed, session.manifest, Path(cfg.model_path).name),
        summary=summary,
    )


def _in_sample(laya: Laya, session: Any) -> dict[str, Any]:
    """Whether the model was trained on this session: by session digest (``dualhub train``), or by
    simulator seed, length and symbol (``replay.make_default_model``); a multi-symbol simulator
    session (``symbols``, not ``symbol``) counts when the training symbol is one of its symbols."""
    trained = training_sessions(laya.metadata)
    digest, sim = session.digest(), session.manifest.get("simulator") or {}
    sim_symbols = sim.get("symbols") or [sim.get("symbol")]

    def same(e: dict[str, Any]) -> bool:
        if "simulator_seed" in e:
            return (
                bool(sim)
                and (e["simulator_seed"], e["minutes"]) == (sim.get("seed"), sim.get("minutes"))
                and e["symbol"] in sim_symbols
            )
        return e.get("session_digest") == digest

    return {"in_sample": any(same(e) for e in trained), "training_sessions": trained}


def _feed_info(cfg: ReplayConfig, manifest: dict[str, Any], clamped: dict[str, int]) -> dict[str, Any]:
    """The run manifest's ``feed``: how exchange time and local time were put together."""
    clock = FeedClock.of_session(manifest)
    return {
        "exchange_feed": cfg.exchange_feed,
        "latency": cfg.latency_feed,
        "scale": cfg.scale_feed,
        "clock_offset_ns": clock.offset_ns,
        "clock_offset_source": "session manifest 'clock'" if "clock" in manifest else "none: one clock",
        "min_latency_ns": clock.floor_ns,
        "clamped": clamped,
        "rule": "the exchange sees a row when the engine does (ts_recv, as a paper exchange)"
        if cfg.exchange_feed == "local"
        else "the exchange sees a row at ts_event + clock_offset_ns (on the local clock), the engine at "
        + ("ts_recv" if cfg.latency_feed == "recorded" else "that time + the modelled latency")
        + "; a feed latency below min_latency_ns is raised to it (clamped rows)",
    }


def _warnings(
    in_sample: dict[str, Any], feed: dict[str, Any], manifest: dict[str, Any], model: str
) -> tuple[str, ...]:
    out = []
    if in_sample["in_sample"]:
        out.append(
            f"IN-SAMPLE run: model {model} was trained on this session; its results say nothing "
            "about how it does on data it has not seen"
        )
    off = feed["clock_offset_ns"]
    if abs(off) > CLOCK_WARN_NS:
        n = sum(feed["clamped"].values())
        out.append(
            f"session clocks disagree: local - exchange = {off / 1e6:+.1f} ms; the exchange sees market "
            f"data at its event time put on the local clock, {feed['min_latency_ns'] / 1e6:g} ms or more "
            f"before the engine ({n} rows raised to that floor)"
        )
    elif "clock" not in manifest:
        median = ((manifest.get("import") or {}).get("local_minus_exchange_ms") or {}).get("median")
        if isinstance(median, int | float) and abs(median) * 1e6 > CLOCK_WARN_NS:
            out.append(
                f"session clocks disagree (local - exchange median {median:+.1f} ms at import) but the "
                "session has no clock estimate: the exchange sees market data when the engine does; "
                "re-import it to replay with a feed latency"
            )
    return tuple(out)


def _run_dir(session_dir: Path | str, cfg: ReplayConfig, out_dir: Path | str | None) -> Path:
    """``out_dir``, or ``SESSION/runs/run-<hash>`` of the config and the model's content (a model
    retrained into the same file is another run)."""
    if out_dir is not None:
        return Path(out_dir)
    try:
        model = sha256_file(Path(cfg.model_path))
    except OSError:  # Laya says what is wrong with it, before anything is written
        model = ""
    key = hashlib.sha256(f"{cfg.sha256()}\t{model}".encode()).hexdigest()
    return Path(session_dir) / "runs" / f"run-{key[:12]}"


def _tmp_dir(run_dir: Path) -> Path:
    return run_dir.with_name(run_dir.name + ".tmp")


def _is_run(path: Path) -> bool:
    try:
        return "run_schema_version" in orjson.loads((path / "manifest.json").read_bytes())
    except (OSError, orjson.JSONDecodeError, TypeError):
        return False


def _check_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Refuse a run directory that cannot be written or must not be replaced, before any work."""
    check_output_path(run_dir, directory=True)
    if run_dir.exists():
        if not overwrite:
            raise DualhubError(f"{run_dir} exists; pass --overwrite (or another --out) to replace it")
        if any(run_dir.iterdir()) and not _is_run(run_dir):  # --overwrite deletes it: runs only
            raise DualhubError(f"{run_dir} is not a run directory; --overwrite replaces only a previous run")


def _start_run_dir(run_dir: Path, overwrite: bool) -> Path:
    """The run is written into ``<run>.tmp`` and renamed at the end: a half-written run never looks
    finished."""
    _check_run_dir(run_dir, overwrite)
    tmp = _tmp_dir(run_dir)
    if tmp.is_symlink() or tmp.is_file():
        tmp.unlink()
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "events").mkdir(parents=True)
    return tmp


def _progress(enabled: bool, total: int) -> Any:
    """A progress bar over the walk's ``total`` entries (None when not ``enabled``): ``update(n)`` per
    walk chunk, ``update(n, kev)`` per Kev answer (the walk position then, and the answers so far)."""
    import sys

    if not enabled or not sys.stdout.isatty():  # piped, a bar draws nothing but a blank line
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    class _Bar:
        def __init__(self) -> None:
            self.p = Progress(
                "[bold]replay",
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[kev]}"),
                TimeRemainingColumn(),
                transient=True,
            )
            self.p.start()
            self.task = self.p.add_task("replay", total=total, kev="")

        def update(self, n: int, kev: int | None = None) -> None:
            if kev is None:
                self.p.update(self.task, completed=n)
            else:
                self.p.update(self.task, completed=n, kev=f"Kev {kev}")

        def close(self) -> None:
            self.p.update(self.task, completed=total)
            self.p.stop()

    return _Bar()
