"""The order watchdog: a process of its own that cancels everything at the venue when the engine dies.

``dualhub live --live`` cancel-alls the venue on every exit it lives to see (SIGINT/SIGTERM, duration,
kill switch, crash). It cannot on ``kill -9``, an OOM kill or a wedged event loop: its resting orders
would stay on the book, quoting for a process that no longer exists. :class:`Watchdog` starts
``python -m live.watchdog`` beside it, in its own session (a signal to the engine's process group does
not reach it; ``kill -9`` of the engine leaves it running), and the two talk over one pipe, the
watchdog's stdin:

- first line: the API credentials as JSON, so that they are never in an argv (``/proc/PID/cmdline`` is
  world-readable), an environment (the watchdog's is the engine's without ``BITGET_*``), a file or a
  log;
- then ``.`` every ``beat_interval_s`` from a timer on the engine's event loop: a beat is one 2-byte
  ``write(2)`` between ticks, never on the tick path, and it proves what matters, that the loop which
  manages the orders still runs (a thread's beat would go on while the loop is wedged);
- ``stop``: the engine ended normally (its own cancel-all found nothing left open): the watchdog
  records it and exits without touching the venue; ``cancel``: the engine ended but could not confirm
  the venue clean (``left_open`` not empty, or unknown): the watchdog takes over.

Why a pipe, not a file's mtime: the end of the engine is seen at once, not after a timeout. When the
engine dies the kernel closes its end and the watchdog reads EOF; the watchdog also sees its parent
change (``getppid``), which holds even if some other process kept a copy of the pipe. Silence without
EOF (a wedged loop, a stopped process) fires after ``timeout_s``.

Firing: ``POST /api/v2/mix/order/cancel-all-orders`` (productType ``USDT-FUTURES``, marginCoin
``USDT``: every USDT-M order of the account, the engine's exit cancel-all does the same), signed with
:func:`wire.bitget.bitget_v2_rest.build_request` after a server-time sync, then ``orders-pending`` to
check that nothing is left; repeated while orders remain or the venue does not answer, for
``give_up_s``. After a silence the engine may come back: beats re-arm the watchdog (the engine's
reconciliation then finds its orders gone at the venue). After EOF it exits once the venue is clean or
it gave up.

Records: one JSON line per event in ``<session>/watchdog.jsonl`` (fsynced: the record of a cancel must
survive whatever killed the engine) and a text line in ``<session>/watchdog.log``.

Venue-side countdown cancel (a dead man's switch kept by the exchange): Bitget has one only for unified
(UTA) accounts, ``POST /api/v3/trade/countdown-cancel-all`` (``countdown`` 5-60 s, 0 off). The v2
classic-account futures API this project trades has none, and a UTA account is refused the v2 trading
endpoints (40085), so the watchdog's cancel-all is the only one in force.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson

from engine.errors import DualhubError
from wire.bitget.bitget_v2_rest import (
    PATH_CANCEL_ALL,
    PATH_PENDING,
    PATH_TIME,
    PRODUCT_TYPE,
    BitgetError,
    Credentials,
    build_request,
    cancel_all_body,
    parse_batch,
    parse_envelope,
    parse_pending,
)

log = logging.getLogger(__name__)

RECORD_FILE: Final = "watchdog.jsonl"
LOG_FILE: Final = "watchdog.log"
# 10 s: far above any pause of a healthy loop (a GC between frames, a Kev reply), far below what a
# market maker's quotes can sit stale for; the venue watch gives up on a lost link after 20 s
DEFAULT_TIMEOUT_S: Final = 10.0
BEAT: Final = b".\n"
STOP: Final = b"stop\n"
CANCEL: Final = b"cancel\n"
READY: Final = "ready"
START_TIMEOUT_S: Final = 15.0  # the watchdog imports little; 15 s covers a loaded machine
MAX_CREDS_LINE: Final = 64 << 10


def beat_interval_s(timeout_s: float) -> float:
    """Ten beats per timeout, at most one a second (cheap either way: one write)."""
    return min(1.0, max(0.05, timeout_s / 10))


# ---------------------------------------------------------------------------------------------------
# the engine's side


class Watchdog:
    """The engine's handle on its watchdog process: :meth:`start`, :meth:`beat` on a timer, :meth:`stop`."""

    def __init__(self, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        self.proc = proc
        self.timeout_s = timeout_s
        self.interval_s = beat_interval_s(timeout_s)
        self.fd = proc.stdin.fileno() if proc.stdin is not None else -1
        self.beats = 0
        self.lost = ""  # why the pipe to the watchdog broke ("" while it holds)
        self._timer: asyncio.TimerHandle | None = None
        self.stopped = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def start(
        cls,
        session_dir: Path,
        rest_url: str,
        credentials: Credentials,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        demo: bool = False,
    ) -> Watchdog:
        """Start the watchdog, hand it the keys, and wait for it to say it watches (``DualhubError``
        if it does not: a live run is not started unguarded)."""
        session_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "live.watchdog", "--session", str(session_dir), "--exchange-url",
               rest_url, "--timeout-s", repr(float(timeout_s)), "--engine-pid", str(os.getpid())]  # fmt: skip
        if demo:
            cmd.append("--demo")
        env = {k: v for k, v in os.environ.items() if not k.startswith("BITGET_")}
        # its tracebacks, if any, go to its log (they never carry the keys: see _main)
        with open(session_dir / LOG_FILE, "ab") as err:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,  # not in the engine's process group: its signals stay its own
                close_fds=True,
            )
        assert proc.stdin is not None and proc.stdout is not None
        wd = cls(proc, timeout_s)
        try:
            line = orjson.dumps(
                {
                    "api_key": credentials.api_key,
                    "secret": credentials.secret,
                    "passphrase": credentials.passphrase,
                }
            )
            proc.stdin.write(line + b"\n")
            proc.stdin.flush()
            del line
            async with asyncio.timeout(START_TIMEOUT_S):
                answer = await asyncio.to_thread(proc.stdout.readline)
        except (OSError, TimeoutError) as e:
            wd._abandon()
            raise DualhubError(f"the order watchdog did not start: {type(e).__name__}: {e}") from None
        finally:
            proc.stdout.close()
        if answer.decode(errors="replace").strip() != READY:
            wd._abandon()
            raise DualhubError(f"the order watchdog did not start (see {session_dir / LOG_FILE})")
        os.set_blocking(wd.fd, False)  # a beat never waits for the watchdog
        return wd

    def start_beating(self) -> None:
        """Beat from now on, on the running loop, every ``interval_s``."""
        self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        self.beat()
        if not self.lost and not self.stopped:
            self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._tick)

    def beat(self) -> None:
        if self.lost or self.stopped:
            return
        try:
            os.write(self.fd, BEAT)
            self.beats += 1
        except BlockingIOError:
            pass  # the watchdog is behind by 64 KiB of beats; it will read them
        except OSError as e:  # it died: the run goes on, unguarded against a kill -9, and says so
            self.lost = f"{type(e).__name__}: {e}"
            log.error(
                "the order watchdog is gone (%s): a kill -9 now would leave orders at the venue", self.lost
            )

    def stop(self, *, venue_clean: bool) -> str:
        """The engine ends normally: ``venue_clean`` (its cancel-all left nothing open) lets the
        watchdog exit without a cancel; otherwise it cancels itself. Returns how it ended."""
        if self._timer is not None:
            self._timer.cancel()
        if self.stopped:
            return self.stopped
        self.stopped = "stop" if venue_clean else "cancel"
        if not self.lost:
            try:
                os.set_blocking(self.fd, True)
                os.write(self.fd, STOP if venue_clean else CANCEL)
            except OSError as e:
                self.lost = f"{type(e).__name__}: {e}"
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        if venue_clean:
            try:
                self.proc.wait(5.0)  # it only writes its record; reaped, no zombie behind us
            except subprocess.TimeoutExpired:
                log.warning("the order watchdog (pid %d) did not exit after stop", self.proc.pid)
        # "cancel": it goes on cancelling after we are gone; not waited for
        return self.stopped + (f" (watchdog lost: {self.lost})" if self.lost else "")

    def _abandon(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(5.0)
        except (OSError, subprocess.TimeoutExpired):
            pass


# ---------------------------------------------------------------------------------------------------
# the watchdog's side


class Record:
    """``watchdog.jsonl`` (one fsynced JSON line per event) and ``watchdog.log`` (text)."""

    def __init__(self, session_dir: Path) -> None:
        self.jsonl = open(session_dir / RECORD_FILE, "ab")  # noqa: SIM115 (open for the process's life)
        self.log = open(session_dir / LOG_FILE, "a", encoding="utf-8")  # noqa: SIM115

    def __call__(self, event: str, **fields: Any) -> None:
        now = time.time_ns()
        row = {"event": event, "ts_ns": now, **fields}
        self.jsonl.write(orjson.dumps(row) + b"\n")
        self.jsonl.flush()
        os.fsync(self.jsonl.fileno())
        stamp = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now / 1e9)) + f".{now // 1_000_000 % 1000:03d}Z"
        )
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        self.log.write(f"{stamp} watchdog {event} {text}".rstrip() + "\n")
        self.log.flush()


