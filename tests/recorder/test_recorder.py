"""The recorder against the local Bitget server, one fault at a time, asserting on what is written.

For every scenario: each connection's received frames (from the journal) are an exact prefix of
what the server sent on it (nothing missing in the middle), every data frame of the lost tail is
covered by a declared gap for its channel/symbol, the session's Parquet files are readable by
DuckDB and agree with the journal, and the recorder stops cleanly with a manifest.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
import websockets
from websockets.exceptions import InvalidStatus, InvalidURI

from engine.store import open_session
from recorder.record import RecordConfig, Recorder, RecordError
from recorder.recover import recover
from tests.helpers import REPO
from venue.bitget.public_server import BitgetServer, Fault, toy_frames
from wire.bitget.bitget_v2 import arg
from wire.connection import (
    ConnectionConfig,
    SlidingWindow,
    backoff_delays,
    chunk_subscribe,
    peek_arg,
    retryable,
    shard_args,
)
from wire.journal import META, RECV, JournalWriter, finalise_dangling, iter_segment, list_segments, replay

SYMS = ("BTCUSDT", "ETHUSDT")


def fast_conn(url: str, **kw: Any) -> ConnectionConfig:
    base = dict(
        ping_interval_s=0.25,
        pong_timeout_s=0.5,
        silence_limit_s=0.5,
        watchdog_tick_s=0.02,
        backoff_initial_s=0.02,
        backoff_max_s=0.2,
        min_stable_s=0.0,
        silent_after_s=0.4,
        open_timeout_s=2.0,
    )
    base.update(kw)
    return ConnectionConfig(url=url, **base)


async def record(
    tmp: Path,
    src: list[tuple[int, bytes]],
    *,
    faults: tuple[Fault, ...] = (),
    channels: tuple[str, ...] = ("books15", "trade"),
    symbols: tuple[str, ...] = SYMS,
    speed: float = 20.0,
    server_kw: dict[str, Any] | None = None,
    cfg_kw: dict[str, Any] | None = None,
    conn_kw: dict[str, Any] | None = None,
    settle_s: float = 0.3,
) -> tuple[BitgetServer, Recorder, dict[str, Any]]:
    async with BitgetServer(src, speed=speed, faults=faults, **(server_kw or {})) as srv:
        cfg = RecordConfig(
            out=str(tmp / "s"),
            symbols=symbols,
            channels=channels,
            flush_interval_ms=50,
            connection=fast_conn(srv.url, **(conn_kw or {})),
            **(cfg_kw or {}),
        )
        rec = Recorder(cfg)
        task = asyncio.create_task(rec.run())
        await asyncio.wait_for(srv.finished.wait(), 30)
        await asyncio.sleep(settle_s)
        rec.request_stop("test")
        manifest = await asyncio.wait_for(task, 30)
    return srv, rec, manifest


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


# ---------------------------------------------------------------- assertions on what was written


def client_sessions(journal_dir: Path) -> list[list[tuple[int, bytes]]]:
    """Received frames grouped per connection session (a ``connect`` META starts one)."""
    sessions: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
    n: dict[int, int] = {}
    for r in replay(journal_dir):
        if r.kind == META and r.meta().get("t") == "connect":
            n[r.conn_id] = n.get(r.conn_id, -1) + 1
            sessions[(r.conn_id, n[r.conn_id])] = []
        elif r.kind == RECV:
            sessions[(r.conn_id, n[r.conn_id])].append((r.ts_recv_ns, r.payload))
    return list(sessions.values())


def check_nothing_lost(srv: BitgetServer, out: Path, manifest: dict[str, Any]) -> list[Any]:
    """Returns the data frames lost at connection tails (each covered by a gap); fails otherwise."""
    gaps = manifest["recorder"]["gaps"]
    per_conn: dict[int, list[Any]] = {}
    for s in srv.log:
        per_conn.setdefault(s.conn, []).append(s)
    unmatched = set(per_conn)
    lost: list[Any] = []
    for sess in client_sessions(out / "journal"):
        if not sess:
            continue
        frames = [p for _, p in sess]
        match = [c for c in unmatched if [s.frame for s in per_conn[c][: len(frames)]] == frames]
        assert match, f"a session's frames are not a prefix of any server connection: {frames[:3]}"
        c = match[0]
        unmatched.discard(c)
        last_ts = sess[-1][0]
        for s in per_conn[c][len(frames) :]:
            if s.kind != "data":
                continue
            assert any(
                g["channel"] == s.channel
                and g["symbol"] == s.symbol
                and g["start_ns"] <= last_ts <= g["end_ns"]
                for g in gaps
            ), f"lost {s.channel}/{s.symbol} frame outside any declared gap"
            lost.append(s)
    for c in unmatched:  # server connections from which nothing arrived
        for s in per_conn[c]:
            if s.kind == "data":
                assert any(g["channel"] == s.channel and g["symbol"] == s.symbol for g in gaps)
                lost.append(s)
    return lost


def check_files(out: Path, manifest: dict[str, Any]) -> dict[str, int]:
    s = open_session(out)
    s.verify()
    counts = {}
    for stream in s.streams:
        files = [str(p) for p in s.files(stream)]
        n = duckdb.sql(f"select count(*) from read_parquet({files!r})").fetchall()[0][0]
        assert n == manifest["streams"][stream]["rows"]
        counts[stream] = n
    # the journal agrees with the tables: one BookSnapshot per good books15 frame, every trade once
    # (the trade snapshot after a resubscribe repeats trades already received)
    books15 = 0
    trade_ids: set[tuple[str, str]] = set()
    for r in replay(out / "journal"):
        if r.kind == RECV and r.payload.startswith(b'{"action"'):
            try:
                f = orjson.loads(r.payload)
            except orjson.JSONDecodeError:
                continue
            ch = f["arg"]["channel"]
            books15 += ch == "books15"
            if ch == "trade":
                trade_ids.update((f["arg"]["instId"], d["tradeId"]) for d in f["data"])
    assert counts.get("books15", 0) >= books15 and counts.get("trade", 0) == len(trade_ids)
    assert counts.get("gap", 0) == len(manifest["recorder"]["gaps"])
    return counts


# ---------------------------------------------------------------- scenarios


def test_clean_recording(tmp_path: Path) -> None:
    srv, rec, m = run(record(tmp_path, toy_frames(SYMS, n=60), speed=30))
    out = tmp_path / "s"
    assert check_nothing_lost(srv, out, m) == []
    counts = check_files(out, m)
    assert counts["books15"] == 120 and counts["trade"] == 60 and "gap" not in counts
    r = m["recorder"]
    assert r["gaps"] == [] and r["reconnects"] == 0 and r["stopped_by"] == "test" and not r["recovered"]
    assert r["asked"]["symbols"] == list(SYMS) and r["asked"]["channels"] == ["books15", "trade"]
    assert r["received"]["books15:BTCUSDT"]["frames"] == 60 and r["never_received"] == []
    assert r["acked_but_silent"] == [] and r["silent_flagged"] == [] and r["rejected"] == []
    line = rec.status_text({"books15": 20.0, "trade": 10.0})
    assert "conns 0/1 up" in line and "books15 20.0/s" in line and "gaps 0" in line
    assert sorted(r["acked"]) == sorted(f"{c}:{s}" for s in SYMS for c in ("books15", "trade"))
    assert (out / "record.json").exists() and [p.name for p in (out / "journal").iterdir()] == [
        "seg-000000.dhj"
    ]
    # ts_recv is the local receive time; ts_event the exchange time (both ns)
    row = duckdb.sql(
        f"select ts_event, ts_recv from read_parquet('{out}/books15/*.parquet') limit 1"
    ).fetchall()[0]
    assert row[0] == 1_700_000_000_000 * 1_000_000 and row[1] > row[0]


def test_drop_reconnects_resubscribes_and_records_gap(tmp_path: Path) -> None:
    srv, rec, m = run(
        record(tmp_path, toy_frames(SYMS, n=150), speed=20, faults=(Fault(kind="drop", at_frame=40),))
    )
    out = tmp_path / "s"
    check_nothing_lost(srv, out, m)
    check_files(out, m)
    r = m["recorder"]
    assert srv.connections == 2 and r["reconnects"] == 1
    assert {(g["channel"], g["symbol"]) for g in r["gaps"]} == {
        (c, s) for s in SYMS for c in ("books15", "trade")
    }
    assert all(g["reason"].startswith("disconnect:") and g["end_ns"] > g["start_ns"] for g in r["gaps"])
    # frames flowed again after the reconnect
    assert all(
        v["last_ns"] > max(g["end_ns"] for g in r["gaps"]) for k, v in r["received"].items() if "books15" in k
    )


def test_stall_is_caught_by_the_silence_watchdog(tmp_path: Path) -> None:
    f = Fault(kind="stall", at_frame=20)  # forever, socket left open
    srv, rec, m = run(record(tmp_path, toy_frames(SYMS, n=200), speed=20, faults=(f,)))
    out = tmp_path / "s"
    lost = check_nothing_lost(srv, out, m)
    check_files(out, m)
    r = m["recorder"]
    assert r["disconnects"][0]["reason"] in ("silence", "pong_timeout")
    assert r["reconnects"] >= 1 and len(r["gaps"]) == 4
    assert any(w.reason == "stall" for w in srv.withheld) and lost == []


def test_missing_pongs_drop_the_connection(tmp_path: Path) -> None:
    f = Fault(kind="no_pong", at_frame=5)  # data keeps flowing; only pongs stop
    srv, rec, m = run(
        record(tmp_path, toy_frames(SYMS, n=200), speed=20, faults=(f,), conn_kw={"silence_limit_s": 5})
    )
    out = tmp_path / "s"
    check_nothing_lost(srv, out, m)
    check_files(out, m)
    r = m["recorder"]
    assert r["disconnects"][0]["reason"] == "pong_timeout" and r["reconnects"] >= 1
    assert r["pongs"] > 0  # the second connection answers


def test_garbage_truncated_and_error_events_are_quarantined_not_fatal(tmp_path: Path) -> None:
    faults = (
        Fault(kind="garbage", at_frame=5, count=3),
        Fault(kind="truncated", at_frame=10),
        Fault(kind="error_event", at_frame=12, code="30016"),
        Fault(kind="error_event", at_frame=14, code=30001),
    )
    srv, rec, m = run(record(tmp_path, toy_frames(SYMS, n=60), speed=30, faults=faults))
    out = tmp_path / "s"
    assert check_nothing_lost(srv, out, m) == []
    counts = check_files(out, m)
    r = m["recorder"]
    assert r["reconnects"] == 0 and r["quarantined"] == counts["quarantine"] == 4
    # the truncated frame still names its arg: its data is lost, a gap from that arg's previous frame
    (cut,) = [s for s in srv.log if s.kind == "truncated"]
    ((ch, sym, reason),) = [(g["channel"], g["symbol"], g["reason"]) for g in r["gaps"]]
    assert (ch, sym, reason) == (cut.channel, cut.symbol, "quarantined:bad_json")
    q = duckdb.sql(f"select reason, raw from read_parquet('{out}/quarantine/*.parquet')").fetchall()
    assert all(reason.startswith("not JSON") for reason, _ in q)
    assert sum(raw.startswith("\x00garbage") for _, raw in q) == 3
    assert [e["code"] for e in r["errors"]] == [30016, 30001]  # string "30016" and number, both parsed
    # the truncated frame was lost as data: one books15 or trade frame fewer than sent
    assert counts["books15"] + counts["trade"] == 120 + 60 - 1


def test_books_seq_skip_and_bad_checksum_resubscribe_and_gap(tmp_path: Path) -> None:
    faults = (Fault(kind="skip_seq", at_frame=20), Fault(kind="bad_checksum", at_frame=60))
    srv, rec, m = run(record(tmp_path, toy_frames(SYMS, n=150), speed=15, faults=faults, channels=("books",)))
    out = tmp_path / "s"
    check_nothing_lost(srv, out, m)
    counts = check_files(out, m)
    r = m["recorder"]
    reasons = sorted(g["reason"] for g in r["gaps"])
    assert reasons == ["books_checksum", "books_seq_gap"], r["gaps"]
    assert r["resubscribes"] == 2 and r["reconnects"] == 0
    # each gap starts at the last good books push before the break and ends at the resubscribe ack
    books_rx = [
        x.ts_recv_ns for x in replay(out / "journal") if x.kind == RECV and b'"books"' in x.payload[:80]
    ]
    for g in r["gaps"]:
        assert g["start_ns"] in books_rx and g["start_ns"] < g["end_ns"]
        assert any(g["start_ns"] < t < g["end_ns"] for t in books_rx)  # the push that broke the book
    assert r["book_faults"]["seq_gap"] == 1 and r["book_faults"]["checksum"] == 1
    # books-only symbols: the rebuilt top 15 goes into the books15 stream, one per good push
    assert counts["books15"] > 250 and counts["quarantine"] >= 2
    q = duckdb.sql(f"select reason from read_parquet('{out}/quarantine/*.parquet')").fetchall()
    assert {x[0].split(":")[1].strip() for x in q} >= {"seq_gap", "checksum"}
    # after each gap a fresh snapshot arrived and the book was consistent again
    last_gap_end = max(g["end_ns"] for g in r["gaps"])
    assert r["received"]["books:BTCUSDT"]["last_ns"] > last_gap_end
    assert (
        duckdb.sql(
            f"select count(*) from read_parquet('{out}/books15/*.parquet') where bid_px_0 >= ask_px_0"
        ).fetchall()[0][0]
        == 0
    )


def test_own_send_rate_limit_keeps_the_server_happy(tmp_path: Path) -> None:
    # pings every 20 ms would be 50 msgs/s; our limiter holds it to 10 per 1.1 s
    srv, rec, m = run(
        record(
            tmp_path,
            toy_frames(SYMS, n=300),
            speed=20,
            conn_kw={"ping_interval_s": 0.02, "pong_timeout_s": 2},
        )
    )
    assert srv.rate_limited == 0 and m["recorder"]["reconnects"] == 0
    sent = [r.ts_recv_ns for r in replay(tmp_path / "s" / "journal") if r.kind == 1]
    assert len(sent) > 15
    for i in range(len(sent) - 10):
        assert sent[i + 10] - sent[i] >= 1.0e9  # never 11 in one second


def test_server_rate_limit_kick_is_survived(tmp_path: Path) -> None:
    # with our limiter loosened the server enforces its own: 30006, "30007", close; we reconnect
    srv, rec, m = run(
        record(
            tmp_path,
            toy_frames(SYMS, n=150),
            speed=20,
            conn_kw={"ping_interval_s": 0.02, "max_msgs_per_s": 1000, "pong_timeout_s": 2},
        )
    )
    assert srv.rate_limited >= 1
    r = m["recorder"]
    assert {e["code"] for e in r["errors"]} >= {30006, 30007}
    assert r["reconnects"] >= 1 and r["gaps"]
    check_nothing_lost(srv, tmp_path / "s", m)
    check_files(tmp_path / "s", m)


def test_acked_but_silent_and_rejected_symbols_are_reported(tmp_path: Path) -> None:
    srv, rec, m = run(
        record(
            tmp_path,
            toy_frames(SYMS, n=80),
            speed=10,
            symbols=("BTCUSDT", "XRPUSDT", "NOPEUSDT"),
            channels=("books15",),
            server_kw={"symbols": {"BTCUSDT", "XRPUSDT"}},
            faults=(Fault(kind="drop", at_frame=30),),
        )
    )
    r = m["recorder"]
    assert r["acked_but_silent"] == ["books15:XRPUSDT"] == r["silent_flagged"]
    assert r["rejected"] == ["books15:NOPEUSDT"] and r["errors"][0]["code"] == 30001
    assert r["never_received"] == ["books15:XRPUSDT", "books15:NOPEUSDT"]
    # the rejected arg is not asked again after the reconnect, and gets no gap
    subs = [
        orjson.loads(x.payload)
        for x in replay(tmp_path / "s" / "journal")
        if x.kind == 1 and x.payload != b"ping"
    ]
    assert [len(s["args"]) for s in subs] == [3, 2]
    assert {g["symbol"] for g in r["gaps"]} == {"BTCUSDT", "XRPUSDT"}
    assert rec.connections[0].args[("books15", "XRPUSDT")].silent_flagged
    status = rec.status_text({})
    assert "SILENT books15:XRPUSDT" in status and "REJECTED books15:NOPEUSDT" in status


def test_sharding_over_connections(tmp_path: Path) -> None:
    syms = ("BTCUSDT", "ETHUSDT", "SOLUSDT")
    srv, rec, m = run(
        record(tmp_path, toy_frames(syms, n=40), speed=30, symbols=syms, cfg_kw={"max_channels_per_conn": 4})
    )
    assert len(rec.connections) == 2 and srv.connections == 2
    assert [len(c.args) for c in rec.connections] == [4, 2]
    assert check_nothing_lost(srv, tmp_path / "s", m) == []
    assert check_files(tmp_path / "s", m)["books15"] == 120


def test_rotation_writes_parts_while_recording(tmp_path: Path) -> None:
    srv, rec, m = run(record(tmp_path, toy_frames(SYMS, n=120), speed=20, cfg_kw={"rotate_s": 0.15}))
    segs = list_segments(tmp_path / "s" / "journal")
    assert len(segs) >= 4 and all(finished for _, _, finished in segs)
    # a part for each segment that holds books (on a loaded machine the feed may start a segment late
    # or end one early: how many segments hold books is the recording's, not the test's)
    with_books = sum(
        any(b'"action":"snapshot"' in r.payload and b'"books15"' in r.payload for r in iter_segment(p))
        for _, p, _ in segs
    )
    assert len(open_session(tmp_path / "s").files("books15")) == with_books >= 2
    assert rec.segments_done == len(segs)
    assert check_nothing_lost(srv, tmp_path / "s", m) == []
    assert check_files(tmp_path / "s", m)["books15"] == 240


def test_normaliser_failure_keeps_the_raw_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Raw first: a decoding bug loses no frame; the recording says so and `recover` rebuilds it."""
    import recorder.record as record_mod

    def broken(*a: Any, **k: Any) -> int:
        raise RuntimeError("decoder bug")

    monkeypatch.setattr(record_mod, "normalise_segment", broken)
    with pytest.raises(RecordError, match="decoder bug.*recover"):
        run(record(tmp_path, toy_frames(SYMS, n=60), speed=30, cfg_kw={"rotate_s": 0.1}))
    monkeypatch.undo()
    out = tmp_path / "s"
    assert not (out / "manifest.json").exists()
    m = recover(out)
    assert check_files(out, m)["books15"] == 120 and m["recorder"]["stopped_by"] == "test"


