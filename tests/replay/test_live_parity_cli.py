"""``dualhub parity LIVE_SESSION``: a paper live run against the local exchange replays with no
divergence; a tampered live event log gives the first divergence and exit 1; a real-orders session
says what cannot be reproduced; bad input is one error line and exit 2."""

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dualhub.cli import main
from live.runner import LiveConfig, run_live
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames
from wire.bitget.bitget_v2_rest import Credentials

SPEED = 10.0


@pytest.fixture(scope="module")
def frames():
    return list(simulator_frames(["BTCUSDT"], minutes=2, seed=3))


def _run(frames, out: Path, **kw):
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED)) as ex:
        cfg = LiveConfig(
            out=str(out),
            exchange_url=ex.rest_url,
            ws_url=ex.ws_url,
            laya_provider="cpu",
            duration_s=4.0,
            **kw,
        )
        creds = (
            Credentials("local-key", "local-secret", "local-passphrase") if kw.get("mode") == "live" else None
        )
        r = run_live(cfg, credentials=creds)
    assert r.exit_code == 0, r.summary
    return r


@pytest.fixture(scope="module")
def paper(frames, tmp_path_factory):
    return _run(
        frames, tmp_path_factory.mktemp("parity") / "paper", latency_order_entry="lognormal:p5=1ms,p95=9ms"
    )


def test_paper_session_has_no_divergence(paper, capsys):
    assert main(["parity", str(paper.session_dir)]) == 0
    out = capsys.readouterr().out
    c = paper.counts["BTCUSDT"]
    assert c["fill"] > 3 and c["kev_response"] > 2  # a run that traded and asked Kev
    n = sum(
        c[s]
        for s in ("label", "kev_queue", "kev_request", "kev_response", "command", "risk", "order", "fill")
    )
    assert f"no divergence: {n} events identical" in out
    assert f"cassette: {c['kev_request']} hits, 0 misses" in out
    assert "cannot be reproduced" not in out
    replay = paper.session_dir / "runs" / "parity-BTCUSDT"
    assert pq.read_table(replay / "events" / "fill.parquet").num_rows == c["fill"]
    assert main(["parity", str(paper.run_dirs["BTCUSDT"])]) == 0  # a run directory works too (replaced)


def test_tampered_live_log_gives_the_first_divergence(paper, tmp_path, capsys):
    session = tmp_path / "tampered"
    shutil.copytree(paper.session_dir, session, ignore=shutil.ignore_patterns("parity-*"))
    path = session / "runs" / "live-BTCUSDT" / "events" / "fill.parquet"
    fills = pq.read_table(path)
    k = fills.num_rows // 2
    px = fills.column("px").to_pylist()
    px[k] += 0.5  # the live run "saw" one fill at another price
    pq.write_table(fills.set_column(fills.schema.get_field_index("px"), "px", pa.array(px)), path)
    assert main(["parity", str(session)]) == 1
    out = capsys.readouterr().out
    assert "first divergence" in out and f"fill #{k}" in out
    assert str(px[k]) in out and str(px[k] - 0.5) in out  # both values, side by side


def test_real_orders_session_says_what_cannot_be_reproduced(frames, tmp_path, capsys):
    r = _run(frames, tmp_path / "live", mode="live")
    assert r.counts["BTCUSDT"]["fill"] > 0  # the venue filled orders: those cannot come back
    assert main(["parity", str(r.session_dir)]) == 0
    out = capsys.readouterr().out
    assert "(live run)" in out
    assert "the venue's acks, rejects and fills came from the real venue and cannot be reproduced" in out
    assert "the first report came at ts_recv" in out and "are not compared" in out
    assert "no divergence before the first execution report" in out
    assert "labels   compared over the whole run (market data and Laya only): no divergence " in out
    assert "no divergence: " not in out  # never a pass of the whole run


def test_paper_run_with_a_real_llm_has_no_divergence(frames, llama_server, tmp_path, capsys):
    """Kev is a real llama-server: `dualhub parity` replays its answers, with their lags, from the
    run's cassette."""
    r = _run(frames, tmp_path / "llm", kev_url=llama_server.url)
    n = r.counts["BTCUSDT"]["kev_request"]
    assert n >= 1
    assert main(["parity", str(r.session_dir)]) == 0
    out = capsys.readouterr().out
    assert f"cassette: {n} hits, 0 misses" in out and "no divergence: " in out


def test_bad_input_is_one_error_line(paper, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for arg in (tmp_path / "nope", tmp_path / "empty"):
        assert main(["parity", str(arg)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("dualhub parity: error: "), err
    run = tmp_path / "s" / "runs" / "live-BTCUSDT"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"kind": "replay"}')
    assert main(["parity", str(tmp_path / "s")]) == 2
    assert "not a finished live run" in capsys.readouterr().err
    broken = tmp_path / "broken"
    shutil.copytree(paper.session_dir, broken, ignore=shutil.ignore_patterns("parity-*"))
    (broken / "runs" / "live-BTCUSDT" / "kev_cassette.parquet").unlink()
    assert main(["parity", str(broken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lacks kev_cassette.parquet" in err[0]
    assert not (broken / "runs" / "parity-BTCUSDT").exists()  # refused before any replay
