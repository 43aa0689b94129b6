"""The Kev timeout a run uses with a real llama-server, from what ``dualhub kev bench`` measured.

``dualhub kev bench`` times the prompts Kev really sends (the single-instrument question and the
portfolio hub's, a longer prompt) and leaves its figures here, one JSON file per server model.
``dualhub replay --kev-mode llm`` and ``dualhub live --kev-url`` ask the server which model it serves
(``/props``) and, when no ``--kev-timeout-ms`` is given, use the recommendation measured for that model
and the prompt the run sends; an explicit timeout below the measured p50 is said at start, because
most answers would then arrive after the engine has given up on them.

The directory is ``$DUALHUB_KEV_ADVICE_DIR`` or ``~/.cache/dualhub/kev-advice``: the figures belong to
the machine and the model, not to a session or a repository.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_MS = 2000
PROMPTS = ("single", "portfolio")


def advice_dir() -> Path:
    env = os.environ.get("DUALHUB_KEV_ADVICE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "dualhub" / "kev-advice"


def _file_for(model_path: str) -> Path:
    # the model file's name, not its whole path: the same GGUF in another venv is the same model
    name = Path(model_path).name or "unknown-model"
    return advice_dir() / (re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".json")


def save(result: dict[str, Any]) -> Path | None:
    """Keep a bench ``result``'s per-prompt figures for its model (written whole or not at all)."""
    model = result.get("model_path") or result.get("model") or ""
    prompts = {
        k: {
            "p50_ms": v["wall_ms"]["p50"],
            "p99_ms": v["wall_ms"]["p99"],
            "recommended_ms": v["recommended_kev_timeout_ms"],
            "n": v["ok"],
        }
        for k, v in (result.get("prompts") or {}).items()
        if v.get("wall_ms") and v.get("recommended_kev_timeout_ms")
    }
    if not model or not prompts:
        return None
    path = _file_for(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"kind": "dualhub.kev_advice", "model_path": model, "measured": result.get("measured", ""),
            "prompts": prompts}  # fmt: skip
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".advice-")
    with os.fdopen(fd, "w") as f:
        json.dump(body, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def load(model_path: str) -> dict[str, Any] | None:
    """The figures kept for ``model_path``'s model, or None (none kept, or a file that does not read
    as advice: it is then ignored, never trusted)."""
    try:
        body = json.loads(_file_for(model_path).read_text())
        prompts = body["prompts"]
        for p in prompts.values():
            if not all(isinstance(p[k], (int, float)) and p[k] > 0 for k in ("p50_ms", "recommended_ms")):
                return None
        return body if isinstance(body, dict) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def server_model(url: str, timeout_s: float = 3.0) -> str | None:
    """The model file the llama-server at ``url`` serves (its ``/props``), or None if it does not say."""
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + "/props", timeout=timeout_s)
        r.raise_for_status()
        props = r.json()
    except (httpx.HTTPError, ValueError):
        return None
    path = props.get("model_path") if isinstance(props, dict) else None
    return path if isinstance(path, str) and path else None


@dataclass(frozen=True, slots=True)
class TimeoutChoice:
    timeout_ms: int
    line: str  # what the run says at start about it
    below_p50: bool = False


def choose(explicit_ms: int | None, model_path: str | None, prompt: str) -> TimeoutChoice:
    """The timeout for a run sending ``prompt`` (one of :data:`PROMPTS`) to ``model_path``'s server:
    ``explicit_ms`` if given (said when it is below the measured p50), else the measured
    recommendation, else :data:`DEFAULT_TIMEOUT_MS` with how to measure one."""
    advice = load(model_path) if model_path else None
    fig = (advice or {}).get("prompts", {}).get(prompt)
    model = Path(model_path).name if model_path else "the server's model"
    if explicit_ms is not None:
        if fig and explicit_ms < fig["p50_ms"]:
            return TimeoutChoice(
                explicit_ms,
                f"Kev timeout {explicit_ms} ms is below the p50 of {fig['p50_ms']:.0f} ms that `dualhub kev "
                f"bench` measured for {model} on the {prompt} prompt: most answers will be discarded "
                f"(recommended --kev-timeout-ms {fig['recommended_ms']})",
                below_p50=True,
            )
        return TimeoutChoice(explicit_ms, f"Kev timeout {explicit_ms} ms (--kev-timeout-ms)")
    if fig:
        return TimeoutChoice(
            int(fig["recommended_ms"]),
            f"Kev timeout {int(fig['recommended_ms'])} ms: `dualhub kev bench` measured {model} on the "
            f"{prompt} prompt (p50 {fig['p50_ms']:.0f} ms, p99 {fig['p99_ms']:.0f} ms)",
        )
    return TimeoutChoice(
        DEFAULT_TIMEOUT_MS,
        f"Kev timeout {DEFAULT_TIMEOUT_MS} ms (the default): no `dualhub kev bench` figures for {model}; "
        "answers slower than that are discarded — `dualhub kev bench --url URL` measures the server",
    )
