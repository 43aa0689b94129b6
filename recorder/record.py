"""``dualhub record``: live capture of Bitget v2 public channels into a session.

Layout of a recording directory::

    <out>/record.json               what was asked (written first; ``recover`` needs it)
    <out>/journal/seg-NNNNNN.dhj    the raw journal (``.dhj.part`` while being written)
    <out>/<stream>/part-NNNNN.parquet
    <out>/manifest.json             written last: the session is complete

Connections (``wire.connection``, at most 50 channels each) write every frame to the journal
first. A flush timer writes a journal block every ``flush_interval_ms``; when the segment is due for
rotation (``rotate_s`` / ``rotate_bytes``) it is finished (fsync + rename) and normalised in a worker
thread into Parquet parts through the codec. SIGINT/SIGTERM, ``duration_s`` or every connection
failing fatally stop the recording cleanly: connections are closed, open gaps end at the stop time,
the journal is finished, the last segment is normalised and the manifest is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from engine.bounds import check_count, check_ms, check_seconds, check_seed
from engine.errors import DualhubError, os_error_text
from engine.store import MANIFEST, SessionWriter, write_json
from engine.validate import WireLimits
from recorder.normalise import Normaliser, warm_up
from wire.bitget.bitget_v2 import INST_TYPE, WS_PUBLIC_URL, arg
from wire.connection import (
    MAX_CHANNELS_PER_CONNECTION,
    Connection,
    ConnectionConfig,
    SlidingWindow,
    shard_args,
)
from wire.journal import JournalWriter, SegmentScan, iter_blocks, iter_segment

log = logging.getLogger(__name__)

RECORD_JSON = "record.json"
JOURNAL_DIR = "journal"
CHANNELS = ("books", "books1", "books5", "books15", "trade")


class RecordError(DualhubError):
    pass


@dataclass(frozen=True, kw_only=True)
class RecordConfig:
    """Everything a recording needs; its sha256 goes into the manifest."""

    out: str
    symbols: tuple[str, ...]
    channels: tuple[str, ...] = ("books15", "trade")
    inst_type: str = INST_TYPE
    duration_s: float | None = None
    flush_interval_ms: int = 200
    rotate_s: float = 900.0
    rotate_bytes: int = 64 << 20
    max_channels_per_conn: int = MAX_CHANNELS_PER_CONNECTION
    seed: int = 0
    status: bool = False
    status_interval_s: float = 1.0
    connection: ConnectionConfig = field(default_factory=lambda: ConnectionConfig(url=WS_PUBLIC_URL))
    # what a frame may hold (engine.validate.WireLimits); in record.json, so recover checks the same
    wire: WireLimits = field(default_factory=WireLimits)

    def __post_init__(self) -> None:
        if not self.symbols:
            raise RecordError("no symbols to record")
        bad = [c for c in self.channels if c not in CHANNELS]
        if bad:
            raise RecordError(f"unknown channel(s) {bad}; Bitget v2 public channels are {CHANNELS}")
        if not self.channels:
            raise RecordError(f"no channels to record; Bitget v2 public channels are {CHANNELS}")
        if self.flush_interval_ms <= 0:
            raise RecordError("flush_interval_ms must be > 0")
        if self.duration_s is not None and self.duration_s <= 0:
            raise RecordError("duration_s must be > 0")
        if not 1 <= self.max_channels_per_conn <= MAX_CHANNELS_PER_CONNECTION:
            raise RecordError(f"max_channels_per_conn must be in 1..{MAX_CHANNELS_PER_CONNECTION}")
        if self.duration_s is not None:
            check_seconds(self.duration_s, "duration_s")
        check_ms(self.flush_interval_ms, "flush_interval_ms")
        check_seconds(self.rotate_s, "rotate_s")
        check_seconds(self.status_interval_s, "status_interval_s")
        check_count(self.rotate_bytes, "rotate_bytes", low=1 << 10, high=1 << 40)
        check_seed(self.seed)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> str:
        return hashlib.sha256(orjson.dumps(self.to_json(), option=orjson.OPT_SORT_KEYS)).hexdigest()


def asked_of(cfg: RecordConfig, n_connections: int) -> dict[str, Any]:
    return {
        "url": cfg.connection.url,
        "inst_type": cfg.inst_type,
        "wire_limits": cfg.wire.to_json(),
        "symbols": list(cfg.symbols),
        "channels": list(cfg.channels),
        "connections": n_connections,
        "config": cfg.to_json(),
        "config_sha256": cfg.digest(),
    }


def new_writer(root: Path, asked: dict[str, Any]) -> SessionWriter:
    # the contracts read from the exchange at the start travel in record.json, so a recovery keeps them
    extra = {k: asked[k] for k in ("contracts", "contracts_error") if asked.get(k)}
    return SessionWriter(root, source=f"bitget_v2:{asked['url']}", symbols=asked["symbols"], extra=extra)


async def exchange_contracts(rest_url: str, symbols: Sequence[str]) -> dict[str, Any]:
    """The recorded symbols' contract specs as the exchange's contracts endpoint gives them, for the
    session's manifest: ``{"contracts": {symbol: spec}}``, or ``{"contracts_error": why}`` (a recording
    never stops for them: a replay then says it used the engine's defaults)."""
    import httpx

    from engine.contract import spec_of
    from wire.bitget.bitget_v2_rest import (
        PATH_CONTRACTS,
        PRODUCT_TYPE,
        BitgetError,
        parse_contract,
        parse_envelope,
    )

    # one unsigned GET: the recorder stands below live mode (tests/test_layout.py), so it asks the
    # endpoint itself with the shared codec rather than through live's gateway
    try:
        async with httpx.AsyncClient(timeout=3.0) as client:
            r = await client.get(rest_url.rstrip("/") + PATH_CONTRACTS, params={"productType": PRODUCT_TYPE})
        env = parse_envelope(r.status_code, r.content)
        specs = {c.symbol: c for c in (parse_contract(row) for row in env.data or [])}
    except (BitgetError, httpx.HTTPError, ValueError, OSError) as e:
        return {"contracts_error": f"{rest_url}: {e}"}
    out = {
        s: spec_of(specs[s].config(), contract_type="perpetual", source="exchange", origin=rest_url)
        for s in symbols
        if s in specs
    }
    missing = [s for s in symbols if s not in specs]
    why = {"contracts_error": f"{rest_url} lists no contract for {missing}"} if missing else {}
    return {"contracts": out} | why