class Venue:
    """Signed cancel-all and pending orders over a synchronous HTTP client (the watchdog has no loop)."""

    def __init__(
        self, rest_url: str, creds: Credentials, *, demo: bool = False, timeout_s: float = 5.0
    ) -> None:
        import httpx  # here, not at the top: the engine's side imports this module too

        self._httpx = httpx
        self.creds = creds
        self.demo = demo
        self.client = httpx.Client(base_url=rest_url.rstrip("/"), timeout=httpx.Timeout(timeout_s))
        self.offset_ms = 0

    def _call(
        self, method: str, path: str, *, params: Any = None, body: Any = None, signed: bool = True
    ) -> Any:
        req = build_request(
            method,
            path,
            params=params,
            body=body,
            credentials=self.creds if signed else None,
            ts_ms=time.time_ns() // 1_000_000 + self.offset_ms,
            demo=self.demo,
        )
        resp = self.client.request(
            req.method, req.target, content=req.body or None, headers=dict(req.headers)
        )
        return parse_envelope(resp.status_code, resp.content).data

    def sync_time(self) -> None:
        t0 = time.time_ns() // 1_000_000
        data = self._call("GET", PATH_TIME, signed=False)
        t1 = time.time_ns() // 1_000_000
        self.offset_ms = int(data["serverTime"]) - (t0 + t1) // 2

    def cancel_all(self) -> dict[str, Any]:
        """One cancel-all and the count of what is still open. Errors come back in words (redacted).

        The open orders are asked for even when the cancel-all was refused: a venue that answers "no
        order to cancel" with an error code is clean, and only ``orders-pending`` says so."""
        out: dict[str, Any] = {"cancelled": 0, "failed": 0, "left_open": "unknown", "error": ""}
        errors = (BitgetError, self._httpx.HTTPError, KeyError, TypeError, ValueError)
        try:
            self.sync_time()  # a stale ACCESS-TIMESTAMP is refused (40008); our clock if this fails
        except errors as e:
            out["time_sync"] = self._words(e)
        try:
            res = parse_batch(self._call("POST", PATH_CANCEL_ALL, body=cancel_all_body()))
            out["cancelled"] = len(res.success)
            out["failed"] = len(res.failure)
        except errors as e:
            out["error"] = self._words(e)
        try:
            pending = parse_pending(self._call("GET", PATH_PENDING, params={"productType": PRODUCT_TYPE}))
            out["left_open"] = len(pending)
        except errors as e:
            out["error"] = "; ".join(filter(None, (out["error"], "orders-pending: " + self._words(e))))
        return out

    def _words(self, e: BaseException) -> str:
        # httpx names the URL, never headers; Bitget's messages echo no keys; redacted all the same
        return self.creds.redact(f"{type(e).__name__}: {e}")[:300]


