"""ONNX Runtime checks: package, CUDA/cuDNN needs, nvidia wheels, ``preload_dlls()``, CUDA provider library.

Everything reported is read or measured on this machine: the installed distributions
(``importlib.metadata``), the wheel's own build info (``onnxruntime/capi/build_and_package_info.py``),
what ``onnxruntime.preload_dlls()`` printed, and the ``OSError`` of loading the CUDA provider library
with ``ctypes`` (the dynamic loader names the first shared object it cannot find), with ``ldd`` for the
rest. The Laya session itself is :mod:`doctor.laya`. See ``shared/docs/onnxruntime-gpu.md``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata as md
import io
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from doctor.checks import Check, Status
from doctor.gpu import GpuInfo

CUDA_PROVIDER_LIB: Final = "libonnxruntime_providers_cuda.so"

# onnxruntime-gpu release (major, minor) -> (CUDA major, cuDNN major) of the wheel published on PyPI.
# Sources: ONNX Runtime's requirements table,
# https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html#requirements (rows up to
# 1.19; "starting with 1.19, CUDA 12.x is the default version on PyPI"); PyPI metadata of 1.23.2 and
# 1.24.4 (their `cuda`/`cudnn` extras require nvidia-*-cu12 and nvidia-cudnn-cu12~=9.0; read with
# `pip install --dry-run --report`, 2026-11); the 1.31.1 wheel installed here (build info
# cuda_version='13.0', extras nvidia-*~=13.0 and nvidia-cudnn-cu13~=9.0). 1.25-1.30 are not in the
# table (not verified); for the installed release the wheel's own build info is what counts.
CUDA_BY_RELEASE: Final[Mapping[tuple[int, int], tuple[int, int]]] = {
    (1, 15): (11, 8),
    (1, 16): (11, 8),
    (1, 17): (11, 8),
    (1, 18): (11, 8),
    (1, 19): (12, 9),
    (1, 20): (12, 9),
    (1, 21): (12, 9),
    (1, 22): (12, 9),
    (1, 23): (12, 9),
    (1, 24): (12, 9),
    (1, 31): (13, 9),
}
CUDA_TABLE_SOURCE: Final = (
    "onnxruntime.ai CUDA-ExecutionProvider requirements table; PyPI metadata of 1.23.2/1.24.4; "
    "the installed 1.31.1 wheel"
)
# The newest release in the table built for each CUDA major (the one to install on such a machine).
# 1.18.1 predates the [cuda,cudnn] extras (added in 1.21): CUDA 11.8 and cuDNN 8 come from the system.
RELEASE_FOR_CUDA_MAJOR: Final[Mapping[int, str]] = {
    11: "onnxruntime-gpu==1.18.1",
    12: "onnxruntime-gpu[cuda,cudnn]==1.24.4",
}
# Which wheel ships a CUDA library (soname stem), for the install line. CUDA 13 wheels dropped the
# -cu13 suffix except cuDNN (see onnxruntime.print_debug_info). libcublas comes with the `cudnn`
# extra: nvidia-cudnn-cuNN requires nvidia-cublas.
_WHEEL_BY_LIB: Final = {
    "libcublasLt": "nvidia-cublas",
    "libcublas": "nvidia-cublas",
    "libcudart": "nvidia-cuda-runtime",
    "libnvrtc": "nvidia-cuda-nvrtc",
    "libcurand": "nvidia-curand",
    "libcufft": "nvidia-cufft",
    "libnvJitLink": "nvidia-nvjitlink",
    "libcudnn": "nvidia-cudnn",
}
_DRIVER_LIBS: Final = ("libcuda.so", "libnvidia-ml.so")
_SONAME_ERROR = re.compile(r"^(?P<lib>[^\s:/]+\.so[\w.]*): cannot open shared object file")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NOT_NVIDIA_LIBS: Final = ("nvidia-ml-py",)  # NVML bindings, not a CUDA library wheel


# ---------------------------------------------------------------------------------------------------
# helpers


@contextlib.contextmanager
def capture_output() -> Iterator[list[str]]:
    """Capture Python's and the C libraries' stdout/stderr (fds 1 and 2); the text lands in the list.
    ONNX Runtime's own log lines are let through to it (Laya keeps them off the terminal elsewhere)."""
    ort_log: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    try:
        from engine.laya.model import ort_log_severity

        ort_log = ort_log_severity(2)  # warnings and errors, as ORT logs by default
    except (ImportError, OSError):  # no usable onnxruntime: none of its lines to let through
        pass
    sink: list[str] = []
    buf = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = (os.dup(1), os.dup(2))
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf), ort_log:
                yield sink
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            tmp.seek(0)
            sink.append(_ANSI.sub("", buf.getvalue() + tmp.read().decode(errors="replace")))


