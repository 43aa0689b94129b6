"""One instrument of a live run and the run it writes to (:class:`SymbolRun`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.contract import ContractConfig
from engine.core import Engine
from engine.eventlog import EventLog
from engine.events import InputQuarantined, ReconcileEvent, VenueStatus
from engine.kev.cassette import RecordingAdvisor
from engine.latency.recorded import LatencySink
from live.kev_backend import LiveKevBackend
from live.wal import LiveWal
from venue.exchange import SimExchange


@dataclass
class SymbolRun:
    """One instrument of the run and the run it writes to (a portfolio's instruments share one run:
    its directory, log, sink, advisor, Kev, journal and the event lists)."""

    symbol: str
    contract: ContractConfig
    run_dir: Path
    tmp: Path
    log: EventLog
    sink: LatencySink
    advisor: RecordingAdvisor
    kev: LiveKevBackend
    engine: Engine
    paper: SimExchange | None
    reconcile: list[ReconcileEvent] = field(default_factory=list)
    venue: list[VenueStatus] = field(default_factory=list)
    quarantine: list[InputQuarantined] = field(default_factory=list)  # decoded events kept from the engine
    wal: LiveWal | None = None  # the run's write-ahead journal (live/wal.py)