def test_connect_failures_back_off_then_connect(tmp_path: Path) -> None:
    async def go() -> tuple[Any, ...]:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        cfg = RecordConfig(
            out=str(tmp_path / "s"),
            symbols=("BTCUSDT",),
            flush_interval_ms=50,
            connection=fast_conn(f"ws://127.0.0.1:{port}/v2/ws/public", backoff_initial_s=0.05),
        )
        rec = Recorder(cfg)
        task = asyncio.create_task(rec.run())
        await asyncio.sleep(0.5)  # nothing listens yet: refused, retried with backoff
        async with BitgetServer(toy_frames(("BTCUSDT",), n=40), speed=40, port=port) as srv:
            await asyncio.wait_for(srv.finished.wait(), 10)
            await asyncio.sleep(0.2)
            rec.request_stop("test")
            m = await task
        return srv, m

    srv, m = run(go())
    r = m["recorder"]
    assert 2 <= r["failed_connects"] <= 12 and r["connects"] == 1
    assert r["received"]["books15:BTCUSDT"]["frames"] == 40


def test_fatal_handshake_rejection_stops_cleanly(tmp_path: Path) -> None:
    """HTTP 403 on the upgrade is not retryable: reported as fatal, the recorder stops with a manifest."""
    from websockets.asyncio.server import serve

    async def go() -> dict[str, Any]:
        def reject(conn: Any, request: Any) -> Any:
            return conn.respond(403, "blocked\n")

        async with serve(lambda ws: ws.wait_closed(), "127.0.0.1", 0, process_request=reject) as server:
            port = server.sockets[0].getsockname()[1]
            cfg = RecordConfig(
                out=str(tmp_path / "s"), symbols=("BTCUSDT",), connection=fast_conn(f"ws://127.0.0.1:{port}/")
            )
            return await asyncio.wait_for(Recorder(cfg).run(), 10)

    m = run(go())
    r = m["recorder"]
    assert r["stopped_by"] == "all_connections_failed" and r["failed_connects"] == 1
    assert "403" in r["fatal"][0]["error"] and r["connects"] == 0
    assert r["never_received"] == ["books15:BTCUSDT", "trade:BTCUSDT"]


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "record.json").write_text("{}")
    cfg = RecordConfig(out=str(tmp_path / "s"), symbols=("BTCUSDT",))
    with pytest.raises(RecordError, match="recover"):
        run(Recorder(cfg).run())
    with pytest.raises(RecordError):
        RecordConfig(out="x", symbols=("BTCUSDT",), channels=("books50",))