def finish(writer: SessionWriter, norm: Normaliser, extra: dict[str, Any]) -> dict[str, Any]:
    """Close gaps still open, add the recorder summary to the manifest, write it."""
    writer.add_all(norm.finish())
    writer.extra["recorder"] = {**norm.summary(), **extra}
    return writer.close()


def normalise_segment(
    path: Path, norm: Normaliser, writer: SessionWriter, scan: SegmentScan | None = None
) -> int:
    """Decode one finished journal segment into the session's Parquet parts; returns records read.

    One part per stream per segment (more past ``writer.rows_per_part``), whichever path decoded it."""
    batch: list[Any] = []
    if norm.columns is None:  # the general path, record by record
        n = 0
        for rec in iter_segment(path, scan):
            batch.extend(norm.feed(rec))
            n += 1
    else:
        n = sum(norm.feed_block(raw, batch) for raw in iter_blocks(path, scan))
        if scan is not None:
            scan.records += n
        for stream, table in norm.columns.take_tables(writer.rows_per_part):
            writer.add_table(stream, table)
    writer.add_all(batch)
    writer.flush()
    return n


class Recorder:
    def __init__(self, cfg: RecordConfig, rest_url: str = "") -> None:
        """``rest_url``: a Bitget REST base whose contracts endpoint gives the symbols' specs ("" none)."""
        self.cfg = cfg
        self.rest_url = rest_url
        self.root = Path(cfg.out)
        args = [arg(ch, s, cfg.inst_type) for s in cfg.symbols for ch in cfg.channels]
        self.shards = shard_args(args, cfg.max_channels_per_conn)
        self.asked = asked_of(cfg, len(self.shards))
        self.connections: list[Connection] = []
        self.journal: JournalWriter | None = None
        self.stop_reason = ""
        self._stop = asyncio.Event()
        self._segments: asyncio.Queue[Path | None] = asyncio.Queue()
        self.started_mono = 0.0
        self.segments_done = 0
        self.normalise_error = ""
        warm_up()  # load the compiled block scan now, not when the first segment is due

    def request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self.stop_reason = reason
            self._stop.set()

    def _prepare(self) -> None:
        if (self.root / MANIFEST).exists():
            raise RecordError(f"{self.root} already holds a finished session")
        if (self.root / RECORD_JSON).exists():
            raise RecordError(
                f"{self.root} holds an unfinished recording; finish it with `dualhub recover {self.root}`"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        write_json(self.root / RECORD_JSON, {**self.asked, "started_ns": time.time_ns()})

    async def run(self) -> dict[str, Any]:
        """Record until stopped; returns the manifest."""
        if not (self.root / MANIFEST).exists() and not (self.root / RECORD_JSON).exists():
            if self.cfg.inst_type != INST_TYPE:
                why = f"no contracts endpoint read for instType {self.cfg.inst_type}"
                self.asked["contracts_error"] = why
            elif self.rest_url:
                self.asked.update(await exchange_contracts(self.rest_url, self.cfg.symbols))
        self._prepare()
        cfg = self.cfg
        self.journal = journal = JournalWriter(
            self.root / JOURNAL_DIR, rotate_s=cfg.rotate_s, rotate_bytes=cfg.rotate_bytes
        )
        writer = new_writer(self.root, self.asked)
        norm = Normaliser(self.asked)
        attempts = SlidingWindow(cfg.connection.max_connect_attempts, cfg.connection.connect_window_s)
        self.connections = [
            Connection(
                i,
                shard,
                journal,
                cfg.connection,
                rng=random.Random(cfg.seed * 1_000_003 + i),
                attempts=attempts,
            )
            for i, shard in enumerate(self.shards)
        ]
        self.started_mono = time.monotonic()
        journal.meta(time.time_ns(), 0xFFFF, {"t": "start", "asked": self.asked})
        conn_tasks = [asyncio.create_task(c.run(), name=f"conn{c.conn_id}") for c in self.connections]
        worker = asyncio.create_task(self._normaliser(norm, writer), name="normaliser")
        flusher = asyncio.create_task(self._flusher(), name="journal-flush")
        flusher.add_done_callback(self._flusher_done)
        status = asyncio.create_task(self._status(), name="status") if cfg.status else None
        watch = asyncio.create_task(self._watch(conn_tasks), name="conn-watch")
        try:
            if cfg.duration_s is not None:
                try:
                    await asyncio.wait_for(self._stop.wait(), timeout=cfg.duration_s)
                except TimeoutError:
                    self.request_stop("duration")
            else:
                await self._stop.wait()
        finally:
            # ---- clean shutdown: stop connections, end open gaps, finish the journal, normalise the rest
            for c in self.connections:
                c.stop()
            for t in conn_tasks + [watch]:
                t.cancel()
            await asyncio.gather(*conn_tasks, watch, return_exceptions=True)
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
            end = time.time_ns()
            for c in self.connections:
                for key in list(c.open_gaps):
                    c.close_gap(key, end, how="shutdown")
            journal.meta(end, 0xFFFF, {"t": "stop", "reason": self.stop_reason or "cancelled"})
            last = journal.close()
            if last is not None:
                self._segments.put_nowait(last)
            self._segments.put_nowait(None)
            await worker
            if status is not None:
                status.cancel()
                await asyncio.gather(status, return_exceptions=True)
        extra = {
            "recovered": False,
            "stopped_by": self.stop_reason or "cancelled",
            "journal": {
                "segments": [p.name for p in journal.finished],
                "records": journal.records,
                "frames": journal.frames,
                "bytes": journal.bytes_written,
            },
            "live": {f"conn{c.conn_id}": asdict(c.stats) for c in self.connections},
        }
        if self.normalise_error:
            remove_tmp_files(self.root)
            raise RecordError(
                f"normalisation failed ({self.normalise_error}); the raw journal in "
                f"{self.root / JOURNAL_DIR} is complete: fix the cause and run `dualhub recover {self.root}`"
            )
        return await asyncio.to_thread(finish, writer, norm, extra)

    async def _flusher(self) -> None:
        assert self.journal is not None
        j = self.journal
        interval = self.cfg.flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            j.flush()
            if j.rotate_due():
                self._segments.put_nowait(j.rotate())

    def _flusher_done(self, t: asyncio.Task[Any]) -> None:
        if not t.cancelled() and t.exception() is not None:
            # cannot write the journal (disk full, I/O error): stop; closing the journal re-raises it, and
            # that error (or the stop reason) is what the user sees, once
            log.info("journal flush failed: %s", t.exception())
            self.request_stop(f"journal_error: {t.exception()}")

    async def _normaliser(self, norm: Normaliser, writer: SessionWriter) -> None:
        while True:
            seg = await self._segments.get()
            if seg is None:
                return
            if self.normalise_error:
                continue  # keep recording raw; the session is rebuilt by `recover` once fixed
            try:
                await asyncio.to_thread(normalise_segment, seg, norm, writer)
            except Exception as e:
                self.normalise_error = f"{seg.name}: {type(e).__name__}: {e}"
                log.error("normalisation failed, recording raw only: %s", self.normalise_error)
                continue
            self.segments_done += 1

    async def _watch(self, tasks: Sequence[asyncio.Task[Any]]) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)
        self.request_stop("all_connections_failed")

    # ------------------------------------------------------------ status line

    def status_text(self, rates: dict[str, float]) -> str:
        up = sum(c.stats.up for c in self.connections)
        gaps = sum(c.stats.gaps for c in self.connections)
        reconnects = sum(max(0, c.stats.connects - 1) for c in self.connections)
        silent = [f"{k[0]}:{k[1]}" for c in self.connections for k, s in c.args.items() if s.silent_flagged]
        rej = [f"{k[0]}:{k[1]}" for c in self.connections for k, s in c.args.items() if s.rejected]
        mb = (self.journal.bytes_written / 1e6) if self.journal else 0.0
        elapsed = time.monotonic() - self.started_mono
        fps = " ".join(f"{ch} {r:.1f}/s" for ch, r in sorted(rates.items())) or "-"
        s = (
            f"{elapsed:7.0f}s  conns {up}/{len(self.connections)} up  {fps}  gaps {gaps}  "
            f"reconnects {reconnects}  journal {mb:.2f} MB  segments {self.segments_done}"
        )
        if silent:
            s += f"  SILENT {','.join(silent)}"
        if rej:
            s += f"  REJECTED {','.join(rej)}"
        return s

    async def _status(self) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        console = Console(stderr=True)
        prev: dict[str, int] = {}
        prev_t = time.monotonic()
        with Live(Text("starting"), console=console, refresh_per_second=4, transient=False) as live:
            while True:
                await asyncio.sleep(self.cfg.status_interval_s)
                now = time.monotonic()
                tot: dict[str, int] = {}
                for c in self.connections:
                    for ch, n in c.stats.by_channel.items():
                        tot[ch] = tot.get(ch, 0) + n
                dt = max(1e-9, now - prev_t)
                rates = {ch: (n - prev.get(ch, 0)) / dt for ch, n in tot.items()}
                prev, prev_t = tot, now
                live.update(Text(self.status_text(rates)))


