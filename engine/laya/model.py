"""Laya, the fast model: an ONNX classifier run on every book snapshot.

:class:`Laya` loads an ONNX file, checks that it fits this engine (``feature_version`` metadata equal
to the version the caller computes, input float32 ``[N, n_features]`` of that version (v0: 128,
v1: 36), a label output and a 4-class probability output, ``label_map`` metadata),
creates the ONNX Runtime session on the provider asked for, reports the provider that is actually
active, and warms up. Every problem with the file is a :class:`LayaModelError` with a message that
names it, never a raw ONNX Runtime traceback.

Providers. ``onnxruntime.get_available_providers()`` lists what was compiled in, not what can load
(``shared/docs/onnxruntime-gpu.md``): a CPU-only machine with ``onnxruntime-gpu`` lists CUDA and
still runs on CPU. So only ``session.get_providers()`` is trusted. ``provider="auto"`` asks for CUDA
then CPU and accepts CPU with a warning and a ``fallback_reason``; ``provider="cuda"`` asks the same
but refuses to run on CPU; ``provider="cpu"`` asks for CPU only. The fallback is one warning (once
per model file and reason in a process); ONNX Runtime's own lines about the CUDA library it could not
load are kept off the terminal, and ``dualhub doctor`` shows them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import onnxruntime as ort

from engine.errors import DualhubError
from engine.events import Label
from engine.laya import features_v1
from engine.laya.features import FEATURE_VERSION, N_FEATURES

log = logging.getLogger(__name__)

# The default Laya model shipped with the project (rebuilt by `python -m replay.make_default_model`).
DEFAULT_MODEL: Final = Path(__file__).resolve().parents[2] / "data" / "models" / "laya-v0.onnx"
CUDA: Final = "CUDAExecutionProvider"
CPU: Final = "CPUExecutionProvider"
PROVIDER_CHOICES: Final = ("auto", "cuda", "cpu")
N_CLASSES: Final = len(Label)
EXPECTED_LABEL_MAP: Final = {int(lab): lab.name for lab in Label}
# predict_batch runs at most this many rows at a time: ONNX Runtime's CPU GEMM changes kernel for
# large inputs (seen from 4096 rows here), which would change the last bits of the probabilities.
BATCH_CHUNK_ROWS: Final = 1024
_LABEL_OUTPUT_NAMES: Final = ("label", "output_label")
_PROBS_OUTPUT_NAMES: Final = ("probabilities", "output_probability", "probs")
# Feature versions this engine can compute, and their row width.
FEATURE_SIZES: Final = {FEATURE_VERSION: N_FEATURES, features_v1.FEATURE_VERSION: features_v1.N_FEATURES}


class LayaModelError(DualhubError, ValueError):
    """The model file or its runtime setup does not fit Laya; the message says what and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayaConfig:
    """How to load Laya.

    ``provider``: ``"auto"`` (CUDA if it loads, else CPU with a warning), ``"cuda"`` (CUDA or
    :class:`LayaModelError`), ``"cpu"``. ``gpu_mem_limit_bytes`` caps the CUDA arena.
    ``intra_op_threads``: ONNX Runtime threads per run (1 suits a tiny per-tick model).
    ``warmup_runs``: tick-path runs on load; the first is timed apart from the rest.
    ``feature_version``: the features the caller computes (:data:`FEATURE_SIZES`); a model trained
    on any other version is refused. ``"auto"``: the version the model's metadata names.
    """

    model_path: Path
    provider: str = "auto"
    gpu_mem_limit_bytes: int = 2 << 30
    intra_op_threads: int = 1
    warmup_runs: int = 20
    feature_version: str = FEATURE_VERSION

    def __post_init__(self) -> None:
        if self.provider not in PROVIDER_CHOICES:
            raise ValueError(f"provider must be one of {PROVIDER_CHOICES}, got {self.provider!r}")
        if self.gpu_mem_limit_bytes <= 0:
            raise ValueError(f"gpu_mem_limit_bytes must be > 0, got {self.gpu_mem_limit_bytes}")
        if self.intra_op_threads < 1:
            raise ValueError(f"intra_op_threads must be >= 1, got {self.intra_op_threads}")
        if self.warmup_runs < 1:
            raise ValueError(f"warmup_runs must be >= 1, got {self.warmup_runs}")
        if self.feature_version != "auto" and self.feature_version not in FEATURE_SIZES:
            raise ValueError(
                f"feature_version must be 'auto' or one of {sorted(FEATURE_SIZES)}, "
                f"got {self.feature_version!r}"
            )