def _read_creds(fd: int, deadline_s: float) -> tuple[Credentials, bytes]:
    """The first line of the pipe (the keys) and whatever came after it."""
    buf = b""
    end = time.monotonic() + deadline_s
    while b"\n" not in buf:
        left = end - time.monotonic()
        if left <= 0 or len(buf) > MAX_CREDS_LINE:
            raise SystemExit("watchdog: no credentials on stdin")
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise SystemExit("watchdog: stdin closed before the credentials")
            buf += chunk
    line, rest = buf.split(b"\n", 1)
    try:
        d = orjson.loads(line)
        creds = Credentials(str(d["api_key"]), str(d["secret"]), str(d["passphrase"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise SystemExit("watchdog: the credentials line is not valid") from None  # no text of it
    return creds, rest


def cancel_until_clean(
    venue: Venue,
    record: Record,
    *,
    reason: str,
    give_up_s: float,
    sleep: Callable[[float], None] = time.sleep,
    **fields: Any,
) -> bool:
    """Cancel-all until ``orders-pending`` lists nothing, backing off 0.5 s to 10 s, for ``give_up_s``."""
    end = time.monotonic() + give_up_s
    wait = 0.5
    tries = 0
    while True:
        tries += 1
        res = venue.cancel_all()
        record("cancel_all", reason=reason, attempt=tries, **fields, **res)
        if res["left_open"] == 0:
            return True
        if time.monotonic() + wait > end:
            record("gave_up", reason=reason, attempts=tries, left_open=res["left_open"])
            return False
        sleep(wait)
        wait = min(10.0, wait * 2)


def watch(
    fd: int,
    rest: bytes,
    *,
    timeout_s: float,
    engine_pid: int,
    fire: Callable[[str, float], bool],
    record: Record,
) -> str:
    """Read beats until the engine stops (``stop``), hands over (``cancel``) or dies (EOF, or a new
    parent). ``timeout_s`` of silence without either fires too, and again every ``timeout_s`` while
    the venue is not clean; beats coming back re-arm it. Returns how the watch ended."""
    last = time.monotonic()
    next_fire = 0.0  # monotonic time before which a silence does not fire again
    silence_fired = False
    pending = rest
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line == b".":
                if silence_fired:
                    record("rearmed", silent_s=round(time.monotonic() - last, 3))
                    silence_fired, next_fire = False, 0.0
                last = time.monotonic()
            elif line == b"stop":
                record("stop", detail="the engine stopped normally: nothing cancelled")
                return "stop"
            elif line == b"cancel":
                fire("engine_asked", time.monotonic() - last)
                return "cancel"
        now = time.monotonic()
        if os.getppid() != engine_pid:  # the engine exited: we were handed to another parent
            fire("engine_gone", now - last)
            return "engine_gone"
        if now - last >= timeout_s and now >= next_fire:
            # wedged or stopped, not known dead: cancel, and keep watching (it may come back)
            silence_fired = True
            clean = fire("heartbeat_stopped", now - last)
            next_fire = math.inf if clean else time.monotonic() + timeout_s
        wait = 0.2 if silence_fired else max(0.01, min(0.2, last + timeout_s - now))
        if select.select([fd], [], [], wait)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:  # EOF: every holder of the pipe's other end is gone without a stop
                fire("engine_gone", time.monotonic() - last)
                return "engine_gone"
            pending += chunk


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m live.watchdog", description=__doc__.splitlines()[0])
    p.add_argument("--session", type=Path, required=True)
    p.add_argument("--exchange-url", required=True)
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    p.add_argument("--engine-pid", type=int, required=True)
    p.add_argument("--demo", action="store_true")
    p.add_argument("--give-up-s", type=float, default=0.0, help="default: max(60, 6 x timeout)")
    a = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the engine's to handle
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the terminal closing must not take the guard away
    fd = sys.stdin.fileno()
    creds, rest = _read_creds(fd, START_TIMEOUT_S)
    record = Record(a.session)
    venue = Venue(a.exchange_url, creds, demo=a.demo)
    give_up_s = a.give_up_s or max(60.0, 6 * a.timeout_s)
    record(
        "start", pid=os.getpid(), engine_pid=a.engine_pid, timeout_s=a.timeout_s, exchange_url=a.exchange_url
    )
    sys.stdout.write(READY + "\n")
    sys.stdout.close()  # the engine reads one line; nothing more goes there

    def fire(reason: str, silent_s: float) -> bool:
        record("fired", reason=reason, silent_s=round(silent_s, 3))
        # the engine may still be alive after a silence: a short try, then back to reading its beats
        limit = min(give_up_s, a.timeout_s) if reason == "heartbeat_stopped" else give_up_s
        return cancel_until_clean(venue, record, reason=reason, give_up_s=limit)

    how = watch(fd, rest, timeout_s=a.timeout_s, engine_pid=a.engine_pid, fire=fire, record=record)
    record("exit", how=how)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
