"""The doctor's result type and its configuration (the runner that calls every area's checks is
:mod:`doctor.run`, so that the areas can import this module and it none of them).

A :class:`Check` is one row of the report: what was checked, ``ok``/``warn``/``fail``, the evidence
(what was measured or read, never a guess) and the fix (a command or a step, empty when there is
nothing to do). ``warn`` means the stack runs but not as configured for production (CPU instead of
GPU, a non-deterministic Kev); ``fail`` means something the user asked for cannot work.

Endpoints: a URL the user passed (``--kev-url``, ``--exchange-url``) that does not answer is a
``fail``; the default URL not answering is a ``warn`` (nothing was asked of it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

Status = Literal["ok", "warn", "fail"]
STATUSES: Final = ("ok", "warn", "fail")

# llama-server listens on 8080 unless told otherwise (its --port default).
DEFAULT_KEV_URL: Final = "http://127.0.0.1:8080"
# An estimate for one symbol's books15 + trade: ~1 KB books15 frame every ~150 ms plus trades is about
# 30-40 MB/h of raw journal, plus the Parquet written from it; 100 MB/h leaves a margin.
DEFAULT_RECORD_RATE_MB_PER_H: Final = 100.0
DEFAULT_SESSION_DIR: Final = Path("data") / "sessions"


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One row of the doctor's report. ``data`` holds the machine-readable facts behind ``evidence``."""

    area: str
    name: str
    status: Status
    evidence: str
    fix: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["data"] = dict(self.data)
        return d


def default_threads() -> int:
    """Compute threads the default stack uses: llama-server ``-t`` plus Laya's intra-op threads."""
    from engine.kev.server import ServerConfig
    from engine.laya.model import LayaConfig

    return ServerConfig().threads + LayaConfig(model_path=Path("unused.onnx")).intra_op_threads


@dataclass(frozen=True, slots=True, kw_only=True)
class DoctorConfig:
    """What the doctor checks against. ``kev_url``/``exchange_url`` None = the default, not asked for.

    ``threads``: compute threads the stack is configured to use (None: llama-server ``-t`` plus Laya's
    intra-op threads of the default configs). ``live``: also check the exchange API keys.
    """

    model_path: Path | None = None
    gpu_mem_limit_bytes: int = 2 << 30
    kev_url: str | None = None
    kev_timeout_s: float = 60.0
    kev_engine_timeout_ms: int | None = None  # the engine's Kev timeout (--kev-timeout-ms); None: default
    exchange_url: str | None = None
    exchange_timeout_s: float = 5.0
    symbol: str = "BTCUSDT"
    live: bool = False
    session_dir: Path = DEFAULT_SESSION_DIR
    record_rate_mb_per_h: float = DEFAULT_RECORD_RATE_MB_PER_H
    threads: int | None = None

    def __post_init__(self) -> None:
        if not self.record_rate_mb_per_h > 0:
            raise ValueError(f"record_rate_mb_per_h must be > 0, got {self.record_rate_mb_per_h}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.gpu_mem_limit_bytes <= 0:
            raise ValueError(f"gpu_mem_limit_bytes must be > 0, got {self.gpu_mem_limit_bytes}")
        if self.kev_timeout_s <= 0 or self.exchange_timeout_s <= 0:
            raise ValueError("timeouts must be > 0")
        for name in ("kev_url", "exchange_url"):
            url = getattr(self, name)
            if url is not None and not url.startswith(("http://", "https://")):
                raise ValueError(f"{name} must start with http:// or https://, got {url!r}")


def worst(checks: list[Check]) -> Status:
    if any(c.status == "fail" for c in checks):
        return "fail"
    return "warn" if any(c.status == "warn" for c in checks) else "ok"


def summary(checks: list[Check]) -> dict[str, int]:
    return {s: sum(1 for c in checks if c.status == s) for s in STATUSES}


def exit_code(checks: list[Check]) -> int:
    """1 when any check failed; a warning alone is 0."""
    return 1 if worst(checks) == "fail" else 0


def _guarded(area: str, fn: Callable[[], list[Check]]) -> list[Check]:
    # The doctor reports; it must not die on the problem it is diagnosing. An unexpected error in
    # one area becomes a failed row naming it (no traceback), and the other areas still run.
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - see above
        return [
            Check(
                area=area,
                name="doctor internal error",
                status="fail",
                evidence=f"{type(e).__name__}: {e}"[:500],
                fix="report this as a dualhub bug, with `dualhub doctor --json` output",
            )
        ]