# ---------------------------------------------------------------- crash and signals (subprocess)


def _recorder_cmd(url: str, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "recorder.cli",
        "record",
        "--symbols",
        "BTCUSDT,ETHUSDT",
        "--channels",
        "books15,trade,books",
        "--out",
        str(out),
        "--url",
        url,
        "--flush-ms",
        "50",
        "--ping-s",
        "0.5",
        "--no-status",
    ]


async def _run_subprocess_until(tmp: Path, sig: int, frames_before_signal: int) -> tuple[BitgetServer, int]:
    out = tmp / "s"
    async with BitgetServer(toy_frames(SYMS, n=3000), speed=10) as srv:
        proc = await asyncio.create_subprocess_exec(
            *_recorder_cmd(srv.url, out), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        t0 = time.monotonic()
        while len(srv.data_frames()) < frames_before_signal:
            assert time.monotonic() - t0 < 20, "recorder never received data"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # at least one journal flush after those frames
        os.kill(proc.pid, sig)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode is not None
    if sig != signal.SIGKILL:
        assert proc.returncode == 0, err.decode()
    return srv, proc.returncode


def test_kill_9_then_recover(tmp_path: Path) -> None:
    srv, rc = run(_run_subprocess_until(tmp_path, signal.SIGKILL, 200))
    out = tmp_path / "s"
    assert rc == -signal.SIGKILL and not (out / "manifest.json").exists()
    assert any(p.name.endswith(".dhj.part") for p in (out / "journal").iterdir())
    m = recover(out)
    r = m["recorder"]
    assert r["recovered"] and r["stopped_by"] == "crash"
    assert not any(p.name.endswith(".part") for p in (out / "journal").iterdir())
    counts = check_files(out, m)
    assert counts["books15"] >= 50 and counts["trade"] > 0
    # what was journaled is a prefix of what the server sent: the crash lost only the tail
    sess = client_sessions(out / "journal")
    sent = [s.frame for s in srv.log if s.conn == 0]
    assert [p for _, p in sess[0]] == sent[: len(sess[0])]
    assert len(sent) - len(sess[0]) < len(sent) // 2
    with pytest.raises(Exception, match="already a finished session"):
        recover(out)


def test_sigterm_stops_cleanly(tmp_path: Path) -> None:
    srv, rc = run(_run_subprocess_until(tmp_path, signal.SIGTERM, 100))
    out = tmp_path / "s"
    m = open_session(out).manifest
    assert rc == 0 and m["recorder"]["stopped_by"] == "SIGTERM" and not m["recorder"]["recovered"]
    check_files(out, m)
    assert not any(p.name.endswith(".part") for p in (out / "journal").iterdir())


# ---------------------------------------------------------------- journal


def test_journal_segments_temp_names_and_replay(tmp_path: Path) -> None:
    j = JournalWriter(tmp_path, rotate_bytes=1 << 30)
    assert [p.name for p in tmp_path.iterdir()] == ["seg-000000.dhj.part"]
    frames = [os.urandom(random.Random(i).randint(0, 300)) for i in range(500)]
    for i, f in enumerate(frames):
        j.append(1_000 + i, i % 3, f)
        if i % 100 == 99:
            j.flush()
    j.meta(5, 0, {"t": "x"})
    first = j.rotate()
    j.append(9_999, 1, b"tail")
    last = j.close()
    assert [first.name, last.name] == ["seg-000000.dhj", "seg-000001.dhj"]
    recs = list(replay(tmp_path))
    assert [r.payload for r in recs if r.kind == RECV] == frames + [b"tail"]
    assert recs[0].ts_recv_ns == 1_000 and recs[1].conn_id == 1 and recs[500].meta() == {"t": "x"}


def test_journal_torn_tail_is_cut_and_kept_up_to_last_block(tmp_path: Path) -> None:
    j = JournalWriter(tmp_path)
    for i in range(10):
        j.append(i, 0, b"frame-%d" % i)
    j.flush()
    for i in range(10, 20):
        j.append(i, 0, b"frame-%d" % i)
    j.flush()
    path = j.current_path
    assert path is not None
    os.close(j._fd)  # simulate a crash: no close(), no rename
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 5)  # the second block is torn
    scans = finalise_dangling(tmp_path)
    assert scans[0].torn.startswith("torn block") and scans[0].records == 10
    final = tmp_path / "seg-000000.dhj"
    assert final.exists() and final.stat().st_size == scans[0].good_bytes
    assert [r.payload for r in iter_segment(final)] == [b"frame-%d" % i for i in range(10)]


