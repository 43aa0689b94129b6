#!/usr/bin/env python3
"""Bad numbers on every numeric option of the commands: each must be one `dualhub CMD: error:` line.

Simulates a short session and replays it once, then runs each command below with each of its options
given as a metavar in `--help` set, one at a time, to -1, 0, NaN, infinity, 1e400 and a 23-digit
integer. Prints every case that raised a traceback (TRACEBACK), exited 0 on one of the values that
no setting should take (ACCEPTED: NaN, infinity, 1e400; -1 and 0 are legitimate for some options
and are only printed with `--all`) or ran past the timeout (TIMEOUT: a server that started, or a run
that accepted an absurd length; a server still running after 5 s has started, which is an ACCEPTED).
Commands that would touch the network are pointed at a dead port.

    .venv/bin/python bench/fuzz_cli.py [--only replay,simulate] [--all] [--timeout 30]
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DUALHUB = [sys.executable, "-m", "dualhub.cli"]
VALUES = ("-1", "0", "nan", "inf", "1e400", "99999999999999999999999")
NEVER = {"nan", "inf", "1e400"}  # no setting takes these: exit 0 on one is a finding
SKIP = {"--out", "--session", "--model", "--symbol", "--symbols", "--kev-url", "--kev-cassette", "--url"}
SKIP |= {"--exchange-url", "--ws-url", "--metrics-json", "--html", "--kill-file", "--kev-lag-fit", "--ray"}
SERVERS = {"serve", "serve-exchange"}  # they run until stopped: still running after a few seconds = started


def dead_url(scheme: str = "http") -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"{scheme}://127.0.0.1:{s.getsockname()[1]}"


def commands(session: Path, run: Path, tmp: Path) -> dict[str, list[str]]:
    """Each command with the arguments that make it runnable here (outputs under ``tmp``)."""
    return {
        "simulate": ["--out", str(tmp / "sim"), "--minutes", "1"],
        "replay": [str(session), "--out", str(tmp / "rep"), "--overwrite"],
        "train": [str(session), "--out", str(tmp / "m.onnx")],
        "diff": [str(run), str(run)],
        "serve": ["--simulate", "--exit-when-done", "--speed", "0", "--minutes", "0.2"],
        "serve-exchange": [str(session)],
        "record": [
            "--symbols",
            "BTCUSDT",
            "--out",
            str(tmp / "rec"),
            "--duration",
            "1",
            "--url",
            dead_url("ws") + "/v2/ws/public",
        ],  # fmt: skip
        "live": [
            "--paper",
            "--contract-defaults",
            "--exchange-url",
            dead_url(),
            "--duration",
            "1",
            "--out",
            str(tmp / "live"),
        ],  # fmt: skip
        "doctor": ["--kev-url", dead_url(), "--exchange-url", dead_url()],
        "kev bench": ["--url", dead_url()],
    }


def numeric_options(cmd: str) -> list[str]:
    h = subprocess.run([*DUALHUB, *cmd.split(), "--help"], capture_output=True, text=True, cwd=ROOT).stdout
    opts = re.findall(r"^\s{2}(?:-\w, )?(--[a-z0-9-]+) [A-Z_0-9]+\b", h, re.M)
    return [o for o in dict.fromkeys(opts) if o not in SKIP]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated commands (default: all below)")
    ap.add_argument("--all", action="store_true", help="also print -1 and 0 taken (legitimate for some)")
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from replay.config import ReplayConfig
    from replay.driver import run_replay
    from venue.simulator import simulate_session

    findings = 0
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        session = simulate_session(tmp / "s", minutes=1.0, seed=3)
        run = run_replay(session, ReplayConfig(laya_provider="cpu"), out_dir=tmp / "run").run_dir
        cmds = commands(session, run, tmp)
        for cmd in a.only.split(",") if a.only else cmds:
            opts = numeric_options(cmd)
            print(f"{cmd}: {len(opts)} options", flush=True)
            for opt in opts:
                for v in VALUES:
                    argv = [*DUALHUB, *cmd.split(), *cmds[cmd], opt, v]
                    server = cmd in SERVERS
                    try:
                        p = subprocess.run(
                            argv, capture_output=True, text=True, timeout=5 if server else a.timeout, cwd=ROOT
                        )
                    except subprocess.TimeoutExpired:
                        if not server:
                            print(f"  TIMEOUT   {cmd} {opt} {v}", flush=True)
                            findings += 1
                        elif v in NEVER or a.all:
                            print(f"  ACCEPTED  {cmd} {opt} {v} (started)", flush=True)
                            findings += v in NEVER
                        continue
                    out = (p.stdout + p.stderr).strip()
                    if "Traceback" in out:
                        print(f"  TRACEBACK {cmd} {opt} {v}: {out.splitlines()[-1][:160]}", flush=True)
                        findings += 1
                    elif p.returncode == 0 and (v in NEVER or a.all):
                        print(f"  ACCEPTED  {cmd} {opt} {v}", flush=True)
                        findings += v in NEVER
    print(f"{findings} findings")


if __name__ == "__main__":
    main()
