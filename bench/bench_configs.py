#!/usr/bin/env python3
"""Replay throughput of every configuration a researcher reaches for, on the same 1M snapshots.

Issue 17 asks for 250 000 snapshots/s on the default workload and 160 000 with the strategy kept
trading in *every* configuration, not only the synthetic default. This script replays the
``bench_replay_1m.py`` session (gen_books' snapshots and trades, Laya on every snapshot, queue fills)
under each configuration below, one core, each in a fresh process that runs it ``--runs-per-process``
times (the median of runs 1.. is the figure: code loaded, memory paged in, as hftbacktest's
``--runs``), and prints snapshots/s, peak RSS, the events written and the engine the run's
``runtime.json`` names. Configurations alternate within each repeat, so drift hits them alike.

The inputs some configurations need are made first, untimed, from a default run of each workload:
its ``kev_response`` events as the Kev cassette (every request hits), the fit of its lags
(``dualhub kev fit-lag``'s, drawn lags allowed) as the fitted lag, and 2 000 lognormal draws as an
empirical order-latency file.

Left out, with why: ``--kev-mode llm`` (the workload asks Kev ~35 000 times; at llama-server's 2.5 s
a call the replay's speed is the LLM's, which ``bench/bench_kev.py`` measures) and features v1 (no v1
model ships in ``data/models``).

    .venv/bin/python bench/bench_configs.py --data /tmp/gb1m [--workload default|trading|both]
        [--only tick,cassette] [--repeat 1] [--runs-per-process 3] [--out configs.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay_1m import run_dualhub, session_from_gen_books  # noqa: E402
from peer import ROOT  # noqa: E402

from replay.kev_cli import fit_runs  # noqa: E402

# name -> (ReplayConfig arguments as Python source, what it changes). {cassette}, {lag} and {orderlat}
# are the inputs made before the runs.
CONFIGS: dict[str, tuple[str, str]] = {
    "default": ("", "rule advisor, lognormal Kev lag, labels in batch, constant latencies"),
    "cassette": ("kev_mode='cassette', kev_cassette={cassette!r}", "Kev's recorded replies at their lags"),
    "kev_lag_fit": ("kev_lag_fit={lag!r}", "Kev's lag from `dualhub kev fit-lag` (empirical)"),
    "tick": ("laya_mode='tick'", "Laya per snapshot, as live parity replays"),
    "lognormal_orders": (
        "latency_order_entry='lognormal:p5=2ms,p95=8ms', latency_order_response='lognormal:p5=2ms,p95=8ms', "
        "latency_cancel='lognormal:p5=2ms,p95=8ms'",
        "order entry, response and cancel latencies drawn per order",
    ),
    "empirical_orders": (
        "latency_order_entry='empirical:{orderlat}', latency_order_response='empirical:{orderlat}'",
        "order latencies drawn from samples",
    ),
    "feed_latency": ("latency_feed='lognormal:p5=1ms,p95=5ms'", "market data latency modelled"),
    "laya_latency": ("latency_laya='lognormal:p5=50us,p95=400us'", "Laya's latency drawn per book"),
    "fill_touch": ("", "fills without a queue (fill_NAME: that fill model)"),
    "fill_risk_averse": ("", "queue moved by trades only"),
    "imbalance_lean": ("strategy='imbalance_lean'", "the other compiled strategy"),
    "python_strategy": (
        "strategy={example!r}",
        "a plain Python strategy (docs/examples/microprice.py) through the loop's stops",
    ),
    "scaled": ("scale_kev=2.0, scale_order=0.5", "what-if latency multipliers"),
}


def _inputs(session: Path, td: Path, loss: float | None) -> dict[str, str]:
    """The cassette, the lag fit and the order-latency samples, from one default run of the workload
    (untimed): its own cassette, as the other workload's requests would miss it."""
    base = td / f"base-{loss}"
    run_dualhub(session, base, "queue_power2", loss)
    lag = td / f"lag-{loss}.json"
    # the default run's lags were drawn from the lag model: `fit-lag` refuses them unless told
    lag.write_text(json.dumps(fit_runs([base], allow_modelled=True)))
    rng = np.random.default_rng(7)
    samples = np.exp(rng.normal(np.log(4e6), 0.4, 2000)).astype(np.int64)
    orderlat = td / "order_latency.json"
    orderlat.write_text(json.dumps(samples.tolist()))
    example = ROOT / "docs" / "examples" / "microprice.py"
    return {"cassette": str(base), "lag": str(lag), "orderlat": str(orderlat), "example": f"{example}:quote"}


