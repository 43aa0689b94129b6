"""Kev's client in its own process: the caller's event loop only writes a context and reads a reply.

Why: with Kev's HTTP client (httpx, request building, JSON parsing, schema checks, retries) on the
live event loop, the frame that follows a Kev round trip found the tick path's code and data evicted
from the CPU caches (bench/bench_tick_path.py: label p99 ~47 us on those frames against ~20 us).
Here the advisor runs in a child process with its own event loop; the parent's share of a request is
one pickled :class:`~engine.kev.advisor.KevContext` written to a pipe and one pickled
:class:`~engine.kev.advisor.KevReply` read back.

A thread would not do: its Python work would hold the GIL the tick path needs.

What the caller sees is the wrapped advisor's: the same ``name``, the same ``key`` (computed here,
in the parent), the same replies, and an exception from the child is raised again under its own
class name (a subclass of :class:`KevProcessError`), so ``type(exc).__name__`` reads as before. A
child that dies fails every pending request and every later one with :class:`KevProcessError`; it
never takes the caller down. Cancelling ``advise`` cancels the request in the child.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from engine.errors import DualhubError
from engine.kev.advisor import KevAdvisor, KevContext, KevReply

log = logging.getLogger(__name__)

# messages, parent -> child: (ADVISE, id, ctx) | (CANCEL, id) | (CLOSE,)
# child -> parent: (REPLY, id, reply) | (ERROR, id, type name, text) | (CLOSED,)
ADVISE, CANCEL, CLOSE, REPLY, ERROR, CLOSED = range(6)


class KevProcessError(DualhubError):
    """Kev's process failed a request: it raised (a subclass named after the child's exception), or
    it is gone."""


_ERROR_TYPES: dict[str, type[KevProcessError]] = {}


def _error_type(name: str) -> type[KevProcessError]:
    """A KevProcessError subclass called ``name`` (so ``type(e).__name__`` is the child's)."""
    t = _ERROR_TYPES.get(name)
    if t is None:
        t = _ERROR_TYPES[name] = type(name, (KevProcessError,), {})
    return t


class ProcessAdvisor:
    """Runs ``factory()`` (a picklable callable returning a :class:`KevAdvisor`) in a child process.

    ``key_fn`` and ``name`` are the wrapped advisor's, given here so the parent never builds it.
    Call :meth:`aclose` when done (the child also exits when the parent's end of the pipe closes).
    """

    def __init__(self, factory: Callable[[], KevAdvisor], *, name: str, key_fn: Callable[[KevContext], str]):
        self.name = name
        self._key_fn = key_fn
        # A fresh interpreter running this module, not multiprocessing's spawn: spawn would import the
        # caller's __main__ again in the child (a script without a main guard would start itself), and
        # fork must not copy a process that holds ONNX Runtime's threads. The child gets its end of a
        # multiprocessing pipe (same framing both ways) and the pickled factory as the first message.
        self._conn, child_conn = mp.Pipe(duplex=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "engine.kev.process", str(child_conn.fileno())],
            pass_fds=(child_conn.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child_conn.close()
        self._conn.send_bytes(pickle.dumps(factory, protocol=pickle.HIGHEST_PROTOCOL))
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[KevReply]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead = ""  # why the child is gone, once it is
        self._closed = False

    @classmethod
    def llama(cls, config: Any) -> ProcessAdvisor:
        """:class:`~engine.kev.llama.LlamaAdvisor` with ``config`` (a LlamaConfig), in its own process."""
        from engine.kev.llama import LlamaAdvisor

        return cls(partial(LlamaAdvisor, config), name=LlamaAdvisor.name, key_fn=config.key)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def key(self, ctx: KevContext) -> str:
        return self._key_fn(ctx)

    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise KevProcessError("a ProcessAdvisor serves the event loop that first used it")
        self._loop = loop
        loop.add_reader(self._conn.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        try:
            while self._conn.poll():
                msg = pickle.loads(self._conn.recv_bytes())
                kind = msg[0]
                if kind == REPLY or kind == ERROR:
                    fut = self._pending.pop(msg[1], None)
                    if fut is None or fut.done():  # cancelled meanwhile
                        continue
                    if kind == REPLY:
                        fut.set_result(msg[2])
                    else:
                        fut.set_exception(_error_type(msg[2])(msg[3]))
                elif kind == CLOSED:
                    self._gone("closed")
                    return
        except (EOFError, OSError) as e:
            self._gone(f"exited ({type(e).__name__}, exit code {self._proc.poll()})")
        except Exception as e:  # an undecodable message: the channel can no longer be trusted
            self._gone(f"sent an unreadable message ({type(e).__name__})")

    def _gone(self, why: str) -> None:
        if not self._dead:
            self._dead = why
            if not self._closed:
                log.warning("Kev process %s: %s", self._proc.pid, why)
        if self._loop is not None:
            self._loop.remove_reader(self._conn.fileno())
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(KevProcessError(f"Kev process {why}"))

    def _send(self, msg: tuple[Any, ...]) -> None:
        self._conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    async def advise(self, ctx: KevContext) -> KevReply:
        if self._closed:
            raise KevProcessError("Kev process closed")
        self._attach()
        if self._dead:
            raise KevProcessError(f"Kev process {self._dead}")
        rid = next(self._ids)
        fut: asyncio.Future[KevReply] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._send((ADVISE, rid, ctx))
        except OSError as e:
            self._pending.pop(rid, None)
            self._gone(f"exited ({type(e).__name__}, exit code {self._proc.poll()})")
            raise KevProcessError(f"Kev process {self._dead}") from None
        try:
            return await fut
        except asyncio.CancelledError:
            if self._pending.pop(rid, None) is not None and not self._dead:
                try:
                    self._send((CANCEL, rid))
                except OSError:
                    pass
            raise

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Close the wrapped advisor in the child, then wait for it to exit (terminated after
        ``timeout_s``)."""
        if self._closed:
            return
        self._closed = True
        if not self._dead:
            try:
                self._send((CLOSE,))
            except OSError:
                pass
        try:
            await asyncio.to_thread(self._proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.terminate()
            await asyncio.to_thread(self._proc.wait, 5.0)
        self._gone("closed")
        self._conn.close()

    @property
    def exitcode(self) -> int | None:
        """The child's exit status once it has exited (None while it runs)."""
        return self._proc.poll()


def _child_main(fd: int) -> None:
    conn = Connection(fd)
    try:
        factory = pickle.loads(conn.recv_bytes())
        asyncio.run(_serve(conn, factory))
    except (KeyboardInterrupt, EOFError):  # Ctrl-C reaches the whole process group; the parent went away
        pass
    finally:
        conn.close()


async def _serve(conn: Connection, factory: Callable[[], KevAdvisor]) -> None:
    loop = asyncio.get_running_loop()
    advisor = factory()
    tasks: dict[int, asyncio.Task[KevReply]] = {}
    done = asyncio.Event()

    def send(msg: tuple[Any, ...]) -> None:
        try:
            conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # the parent is gone
            done.set()

    def finished(rid: int, task: asyncio.Task[KevReply]) -> None:
        tasks.pop(rid, None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            send((REPLY, rid, task.result()))
        else:
            send((ERROR, rid, type(exc).__name__, str(exc)))

    def readable() -> None:
        try:
            while conn.poll():
                msg = pickle.loads(conn.recv_bytes())
                if msg[0] == ADVISE:
                    rid = msg[1]
                    task = loop.create_task(advisor.advise(msg[2]))
                    tasks[rid] = task
                    task.add_done_callback(partial(finished, rid))
                elif msg[0] == CANCEL:
                    t = tasks.pop(msg[1], None)
                    if t is not None:
                        t.cancel()
                elif msg[0] == CLOSE:
                    done.set()
                    return
        except (EOFError, OSError):
            done.set()

    loop.add_reader(conn.fileno(), readable)
    await done.wait()
    loop.remove_reader(conn.fileno())
    for t in tasks.values():
        t.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    aclose = getattr(advisor, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:  # closing an HTTP client at exit: nothing left to report it to
            pass
    send((CLOSED,))


if __name__ == "__main__":
    _child_main(int(sys.argv[1]))