@functools.cache
def _preload_cuda_libraries() -> str:
    """Load CUDA/cuDNN from the nvidia pip wheels if present (``onnxruntime.preload_dlls``, ORT >= 1.21).

    Process-wide and idempotent, so done once. Returns what it printed (names of libraries that
    failed to load), which goes into the fallback reason if CUDA does not come up.
    """
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return ""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            preload()
    except Exception as e:  # a diagnostic aid only: never fatal
        buf.write(f"preload_dlls failed: {e}")
    return buf.getvalue()


# ONNX Runtime's logger severity while a session that asks for CUDA is created. Where CUDA cannot
# load, ORT writes the failed provider library (an error and a warning) straight to fd 2, in every
# command; Laya's own warning (``fallback_reason``) says why CPU runs instead. 4 (fatal) keeps ORT's
# lines off the terminal; `dualhub doctor` collects them (``ort_log_severity``).
_ORT_DEFAULT_SEVERITY: Final = 2  # ORT's own default (warning), which nothing else in dualhub changes
_ort_severity = 4
_fallbacks_said: set[tuple[str, str]] = set()


@contextlib.contextmanager
def ort_log_severity(level: int) -> Iterator[None]:
    """ONNX Runtime's log severity while Laya models that ask for CUDA load inside this block."""
    global _ort_severity
    saved, _ort_severity = _ort_severity, level
    try:
        yield
    finally:
        _ort_severity = saved


@contextlib.contextmanager
def _ort_quiet(active: bool) -> Iterator[None]:
    if not active or _ort_severity == _ORT_DEFAULT_SEVERITY:
        yield
        return
    ort.set_default_logger_severity(_ort_severity)
    try:
        yield
    finally:  # ORT has no getter for it
        ort.set_default_logger_severity(_ORT_DEFAULT_SEVERITY)


def training_sessions(metadata: dict[str, str]) -> list[dict[str, Any]]:
    """The sessions a model was trained on, from its ``training_sessions`` metadata.

    ``dualhub train`` writes one entry per session (``name``, ``session_digest``, ...): those two are
    returned. ``replay.make_default_model`` describes simulator runs (``symbol``, ``minutes``,
    ``seeds``): one entry per seed (``simulator_seed``, ``symbol``, ``minutes``). Missing or
    unreadable metadata: ``[]``."""
    try:
        raw = json.loads(metadata.get("training_sessions", "[]"))
        if isinstance(raw, dict) and "seeds" in raw:
            return [
                {"simulator_seed": int(seed), "symbol": raw.get("symbol"), "minutes": raw.get("minutes")}
                for seed in raw["seeds"]
            ]
        return [{"name": e.get("name"), "session_digest": e.get("session_digest")} for e in raw]
    except (ValueError, TypeError, AttributeError):
        return []


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shape_str(shape: list[Any]) -> str:
    return "[" + ", ".join("None" if not isinstance(d, int) else str(d) for d in shape) + "]"


