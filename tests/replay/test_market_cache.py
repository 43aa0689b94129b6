"""The market cache (replay/market_cache.py): built once, reused to the same digest, checked on use,
keyed by what the cached bits depend on, kept under its size cap."""

import dataclasses
import os
from types import SimpleNamespace

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

import replay.book_source as book_source
from engine.store import open_session
from engine.validate import LEVEL_COLUMNS
from replay.config import ReplayConfig
from replay.driver import run_replay
from replay.market_cache import DIR_NAME, MarketCache, key_for, open_market
from venue.simulator import simulate_session

CFG = ReplayConfig(seed=5, laya_provider="cpu")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=0.5, seed=21)


@pytest.fixture
def small_blocks(monkeypatch):
    # several blocks on a short session: the cache's files, their order and the walk's reads of them
    monkeypatch.setattr(book_source, "BLOCK", 64)


def _entries(session) -> list:
    root = session / DIR_NAME
    return sorted(p for p in root.iterdir() if p.is_dir() and ".tmp" not in p.name) if root.is_dir() else []


def test_built_then_reused_to_the_same_digest(session, tmp_path, small_blocks):
    plain = run_replay(session, CFG, out_dir=tmp_path / "plain")
    assert plain.market_cache == ""  # not asked: nothing read or written
    assert not (session / DIR_NAME).exists()
    built = run_replay(session, CFG, out_dir=tmp_path / "built", market_cache=True)
    reused = run_replay(session, CFG, out_dir=tmp_path / "reused", market_cache=True)
    assert (built.market_cache, reused.market_cache) == ("built", "reused")
    assert plain.digest == built.digest == reused.digest
    for name in ("label", "order", "fill"):  # the same files, not only the same hash
        a = pq.read_table(tmp_path / "plain" / "events" / f"{name}.parquet")
        assert a.equals(pq.read_table(tmp_path / "reused" / "events" / f"{name}.parquet"))
    (entry,) = _entries(session)
    manifest = orjson.loads((entry / "manifest.json").read_bytes())
    assert manifest["rows"] == plain.books and len(manifest["files"]) == -(-plain.books // 64) > 2

    # a notebook's view: the books' levels in row order, memory-mapped, as the session holds them
    table = open_market(session, provider="cpu")
    assert table is not None and table.num_rows == plain.books
    books = open_session(session).read_table("books15")
    levels = np.asarray(table.column("levels").combine_chunks().values).reshape(-1, len(LEVEL_COLUMNS))
    want = np.column_stack([books.column(c).to_numpy() for c in LEVEL_COLUMNS])
    assert np.array_equal(levels, want)


def test_a_corrupted_cache_file_is_found_and_rebuilt_never_used(session, tmp_path, small_blocks):
    first = run_replay(session, CFG, out_dir=tmp_path / "a", market_cache=True)
    (entry,) = _entries(session)
    block = entry / "blocks" / "000001.arrow"
    data = bytearray(block.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern inside the levels
    block.write_bytes(bytes(data))
    again = run_replay(session, CFG, out_dir=tmp_path / "b", market_cache=True)
    assert again.digest == first.digest
    assert again.market_cache == "built"  # found on reading, dropped, the run started over and rebuilt it
    (entry,) = _entries(session)
    assert block.read_bytes() != bytes(data)
    assert run_replay(session, CFG, out_dir=tmp_path / "c", market_cache=True).market_cache == "reused"

    # a file this process has checked and read before, then written: checked again, found, rebuilt
    st = block.stat()
    good = block.read_bytes()
    block.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    os.utime(block, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a later write, whatever the clock
    again = run_replay(session, CFG, out_dir=tmp_path / "d", market_cache=True)
    assert (again.digest, again.market_cache) == (first.digest, "built")

    block.unlink()  # a missing file is corrupt too
    assert run_replay(session, CFG, out_dir=tmp_path / "e", market_cache=True).market_cache == "built"


def test_the_key_names_what_the_cached_bits_depend_on(session):
    laya = SimpleNamespace(
        model_sha256="m" * 64, feature_version="v0", active_provider="CPUExecutionProvider"
    )
    base = key_for(open_session(session).digest(), "BTCUSDT", laya, "batch")
    assert base == key_for(open_session(session).digest(), "BTCUSDT", laya, "batch")
    changed = [
        dataclasses.replace(base, session_digest="0" * 64),  # another session file
        dataclasses.replace(base, model_sha256="n" * 64),  # a retrained model
        dataclasses.replace(base, feature_version="v1"),
        dataclasses.replace(base, feature_code="f" * 64),  # an edited feature kernel
        dataclasses.replace(base, laya_mode="tick"),
        dataclasses.replace(base, provider="CUDAExecutionProvider"),
        dataclasses.replace(base, symbol="ETHUSDT"),
        dataclasses.replace(base, version=base.version + 1),
    ]
    hexes = {k.hex() for k in [base, *changed]}
    assert len(hexes) == len(changed) + 1
    cache = MarketCache("/nowhere")
    assert len({cache.entry(k) for k in [base, *changed]}) == len(changed) + 1


def test_an_entry_of_another_key_under_the_same_name_is_not_used(session, tmp_path, small_blocks):
    run_replay(session, CFG, out_dir=tmp_path / "a", market_cache=True)
    (entry,) = _entries(session)
    m = orjson.loads((entry / "manifest.json").read_bytes())
    m["key"]["model_sha256"] = "0" * 64
    (entry / "manifest.json").write_bytes(orjson.dumps(m))
    assert run_replay(session, CFG, out_dir=tmp_path / "b", market_cache=True).market_cache == "built"


def test_entries_are_evicted_by_size_least_recently_used_first(tmp_path, small_blocks):
    a = simulate_session(tmp_path / "a", minutes=0.3, seed=1)
    cache_dir = tmp_path / "cache"
    big = MarketCache(cache_dir, cap=1 << 30)
    run_replay(a, CFG, out_dir=tmp_path / "r1", market_cache=big)
    run_replay(
        a,
        dataclasses.replace(CFG, symbol="BTCUSDT", laya_mode="tick"),
        out_dir=tmp_path / "r2",
        market_cache=big,
    )
    entries = big.entries()
    assert len(entries) == 2
    one = max(size for _, size, _ in entries)
    # room for one entry: a third run's commit keeps itself and drops the least recently used
    small = MarketCache(cache_dir, cap=one + 1)
    oldest = min(entries)[2]
    newest = max(entries)[2]
    small.evict(keep=newest)
    assert [p for _, _, p in small.entries()] == [newest] and not oldest.exists()
    # an entry that alone would pass the cap is not built; the run goes on without it
    tiny = MarketCache(tmp_path / "tiny", cap=1000)
    r = run_replay(a, CFG, out_dir=tmp_path / "r3", market_cache=tiny)
    assert r.market_cache.startswith("off") and not tiny.entries()


def test_one_builder_per_entry_at_a_time(tmp_path):
    cache = MarketCache(tmp_path / "c", cap=1 << 30)
    laya = SimpleNamespace(model_sha256="m" * 64, feature_version="v0", active_provider="cpu")
    key = key_for("d" * 64, "BTCUSDT", laya, "batch")
    first = cache.builder(key, rows=10, block=64)
    assert first is not None
    assert cache.builder(key, rows=10, block=64) is None  # a second process meanwhile runs without one
    first.abandon()
    again = cache.builder(key, rows=10, block=64)
    assert again is not None
    again.abandon()