def test_journal_time_rotation(tmp_path: Path) -> None:
    t = [0]
    j = JournalWriter(tmp_path, rotate_s=10, monotonic_ns=lambda: t[0])
    assert not j.rotate_due()
    t[0] = 10_000_000_000
    assert j.rotate_due()
    j.rotate()
    assert not j.rotate_due()
    j.close()


# ---------------------------------------------------------------- pure policy


def test_retryable_policy() -> None:
    class R:
        def __init__(self, status: int) -> None:
            self.status_code = status
            self.headers: dict[str, str] = {}

    assert retryable(ConnectionRefusedError()) and retryable(TimeoutError()) and retryable(EOFError())
    assert retryable(OSError("network unreachable"))
    assert retryable(InvalidStatus(R(503))) and retryable(InvalidStatus(R(429)))
    assert not retryable(InvalidStatus(R(403))) and not retryable(InvalidStatus(R(404)))
    assert not retryable(InvalidURI("x", "bad"))
    assert not retryable(ValueError("a bug")) and not retryable(KeyError("a bug"))
    assert retryable(websockets.ConnectionClosedError(None, None))


def test_backoff_is_exponential_jittered_and_seeded() -> None:
    a = list(zip(range(8), backoff_delays(random.Random(1), initial_s=1, max_s=10, factor=2), strict=False))
    b = list(zip(range(8), backoff_delays(random.Random(1), initial_s=1, max_s=10, factor=2), strict=False))
    assert a == b
    ds = [d for _, d in a]
    caps = [1, 2, 4, 8, 10, 10, 10, 10]
    assert all(c / 2 <= d <= c for d, c in zip(ds, caps, strict=True))
    assert ds != [d for _, d in zip(range(8), backoff_delays(random.Random(2)), strict=False)]


