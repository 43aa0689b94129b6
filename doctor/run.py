"""The doctor's runner: every area's checks, in report order, each area guarded so that one area's
unexpected error is a failed row naming it and the others still run."""

from __future__ import annotations

import os
from collections.abc import Mapping

from doctor.checks import Check, DoctorConfig, _guarded


def run_all(cfg: DoctorConfig, *, env: Mapping[str, str] | None = None) -> list[Check]:
    """Every check, in report order: ONNX Runtime and GPU, Laya, Kev, exchange, machine."""
    # the areas bring httpx and Kev's client: loaded when the doctor runs, not whenever the package is
    # imported (dualhub doctor's parser reads its defaults from doctor.checks)
    from doctor import exchange, gpu, kev, laya, machine, onnx

    env = os.environ if env is None else env
    gpu_info = gpu.probe_gpu()
    out: list[Check] = []
    out += _guarded("onnxruntime", lambda: onnx.runtime_checks(gpu_info))
    out += _guarded("gpu", lambda: [gpu.check_gpu(gpu_info)])
    out += _guarded("laya", lambda: laya.laya_checks(cfg, gpu_info))
    out += _guarded("kev", lambda: kev.kev_checks(cfg))
    out += _guarded("exchange", lambda: exchange.exchange_checks(cfg, env=env))
    out += _guarded("machine", lambda: machine.machine_checks(cfg))
    return out
