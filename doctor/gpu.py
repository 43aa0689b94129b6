"""GPU facts from NVML (``nvidia-ml-py``): device names, driver, the CUDA version it supports, memory.

``nvidia-ml-py`` is imported here only, and defensively: without the package, the NVIDIA driver or a
GPU, :func:`probe_gpu` returns a :class:`GpuInfo` whose ``error`` says which of these is missing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from doctor.checks import Check

MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuDevice:
    index: int
    name: str
    memory_free_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """What NVML reported. ``devices`` empty and ``error`` set when it could not tell."""

    devices: tuple[GpuDevice, ...] = ()
    driver_version: str = ""
    cuda_driver_version: tuple[int, int] | None = None  # highest CUDA the driver supports
    error: str = ""
    fix: str = ""

    @property
    def available(self) -> bool:
        return bool(self.devices)

    @property
    def cuda_driver_major(self) -> int | None:
        return self.cuda_driver_version[0] if self.cuda_driver_version else None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def probe_gpu() -> GpuInfo:
    """Ask NVML. Never raises."""
    try:
        import pynvml  # the nvidia-ml-py distribution
    except ImportError:
        return GpuInfo(
            error="nvidia-ml-py is not installed, so GPUs cannot be listed",
            fix="pip install nvidia-ml-py",
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        code = getattr(e, "value", None)
        if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            why = "libnvidia-ml.so.1 not found: no NVIDIA driver is installed on this machine"
        elif code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
            why = "the NVIDIA kernel driver is not loaded"
        else:
            why = "NVML could not start"
        return GpuInfo(
            error=f"NVML init failed ({_text(e)}): {why}",
            fix="on a GPU machine: install the NVIDIA driver (nvidia-smi must work); on a CPU "
            "machine there is nothing to fix, Laya runs on CPU",
        )
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda: tuple[int, int] | None = None
        with contextlib.suppress(pynvml.NVMLError):
            v = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())  # e.g. 13000 for 13.0
            cuda = (v // 1000, (v % 1000) // 10)
        devices = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            devices.append(
                GpuDevice(
                    index=i,
                    name=_text(pynvml.nvmlDeviceGetName(h)),
                    memory_free_bytes=int(mem.free),
                    memory_total_bytes=int(mem.total),
                )
            )
    except pynvml.NVMLError as e:
        return GpuInfo(error=f"NVML query failed: {_text(e)}", fix="check `nvidia-smi`")
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    if not devices:
        return GpuInfo(
            driver_version=driver,
            cuda_driver_version=cuda,
            error=f"NVIDIA driver {driver} is loaded but reports no GPU",
            fix="check that the GPU is visible to this container (CUDA_VISIBLE_DEVICES, --gpus)",
        )
    return GpuInfo(devices=tuple(devices), driver_version=driver, cuda_driver_version=cuda)


def check_gpu(info: GpuInfo) -> Check:
    if not info.available:
        return Check(
            area="gpu",
            name="GPU (NVML)",
            status="warn",
            evidence=f"{info.error}; Laya will run on CPU",
            fix=info.fix,
            data={"error": info.error, "driver_version": info.driver_version},
        )
    v = info.cuda_driver_version
    cuda = f"{v[0]}.{v[1]}" if v else "unknown"
    gpus = "; ".join(
        f"GPU{d.index} {d.name}: {d.memory_free_bytes // MIB} of {d.memory_total_bytes // MIB} MiB free"
        for d in info.devices
    )
    return Check(
        area="gpu",
        name="GPU (NVML)",
        status="ok",
        evidence=f"{gpus}; driver {info.driver_version} (supports CUDA up to {cuda})",
        data={
            "driver_version": info.driver_version,
            "cuda_driver_version": cuda,
            "devices": [
                {
                    "index": d.index,
                    "name": d.name,
                    "memory_free_bytes": d.memory_free_bytes,
                    "memory_total_bytes": d.memory_total_bytes,
                }
                for d in info.devices
            ],
        },
    )
