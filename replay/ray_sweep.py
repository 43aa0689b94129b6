"""``dualhub sweep`` on Ray: one task per (session, parameter set), one results table.

The grid, the row and the key are :mod:`replay.sweep`'s; this module only distributes
:func:`replay.sweep.run_one` (wrapped by :func:`run_task`) over a Ray cluster:

* **Where.** Without an address a local Ray instance is started, sized to the machine (or to
  ``workers``) and shut down at the end; with one (``ray://head:10001``, ``head:6379`` or ``auto``) the
  sweep joins that cluster. A process that already called ``ray.init`` is reused as it is.
* **Resources.** Each task declares ``num_cpus=1`` and ``memory=memory_mb`` so Ray never places more
  replays on a node than it has cores and memory for. Tasks in flight are capped at twice the slots
  the cluster has (re-read every few seconds, so an autoscaling cluster fills as it grows).
* **Paths.** Sessions and results are local paths (on a cluster: a directory mounted at the same path
  on every node) or filesystem URLs that ``pyarrow.fs.FileSystem.from_uri`` understands (``s3://``,
  ``gs://``, ``hdfs://``, ``file://``). A URL session is copied (manifest and listed files only) to the
  node, once, and kept there (:func:`node_session`: the market cache the node's first run of it builds
  beside it serves the node's later runs), replayed there, and the run directory is uploaded to
  ``<results dir>/runs/<key>``.
* **Key, resume.** A run is keyed by (session digest, parameter hash, code version). The driver
  computes the key from the session's manifest before submitting, skips keys that already have a row
  without an error (``resume``), and runs every other key once. A worker refuses to run when its own
  :func:`~replay.sweep.code_version` differs from the driver's (the row is an error), so a key always
  names the code that produced it.
* **Results.** Rows are collected as tasks finish and the whole table is rewritten atomically
  (temporary file, then rename) after every batch of finished tasks, in the grid's order, so a killed
  driver keeps every row it received; runs finished on a worker but not yet received are run again on
  resume, into the same run directory, with the same digest.
* **Failures are rows.** A run that fails inside :func:`~replay.sweep.run_one` is a row with its error
  (as in the serial sweep); a task that raises out of the worker, a worker that dies (after
  ``max_retries`` retries, e.g. killed by the OOM killer), a lost node or a cancelled task become a row
  with the Ray error.
* **Peak RSS.** A Ray worker is a long-lived process that runs many tasks one after another, so its
  high-water mark (``VmHWM`` in ``/proc/self/status``) would be the largest task it ever ran. The task
  resets it first (``echo 5 > /proc/self/clear_refs``), so ``peak_rss_mb`` is this run's peak, including
  what the worker process already held (imported libraries: about 200 MB); ``peak_rss_scope`` is
  ``"task"`` then, and ``"worker"`` where the reset is not allowed (then it is the worker's peak so far).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from engine.errors import DualhubError
from engine.events import SCHEMA_VERSION
from engine.store import MANIFEST, Session, atomic_write_parquet
from replay.sweep import (
    RESULT_SCHEMA,
    Grid,
    SweepSummary,
    cache_note,
    code_version,
    find_sessions,
    loss_stop_note,
    param_column,
    param_hash,
    param_json,
    results_table,
    run_key,
    run_one,
)

DEFAULT_MEMORY_MB: Final = 2048  # per task; size it from a previous sweep's peak_rss_mb
DEFAULT_MAX_RETRIES: Final = 1  # retries of a task whose worker or node died
_SLOTS_REFRESH_S: Final = 5.0
_ERROR_CHARS: Final = 2000

Runner = Callable[..., dict[str, Any]]
RowKey = tuple[str, str, str]

# ---------------------------------------------------------------------------------------------------
# locations: a local path or a pyarrow filesystem URL


def is_uri(text: str) -> bool:
    return "://" in text


@dataclass(frozen=True)
class Location:
    """A local path or a filesystem URL, with the pyarrow filesystem that reads it."""

    text: str  # what to show and store: the absolute local path, or the URL
    fs: pafs.FileSystem
    path: str  # the path on ``fs``
    prefix: str = ""  # the URL up to ``path`` ("s3://", "file://", "hdfs://host:8020"); "" for local
    query: str = ""  # "?endpoint_override=..." of the URL, kept on every child

    @classmethod
    def parse(cls, text: str) -> Location:
        if not is_uri(text):
            p = str(Path(text).expanduser().resolve())
            return cls(p, pafs.LocalFileSystem(), p)
        base, q, query = text.partition("?")
        try:
            fs, path = pafs.FileSystem.from_uri(text)
        except (pa.ArrowInvalid, OSError) as e:
            raise DualhubError(f"cannot open {text}: {e}") from None
        stem = path.rstrip("/")
        prefix = base.rstrip("/")[: -len(stem)] if stem and base.rstrip("/").endswith(stem) else ""
        return cls(text, fs, path, prefix or base.split("://", 1)[0] + "://", q + query)

    @property
    def remote(self) -> bool:
        return bool(self.prefix)

    def at(self, path: str) -> Location:
        return Location(
            self.prefix + path + self.query if self.prefix else path, self.fs, path, self.prefix, self.query
        )

    def child(self, *parts: str) -> Location:
        return self.at("/".join([self.path.rstrip("/"), *parts]))

    @property
    def parent(self) -> Location:
        return self.at(self.path.rstrip("/").rpartition("/")[0] or "/")

    def exists(self) -> bool:
        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self.fs.get_file_info(self.path).type == pafs.FileType.File


def _has_magic(part: str) -> bool:
    return any(c in part for c in "*?[")


def _glob_dirs(pattern: str) -> list[Location]:
    """Directories matching a URL ``pattern`` (``*``, ``?``, ``[...]`` within path components; the
    URL before the first such component is opened with pyarrow, the rest matched by listing)."""
    base, q, query = pattern.partition("?")
    parts = base.split("/")
    first = next((i for i, p in enumerate(parts) if _has_magic(p) and i > 2), len(parts))
    root = Location.parse("/".join(parts[:first]) + q + query)
    found = [root.path]
    for part in (p for p in parts[first:] if p):
        matched: list[str] = []
        for d in found:
            infos = root.fs.get_file_info(pafs.FileSelector(d, allow_not_found=True))
            matched += [
                i.path
                for i in infos
                if i.type == pafs.FileType.Directory and fnmatch.fnmatchcase(i.base_name, part)
            ]
        found = sorted(matched)
    return [root.at(p) for p in found]


def discover_sessions(patterns: Iterable[str]) -> list[str]:
    """Session directories (with ``manifest.json``) matching local globs or URL globs, in order."""
    patterns = list(patterns)
    found: dict[str, None] = {}
    for pattern in patterns:
        if is_uri(pattern):
            for loc in _glob_dirs(pattern):
                if loc.child(MANIFEST).is_file():
                    found[loc.text] = None
            continue
        try:
            found.update((str(p.resolve()), None) for p in find_sessions([pattern]))
        except DualhubError:
            pass  # no match for this one; an error below if none matches at all
    if not found:
        raise DualhubError(f"no session directory (with manifest.json) matches {', '.join(patterns)}")
    return list(found)


def read_manifest(session: str) -> dict[str, Any]:
    loc = Location.parse(session)
    try:
        with loc.fs.open_input_stream(loc.child(MANIFEST).path) as f:
            manifest = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError) as e:
        raise DualhubError(f"{session} is not a readable session: {e}") from None
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise DualhubError(f"{session}: schema version {manifest.get('schema_version')} != {SCHEMA_VERSION}")
    return manifest


def session_digest(session: str) -> str:
    """The session's content digest (:meth:`engine.store.Session.digest`), from its manifest alone;
    "" when it cannot be read (its runs then fail in the worker and become error rows)."""
    try:
        return Session(Path(), read_manifest(session)).digest()
    except DualhubError:
        return ""


# ---------------------------------------------------------------------------------------------------
# results table on a Location


def read_results_at(loc: Location) -> list[dict[str, Any]]:
    try:
        return pq.read_table(loc.path, filesystem=loc.fs).to_pylist()
    except (OSError, ValueError) as e:
        raise DualhubError(f"cannot read results {loc.text}: {e}") from None


def write_results_at(rows: Sequence[Mapping[str, Any]], loc: Location) -> None:
    """The whole table, atomically: a local file via tmp + fsync + rename; a URL via a temporary
    object moved into place (a rename on local and HDFS filesystems; on object stores the final
    object appears whole)."""
    table = results_table(rows)
    if not loc.remote:
        atomic_write_parquet(table, Path(loc.path))
        return
    loc.fs.create_dir(loc.parent.path, recursive=True)
    tmp = loc.path + ".tmp"
    pq.write_table(table, tmp, filesystem=loc.fs, compression="zstd", write_statistics=True)
    loc.fs.move(tmp, loc.path)


# ---------------------------------------------------------------------------------------------------
# the task


def _reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _vm_hwm_mb() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def failed_row(
    session: str, digest: str, params: Mapping[str, Any], version: str, error: str
) -> dict[str, Any]:
    """The row of a run that produced nothing but an error."""
    row: dict[str, Any] = {c: None for c in RESULT_SCHEMA.names}
    row.update(
        session=session,
        session_digest=digest,
        code_version=version,
        param_hash=param_hash(params),
        params=param_json(params),
        error=error[:_ERROR_CHARS],
    )
    row.update({param_column(k): v for k, v in params.items()})
    return row


def _stage_session(session: Location, into: Path) -> Path:
    """Copy a session's manifest and listed files from its filesystem to a local directory."""
    manifest = read_manifest(session.text)
    local = pafs.LocalFileSystem()
    for rel in [MANIFEST, *sorted(manifest["files"])]:
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(
            session.child(rel).path,
            str(into / rel),
            source_filesystem=session.fs,
            destination_filesystem=local,
        )
    return into


