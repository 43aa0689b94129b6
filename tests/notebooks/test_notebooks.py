"""Every notebook in notebooks/ runs headless (nbclient) against a small generated session and run,
so a broken notebook fails CI (10_real_data replays the real recording in ../shared/data/real); no
notebook is committed with outputs; and DUALHUB_SESSION may be a relative path."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def session_and_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from replay.config import ReplayConfig
    from replay.driver import run_replay
    from venue.simulator import simulate_session

    root = tmp_path_factory.mktemp("nb")
    session = simulate_session(root / "session", minutes=1.5, seed=9)
    run = run_replay(session, ReplayConfig(seed=2, laya_provider="cpu"), out_dir=root / "run").run_dir
    return session, run


EXPECTED = (
    "01_session",
    "02_labels_vs_returns",
    "03_fills_pnl",
    "04_latency",
    "05_latency_whatif",
    "06_queue_models",
    "07_kev_lag_ablation",
    "08_laya_calibration",
    "09_multiseed_whatif",
    "10_real_data",
    "11_tear_sheet",
    "12_portfolio",
)


def test_the_notebooks_are_there() -> None:
    assert sorted(p.stem for p in NOTEBOOKS) == sorted(EXPECTED)


def _execute(path: Path, cwd: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()  # raises CellExecutionError (with the cell and traceback) on any failure
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(
    path: Path, session_and_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    session, run = session_and_run
    monkeypatch.setenv("DUALHUB_SESSION", str(session))
    monkeypatch.setenv("DUALHUB_RUN", str(run))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = _execute(path, REPO)
    images = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})
    ]
    assert images, f"{path.name} drew no plot"


@pytest.mark.slow
def test_a_relative_session_path_is_found_from_where_the_notebook_starts(
    session_and_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session, _ = session_and_run
    shutil.copytree(session, tmp_path / "sessions" / "mine")
    monkeypatch.setenv("DUALHUB_SESSION", "sessions/mine")  # relative to the kernel's start dir, not the repo
    monkeypatch.delenv("PWD", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = _execute(REPO / "notebooks" / "01_session.ipynb", tmp_path)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "sessions/mine" in text and "source" in text  # it opened the session and printed its manifest


@pytest.mark.slow
def test_a_missing_session_path_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("DUALHUB_SESSION", "no/such/session")
    monkeypatch.delenv("DUALHUB_RUN", raising=False)
    with pytest.raises(CellExecutionError) as e:
        _execute(REPO / "notebooks" / "01_session.ipynb", tmp_path)
    msg = str(e.value)
    assert "DUALHUB_SESSION='no/such/session' does not exist" in msg and str(tmp_path) in msg
