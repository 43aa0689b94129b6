"""Recorder throughput: frames per second per core, from the socket to finished Parquet.

The local Bitget server runs in a separate process (``python -m recorder.cli serve --toy N --speed 0``,
as fast as the recorder reads) so its CPU is not charged to the recorder. The recorder runs here;
its CPU time (user + sys, all threads: the event loop and the normaliser thread) is measured with
``getrusage``. The figure of merit is ``frames / recorder CPU seconds`` (= frames/s on one core),
against the target of 50 000 frames/s per core. The journal is then normalised again offline to
split the cost between the live path (receive + journal) and normalisation (decode + Parquet).

    .venv/bin/python bench/bench_recorder.py [--steps 25000] [--symbols 4] [--channels books15,trade]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recorder.normalise import Normaliser
from recorder.record import RecordConfig, Recorder, new_writer, normalise_segment
from wire.connection import ConnectionConfig
from wire.journal import list_segments

TARGET = 50_000


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def bench(steps: int, symbols: list[str], channels: tuple[str, ...], out: Path) -> dict[str, float]:
    srv = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recorder.cli",
            "serve",
            "--toy",
            str(steps),
            "--symbols",
            ",".join(symbols),
            "--speed",
            "0",
            "--exit-when-done",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = srv.stdout.readline().strip()  # "listening ws://..."
    assert line.startswith("listening "), line + srv.stderr.read()
    url = line.split(" ", 1)[1]
    # toy feed: one books15 per symbol per step, one trade per symbol every 2nd step; books derived per step
    per_step = {"books15": 1.0, "trade": 0.5, "books": 1.0}
    expected = int(sum(per_step[c] for c in channels) * steps * len(symbols))
    cfg = RecordConfig(
        out=str(out),
        symbols=tuple(symbols),
        channels=channels,
        flush_interval_ms=200,
        connection=ConnectionConfig(url=url, ping_interval_s=25, silence_limit_s=30, max_queue=4096),
    )
    c_init = cpu_s()
    rec = Recorder(cfg)  # loads the compiled block scan (once per process; reported, not counted)
    c0, w0 = cpu_s(), time.perf_counter()
    task = asyncio.create_task(rec.run())
    while (
        rec.journal is None
        or sum(c.stats.by_channel.get(ch, 0) for c in rec.connections for ch in channels) < expected
    ):
        await asyncio.sleep(0.05)
        if "-v" in sys.argv:
            print(
                [(c.stats.up, c.stats.frames, c.stats.by_channel) for c in rec.connections], file=sys.stderr
            )
        if task.done():
            break
    w_recv = time.perf_counter() - w0
    rec.request_stop("bench")
    manifest = await task
    c1, w1 = cpu_s(), time.perf_counter()
    srv.wait(timeout=30)
    frames = manifest["recorder"]["frames"]
    # offline: the normalisation share (decode + Parquet) of the same journal
    with tempfile.TemporaryDirectory() as d:
        norm = Normaliser(manifest["recorder"]["asked"])
        writer = new_writer(Path(d) / "s", manifest["recorder"]["asked"])
        c2 = cpu_s()
        for _, p, _ in list_segments(out / "journal"):
            normalise_segment(p, norm, writer)
        writer.close()
        c3 = cpu_s()
    rows = sum(v["rows"] for v in manifest["streams"].values())
    return {
        "frames": frames,
        "rows": rows,
        "wall_s": w1 - w0,
        "wall_receive_s": w_recv,
        "cpu_s": c1 - c0,
        "frames_per_cpu_s": frames / (c1 - c0),
        "frames_per_wall_s": frames / (w1 - w0),
        "normalise_cpu_s": c3 - c2,
        "normalise_frames_per_cpu_s": frames / (c3 - c2),
        "live_frames_per_cpu_s": frames / max(1e-9, (c1 - c0) - (c3 - c2)),
        "journal_mb": manifest["recorder"]["journal"]["bytes"] / 1e6,
        "startup_cpu_s": c0 - c_init,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=25_000)
    ap.add_argument("--symbols", type=int, default=4)
    ap.add_argument("--channels", default="books15,trade")
    ap.add_argument("-v", action="store_true", help="progress on stderr")
    a = ap.parse_args()
    symbols = ["BTCUSDT", "ETHUSDT", "SOLUSDT", "XRPUSDT", "DOGEUSDT", "ADAUSDT"][: a.symbols]
    with tempfile.TemporaryDirectory() as d:
        r = asyncio.run(bench(a.steps, symbols, tuple(a.channels.split(",")), Path(d) / "s"))
    print(
        f"channels {a.channels}, {len(symbols)} symbols, {r['frames']:,} frames -> {r['rows']:,} rows, "
        f"journal {r['journal_mb']:.1f} MB"
    )
    print(
        f"wall {r['wall_s']:.2f} s ({r['frames_per_wall_s']:,.0f} frames/s;"
        f" receiving took {r['wall_receive_s']:.2f} s)"
    )
    print(
        f"recorder CPU {r['cpu_s']:.2f} s -> {r['frames_per_cpu_s']:,.0f} frames/s per core "
        f"(target {TARGET:,}: {r['frames_per_cpu_s'] / TARGET:.0%})"
    )
    print(
        f"  (startup, once per process, not counted: {r['startup_cpu_s']:.2f} s CPU;"
        f" counted it would be {r['frames'] / (r['cpu_s'] + r['startup_cpu_s']):,.0f} frames/s per core)"
    )
    print(f"  live path (socket -> journal): {r['live_frames_per_cpu_s']:,.0f} frames/s per core")
    print(
        f"  normalise (journal -> Parquet): {r['normalise_frames_per_cpu_s']:,.0f} frames/s per core "
        f"({r['normalise_cpu_s']:.2f} s)"
    )


if __name__ == "__main__":
    main()
