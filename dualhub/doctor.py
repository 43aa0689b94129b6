"""``dualhub doctor``: can this machine run the stack, and how to fix what it cannot.

One row per check (ok / warn / fail, the evidence, the fix) as a table, or ``--json`` for scripts. The
exit code is 1 when any check fails (a warning alone is 0), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engine.errors import DualhubError

STATUS_STYLE = {"ok": "bold green", "warn": "bold yellow", "fail": "bold red"}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from doctor.checks import DEFAULT_KEV_URL, DEFAULT_RECORD_RATE_MB_PER_H, DEFAULT_SESSION_DIR

    p = sub.add_parser(
        "doctor",
        help="check that this machine can run the stack (ONNX Runtime/CUDA, Laya, Kev, exchange, machine)",
        description="Check ONNX Runtime and CUDA (package, missing libraries, active provider, warm-up), "
        "Kev's llama-server (health, props, one schema-constrained request, its latency against the Kev "
        "timeout, determinism), the Bitget "
        "endpoint (reachability, clock skew, contract, API keys with --live) and the machine (disk, "
        "clock source, open files, CPUs). Prints one row per check with the evidence and the fix. "
        "Exit code 1 when any check fails.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--model", type=Path, help="Laya ONNX model (default data/models/laya-v0.onnx)")
    p.add_argument("--kev-url", help=f"llama-server URL (default {DEFAULT_KEV_URL}; not answering = warn)")
    p.add_argument(
        "--kev-timeout-ms",
        type=int,
        help="the Kev timeout live/replay will run with: an answer slower than it fails the check (the "
        "default 2000 ms: warns); the check recommends a value",
    )
    p.add_argument(
        "--exchange-url",
        help="Bitget REST base URL (default https://api.bitget.com; not answering = warn); "
        "e.g. the local exchange from venue.bitget.rest_server",
    )
    p.add_argument("--symbol", default="BTCUSDT", help="contract to look up (default BTCUSDT)")
    p.add_argument(
        "--live", action="store_true", help="also require the BITGET_API_* keys in the environment"
    )
    p.add_argument(
        "--session-dir",
        type=Path,
        default=DEFAULT_SESSION_DIR,
        help=f"where sessions are recorded (default {DEFAULT_SESSION_DIR})",
    )
    p.add_argument(
        "--record-rate-mb-per-h",
        type=float,
        default=DEFAULT_RECORD_RATE_MB_PER_H,
        metavar="N",
        help=f"expected recording volume for the disk check (default {DEFAULT_RECORD_RATE_MB_PER_H:g})",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="compute threads the stack is configured to use (default: llama-server -t + Laya intra-op)",
    )
    p.add_argument("--gpu-mem-limit-mib", type=int, default=2048, help="Laya's CUDA arena cap (default 2048)")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(a: argparse.Namespace) -> int:
    from doctor.checks import DoctorConfig, exit_code, summary, worst
    from doctor.run import run_all
    from engine.urls import check_url

    for flag, url in (("--kev-url", a.kev_url), ("--exchange-url", a.exchange_url)):
        if url is not None:
            check_url(url, flag)
    if a.kev_timeout_ms is not None and a.kev_timeout_ms <= 0:
        raise DualhubError(f"--kev-timeout-ms must be > 0, got {a.kev_timeout_ms}")
    try:
        cfg = DoctorConfig(
            model_path=a.model,
            gpu_mem_limit_bytes=a.gpu_mem_limit_mib << 20,
            kev_url=a.kev_url,
            kev_engine_timeout_ms=a.kev_timeout_ms,
            exchange_url=a.exchange_url,
            symbol=a.symbol,
            live=a.live,
            session_dir=a.session_dir,
            record_rate_mb_per_h=a.record_rate_mb_per_h,
            threads=a.threads,
        )
    except ValueError as e:
        raise DualhubError(str(e)) from None
    checks = run_all(cfg)
    code = exit_code(checks)
    if a.json:
        report: dict[str, Any] = {
            "status": worst(checks),
            "summary": summary(checks),
            "exit_code": code,
            "checks": [c.to_json() for c in checks],
        }
        sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
    else:
        print_table(_cpu_machine(checks))
    return code


# The checks that only say why CUDA does not run. On a machine with no NVIDIA device that is no news,
# and five rows each telling it to install nvidia wheels bury the rest: the table folds them into one
# (--json keeps every check, and the exit status counts them all).
_CUDA_CHECKS = {
    ("onnxruntime", "nvidia library wheels"),
    ("onnxruntime", "preload_dlls()"),
    ("onnxruntime", "CUDA provider library"),
    ("gpu", "GPU (NVML)"),
    ("laya", "session provider"),
}


def _cpu_machine(checks: list[Any]) -> list[Any]:
    import dataclasses

    from engine.optional import has_nvidia_gpu

    folded = [c for c in checks if (c.area, c.name) in _CUDA_CHECKS and c.status == "warn"]
    if has_nvidia_gpu() or not folded:
        return checks
    one = dataclasses.replace(
        folded[0],
        area="gpu",
        name="none on this machine",
        status="ok",
        evidence=f"no NVIDIA device (/dev/nvidia*): Laya runs on CPU; {len(folded)} CUDA checks folded "
        "into this row (dualhub doctor --json lists them)",
        fix="",
    )
    out, placed = [], False
    for c in checks:
        if c in folded:
            if not placed:
                out.append(one)
                placed = True
        else:
            out.append(c)
    return out


def print_table(checks: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from doctor.checks import summary, worst

    # piped, 120 columns: the evidence and fix columns fold, no line is wider
    console = Console(width=None if sys.stdout.isatty() else 120)
    table = Table(title="dualhub doctor", show_lines=True, expand=False)
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("evidence", overflow="fold", ratio=3)
    table.add_column("fix", overflow="fold", ratio=2)
    for c in checks:
        # Text(), not markup: evidence quotes library output with [brackets].
        table.add_row(
            Text(f"{c.area}: {c.name}"),
            Text(c.status, style=STATUS_STYLE[c.status]),
            Text(c.evidence),
            Text(c.fix),
        )
    console.print(table)
    s = summary(checks)
    overall = worst(checks)
    console.print(
        Text(f"{s['ok']} ok, {s['warn']} warn, {s['fail']} fail: ", style="bold")
        + Text(overall, style=STATUS_STYLE[overall])
    )
