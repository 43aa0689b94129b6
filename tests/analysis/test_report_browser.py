"""The HTML report opened in a real browser: Debian's headless Chromium (.ci/test.sh installs it) renders
the file and dumps its DOM. The report must be one self-contained file (no external reference), every
figure must be an inline image that the browser draws, and every table must be there."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium() -> str:
    exe = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    assert exe, "Debian's chromium is missing: apt-get install chromium (.ci/test.sh installs it)"
    return exe


def browse(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", *args, page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": str(tmp), "PATH": "/usr/bin:/bin"},
        check=True,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], int]:
    from analysis import tearsheet
    from analysis.html import write_html
    from analysis.report import run_report
    from replay.config import ReplayConfig
    from replay.driver import run_replay
    from venue.simulator import simulate_session

    root = tmp_path_factory.mktemp("browser")
    session = simulate_session(root / "session", minutes=1.0, seed=5)
    run = run_replay(session, ReplayConfig(seed=1, laya_provider="cpu"), out_dir=root / "run").run_dir
    out = write_html(run, root / "report.html")
    ts = tearsheet.compute(run)
    figs = tearsheet.figures(ts)
    import matplotlib.pyplot as plt

    for f in figs.values():
        plt.close(f)
    names = [*figs, "market", "latency", "labels"]
    return out, names, len(tearsheet.sections(ts)) + len(run_report(run))


def test_the_report_is_one_self_contained_file(report) -> None:
    out, names, _ = report
    text = out.read_text()
    assert not re.search(r"(?i)\b(src|href)\s*=\s*['\"](?!data:)", text), "a reference outside the file"
    assert not re.search(r"(?i)https?://|url\(\s*['\"]?(?!data:)|<script|<link|@import", text)
    assert len(re.findall(r"<img [^>]*src='data:image/png;base64,", text)) == len(names)


@pytest.mark.slow
def test_chromium_renders_every_figure_and_table(report, tmp_path: Path) -> None:
    from PIL import Image

    out, names, tables = report
    dom = browse(out, tmp_path, "--dump-dom").stdout
    imgs = re.findall(r"<img [^>]*>", dom)
    alts = sorted(re.search(r'alt="([^"]+)"', i).group(1) for i in imgs)
    assert alts == sorted(names)
    assert all('src="data:image/png;base64,' in i for i in imgs)
    assert len(re.findall(r"<table", dom)) == tables
    for title in ("Tear sheet", "Performance (Sharpe and Sortino at 1 s sampling)", "Fee-adjusted markouts"):
        assert title in dom

    shot = tmp_path / "shot.png"
    browse(out, tmp_path, f"--screenshot={shot}", "--window-size=1400,4000")
    px = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
    assert px.shape[:2] == (4000, 1400)
    assert px.std() > 20, "the screenshot is blank"
    # the plots' colours (saturated pixels: lines, bars, markers) are drawn, not broken-image icons
    saturated = (px.max(axis=2) - px.min(axis=2)) > 80
    assert saturated.mean() > 0.005, f"only {saturated.mean():.4%} of the page is plot colour"