class Laya:
    """A loaded, validated, warmed-up Laya model. Not thread-safe: one instance per tick loop."""

    def __init__(self, config: LayaConfig) -> None:
        self.config = config
        path = Path(config.model_path)
        self.model_path = path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise LayaModelError(
                f"Laya model not found: {path} (build the default with `python -m replay.make_default_model`)"
            ) from None
        except OSError as e:
            raise LayaModelError(f"cannot read Laya model {path}: {e.strerror or e}") from None
        self.model_sha256: str = hashlib.sha256(data).hexdigest()

        self.requested_providers: list[str] = [CPU] if config.provider == "cpu" else [CUDA, CPU]
        compiled_in = ort.get_available_providers()
        provider_args: list[Any] = []
        preload_note = ""
        asks_cuda = False
        for name in self.requested_providers:
            if name not in compiled_in:
                continue  # asking ORT for a provider it lacks only produces its own warning
            if name == CUDA:
                asks_cuda = True
                preload_note = _preload_cuda_libraries()
                provider_args.append(
                    (
                        CUDA,
                        {
                            "gpu_mem_limit": str(config.gpu_mem_limit_bytes),
                            "arena_extend_strategy": "kSameAsRequested",
                        },
                    )
                )
            else:
                provider_args.append(name)

        so = ort.SessionOptions()
        so.intra_op_num_threads = config.intra_op_threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.use_deterministic_compute = True
        so.log_severity_level = 3  # errors only
        try:
            with _ort_quiet(asks_cuda):
                self._session = ort.InferenceSession(data, sess_options=so, providers=provider_args)
        except Exception as e:  # ORT raises several pybind exception types for bad files
            raise LayaModelError(f"{path} is not a loadable ONNX model: {_short(e)}") from None

        self.active_providers: list[str] = list(self._session.get_providers())
        self.active_provider: str = self.active_providers[0]
        self.fallback_reason: str = ""
        if self.active_provider != self.requested_providers[0]:
            why = self._why_no_cuda(compiled_in, preload_note)
            if config.provider == "cuda":
                raise LayaModelError(
                    f"provider='cuda' but onnxruntime could only start {self.active_provider}: {why}. "
                    "Run `dualhub doctor`, or use provider='auto' to accept CPU"
                )
            self.fallback_reason = (
                f"CUDA was requested but onnxruntime fell back to {self.active_provider}: {why}. "
                "Run `dualhub doctor` for details"
            )
            # once per model file and reason in a process: a sweep or a retried replay loads it again
            said = (str(path.resolve()), self.fallback_reason)
            log.log(
                logging.DEBUG if said in _fallbacks_said else logging.WARNING,
                "Laya %s: %s",
                path.name,
                self.fallback_reason,
            )
            _fallbacks_said.add(said)

        meta = self._session.get_modelmeta()
        self.metadata: dict[str, str] = dict(meta.custom_metadata_map)
        self.feature_version: str = self._validate_feature_version()
        self.n_features: int = FEATURE_SIZES[self.feature_version]
        self._validate_io()
        self.label_map: dict[int, str] = self._validate_label_map()

        # The tick path feeds two rows (the features, then zeros) and keeps row 0: ONNX Runtime's
        # CPU GEMM takes a different kernel for a single row, whose results differ from a batch's
        # in the last bits; with two rows (and batches cut at BATCH_CHUNK_ROWS), predict() is
        # bit-identical to predict_batch() on CPU (checked in tests/engine/laya/test_laya.py), so tick and
        # batch replays agree. The second row adds little to a run.
        self._x = np.zeros((2, self.n_features), dtype=np.float32)
        self._feeds = {self._input_name: self._x}
        self._run = self._session.run
        # The tick path calls the compiled session directly when this onnxruntime has one: the public
        # run() re-validates feed names and ownership on every call (our feeds are fixed and checked at
        # load, so on the tick path that is pure cost) and would silently retry on another provider
        # after an EP failure, which Laya must never do (the error is raised and reported instead).
        inner = getattr(self._session, "_sess", None)
        # one RunOptions for every tick: given None, each call makes a default one (~0.45 of ~2.7 us)
        self._run_options = ort.RunOptions()
        opts = self._run_options
        self._run_tick = (
            (lambda names, feeds: inner.run(names, feeds, opts)) if inner is not None else self._run
        )
        self.warmup_first_ms, self.warmup_steady_ms = self._warm_up(config.warmup_runs)
        # On CPU the tick path runs on an IO binding: the input row and both outputs are bound once
        # to arrays this object owns, so a tick allocates nothing and converts nothing (same
        # bits: tests/engine/laya/test_laya.py; bench/bench_tick_stages.py times it). Other providers keep
        # run(): their outputs would be copied back from the device anyway.
        self._tick_label = np.zeros(2, dtype=np.int64)
        self._tick_probs = np.zeros((2, N_CLASSES), dtype=np.float32)
        self._tick_bound: Callable[[], None] | None = None
        if self.active_provider == CPU and inner is not None and hasattr(inner, "run_with_iobinding"):
            binding = self._session.io_binding()
            binding.bind_cpu_input(self._input_name, self._x)
            binding.bind_output(self._output_names[0], "cpu", 0, np.int64, [2], self._tick_label.ctypes.data)
            binding.bind_output(
                self._output_names[1], "cpu", 0, np.float32, [2, N_CLASSES], self._tick_probs.ctypes.data
            )
            self._binding = binding  # keeps the binding (and what it points at) alive
            self._tick_bound = functools.partial(inner.run_with_iobinding, binding._iobinding, opts)
        # predict_each puts two rows in one call only where this model gives a row the same bits beside
        # another row as beside the pad (a model that mixes rows, e.g. normalising over the batch,
        # would label differently from live): checked once here on a few seeded rows
        self.rows_per_tick_call = 2 if self._tick_bound is not None and self._rows_independent() else 1

    # -- loading ------------------------------------------------------------------------------

    @staticmethod
    def _why_no_cuda(compiled_in: list[str], preload_note: str) -> str:
        if CUDA not in compiled_in:
            return (
                f"this onnxruntime build ({ort.__version__}, {ort.get_device()}) has no {CUDA} "
                "(is the plain `onnxruntime` package installed instead of, or beside, `onnxruntime-gpu`?)"
            )
        missing = [ln.strip() for ln in preload_note.splitlines() if "Failed to load" in ln]
        return (
            f"onnxruntime {ort.__version__} could not start {CUDA} (no GPU, or the CUDA/cuDNN libraries "
            "it needs are missing or of the wrong major version"
            + (f"; {missing[0]}" if missing else "")
            + ")"
        )

    def _validate_io(self) -> None:
        inputs = self._session.get_inputs()
        if len(inputs) != 1:
            names = [i.name for i in inputs]
            raise LayaModelError(f"model has {len(inputs)} inputs {names}; Laya feeds exactly one")
        inp = inputs[0]
        if inp.type != "tensor(float)":
            raise LayaModelError(
                f"model input {inp.name!r} is {inp.type}; features {self.feature_version} are float32"
            )
        shape = list(inp.shape)
        if len(shape) != 2 or shape[1] != self.n_features:
            raise LayaModelError(
                f"model input shape {_shape_str(shape)} does not match "
                f"features {self.feature_version} ({self.n_features})"
            )
        if isinstance(shape[0], int):
            raise LayaModelError(
                f"model input shape {_shape_str(shape)} has a fixed batch dimension; "
                f"Laya needs [None, {self.n_features}]"
            )
        self._input_name: str = inp.name

        outputs = self._session.get_outputs()
        by_name = {o.name: o for o in outputs}
        label = next((by_name[n] for n in _LABEL_OUTPUT_NAMES if n in by_name), None)
        if label is None:
            label = next((o for o in outputs if o.type == "tensor(int64)" and len(o.shape) == 1), None)
        probs = next((by_name[n] for n in _PROBS_OUTPUT_NAMES if n in by_name), None)
        if probs is None:
            probs = next((o for o in outputs if o.type == "tensor(float)" and len(o.shape) == 2), None)
        found = [f"{o.name}: {o.type} {_shape_str(list(o.shape))}" for o in outputs]
        if label is None or label.type != "tensor(int64)":
            raise LayaModelError(f"model has no int64 label output (outputs: {found})")
        if probs is None or probs.type != "tensor(float)" or len(probs.shape) != 2:
            raise LayaModelError(
                f"model has no float32 [N, {N_CLASSES}] probabilities output (outputs: {found}); "
                "export sklearn classifiers with zipmap disabled"
            )
        if isinstance(probs.shape[1], int) and probs.shape[1] != N_CLASSES:
            raise LayaModelError(
                f"model probabilities output {probs.name!r} has {probs.shape[1]} classes; "
                f"Laya has {N_CLASSES} "
                f"({', '.join(EXPECTED_LABEL_MAP.values())})"
            )
        self._label_name: str = label.name
        self._probs_name: str = probs.name
        self._output_names = [label.name, probs.name]

    def _validate_feature_version(self) -> str:
        version = self.metadata.get("feature_version")
        if version is None:
            raise LayaModelError(
                "model metadata has no 'feature_version' "
                f"(this engine computes features {self.config.feature_version})"
            )
        if self.config.feature_version == "auto" and version not in FEATURE_SIZES:
            raise LayaModelError(
                f"model was trained on features {version!r}, which this engine cannot compute "
                f"(known feature versions: {', '.join(sorted(FEATURE_SIZES))})"
            )
        if self.config.feature_version not in ("auto", version):
            hint = (
                f" (compute {version} instead: `dualhub replay --features {version}`)"
                if version in FEATURE_SIZES
                else f" (known feature versions: {', '.join(sorted(FEATURE_SIZES))})"
            )
            raise LayaModelError(
                f"model was trained on features {version!r} but this engine computes "
                f"{self.config.feature_version!r}{hint}"
            )
        return version

    def _validate_label_map(self) -> dict[int, str]:
        raw = self.metadata.get("label_map")
        if raw is None:
            raise LayaModelError('model metadata has no \'label_map\' (JSON like {"0": "HOLD", ...})')
        try:
            parsed = json.loads(raw)
            label_map = {int(k): str(v) for k, v in parsed.items()}
        except (ValueError, TypeError, AttributeError):
            raise LayaModelError(
                f"model metadata 'label_map' is not a JSON object of class ids: {raw[:200]!r}"
            ) from None
        if label_map != EXPECTED_LABEL_MAP:
            raise LayaModelError(
                f"model label_map {label_map} does not match engine labels {EXPECTED_LABEL_MAP}"
            )
        return label_map

    def _warm_up(self, runs: int) -> tuple[float, float]:
        times_ms: list[float] = []
        try:
            for _ in range(runs):
                t0 = time.perf_counter_ns()
                label, probs = self._run(self._output_names, self._feeds)
                times_ms.append((time.perf_counter_ns() - t0) / 1e6)
            batch_labels, batch_probs = self._run(
                self._output_names, {self._input_name: np.zeros((3, self.n_features), dtype=np.float32)}
            )
        except Exception as e:
            raise LayaModelError(f"model failed on a warm-up run: {_short(e)}") from None
        if label.shape != (2,) or probs.shape != (2, N_CLASSES) or probs.dtype != np.float32:
            raise LayaModelError(
                f"model outputs label {label.shape} and probabilities {probs.shape} {probs.dtype} "
                f"for two rows; expected (2,) and (2, {N_CLASSES}) float32"
            )
        if batch_labels.shape != (3,) or batch_probs.shape != (3, N_CLASSES):
            raise LayaModelError(
                f"model outputs {batch_labels.shape} / {batch_probs.shape} for 3 rows; "
                "it must handle any batch size"
            )
        steady = statistics.median(times_ms[1:]) if len(times_ms) > 1 else times_ms[0]
        return times_ms[0], steady

    def _rows_independent(self) -> bool:
        rows = np.random.default_rng(0).normal(0.0, 3.0, (6, self.n_features)).astype(np.float32)
        alone = [self.predict(r) for r in rows]
        bound = self._tick_bound
        assert bound is not None
        same = True
        for i in range(0, len(rows), 2):
            self._x[:] = rows[i : i + 2]
            bound()
            for j in (0, 1):
                lab, pr = alone[i + j]
                same &= int(self._tick_label[j]) == lab and bool(np.array_equal(self._tick_probs[j], pr))
        self._x[:] = 0.0
        return same

    # -- inference ----------------------------------------------------------------------------

    def predict(self, features: np.ndarray) -> tuple[int, np.ndarray]:
        """One feature row ``(n_features,)`` -> (label id, probabilities ``(4,)`` float32). The tick path."""
        if features.shape != (self.n_features,):
            raise ValueError(f"features must have shape ({self.n_features},), got {features.shape}")
        self._x[0] = features
        return self.predict_row()

    @property
    def input_row(self) -> np.ndarray:
        """The tick path's feature row ``(n_features,)`` float32: write features here, then call
        :meth:`predict_row` (saves :meth:`predict`'s copy and shape check)."""
        return self._x[0]

    def predict_row(self) -> tuple[int, np.ndarray]:
        """:meth:`predict` of what :attr:`input_row` holds now."""
        bound = self._tick_bound
        if bound is not None:
            bound()
            return int(self._tick_label[0]), self._tick_probs[0].copy()  # the buffer is reused
        label, probs = self._run_tick(self._output_names, self._feeds)
        return int(label[0]), probs[0]

    def predict_each(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``(n, n_features)`` -> as :meth:`predict_batch`, but each row through the tick path's
        call, as live mode labels it: what a tick-mode replay computes.

        On the CPU binding two rows share a call: the tick path's call has two rows (the features and a
        pad row of zeros), and here the next row takes the pad's place. In a model whose rows do not
        mix (each row of a GEMM is its own dot products, the rest is per row; checked at load:
        :attr:`rows_per_tick_call`), each comes out with the bits :meth:`predict` gives it alone
        (``tests/engine/laya/test_laya.py``), in half the calls. Otherwise, and on other providers,
        each row is a :meth:`predict`."""
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X must have shape (n, {self.n_features}), got {X.shape}")
        n = X.shape[0]
        labels = np.empty(n, dtype=np.int64)
        probs = np.empty((n, N_CLASSES), dtype=np.float32)
        bound = self._tick_bound
        if n == 0:
            return labels, probs
        if bound is not None:
            # Rows in and results out as bytes through memoryviews of the bound buffers: numpy's
            # indexing and slice assignment cost ~0.4 us a call here, these ~0.2 (the inference ~2.3).
            x = np.ascontiguousarray(X, dtype=np.float32)
            step = 8 * self.n_features  # two rows
            src, dst = memoryview(x).cast("B"), memoryview(self._x).cast("B")
            lab, lab_out = memoryview(self._tick_label).cast("B"), memoryview(labels).cast("B")
            pr, pr_out = memoryview(self._tick_probs).cast("B"), memoryview(probs).cast("B")
            w = 8 * N_CLASSES
            pairs = n // 2 if self.rows_per_tick_call == 2 else 0
            for i in range(pairs):
                dst[:] = src[i * step : (i + 1) * step]
                bound()
                lab_out[16 * i : 16 * i + 16] = lab
                pr_out[w * i : w * i + w] = pr
            self._x[1] = 0.0  # the pad row as predict() has it
            for i in range(2 * pairs, n):  # the last row of an odd count (or every row) alone
                labels[i], probs[i] = self.predict(x[i])
        else:
            for i in range(n):
                labels[i], probs[i] = self.predict(X[i])
        return labels, probs

    def predict_batch(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``(n, n_features)`` -> (labels int64 ``(n,)``, probabilities ``(n, 4)`` float32)."""
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X must have shape (n, {self.n_features}), got {X.shape}")
        if X.shape[0] == 0:
            return np.empty(0, dtype=np.int64), np.empty((0, N_CLASSES), dtype=np.float32)
        x = np.ascontiguousarray(X, dtype=np.float32)
        n = x.shape[0]
        labels = np.empty(n, dtype=np.int64)
        probs = np.empty((n, N_CLASSES), dtype=np.float32)
        for start in range(0, n, BATCH_CHUNK_ROWS):
            stop = min(start + BATCH_CHUNK_ROWS, n)
            lab, pr = self._run(self._output_names, {self._input_name: x[start:stop]})
            labels[start:stop] = lab
            probs[start:stop] = pr
        return labels, probs

    def label_name(self, label: int) -> str:
        return self.label_map[label]

    def describe(self) -> dict[str, Any]:
        """Provider and model facts for run manifests and ``dualhub doctor``."""
        return {
            "model_path": str(self.model_path),
            "model_sha256": self.model_sha256,
            "feature_version": self.feature_version,
            "n_features": self.n_features,
            "label_map": {str(k): v for k, v in self.label_map.items()},
            "provider_config": self.config.provider,
            "requested_providers": list(self.requested_providers),
            "active_provider": self.active_provider,
            "active_providers": list(self.active_providers),
            "fallback_reason": self.fallback_reason,
            "compiled_in_providers": ort.get_available_providers(),
            "onnxruntime_version": ort.__version__,
            "gpu_mem_limit_bytes": self.config.gpu_mem_limit_bytes,
            "intra_op_threads": self.config.intra_op_threads,
            "warmup_runs": self.config.warmup_runs,
            "warmup_first_ms": self.warmup_first_ms,
            "warmup_steady_ms": self.warmup_steady_ms,
            "rows_per_tick_call": self.rows_per_tick_call,
            "input_name": self._input_name,
            "output_names": list(self._output_names),
            "metadata": dict(sorted(self.metadata.items())),
        }