@contextlib.contextmanager
def collect_logs(name: str) -> Iterator[list[str]]:
    """Keep a logger's records (e.g. Laya's fallback warning) out of the report's stderr."""
    logger = logging.getLogger(name)
    records: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = _Keep()
    old_propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.propagate = old_propagate


def _major_minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def ort_distributions() -> list[tuple[str, str]]:
    """(name, version) of every installed distribution that provides the ``onnxruntime`` module."""
    found: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"] or ""
        files = dist.files
        if files is not None:
            provides = any(str(f).replace("\\", "/") == "onnxruntime/__init__.py" for f in files)
        else:  # no RECORD: fall back on the name
            provides = name.lower() == "onnxruntime" or name.lower().startswith("onnxruntime-")
        if provides:
            found[name] = dist.version
    return sorted(found.items())


def _build_info() -> dict[str, str]:
    try:
        from onnxruntime.capi import build_and_package_info as info
    except ImportError:
        return {}
    return {
        k: str(getattr(info, k)) for k in ("package_name", "__version__", "cuda_version") if hasattr(info, k)
    }


def extras_requirements(dist_name: str, extras: tuple[str, ...] = ("cuda", "cudnn")) -> list[str]:
    """Requirement strings a distribution adds for ``extras`` (from its metadata)."""
    from packaging.requirements import Requirement

    try:
        reqs = md.requires(dist_name) or []
    except md.PackageNotFoundError:
        return []
    out = []
    for text in reqs:
        req = Requirement(text)
        if req.marker is not None and any(req.marker.evaluate({"extra": e}) for e in extras):
            out.append(f"{req.name}{req.specifier}")
    return out


def nvidia_distributions() -> list[tuple[str, str]]:
    out = []
    for dist in md.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith("nvidia-") and name.lower() not in _NOT_NVIDIA_LIBS:
            out.append((name, dist.version))
    return sorted(set(out))


def _gpu_package() -> str | None:
    names = [n for n, _ in ort_distributions()]
    return "onnxruntime-gpu" if "onnxruntime-gpu" in names else (names[0] if names else None)


def cuda_severity(gpu: GpuInfo) -> Status:
    """A CUDA problem fails a machine with a GPU; without one it is a warning (Laya runs on CPU)."""
    return "fail" if gpu.available else "warn"


# ---------------------------------------------------------------------------------------------------
# the CUDA provider library: what the loader cannot find


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderLoad:
    path: str
    exists: bool
    loaded: bool
    error: str = ""  # the OSError text from the dynamic loader
    missing_library: str = ""  # the soname it named, when it named one
    ldd_not_found: tuple[str, ...] = ()


def provider_library_path() -> Path:
    import onnxruntime

    return Path(onnxruntime.__file__).parent / "capi" / CUDA_PROVIDER_LIB