def run_record(cfg: RecordConfig, rest_url: str = "") -> dict[str, Any]:
    """Blocking entry: record with SIGINT/SIGTERM handled as a clean stop."""
    rec = Recorder(cfg, rest_url)

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, rec.request_stop, signal.Signals(sig).name)
        return await rec.run()

    try:
        return asyncio.run(main())
    except OSError as e:  # a full disk, say: what reached the journal is kept, and recover finishes it
        if not (rec.root / RECORD_JSON).exists():  # not started: nothing of ours here but that file's tmp
            with contextlib.suppress(OSError):
                (rec.root / (RECORD_JSON + ".tmp")).unlink()
            raise RecordError(os_error_text(e)) from None
        remove_tmp_files(rec.root)
        raise RecordError(
            f"{os_error_text(e)}; the journal up to here is on disk: fix that and run "
            f"`dualhub recover {rec.root}`"
        ) from None


def remove_tmp_files(root: Path) -> None:
    """Delete the ``*.tmp`` files an interrupted atomic write leaves (``manifest.json.tmp``,
    ``<stream>/part-N.parquet.tmp``); the journal's ``.dhj.part`` segments are data and stay."""
    for p in [*root.glob("*.tmp"), *root.glob("*/*.tmp")]:
        if p.is_file():
            p.unlink()


def disk_free_bytes(path: Path) -> int:
    return shutil.disk_usage(path if path.exists() else path.parent).free


def print_summary(manifest: dict[str, Any], out: Any = sys.stderr) -> None:
    r = manifest.get("recorder", {})
    streams = ", ".join(f"{k} {v['rows']}" for k, v in manifest.get("streams", {}).items()) or "no rows"
    print(
        f"recorded {r.get('frames', 0)} frames ({streams}); gaps {len(r.get('gaps', []))}; "
        f"reconnects {r.get('reconnects', 0)}; stopped by {r.get('stopped_by', '?')}",
        file=out,
    )
    for a in r.get("acked_but_silent", []):
        print(f"warning: {a} was acknowledged but never sent data", file=out)
    for a in r.get("rejected", []):
        print(f"warning: {a} was rejected by the exchange", file=out)
