"""Laya checks: the provider a real session gets with ``gpu_mem_limit``, and the warm-up latencies.

The session is created through :class:`engine.laya.model.Laya`, exactly as the engine creates it, with
ONNX Runtime's own log captured (it names the library it could not load). The warm-up row shows the
first-run spike against the steady state, then times tick-path calls after warm-up to show the spike
is gone before the first frame.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

from doctor.checks import Check, DoctorConfig
from doctor.gpu import GpuInfo
from doctor.onnx import (
    capture_output,
    collect_logs,
    cuda_fix,
    cuda_needs,
    cuda_severity,
    probe_provider_library,
)

_ORT_LOG_LINE = re.compile(r"\[[EW]:onnxruntime[^\]]*\]\s*(?P<msg>.*)")


def _ort_messages(text: str) -> list[str]:
    """ONNX Runtime's error/warning log lines, without their source-location prefixes."""
    out = []
    for line in text.splitlines():
        m = _ORT_LOG_LINE.search(line)
        if not m:
            continue
        msg = m.group("msg")
        msg = msg.split(" : FAIL : ", 1)[-1]
        msg = msg.split(". Please install", 1)[0]
        out.append(msg.strip())
    return out


def laya_checks(cfg: DoctorConfig, gpu: GpuInfo) -> list[Check]:
    import numpy as np
    import onnxruntime as ort

    from engine.laya.features import N_FEATURES
    from engine.laya.model import CUDA, DEFAULT_MODEL, Laya, LayaConfig, LayaModelError

    model = Path(cfg.model_path) if cfg.model_path is not None else DEFAULT_MODEL
    try:
        with collect_logs("engine.laya.model"), capture_output() as out:
            laya = Laya(
                LayaConfig(model_path=model, provider="auto", gpu_mem_limit_bytes=cfg.gpu_mem_limit_bytes)
            )
    except LayaModelError as e:
        fix = "pass --model PATH, or build the default with `python -m replay.make_default_model`"
        return [
            Check(area="laya", name="session provider", status="fail", evidence=str(e), fix=fix),
            Check(
                area="laya", name="warm-up", status="fail", evidence="not measured: the model did not load"
            ),
        ]
    ort_log = _ort_messages(out[0])
    d = laya.describe()
    requested = ", ".join(
        f"{p} (gpu_mem_limit={cfg.gpu_mem_limit_bytes})" if p == CUDA else p for p in laya.requested_providers
    )
    prov_data = {
        "model_path": str(model),
        "requested_providers": laya.requested_providers,
        "active_providers": laya.active_providers,
        "active_provider": laya.active_provider,
        "fallback_reason": laya.fallback_reason,
        "gpu_mem_limit_bytes": cfg.gpu_mem_limit_bytes,
        "onnxruntime_log": ort_log,
    }
    evidence = f"{model.name}: asked for [{requested}], session.get_providers() = {laya.active_providers}" + (
        f"; onnxruntime logged: {' | '.join(ort_log)}" if ort_log else ""
    )
    if laya.active_provider == CUDA:
        provider_row = Check(
            area="laya", name="session provider", status="ok", evidence=evidence, data=prov_data
        )
    else:
        load = probe_provider_library()
        cuda_major, _, _ = cuda_needs(ort.__version__)
        provider_row = Check(
            area="laya",
            name="session provider",
            status=cuda_severity(gpu) if CUDA in ort.get_available_providers() else "warn",
            evidence=evidence,
            fix=cuda_fix(load, gpu, ort.__version__, cuda_major)
            or 'pip install "onnxruntime-gpu[cuda,cudnn]" (see the onnxruntime rows)',
            data=prov_data,
        )

    # Warm-up: Laya timed its first run apart from the rest; then time tick-path calls after it.
    x = np.zeros(N_FEATURES, dtype=np.float32)
    after_ms = []
    for _ in range(200):
        t0 = time.perf_counter_ns()
        laya.predict(x)
        after_ms.append((time.perf_counter_ns() - t0) / 1e6)
    after_ms.sort()
    p50 = statistics.median(after_ms)
    p99 = after_ms[int(0.99 * (len(after_ms) - 1))]
    first, steady = laya.warmup_first_ms, laya.warmup_steady_ms
    absorbed = p99 < first
    warm_data = {
        "provider": laya.active_provider,
        "warmup_runs": d["warmup_runs"],
        "warmup_first_ms": first,
        "warmup_steady_ms": steady,
        "after_warmup_ticks": len(after_ms),
        "after_warmup_p50_ms": p50,
        "after_warmup_p99_ms": p99,
        "after_warmup_max_ms": after_ms[-1],
    }
    ratio = f"{first / steady:.0f}x" if steady > 0 else "n/a"
    evidence = (
        f"{laya.active_provider}: first run {first:.3f} ms, steady {steady:.3f} ms (median of "
        f"{d['warmup_runs'] - 1} more warm-up runs; first-run spike {ratio}); after warm-up, "
        f"{len(after_ms)} ticks: p50 {p50:.3f}, p99 {p99:.3f}, max {after_ms[-1]:.3f} ms"
    )
    if absorbed:
        warm_row = Check(
            area="laya",
            name="warm-up",
            status="ok",
            evidence=evidence + ": the spike is absorbed by warm-up, before the first frame",
            data=warm_data,
        )
    else:
        warm_row = Check(
            area="laya",
            name="warm-up",
            status="warn",
            evidence=evidence + ": ticks after warm-up are still as slow as the first run",
            fix="raise LayaConfig.warmup_runs, and check for CPU contention (machine rows)",
            data=warm_data,
        )
    return [provider_row, warm_row]