def test_sliding_window() -> None:
    w = SlidingWindow(10, 1.0)
    for i in range(10):
        assert w.wait_s(i * 0.01) == 0
        w.record(i * 0.01)
    assert w.wait_s(0.5) == pytest.approx(0.5)
    assert w.wait_s(1.0) == 0  # the first one left the window
    budget = SlidingWindow(300, 300.0)
    for i in range(300):
        budget.record(i * 0.1)
    assert budget.wait_s(30.0) == pytest.approx(270.0)


def test_shard_and_chunk() -> None:
    args = [arg(c, f"S{i:03d}USDT") for i in range(40) for c in ("books15", "trade")]
    shards = shard_args(args, 50)
    assert [len(s) for s in shards] == [50, 30]
    assert sorted(map(str, args)) == sorted(map(str, [a for s in shards for a in s]))
    chunks = chunk_subscribe(args, 4096)
    assert (
        all(len(orjson.dumps(c)) <= 4096 for c in chunks) and sum(map(len, chunks)) == 80 and len(chunks) > 1
    )
    assert Counter(a["channel"] for c in chunks for a in c) == {"books15": 40, "trade": 40}


def test_peek_arg() -> None:
    raw = b'{"action":"update","arg":{"instType":"USDT-FUTURES","channel":"trade","instId":"BTCUSDT"}'
    raw += b',"data":[]}'
    assert peek_arg(raw) == arg("trade", "BTCUSDT")
    assert peek_arg(b'{"action":"update","data":[]}') is None
    assert peek_arg(b'{"action":"update","arg":{"channel":') is None
