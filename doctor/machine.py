"""Machine checks: disk headroom for recording, clock source, open-file limit, CPUs vs threads."""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from doctor.checks import Check, DoctorConfig, Status, default_threads

CLOCKSOURCE: Final = Path("/sys/devices/system/clocksource/clocksource0")
# Clock sources read without a trap to the hypervisor or a slow bus (tens of ns per read).
FAST_CLOCKSOURCES: Final = ("tsc", "kvm-clock", "arch_sys_counter", "hyperv_clocksource_tsc_page")
HEADROOM_WARN_H: Final = 24.0
HEADROOM_FAIL_H: Final = 1.0
NOFILE_WARN: Final = 4096
MB: Final = 1_000_000


def _existing(path: Path) -> Path:
    p = path.resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def disk_check(session_dir: Path, rate_mb_per_h: float) -> Check:
    where = _existing(session_dir)
    usage = shutil.disk_usage(where)
    hours = usage.free / MB / rate_mb_per_h
    note = "" if where == session_dir.resolve() else f" (nearest existing parent of {session_dir})"
    evidence = (
        f"{usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f} GiB at {where}{note}: "
        f"{hours:,.1f} h of recording at {rate_mb_per_h:g} MB/h"
    )
    data = {"path": str(where), "free_bytes": usage.free, "rate_mb_per_h": rate_mb_per_h, "headroom_h": hours}
    status: Status
    if hours < HEADROOM_FAIL_H:
        status = "fail"
    elif hours < HEADROOM_WARN_H:
        status = "warn"
    else:
        return Check(area="machine", name="disk headroom", status="ok", evidence=evidence, data=data)
    return Check(
        area="machine",
        name="disk headroom",
        status=status,
        evidence=evidence + f" (want >= {HEADROOM_WARN_H:g} h)",
        fix="free space there, or record to a larger disk (--session-dir here, `dualhub record --out`)",
        data=data,
    )


def _read_cost_ns(fn: Callable[[], object], n: int = 20_000) -> float:
    samples = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)


def clocksource_check(base: Path = CLOCKSOURCE) -> Check:
    try:
        current = (base / "current_clocksource").read_text().strip()
    except OSError as e:
        current = ""
        why = f"cannot read {base / 'current_clocksource'}: {e.strerror or e}"
    try:
        available = (base / "available_clocksource").read_text().split()
    except OSError:
        available = []
    cost = _read_cost_ns(time.time_ns)
    data = {"current": current, "available": available, "time_ns_cost_ns": cost}
    tail = f"; time.time_ns() costs {cost:.0f} ns per read"
    if not current:
        return Check(area="machine", name="clock source", status="warn", evidence=why + tail, data=data)
    evidence = f"{current} (available: {' '.join(available) or '?'}){tail}"
    if current in FAST_CLOCKSOURCES:
        return Check(area="machine", name="clock source", status="ok", evidence=evidence, data=data)
    better = next((c for c in FAST_CLOCKSOURCES if c in available), None)
    return Check(
        area="machine",
        name="clock source",
        status="warn",
        evidence=evidence + ": a slow clock source makes every timestamp and latency measurement expensive",
        fix=(
            f"echo {better} | sudo tee {base / 'current_clocksource'}"
            if better
            else "no fast clock source offered (a VM without a stable TSC); expect costly timestamps"
        ),
        data=data,
    )


def nofile_check() -> Check:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    shown_hard = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    evidence = f"RLIMIT_NOFILE soft {soft}, hard {shown_hard}"
    data = {"soft": soft, "hard": hard}
    if soft >= NOFILE_WARN:
        return Check(area="machine", name="open-file limit", status="ok", evidence=evidence, data=data)
    target = NOFILE_WARN if hard == resource.RLIM_INFINITY else min(max(hard, soft), 65536)
    return Check(
        area="machine",
        name="open-file limit",
        status="warn",
        evidence=evidence + f": below {NOFILE_WARN}; recording many symbols keeps sockets, journals and "
        "Parquet files open at once",
        fix=f"ulimit -n {target}"
        + ("" if target >= NOFILE_WARN else " and raise the hard limit (limits.conf)"),
        data=data,
    )


def _cgroup_cpus() -> float | None:
    """CPUs allowed by a cgroup v2 quota (``cpu.max``), if any."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def cpu_check(threads: int | None) -> Check:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_cpus()
    usable = min(cpus, quota) if quota is not None else cpus
    configured = threads if threads is not None else default_threads()
    how = "--threads" if threads is not None else "default: llama-server -t 1 + Laya intra-op 1"
    evidence = (
        f"{cpus} CPUs usable by this process"
        + (f", cgroup quota {quota:g}" if quota is not None else "")
        + f"; {configured} compute threads configured ({how})"
    )
    data = {"cpus": cpus, "cgroup_quota_cpus": quota, "threads": configured}
    if configured > usable:
        return Check(
            area="machine",
            name="CPUs vs threads",
            status="fail",
            evidence=evidence + ": oversubscribed; llama.cpp's threadpool stalls 20-30x when a core is "
            "taken from it (shared/docs/kev-server.md)",
            fix=f"use at most {max(1, int(usable) - 1)} compute threads "
            "(llama-server -t, Laya intra_op_threads)",
            data=data,
        )
    if configured == usable:
        return Check(
            area="machine",
            name="CPUs vs threads",
            status="warn",
            evidence=evidence + ": every core computes; the event loop, recorder or test runner will "
            "compete with llama-server's threads",
            fix="leave one core free (fewer threads, or a machine with more cores)",
            data=data,
        )
    return Check(area="machine", name="CPUs vs threads", status="ok", evidence=evidence, data=data)


def arrow_pool_check(
    backend: str | None = None, named: str | None = None, by_us: bool | None = None
) -> Check:
    """Which allocator Arrow's buffers really come from (engine/__init__.py names jemalloc before pyarrow
    loads): ``backend`` the pool in use, ``named`` ARROW_DEFAULT_MEMORY_POOL, ``by_us`` whether the
    project named it (defaults: this process's)."""
    import engine

    if backend is None:
        import pyarrow as pa

        backend = pa.default_memory_pool().backend_name
    named = os.environ.get("ARROW_DEFAULT_MEMORY_POOL") if named is None else named
    by_us = engine.ARROW_POOL_SET_HERE if by_us is None else by_us
    who = "set by dualhub" if by_us else "set by you" if named else "not set"
    evidence = f"Arrow's memory pool: {backend} (ARROW_DEFAULT_MEMORY_POOL={named or ''}, {who})"
    data = {"backend": backend, "named": named, "named_by_dualhub": by_us}
    if backend == "jemalloc" or (named and not by_us and backend == named):
        return Check(area="machine", name="Arrow memory pool", status="ok", evidence=evidence, data=data)
    return Check(
        area="machine",
        name="Arrow memory pool",
        status="warn",
        evidence=evidence + ": replays hold more memory (mimalloc keeps what a replay frees beside "
        "numpy's heap; bench/HISTORY.md)",
        fix="a pyarrow with jemalloc (Linux and macOS wheels), or ARROW_DEFAULT_MEMORY_POOL=system",
        data=data,
    )


def machine_checks(cfg: DoctorConfig) -> list[Check]:
    return [
        disk_check(cfg.session_dir, cfg.record_rate_mb_per_h),
        clocksource_check(),
        nofile_check(),
        cpu_check(cfg.threads),
        arrow_pool_check(),
    ]