NODE_SESSIONS_ENV: Final = "DUALHUB_SWEEP_SESSIONS"  # where a node keeps sessions staged from URLs


def node_session(session: Location) -> Path:
    """A session behind a URL, copied once per node (by its digest, under ``$DUALHUB_SWEEP_SESSIONS``,
    default ``<tmp>/dualhub-sweep-sessions``) and kept for the node's later tasks: the market cache the
    first run builds beside it is then reused, one copy and one cache build per session per node
    instead of one per task. Each run still checks the copy's files against its manifest."""
    manifest = read_manifest(session.text)
    name = Session(Path(), manifest).digest()[:32]
    root = Path(os.environ.get(NODE_SESSIONS_ENV) or Path(tempfile.gettempdir()) / "dualhub-sweep-sessions")
    root.mkdir(parents=True, exist_ok=True)
    dest = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other tasks of this session wait for the one copy
        if not (dest / MANIFEST).is_file():
            tmp = root / f"{name}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            _stage_session(session, tmp)
            tmp.rename(dest)  # whole, or not there
    return dest


def _run_staged(
    session: str, params: Mapping[str, Any], runs_dir: str, version: str, runner: Runner
) -> dict[str, Any]:
    """Run with local copies where the session or the results live behind a URL."""
    s_loc, r_loc = Location.parse(session), Location.parse(runs_dir)
    scratch = Path(tempfile.mkdtemp(prefix="dualhub-sweep-"))
    try:
        try:
            local_session = node_session(s_loc) if s_loc.remote else Path(s_loc.path)
        except (DualhubError, OSError) as e:
            return failed_row(session, session_digest(session), params, version, f"staging {session}: {e}")
        local_runs = scratch / "runs" if r_loc.remote else Path(r_loc.path)
        row = runner(str(local_session), params, runs_dir=str(local_runs), version=version)
        if s_loc.remote:
            row["session"] = session
        if r_loc.remote and row.get("run_dir"):
            dest = r_loc.child(Path(row["run_dir"]).name)
            try:
                dest.fs.delete_dir_contents(dest.path, missing_dir_ok=True)
                dest.fs.create_dir(dest.path, recursive=True)
                pafs.copy_files(
                    row["run_dir"],
                    dest.path,
                    source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=dest.fs,
                )
                row["run_dir"] = dest.text
            except OSError as e:
                row["error"] = row["error"] or f"uploading the run to {dest.text}: {e}"
        return row
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_task(
    session: str, params: Mapping[str, Any], *, runs_dir: str, version: str, runner: Runner | None = None
) -> dict[str, Any]:
    """One sweep run inside a Ray worker: :func:`replay.sweep.run_one` (or ``runner``, same signature)
    on a local path or a URL, refused when this worker's code version is not the driver's; then the
    task's own peak RSS and the worker that ran it."""
    scoped = _reset_peak_rss()
    mine = code_version()
    if mine != version:
        row = failed_row(
            session,
            "",
            params,
            version,
            f"worker code version {mine} != driver's {version}; install the same dualhub on every node",
        )
    elif is_uri(session) or is_uri(runs_dir):
        row = _run_staged(session, params, runs_dir, version, runner or run_one)
    else:
        row = (runner or run_one)(session, params, runs_dir=runs_dir, version=version)
    hwm = _vm_hwm_mb()
    if hwm is not None:
        row.update(peak_rss_mb=hwm, peak_rss_scope="task" if scoped else "worker")
    row["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    return row


# ---------------------------------------------------------------------------------------------------
# the driver


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise DualhubError(
            "Ray is not installed: pip install 'dualhub[scale]' (or run with --serial)"
        ) from None
    return ray


def _start_ray(ray: Any, address: str | None, workers: int | None, init_kwargs: Mapping[str, Any]) -> bool:
    """Start or join Ray; True when this call started it (and so must shut it down)."""
    if ray.is_initialized():
        if address:
            raise DualhubError(f"Ray is already initialized in this process; cannot join {address}")
        return False
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, **init_kwargs}
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(
                address="local", num_cpus=workers or os.cpu_count() or 1, include_dashboard=False, **kwargs
            )
    except (ConnectionError, RuntimeError, ValueError) as e:
        if not address:
            raise DualhubError(f"cannot start Ray: {e}") from None
        raise DualhubError(
            f"cannot join Ray at {address}: {e} (a cluster with token authentication also needs "
            "RAY_AUTH_MODE=token and its token here: RAY_AUTH_TOKEN or ~/.ray/auth_token; docs/SCALE.md)"
        ) from None
    return True


