"""Every notebook in notebooks/ runs headless (nbclient) against a small generated session and run,
so a broken notebook fails CI; and no notebook is committed with outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def session_and_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from replay.driver import ReplayConfig, run_replay
    from replay.simulator import simulate_session

    root = tmp_path_factory.mktemp("nb")
    session = simulate_session(root / "session", minutes=1.5, seed=9)
    run = run_replay(session, ReplayConfig(seed=2, laya_provider="cpu"), out_dir=root / "run").run_dir
    return session, run


def test_the_notebooks_are_there() -> None:
    names = {p.name for p in NOTEBOOKS}
    for name in ("01_session", "02_labels_vs_returns", "03_fills_pnl", "04_latency", "05_latency_whatif"):
        assert f"{name}.ipynb" in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(
    path: Path, session_and_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    session, run = session_and_run
    monkeypatch.setenv("DUALHUB_SESSION", str(session))
    monkeypatch.setenv("DUALHUB_RUN", str(run))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    client.execute()  # raises CellExecutionError (with the cell and traceback) on any failure
    images = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})
    ]
    assert images, f"{path.name} drew no plot"