def ldd_not_found(path: Path) -> tuple[str, ...]:
    """Sonames ``ldd`` marks ``not found`` (with the default search path, not what is loaded here)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return ()
    try:
        proc = subprocess.run([ldd, str(path)], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(line.split("=>")[0].strip() for line in proc.stdout.splitlines() if "=> not found" in line)


def probe_provider_library() -> ProviderLoad:
    """Load the CUDA provider library the way ONNX Runtime does and report what the loader says."""
    path = provider_library_path()
    if not path.exists():
        return ProviderLoad(path=str(path), exists=False, loaded=False)
    try:
        ctypes.CDLL(str(path))
    except OSError as e:
        text = str(e)
        m = _SONAME_ERROR.match(text)
        return ProviderLoad(
            path=str(path),
            exists=True,
            loaded=False,
            error=text,
            missing_library=m.group("lib") if m else "",
            ldd_not_found=ldd_not_found(path),
        )
    return ProviderLoad(path=str(path), exists=True, loaded=True)


def _wheel_for(lib: str, cuda_major: int) -> str | None:
    stem = lib.split(".so")[0]
    base = _WHEEL_BY_LIB.get(stem)
    if base is None:
        return None
    if base == "nvidia-cudnn" or cuda_major < 13:
        return f"{base}-cu{cuda_major}"
    return base


def cuda_fix(load: ProviderLoad, gpu: GpuInfo, ort_version: str, cuda_major: int | None) -> str:
    """The install line for what the loader could not find (the wheel release matching the driver)."""
    if load.loaded:
        return ""
    if not load.exists:
        return 'pip uninstall -y onnxruntime onnxruntime-gpu && pip install "onnxruntime-gpu[cuda,cudnn]"'
    missing = (
        [load.missing_library, *load.ldd_not_found] if load.missing_library else list(load.ldd_not_found)
    )
    fixes: list[str] = []
    driver_major = gpu.cuda_driver_major
    if driver_major is not None and cuda_major is not None and driver_major < cuda_major:
        line = RELEASE_FOR_CUDA_MAJOR.get(driver_major)
        fixes.append(
            f"the driver supports CUDA {driver_major} but this wheel needs CUDA {cuda_major}: "
            + (f'pip install "{line}"' if line else "upgrade the NVIDIA driver")
            + " (or upgrade the driver to one supporting CUDA "
            + f"{cuda_major})"
        )
    elif any(not lib.startswith(_DRIVER_LIBS) for lib in missing) or not missing:
        wheels = sorted(
            {w for lib in missing if cuda_major and (w := _wheel_for(lib, cuda_major)) is not None}
        )
        fixes.append(
            f'pip install "onnxruntime-gpu[cuda,cudnn]=={ort_version}"'
            + (f" (brings {', '.join(wheels)}; onnxruntime.preload_dlls() then loads them)" if wheels else "")
        )
    if any(lib.startswith(_DRIVER_LIBS) for lib in missing):
        fixes.append("install the NVIDIA driver (libcuda.so.1 comes with the driver, not from pip)")
    return "; ".join(fixes)


# ---------------------------------------------------------------------------------------------------
# rows


def classify_packages(found: list[tuple[str, str]]) -> Check:
    """The package row from the (name, version) pairs that provide the ``onnxruntime`` module."""
    listed = ", ".join(f"{n} {v}" for n, v in found)
    names = {n.lower() for n, _ in found}
    data = {"packages": dict(found)}
    if not found:
        return Check(
            area="onnxruntime",
            name="package",
            status="fail",
            evidence="no installed distribution provides the onnxruntime module",
            fix='pip install "onnxruntime-gpu[cuda,cudnn]"',
            data=data,
        )
    if len(found) > 1:
        return Check(
            area="onnxruntime",
            name="package",
            status="fail",
            evidence=f"{listed} are all installed and write the same onnxruntime module: whichever "
            "was installed last wins, and uninstalling one breaks the other",
            fix=f"pip uninstall -y {' '.join(n for n, _ in found)} && "
            'pip install "onnxruntime-gpu[cuda,cudnn]"',
            data=data,
        )
    if "onnxruntime-gpu" not in names:
        return Check(
            area="onnxruntime",
            name="package",
            status="warn",
            evidence=f"{listed}: a build without the CUDA provider; Laya can only run on CPU",
            fix=f'pip uninstall -y {found[0][0]} && pip install "onnxruntime-gpu[cuda,cudnn]"',
            data=data,
        )
    return Check(area="onnxruntime", name="package", status="ok", evidence=f"{listed} (only)", data=data)


def package_check() -> Check:
    row = classify_packages(ort_distributions())
    try:
        import onnxruntime as ort
    except ImportError as e:
        return Check(
            area=row.area,
            name=row.name,
            status="fail",
            evidence=f"{row.evidence}; import onnxruntime failed: {e}",
            fix=row.fix or 'pip install "onnxruntime-gpu[cuda,cudnn]"',
            data=row.data,
        )
    where = Path(ort.__file__).parent
    return Check(
        area=row.area,
        name=row.name,
        status=row.status,
        evidence=f"{row.evidence}; module onnxruntime {ort.__version__} ({ort.get_device()}) at {where}",
        fix=row.fix,
        data={**row.data, "module_version": ort.__version__, "module_path": str(where)},
    )


def cuda_needs(ort_version: str) -> tuple[int | None, int | None, str]:
    """(CUDA major, cuDNN major, evidence) the installed wheel needs."""
    info = _build_info()
    pkg = _gpu_package() or "onnxruntime"
    cuda_version = info.get("cuda_version", "")
    cuda_major = int(cuda_version.split(".")[0]) if cuda_version[:1].isdigit() else None
    cudnn_major: int | None = None
    cudnn_req = next((r for r in extras_requirements(pkg, ("cudnn",)) if "cudnn" in r), "")
    m = re.search(r"(\d+)\.", cudnn_req.split("~=")[-1]) if "~=" in cudnn_req else None
    if m:
        cudnn_major = int(m.group(1))
    parts = []
    if cuda_version:
        parts.append(f"wheel build info cuda_version={cuda_version}")
    if cudnn_req:
        parts.append(f"extra 'cudnn' requires {cudnn_req}")
    mm = _major_minor(ort_version)
    table = CUDA_BY_RELEASE.get(mm) if mm else None
    if mm is not None and table is not None:
        agree = (cuda_major in (None, table[0])) and (cudnn_major in (None, table[1]))
        parts.append(
            f"release table: {mm[0]}.{mm[1]} -> CUDA {table[0]}, cuDNN {table[1]}"
            + ("" if agree else " (disagrees with the wheel; the wheel wins)")
        )
        cuda_major = cuda_major if cuda_major is not None else table[0]
        cudnn_major = cudnn_major if cudnn_major is not None else table[1]
    elif mm:
        parts.append(f"{mm[0]}.{mm[1]} is not in the release table")
    return cuda_major, cudnn_major, "; ".join(parts)


def requirement_check(gpu: GpuInfo) -> Check:
    import onnxruntime as ort

    pkg = _gpu_package() or "onnxruntime"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return Check(
            area="onnxruntime",
            name="CUDA/cuDNN needed",
            status="ok",
            evidence=f"{pkg} {ort.__version__} has no CUDA provider, so it needs no CUDA",
        )
    cuda_major, cudnn_major, how = cuda_needs(ort.__version__)
    need = f"CUDA {cuda_major if cuda_major is not None else '?'}.x and cuDNN {cudnn_major or '?'}.x"
    data = {
        "package": pkg,
        "version": ort.__version__,
        "cuda_major": cuda_major,
        "cudnn_major": cudnn_major,
        "table_source": CUDA_TABLE_SOURCE,
    }
    evidence = f"{pkg} {ort.__version__} needs {need} ({how})"
    driver_major = gpu.cuda_driver_major
    if driver_major is None:
        return Check(
            area="onnxruntime",
            name="CUDA/cuDNN needed",
            status="ok",
            evidence=f"{evidence}; no NVIDIA driver here to compare with",
            data=data,
        )
    if cuda_major is not None and driver_major < cuda_major:
        line = RELEASE_FOR_CUDA_MAJOR.get(driver_major)
        return Check(
            area="onnxruntime",
            name="CUDA/cuDNN needed",
            status="fail",
            evidence=f"{evidence}; but the driver supports CUDA only up to "
            f"{gpu.cuda_driver_version[0]}.{gpu.cuda_driver_version[1]}",  # type: ignore[index]
            fix=(f'pip install "{line}" (built for CUDA {driver_major}), ' if line else "")
            + f"or upgrade the NVIDIA driver to one supporting CUDA {cuda_major}",
            data=data,
        )
    return Check(
        area="onnxruntime",
        name="CUDA/cuDNN needed",
        status="ok",
        evidence=f"{evidence}; the driver supports CUDA {driver_major}",
        data=data,
    )


def wheels_check(gpu: GpuInfo) -> Check:
    import onnxruntime as ort

    pkg = _gpu_package() or "onnxruntime"
    wanted = extras_requirements(pkg)
    have = nvidia_distributions()
    have_names = {n.lower() for n, _ in have}
    site = Path(ort.__file__).parent.parent / "nvidia"
    libs = sorted(p.name for p in site.glob("*/lib/*.so*")) if site.is_dir() else []
    data = {"wanted": wanted, "installed": dict(have), "nvidia_dir": str(site), "libraries": libs}
    if not wanted and "CUDAExecutionProvider" not in ort.get_available_providers():
        return Check(
            area="onnxruntime",
            name="nvidia library wheels",
            status="ok",
            evidence="not needed: CPU-only onnxruntime",
            data=data,
        )
    from packaging.requirements import Requirement

    missing = [w for w in wanted if Requirement(w).name.lower() not in have_names]
    installed = ", ".join(f"{n} {v}" for n, v in have) or "none"
    where = f"{site} has {len(libs)} libraries" if site.is_dir() else f"no {site}"
    if missing:
        return Check(
            area="onnxruntime",
            name="nvidia library wheels",
            status=cuda_severity(gpu),
            evidence=f"missing {len(missing)} of the {len(wanted)} wheels of {pkg}[cuda,cudnn]: "
            f"{', '.join(missing)}; installed nvidia wheels: {installed}; {where}",
            fix=f'pip install "{pkg}[cuda,cudnn]=={ort.__version__}" '
            "(or have the same CUDA/cuDNN majors on the system library path)",
            data=data,
        )
    return Check(
        area="onnxruntime",
        name="nvidia library wheels",
        status="ok",
        evidence=f"all of {pkg}[cuda,cudnn] installed: {installed}; {where}",
        data=data,
    )


def _loaded_nvidia_libs() -> list[str]:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    keys = ("libcublas", "libcudart", "libcudnn", "libcufft", "libcurand", "libnvrtc", "libcuda.so")
    return sorted({ln.split()[-1] for ln in maps.splitlines() if any(k in ln for k in keys)})


def preload_check(gpu: GpuInfo) -> Check:
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is None or "CUDAExecutionProvider" not in ort.get_available_providers():
        why = "no preload_dlls() (onnxruntime < 1.21)" if preload is None else "CPU-only onnxruntime"
        return Check(area="onnxruntime", name="preload_dlls()", status="ok", evidence=f"not run: {why}")
    error = ""
    with capture_output() as out:
        try:
            preload()
        except Exception as e:  # noqa: BLE001 - its outcome is what this row reports
            error = f"{type(e).__name__}: {e}"
    text = out[0].strip()
    failed = re.findall(r"Failed to load (\S+?):", text)
    loaded = _loaded_nvidia_libs()
    data = {"output": text, "exception": error, "failed": failed, "loaded": loaded}
    shown = f"loaded {', '.join(loaded)}" if loaded else "no CUDA library is loaded in this process"
    if error or failed:
        return Check(
            area="onnxruntime",
            name="preload_dlls()",
            status=cuda_severity(gpu),
            evidence=(f"raised {error}; " if error else "")
            + (
                f"could not load {', '.join(failed)} (from the nvidia wheels or the default path); "
                if failed
                else ""
            )
            + shown,
            fix=f'pip install "onnxruntime-gpu[cuda,cudnn]=={ort.__version__}"',
            data=data,
        )
    return Check(
        area="onnxruntime",
        name="preload_dlls()",
        status="ok",
        evidence=f"no failures{'; printed: ' + text[:200] if text else ''}; {shown}",
        data=data,
    )


def provider_library_check(gpu: GpuInfo) -> Check:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return Check(
            area="onnxruntime",
            name="CUDA provider library",
            status="ok",
            evidence="not applicable: CPU-only onnxruntime",
        )
    load = probe_provider_library()
    cuda_major, _, _ = cuda_needs(ort.__version__)
    data = {
        "path": load.path,
        "loaded": load.loaded,
        "cdll_error": load.error,
        "missing_library": load.missing_library,
        "ldd_not_found": list(load.ldd_not_found),
    }
    if load.loaded:
        return Check(
            area="onnxruntime",
            name="CUDA provider library",
            status="ok",
            evidence=f"{CUDA_PROVIDER_LIB} loads: every CUDA library it links against was found",
            data=data,
        )
    if not load.exists:
        evidence = f"{load.path} does not exist although CUDAExecutionProvider is compiled in"
    else:
        evidence = f"ctypes.CDLL({CUDA_PROVIDER_LIB}) -> OSError: {load.error}"
        if load.missing_library:
            evidence = f"missing {load.missing_library}: " + evidence
        if load.ldd_not_found:
            evidence += f"; ldd: not found {', '.join(load.ldd_not_found)}"
    return Check(
        area="onnxruntime",
        name="CUDA provider library",
        status=cuda_severity(gpu),
        evidence=evidence,
        fix=cuda_fix(load, gpu, ort.__version__, cuda_major),
        data=data,
    )


def runtime_checks(gpu: GpuInfo) -> list[Check]:
    """Package, CUDA/cuDNN needs, nvidia wheels, preload_dlls() (before any session), provider library."""
    rows = [package_check()]
    if rows[0].status == "fail" and "module_version" not in rows[0].data:
        return rows  # onnxruntime cannot be imported: nothing else to ask it
    return [*rows, requirement_check(gpu), wheels_check(gpu), preload_check(gpu), provider_library_check(gpu)]
