"""Real Kev latency on this machine: start llama-server from the LLM venv, make N calls, print percentiles.

    .venv/bin/python bench/bench_kev.py [-n 20] [--out bench_kev.json]

Needs ``bash .ci/ensure-llama-server.sh`` first. Server flags: the deterministic CI recipe
(``-t 1 -np 1 --cache-ram 0 -c 2048``), SmolLM2-135M Q4_1 served under the production alias.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
from pathlib import Path

from engine.kev.server import LlamaServer, ServerConfig
from engine.store import write_json
from replay.kev_cli import bench_table, run_bench


def rss_mib(pid: int | None) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20, help="measured calls (default 20)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="llama-server -t (default 1)")
    ap.add_argument("--out", help="write the figures as JSON")
    args = ap.parse_args(argv)

    with LlamaServer(config=ServerConfig(threads=args.threads)) as srv:
        print(f"llama-server pid {srv.pid} ready in {srv.startup_s:.2f} s on {srv.url}", file=sys.stderr)
        result = asyncio.run(run_bench(srv.url, args.n, warmup=args.warmup))
        result["server_rss_mib"] = rss_mib(srv.pid)
        result["server_threads"] = args.threads
        result["startup_s"] = srv.startup_s
    result["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"
    print(bench_table(result))
    print(
        f"server RSS after the run: {result['server_rss_mib']:.0f} MiB; startup {result['startup_s']:.2f} s"
    )
    if args.out:
        write_json(Path(args.out), result)
        print(f"wrote {args.out}")
    return 0 if result["ok"] == args.n else 1


if __name__ == "__main__":
    raise SystemExit(main())
