import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _kev_advice_in_the_test_tree(tmp_path_factory):
    """`dualhub kev bench` keeps its figures in the user's cache; tests neither read the user's (a
    replay's Kev timeout would depend on the machine's history) nor write there."""
    os.environ["DUALHUB_KEV_ADVICE_DIR"] = str(tmp_path_factory.mktemp("kev-advice"))


def pytest_collection_modifyitems(items):
    """Every test that talks to the real llama-server is slow (the server answers in ~2.5 s)."""
    for item in items:
        if "llama_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    """A real llama-server (SmolLM2-135M, deterministic flags) for the whole test session.

    Fails, never skips, when the binary or model is missing: run `bash .ci/ensure-llama-server.sh`.
    """
    from engine.kev.server import LlamaNotInstalled, LlamaServer, ServerError

    try:
        server = LlamaServer(log_path=tmp_path_factory.mktemp("llama") / "llama-server.log")
    except LlamaNotInstalled as e:
        pytest.fail(f"llama-server is not installed: {e}\nRun `bash .ci/ensure-llama-server.sh` first.")
    try:
        server.start()
    except ServerError as e:
        pytest.fail(f"llama-server did not start: {e}")
    yield server
    server.stop()
