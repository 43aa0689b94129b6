"""Every command the README lists, run as a newcomer would (the installed ``dualhub`` console script,
one process per command) on small data: each ends with the exit status it documents and never with a
traceback (issue 58). The README's own list is parsed, so a command added there without a run here
fails the test.

Slow: some forty processes, each loading the compiled core; `kev bench` is left out (it starts the real
llama-server: tests/engine/kev cover it) and so is anything that needs the network. With
DUALHUB_FRESH_INSTALL=1 the commands run from a new venv that README command 1's install made."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow

DUALHUB = Path(sys.executable).parent / "dualhub"
BINANCE = REPO / ".." / "shared" / "data" / "real" / "binance-usdm" / "usdm_btcusdt_20240808.gz"


def readme_commands() -> set[str]:
    """The subcommands the README's Commands block lists (``dualhub NAME ...`` lines; ``kev NAME`` for
    Kev's)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Commands", 1)[1].split("```", 2)[1]
    names = set()
    for m in re.finditer(r"dualhub (kev )?([a-z][a-z-]+)", block):
        names.add(f"kev {m.group(2)}" if m.group(1) else m.group(2))
    return names


class Dualhub:
    """Runs ``dualhub ARGS`` and records which commands ran, to check the README's list is covered."""

    def __init__(self, cwd: Path, exe: Path) -> None:
        self.cwd = cwd
        self.exe = exe
        self.ran: set[str] = set()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BITGET_")}

    def name(self, args: tuple[str, ...]) -> str:
        return f"kev {args[1]}" if args[0] == "kev" else args[0]

    def __call__(
        self, *args: str, ok: tuple[int, ...] = (0,), timeout: float = 600
    ) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [str(self.exe), *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        where = f"dualhub {' '.join(args)} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        assert p.returncode in ok, where
        assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, where
        self.ran.add(self.name(args))
        return p

    def start(self, *args: str) -> subprocess.Popen:
        self.ran.add(self.name(args))
        pipe = subprocess.PIPE
        return subprocess.Popen(
            [str(self.exe), *args], cwd=self.cwd, env=self.env, stdout=pipe, stderr=pipe, text=True
        )


def stop(proc: subprocess.Popen) -> str:
    """SIGTERM, then its stderr, which must hold no traceback."""
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    assert "Traceback" not in err, err[-3000:]
    return err


def test_readme_lists_the_commands_this_test_runs():
    assert {"demo", "simulate", "replay", "report", "sql", "diff", "sweep", "record", "recover", "serve",
            "import", "train", "kev fit-lag", "kev bench", "serve-exchange", "live", "parity",
            "doctor"} <= readme_commands()  # fmt: skip


def readme_install() -> str:
    """README command 1's install: the pip requirement it installs (``.[research]``)."""
    first = (REPO / "README.md").read_text().split("```bash", 1)[1].split("\n", 2)[1]
    m = re.search(r"pip install -q -e '?(\.\[[a-z,]+\]|\.)'?", first)
    assert m, first
    return m.group(1)


def test_readme_install_brings_what_the_readme_commands_need():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def closure(names: list[str]) -> set[str]:
        out: set[str] = set()
        for n in names:
            for req in extras[n]:
                inner = re.fullmatch(r"dualhub\[([a-z,]+)\]", req)
                out |= closure(inner.group(1).split(",")) if inner else {re.split(r"[<>=\[ ]", req)[0]}
        return out

    req = readme_install()
    got = closure(re.findall(r"[a-z]+", req.partition("[")[2])) if "[" in req else set()
    # report --html and sweep --plot: matplotlib; train: scikit-learn, onnx; the notebooks: jupyterlab
    assert {"matplotlib", "scikit-learn", "onnx", "jupyterlab"} <= got, (req, got)


def fresh_install(root: Path) -> Path:
    """README command 1's install, as written, into a new venv (the clone installed editable)."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    req = readme_install().replace(".", str(REPO), 1)
    p = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "-e", req], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return venv / "bin" / "dualhub"


def test_every_readme_command_runs(tmp_path):
    exe = DUALHUB
    if os.environ.get("DUALHUB_FRESH_INSTALL") == "1":
        # the whole newcomer's path: README command 1's install in a new venv (minutes, and a download
        # of every dependency), then every command from that venv
        exe = fresh_install(tmp_path)
    assert exe.exists(), f"the console script is not installed: {exe}"
    run = Dualhub(tmp_path, exe)

    run("--help")
    run("doctor")
    run("doctor", "--json")

    # -- simulated sessions, replays of every kind the README shows
    run("simulate", "--out", "sim", "--minutes", "2", "--seed", "7")
    run("simulate", "--out", "pair", "--symbols", "BTCUSDT,ETHUSDT", "--minutes", "1")
    first = run("replay", "sim", "--out", "r1", "--report")
    assert first.stdout.splitlines()[0].strip(), "no blank first line"
    assert len(re.findall(r"^digest[: ]", first.stdout, re.M)) == 1  # the run's digest, once
    run("replay", "sim", "--out", "r2", "--seed", "2", "--fill-model", "queue_power3",
        "--scale-latency", "kev=2,order=0.5", "--features", "auto")  # fmt: skip
    run("replay", "pair", "--symbol", "ETHUSDT", "--instrument", "ETHUSDT:quote_qty=0.06", "--out", "r-eth")
    run("replay", "pair", "--symbols", "BTCUSDT,ETHUSDT", "--kev-hub", "pairs",
        "--instrument", "ETHUSDT:quote_qty=0.06", "--out", "r-pair")  # fmt: skip
    run("replay", "pair", "--symbols", "ALL", "--out", "r-all", "--kev-timeout-ms", "1500")
    run("replay", "sim", "--python-engine", "--out", "r-py", "--strategy", "baseline")
    run("replay", "sim", "--kev-mode", "cassette", "--kev-cassette", "r1", "--out", "r-cas")

    # -- analysis
    run("report", "r1")
    run("report", "r-pair", "--html", "report.html")
    assert (tmp_path / "report.html").stat().st_size > 10_000
    out = run("sql", "r1", "SELECT count(*) AS n FROM label").stdout
    assert re.search(r"\b\d+\b", out)
    run("diff", "r1", "r-cas", ok=(0, 1))
    run("diff", "r1", "r2", ok=(1,))
    # a catalog of the sessions under a folder, then one statement over all of them
    (tmp_path / "days").mkdir()
    shutil.copytree(tmp_path / "sim", tmp_path / "days" / "sim")
    shutil.copytree(tmp_path / "pair", tmp_path / "days" / "pair")
    run("catalog", "days")
    out = run("sql", "days", "SELECT instrument, count(*) AS n FROM books15 GROUP BY instrument").stdout
    assert "ETHUSDT" in out and "BTCUSDT" in out

    # -- a sweep with its plot
    (tmp_path / "grid.toml").write_text('[base]\nlaya_provider = "cpu"\n[grid]\nscale_kev = [0.5, 2]\n')
    run(
        "sweep",
        "grid.toml",
        "--sessions",
        "sim",
        "--serial",
        "--out",
        "results.parquet",
        "--plot",
        "sweep.png",
    )
    assert (tmp_path / "sweep.png").exists()

    # -- training a model, and replaying with it
    run(
        "train", "sim", "--out", "m.onnx", "--folds", "2", "--emergency-bps", "2"
    )  # a short session: few big moves
    run("replay", "sim", "--model", "m.onnx", "--out", "r-model")

    # -- real data, where the shared recording is present
    if BINANCE.exists():
        run("import", "binance-futures", str(BINANCE), "--out", "binance")
        # the session's own contract (Binance USD-M's published spec), said with its fees
        out = run("replay", "binance", "--out", "r-binance").stdout
        assert "taker 0.0005, from the session (known)" in out

    # -- the local protocol server, a recording from it, and a recovery of a killed one
    serve = run.start("serve", "--simulate", "--minutes", "1", "--speed", "20")
    try:
        line = serve.stdout.readline()
        url = line.split()[-1]
        assert url.startswith("ws://"), line
        run("record", "--symbols", "BTCUSDT", "--channels", "books15,trade", "--out", "rec", "--url", url,
            "--duration", "3", "--no-status")  # fmt: skip
        killed = run.start(
            "record", "--symbols", "BTCUSDT", "--out", "rec-killed", "--url", url, "--no-status"
        )
        deadline = time.monotonic() + 60
        while not (tmp_path / "rec-killed" / "journal").exists():
            assert time.monotonic() < deadline and killed.poll() is None
            time.sleep(0.1)
        time.sleep(2)
        killed.kill()
        killed.wait(30)
    finally:
        stop(serve)
    run("recover", "rec-killed")
    assert (tmp_path / "rec-killed" / "manifest.json").exists()
    run("replay", "rec", "--out", "r-rec")

    # -- the local exchange, a live paper run against it, its parity, and the kill switch
    exchange = run.start("serve-exchange", "sim", "--speed", "5")
    try:
        first_line = exchange.stdout.readline().split()
        rest, ws = first_line[first_line.index("REST") + 1], first_line[first_line.index("WS") + 1]
        run("live", "--symbols", "BTCUSDT", "--paper", "--exchange-url", rest, "--ws-url", ws,
            "--out", "live", "--duration", "5", "--provider", "cpu", timeout=300)  # fmt: skip
        # a Python strategy that never returns: the live run stops trading at its time budget, exit 1
        (tmp_path / "stuck.py").write_text("def s(book, tick, qty, label, pos, target, max_pos, params):\n"
                                           "    while True:\n        pass\n")  # fmt: skip
        argv = ["live", "--symbols", "BTCUSDT", "--paper", "--exchange-url", rest, "--ws-url", ws,
                "--out", "live-stuck", "--duration", "60", "--provider", "cpu",
                "--strategy", "stuck.py:s", "--strategy-budget-ms", "300"]  # fmt: skip
        stuck = run(*argv, ok=(1,), timeout=300)
        assert "ran past its time budget of 300 ms" in stuck.stderr
    finally:
        stop(exchange)
    run("parity", "live", ok=(0, 1))
    # Kev's lag as the live run measured it (a simulated run's lags were drawn: fit-lag refuses those)
    run("kev", "fit-lag", "live", "--out", "lag.json")
    run("replay", "sim", "--kev-lag-fit", "lag.json", "--out", "r-lag")
    run("kill", "live", "--reason", "readme")

    # -- and the first command of all, last: it reuses nothing above
    demo = run("demo", "--out", "demo", "--minutes", "0.5")
    wide = [ln for ln in demo.stdout.splitlines() if len(ln) > 120]
    assert not wide, f"the demo's console output is wider than 120 columns: {wide[:3]}"
    assert demo.stdout.splitlines()[0].strip() and "WARNING" not in demo.stdout + demo.stderr

    missing = readme_commands() - run.ran - {"kev bench"}
    assert not missing, f"README commands this test does not run: {sorted(missing)}"