def _slots(ray: Any, memory_bytes: int, cap: int | None) -> int:
    """Tasks the cluster can run at once: its CPUs, or fewer where the declared memory binds."""
    res = ray.cluster_resources()
    n = int(res.get("CPU", 0))
    if memory_bytes:
        n = min(n, int(res.get("memory", 0) // memory_bytes))
    return max(1, min(n, cap) if cap else n)


def _check_memory(ray: Any, memory_bytes: int, local: bool) -> None:
    per_node = [n.get("Resources", {}).get("memory", 0) for n in ray.nodes() if n.get("Alive")]
    if memory_bytes and per_node and max(per_node) < memory_bytes:
        msg = (
            f"--memory-mb {memory_bytes >> 20} exceeds the memory Ray can give a task on any node "
            f"(at most {int(max(per_node)) >> 20} MB)"
        )
        if local:
            raise DualhubError(msg)
        logging.getLogger(__name__).warning("%s; tasks wait for a bigger node", msg)


def _ray_error(ray: Any, e: BaseException, max_retries: int) -> str:
    if isinstance(e, ray.exceptions.RayTaskError):
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException):
            return (
                f"task raised {type(cause).__name__}: {cause}"
                if str(cause)
                else f"task raised {type(cause).__name__}"
            )
        return f"task raised: {str(e).strip().splitlines()[-1]}"
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    retried = f" (after {max_retries} retries)" if isinstance(e, ray.exceptions.WorkerCrashedError) else ""
    return f"{type(e).__name__}{retried}: {first}"


@dataclass(frozen=True)
class _Job:
    rank: int
    session: str
    digest: str
    params: dict[str, Any]
    key: RowKey


def _row_key(row: Mapping[str, Any]) -> RowKey:
    return (row["session_digest"] or row["session"], row["param_hash"], row["code_version"])


def ray_sweep(
    grid: Grid,
    sessions: Sequence[str | Path],
    out: str | Path,
    *,
    address: str | None = None,
    workers: int | None = None,
    memory_mb: int = DEFAULT_MEMORY_MB,
    max_retries: int = DEFAULT_MAX_RETRIES,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    runner: Runner | None = None,
    init_kwargs: Mapping[str, Any] | None = None,
) -> SweepSummary:
    """Run every (session, grid point) as a Ray task; write the results table at ``out`` (path or URL).

    ``runner`` replaces :func:`replay.sweep.run_one` in the workers (same signature; it must be
    importable there or picklable by value).
    """
    if memory_mb < 0 or (workers is not None and workers < 1) or max_retries < 0:
        raise DualhubError("--memory-mb and --max-retries must be >= 0 and --workers >= 1")
    out_loc = Location.parse(str(out))
    if out_loc.exists() and not (resume or overwrite):
        raise DualhubError(
            f"{out_loc.text} exists; pass --resume to continue that sweep or --overwrite to replace it"
        )
    version = code_version()
    old = read_results_at(out_loc) if resume and out_loc.exists() else []
    rows: dict[RowKey, dict[str, Any]] = {_row_key(r): r for r in old}
    names = [Location.parse(str(s)).text for s in sessions]
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(names)))) as pool:  # manifests behind URLs
        digests = dict(zip(names, pool.map(session_digest, names), strict=True))
    jobs: list[_Job] = []
    keys: set[RowKey] = set()
    for s in names:
        for params in grid.points():
            key = (digests[s] or s, param_hash(params), version)
            if key not in keys:  # two copies of one session run once
                keys.add(key)
                jobs.append(_Job(len(jobs), s, digests[s], params, key))
    rank = {j.key: j.rank for j in jobs}
    todo = [j for j in jobs if not (j.key in rows and not rows[j.key]["error"])]
    skipped = len(jobs) - len(todo)
    runs_dir = out_loc.parent.child("runs")

    def write() -> None:
        order = sorted(enumerate(rows.items()), key=lambda t: rank.get(t[1][0], len(jobs) + t[0]))
        write_results_at([row for _, (_, row) in order], out_loc)

    ran = failed = 0
    cache_states: list[str] = []
    if todo:
        ray = _ray()
        started = _start_ray(ray, address, workers, init_kwargs or {})
        memory_bytes = memory_mb << 20
        bar: _Progress | None = None
        inflight: dict[Any, _Job] = {}
        try:
            _check_memory(ray, memory_bytes, local=started and not address)
            bar = _Progress(len(todo), skipped) if progress else None
            cap = workers  # a local instance has that many CPUs anyway; on a cluster: at most that many
            remote = ray.remote(run_task)
            opts: dict[str, Any] = {"num_cpus": 1, "max_retries": max_retries, "retry_exceptions": False}
            if memory_bytes:
                opts["memory"] = memory_bytes
            pending = list(reversed(todo))
            slots, slots_at = _slots(ray, memory_bytes, cap), time.monotonic()
            while pending or inflight:
                if time.monotonic() - slots_at > _SLOTS_REFRESH_S:
                    slots, slots_at = _slots(ray, memory_bytes, cap), time.monotonic()
                while pending and len(inflight) < 2 * slots:
                    job = pending.pop()
                    ref = remote.options(**opts).remote(
                        job.session, job.params, runs_dir=runs_dir.text, version=version, runner=runner
                    )
                    inflight[ref] = job
                if bar:
                    bar.update(running=min(len(inflight), slots))
                refs = list(inflight)
                if not ray.wait(refs, num_returns=1, timeout=1.0)[0]:
                    continue
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)  # all that are done
                for ref in ready:
                    job = inflight.pop(ref)
                    try:
                        row = ray.get(ref)
                    except ray.exceptions.RayError as e:  # raised in the task, worker or node died
                        row = failed_row(
                            job.session, job.digest, job.params, version, _ray_error(ray, e, max_retries)
                        )
                    row["session_digest"] = row["session_digest"] or job.digest
                    ran += 1
                    cache_states.append(row.get("market_cache") or "")
                    if row["error"]:
                        failed += 1
                        if bar:
                            bar.note(
                                f"[red]failed[/] {Path(job.session).name} {row['params']}: {row['error']}"
                            )
                    rows.pop(job.key, None)
                    rows[_row_key(row)] = row
                    if bar:
                        bar.advance(
                            failed=failed,
                            text=f"{Path(job.session).name} {run_key(job.digest, job.key[1])}",
                            caches=cache_note(cache_states),
                        )
                if bar:
                    bar.update(running=min(len(inflight), slots))
                write()  # after every batch: a killed driver keeps every row it received
        finally:
            for ref in inflight:  # interrupted: stop what is still running
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            if bar:
                bar.close()
            if started:
                ray.shutdown()
    if not out_loc.exists():  # nothing ran (everything skipped): still a table to read
        write()
    notes = tuple(n for n in (loss_stop_note(list(rows.values())), cache_note(cache_states)) if n)
    return SweepSummary(
        out=out_loc.text, ran=ran, skipped=skipped, failed=failed, rows=len(rows), notes=notes
    )


class _Progress:
    """done/total, running, failed, ETA; failures printed above the bar."""

    def __init__(self, total: int, skipped: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(
            "[bold]sweep",
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("done, {task.fields[running]} running, [red]{task.fields[failed]} failed[/]"),
            TextColumn("{task.fields[caches]}"),  # market caches built and reused (replay/market_cache.py)
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
        )
        self.p.start()
        if skipped:
            self.p.console.print(f"{skipped} run(s) already in the results table (--resume): skipped")
        self.task = self.p.add_task("", total=total, running=0, failed=0, caches="")

    def update(self, running: int) -> None:
        self.p.update(self.task, running=running)

    def advance(self, failed: int, text: str, caches: str = "") -> None:
        self.p.update(self.task, advance=1, failed=failed, description=text, caches=caches)

    def note(self, text: str) -> None:
        self.p.console.print(text)

    def close(self) -> None:
        self.p.update(self.task, description="")
        self.p.stop()