def _engine(run: Path) -> str:
    rt = json.loads((run / "runtime.json").read_text())
    return f"{rt.get('engine', '?')}: {rt.get('engine_path', '?')}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="gen_books.py output directory")
    ap.add_argument("-n", type=int, default=0, help="use the first n snapshots (0 = all)")
    ap.add_argument("--workload", choices=("default", "trading", "both"), default="both")
    ap.add_argument("--only", default="", help="comma-separated configuration names (default: all)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--runs-per-process", type=int, default=3)
    ap.add_argument("--out", type=Path, help="write the figures as JSON")
    args = ap.parse_args()
    names = [c for c in args.only.split(",") if c] or list(CONFIGS)
    unknown = set(names) - set(CONFIGS)
    if unknown:
        ap.error(f"unknown configurations {sorted(unknown)}; known: {', '.join(CONFIGS)}")
    loads = {"default": None, "trading": 1e12}
    if args.workload != "both":
        loads = {args.workload: loads[args.workload]}
    k = args.runs_per_process
    results: dict[str, dict[str, list[dict]]] = {w: {c: [] for c in names} for w in loads}
    with tempfile.TemporaryDirectory() as tds:
        td = Path(tds)
        session = session_from_gen_books(args.data, td / "s", args.n or None)
        inputs = {w: _inputs(session, td, loss) for w, loss in loads.items()}
        print("inputs made: a cassette and lag fit per workload, 2 000 order-latency samples", flush=True)
        for i in range(args.repeat):
            for w, loss in loads.items():
                for name in names:
                    extra = CONFIGS[name][0].format(**inputs[w])
                    fill = name.removeprefix("fill_") if name.startswith("fill_") else "queue_power2"
                    walls, rates, rss, events, digest, _ = run_dualhub(
                        session, td / "run", fill, loss, one_core=True, runs=k, config=extra
                    )
                    rate = statistics.median(rates[1:]) if k > 1 else rates[0]
                    row = {"rate": rate, "rss_mb": rss, "events": events, "digest": digest}
                    row["engine"] = _engine(td / "run")
                    results[w][name].append(row)
                    print(
                        f"repeat {i} {w:8s} {name:17s} {rate:>9,.0f}/s  peak RSS {rss:,.0f} MB  "
                        f"{events:,} events, digest {digest[:12]}  "
                        f"(runs {', '.join(f'{x:.1f}' for x in walls)} s)  "
                        f"engine {row['engine']}",
                        flush=True,
                    )
    target = {"default": 250_000, "trading": 160_000}
    print(f"\nmedian snapshots/s (one core, median of runs 1..{k - 1} of a process; {args.repeat} repeat(s))")
    heads = [f"{w} (>= {target[w]:,})" for w in loads]
    print(f"{'configuration':18s}" + "".join(f"{h:>28s}" for h in heads))
    for name in names:
        cells = []
        for w in loads:
            rs = results[w][name]
            rate = statistics.median(r["rate"] for r in rs)
            rss = max(r["rss_mb"] for r in rs)
            ok = "ok" if rate >= target[w] else "BELOW"
            cells.append(f"{rate:>10,.0f} {ok:5s} {rss:>6,.0f} MB")
        print(f"{name:18s}" + "".join(f"{c:>28s}" for c in cells) + f"   {CONFIGS[name][1]}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
