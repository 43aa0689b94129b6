"""Kev's client in its own process (engine/kev/process.py): replies routed to their requests,
errors raised again under their own names, a dying child failing requests instead of the caller,
cancellation reaching the child, a clean close, and the live runner using it by default. The happy
path against a real llama-server is in tests/engine/kev/test_kev_llama.py."""

import asyncio
import gc
import os
from functools import partial

import pytest

from engine.kev.advisor import KevContext
from engine.kev.process import KevProcessError, ProcessAdvisor
from live.runner import LiveConfig, LiveRunner
from tests.helpers import REPO
from tests.kev_fakes import FakeAdvisor


def ctx(i: int, *, label: str = "LEAN_BUY", delay_ms: float = 1.0) -> KevContext:
    return KevContext(
        request_id=i,
        ts_ns=i,
        symbol="BTCUSDT",
        label=label,
        label_seq=i,
        p_label=0.9,
        mid=delay_ms,  # FakeAdvisor's answer time
        spread=0.1,
        imbalance=0.0,
        position=0.0,
        max_position=1.0,
    )


def fake(marker: str = "") -> ProcessAdvisor:
    return ProcessAdvisor(partial(FakeAdvisor, marker), name="fake", key_fn=lambda c: f"k{c.request_id}")


def test_concurrent_requests_get_their_own_replies_from_another_process(tmp_path):
    marker = tmp_path / "closed"

    async def go():
        kev = fake(str(marker))
        try:
            # later requests answer sooner: replies come back out of order
            replies = await asyncio.gather(*(kev.advise(ctx(i, delay_ms=40 - 2 * i)) for i in range(20)))
        finally:
            await kev.aclose()
        return kev, replies

    kev, replies = asyncio.run(go())
    assert [r.raw["request_id"] for r in replies] == list(range(20))
    assert [r.key for r in replies] == [f"k{i}" for i in range(20)]
    assert {r.raw["pid"] for r in replies} == {kev.pid} and kev.pid != os.getpid()
    assert kev.name == "fake" and kev.key(ctx(7)) == "k7"
    # closed: the wrapped advisor's aclose ran in the child, and the child exited
    assert marker.read_text() == "closed after 0 cancellations"
    assert kev.exitcode == 0


def test_an_exception_in_the_child_is_raised_under_its_own_name():
    async def go():
        kev = fake()
        try:
            with pytest.raises(KevProcessError) as ei:
                await kev.advise(ctx(1, label="raise"))
            after = await kev.advise(ctx(2))  # the child is still serving
        finally:
            await kev.aclose()
        return ei.value, after

    err, after = asyncio.run(go())
    assert type(err).__name__ == "Boom" and "request 1 failed" in str(err)
    assert after.raw["request_id"] == 2


def test_a_dying_child_fails_pending_and_later_requests_not_the_caller():
    async def go():
        kev = fake()
        try:
            pending = asyncio.ensure_future(kev.advise(ctx(1, delay_ms=2000)))
            await asyncio.sleep(0.05)
            with pytest.raises(KevProcessError, match="exited"):
                await kev.advise(ctx(2, label="exit"))
            with pytest.raises(KevProcessError, match="exited"):
                await pending
            with pytest.raises(KevProcessError, match="exited"):
                await kev.advise(ctx(3))
        finally:
            await kev.aclose()
        return kev

    kev = asyncio.run(go())
    assert kev.exitcode == 3


def test_cancelling_a_request_cancels_it_in_the_child():
    async def go():
        kev = fake()
        try:
            await kev.advise(ctx(0, delay_ms=1))  # the child is up (its start takes ~0.3 s, more when busy)
            t = asyncio.ensure_future(kev.advise(ctx(1, label="hang")))
            await asyncio.sleep(0.2)  # in flight in the child
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            return await kev.advise(ctx(2, delay_ms=50))
        finally:
            await kev.aclose()

    reply = asyncio.run(go())
    assert reply.raw["cancelled"] == 1


def test_closed_advisor_refuses_requests():
    async def go():
        kev = fake()
        await kev.advise(ctx(1))
        await kev.aclose()
        with pytest.raises(KevProcessError, match="closed"):
            await kev.advise(ctx(2))

    asyncio.run(go())


@pytest.mark.parametrize("in_process", [False, True])
def test_live_runner_puts_llama_servers_client_in_its_own_process_unless_told(tmp_path, in_process):
    cfg = LiveConfig(
        out=str(tmp_path / "s"),
        contract_defaults=True,
        laya_provider="cpu",
        kev_url="http://127.0.0.1:9",
        kev_process=not in_process,
        gc_at_idle=False,
    )

    async def go():
        runner = LiveRunner(cfg)
        runner._prepare_dirs()
        runner._build({})
        inner = runner._advisor_inner
        try:
            return type(inner).__name__, inner.name, inner.key(ctx(5))
        finally:
            await inner.aclose()
            gc.unfreeze()  # _build froze what it built; a finished run gives it back the same way

    kind, name, key = asyncio.run(go())
    from engine.kev.llama import LlamaConfig

    assert kind == ("LlamaAdvisor" if in_process else "ProcessAdvisor")
    assert name == "llm" and key == LlamaConfig(base_url="http://127.0.0.1:9").key(ctx(5))


def test_a_script_without_a_main_guard_can_use_it(tmp_path):
    """The child is a fresh interpreter running engine.kev.process, not multiprocessing's spawn, which
    would import the script again in the child (and start it a second time)."""
    import subprocess
    import sys

    root = REPO
    script = tmp_path / "plain_script.py"
    script.write_text(
        "import asyncio, os\n"
        "from functools import partial\n"
        "from engine.kev.process import ProcessAdvisor\n"
        "from tests.kev_fakes import FakeAdvisor\n"
        "from tests.engine.kev.test_kev_process import ctx\n"
        "print('script body ran', flush=True)\n"
        "async def go():\n"
        "    kev = ProcessAdvisor(partial(FakeAdvisor), name='fake', key_fn=str)\n"
        "    r = await kev.advise(ctx(3))\n"
        "    await kev.aclose()\n"
        "    return r.raw['request_id'], r.raw['pid'] != os.getpid()\n"
        "print(asyncio.run(go()))\n"
    )
    p = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=root, timeout=60,
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["script body ran", "(3, True)"]
