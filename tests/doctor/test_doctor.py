"""`dualhub doctor`: every check on this machine, against the local Bitget REST server and a real
llama-server. Nothing is mocked where the machine can answer: the CUDA row is compared with what the
dynamic loader itself says, the clock-skew rows with a server whose clock is really offset.
"""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import json
import os
import re
import resource
import socket

import httpx
import pytest

from doctor import checks as ch
from doctor import exchange, gpu, kev, laya, machine, onnx
from doctor.checks import Check, DoctorConfig
from dualhub.cli import main
from engine.contract import ContractConfig
from venue.bitget.rest_server import BitgetRestServer, contract_row

SONAME = re.compile(r"^lib[\w+-]+(\.[\w+-]+)*\.so(\.\d+)*$")
FAKE_SECRETS = {
    "BITGET_API_KEY": "bg_fakekey_7f3a9c1e55d24b0e",
    "BITGET_API_SECRET": "fakesecret_2b8e6d0a4c9f1e37a5d8",
    "BITGET_API_PASSPHRASE": "fake-pass-phrase-91x",
}


def closed_port_url() -> str:
    """A loopback URL nobody listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def by_name(rows: list[Check]) -> dict[str, Check]:
    return {r.name: r for r in rows}


@pytest.fixture(scope="module")
def gpu_info():
    return gpu.probe_gpu()


@pytest.fixture(scope="module")
def runtime_rows(gpu_info):
    return by_name(onnx.runtime_checks(gpu_info))


@pytest.fixture(scope="module")
def laya_rows(gpu_info):
    return by_name(laya.laya_checks(DoctorConfig(), gpu_info))


@pytest.fixture(scope="module")
def rest():
    with BitgetRestServer() as srv:
        yield srv


# ---------------------------------------------------------------------------------------------------
# ONNX Runtime and GPU


def test_package_row_names_the_one_installed_distribution(runtime_rows):
    row = runtime_rows["package"]
    found = onnx.ort_distributions()
    assert found, "some distribution provides the onnxruntime module in this venv"
    for name, version in found:
        assert f"{name} {version}" in row.evidence
        assert md.version(name) == version
    assert row.status == ("ok" if [n for n, _ in found] == ["onnxruntime-gpu"] else row.status)
    assert row.data["packages"] == dict(found)


def test_package_classification_both_cpu_only_and_none():
    both = onnx.classify_packages([("onnxruntime", "1.31.1"), ("onnxruntime-gpu", "1.31.1")])
    assert both.status == "fail"
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in both.fix
    cpu = onnx.classify_packages([("onnxruntime", "1.31.1")])
    assert cpu.status == "warn" and "CPU" in cpu.evidence and "onnxruntime-gpu[cuda,cudnn]" in cpu.fix
    assert onnx.classify_packages([]).status == "fail"
    assert onnx.classify_packages([("onnxruntime-gpu", "1.31.1")]).status == "ok"


def test_cuda_requirement_row_comes_from_the_wheel_and_the_table(runtime_rows):
    from onnxruntime.capi import build_and_package_info as info

    row = runtime_rows["CUDA/cuDNN needed"]
    cuda_major = int(info.cuda_version.split(".")[0])
    assert row.data["cuda_major"] == cuda_major
    assert f"CUDA {cuda_major}.x" in row.evidence
    assert f"cuda_version={info.cuda_version}" in row.evidence
    if info.__version__.startswith("1.31."):
        assert (row.data["cuda_major"], row.data["cudnn_major"]) == (13, 9)
        assert "nvidia-cudnn-cu13~=9.0" in row.evidence
    assert "onnxruntime.ai" in row.data["table_source"]


def test_cuda_row_reports_the_missing_library_the_loader_names(runtime_rows):
    row = runtime_rows["CUDA provider library"]
    path = onnx.provider_library_path()
    try:
        ctypes.CDLL(str(path))  # after preload_dlls(), as the row was measured
    except OSError as e:
        loader_says = str(e).split(":", 1)[0]
    else:
        assert row.status == "ok" and row.data["loaded"]
        return
    assert SONAME.match(loader_says), loader_says
    assert row.data["missing_library"] == loader_says
    assert row.status in ("warn", "fail")
    assert f"missing {loader_says}" in row.evidence
    assert 'pip install "onnxruntime-gpu[cuda,cudnn]==' in row.fix or "driver" in row.fix
    assert all(SONAME.match(lib) for lib in row.data["ldd_not_found"])


def test_wheels_row_lists_what_the_cuda_cudnn_extras_want(runtime_rows):
    row = runtime_rows["nvidia library wheels"]
    wanted = onnx.extras_requirements("onnxruntime-gpu")
    assert row.data["wanted"] == wanted
    if wanted and not onnx.nvidia_distributions():
        assert row.status in ("warn", "fail")
        assert all(w in row.evidence for w in wanted)


def test_preload_row_captures_its_output_and_prints_nothing(gpu_info, capfd):
    row = onnx.preload_check(gpu_info)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    failed = re.findall(r"Failed to load (\S+?):", row.data.get("output", ""))
    assert row.data.get("failed", []) == failed
    assert (row.status == "ok") == (not failed and not row.data.get("exception"))
    for lib in failed:
        assert lib in row.evidence


def test_gpu_row_reports_nvml_or_why_not(gpu_info):
    row = gpu.check_gpu(gpu_info)
    if gpu_info.available:
        assert row.status == "ok"
        assert all(d.name in row.evidence for d in gpu_info.devices)
        assert "MiB free" in row.evidence and gpu_info.driver_version in row.evidence
    else:
        assert row.status == "warn"
        assert "NVML" in row.evidence or "nvidia-ml-py" in row.evidence
        assert row.fix


def test_gpu_machine_with_an_older_driver_is_told_the_release_that_matches():
    # The decision logic for a GPU machine (none here): the driver's CUDA major vs the wheel's.
    from onnxruntime.capi import build_and_package_info as info

    wheel_major = int(info.cuda_version.split(".")[0])
    old = gpu.GpuInfo(
        devices=(
            gpu.GpuDevice(index=0, name="NVIDIA H200", memory_free_bytes=1 << 30, memory_total_bytes=2 << 30),
        ),
        driver_version="550.54",
        cuda_driver_version=(wheel_major - 1, 4),
    )
    row = onnx.requirement_check(old)
    assert row.status == "fail"
    line = onnx.RELEASE_FOR_CUDA_MAJOR.get(wheel_major - 1)
    assert (line or "upgrade the NVIDIA driver") in row.fix
    load = onnx.ProviderLoad(path="x", exists=True, loaded=False, missing_library="libcublasLt.so.13")
    assert onnx.cuda_fix(load, old, info.__version__, wheel_major).startswith(
        f"the driver supports CUDA {wheel_major - 1}"
    )
    current = gpu.GpuInfo(devices=old.devices, driver_version="580.1", cuda_driver_version=(wheel_major, 0))
    assert onnx.requirement_check(current).status == "ok"
    fix = onnx.cuda_fix(load, current, "1.31.1", 13)
    assert fix.startswith('pip install "onnxruntime-gpu[cuda,cudnn]==1.31.1"') and "nvidia-cublas" in fix
    cu12 = onnx.ProviderLoad(path="x", exists=True, loaded=False, missing_library="libcudnn.so.9")
    assert "nvidia-cudnn-cu12" in onnx.cuda_fix(cu12, current, "1.24.4", 12)


# ---------------------------------------------------------------------------------------------------
# Laya


def test_laya_provider_row_is_what_the_session_reports(laya_rows, runtime_rows):
    from engine.laya.model import DEFAULT_MODEL, Laya, LayaConfig

    row = laya_rows["session provider"]
    laya = Laya(LayaConfig(model_path=DEFAULT_MODEL, provider="auto"))
    assert row.data["active_providers"] == laya.active_providers
    assert row.data["gpu_mem_limit_bytes"] == 2 << 30
    assert f"gpu_mem_limit={2 << 30}" in row.evidence
    if laya.active_provider == "CUDAExecutionProvider":
        assert row.status == "ok"
    else:
        assert row.status in ("warn", "fail") and row.fix
        missing = runtime_rows["CUDA provider library"].data.get("missing_library")
        if missing:  # onnxruntime's own log names the same library as the loader
            assert missing in row.evidence


def test_laya_warmup_numbers_are_present(laya_rows):
    row = laya_rows["warm-up"]
    d = row.data
    assert d["warmup_first_ms"] > 0 and d["warmup_steady_ms"] > 0
    assert d["after_warmup_ticks"] == 200
    assert 0 < d["after_warmup_p50_ms"] <= d["after_warmup_p99_ms"] <= d["after_warmup_max_ms"]
    assert f"first run {d['warmup_first_ms']:.3f} ms" in row.evidence
    assert row.status == ("ok" if d["after_warmup_p99_ms"] < d["warmup_first_ms"] else "warn")


def test_laya_missing_model_is_a_failed_row(tmp_path, gpu_info):
    rows = by_name(laya.laya_checks(DoctorConfig(model_path=tmp_path / "nope.onnx"), gpu_info))
    assert rows["session provider"].status == "fail"
    assert "not found" in rows["session provider"].evidence
    assert "make_default_model" in rows["session provider"].fix
    assert rows["warm-up"].status == "fail"


# ---------------------------------------------------------------------------------------------------
# The local Bitget REST server and the exchange rows


def test_rest_server_speaks_the_envelope(rest):
    with httpx.Client(base_url=rest.url) as c:
        r = c.get("/api/v2/public/time")
        body = r.json()
        assert r.status_code == 200
        assert (body["code"], body["msg"]) == ("00000", "success")
        assert isinstance(body["requestTime"], int)
        assert isinstance(body["data"]["serverTime"], str) and body["data"]["serverTime"].isdigit()

        r = c.get("/api/v2/mix/market/contracts", params={"productType": "usdt-futures"})
        rows = r.json()["data"]
        assert rows == [contract_row(ContractConfig())]
        row = rows[0]
        assert float(row["priceEndStep"]) * 10 ** -int(row["pricePlace"]) == pytest.approx(0.1)
        assert row["sizeMultiplier"] == "0.001" and row["symbolStatus"] == "normal"
        for key in (
            "symbol",
            "baseCoin",
            "quoteCoin",
            "makerFeeRate",
            "takerFeeRate",
            "minTradeNum",
            "volumePlace",
            "supportMarginCoins",
            "symbolType",
            "minTradeUSDT",
            "maxLever",
        ):
            assert key in row
        one = c.get(
            "/api/v2/mix/market/contracts", params={"productType": "USDT-FUTURES", "symbol": "BTCUSDT"}
        )
        assert [r["symbol"] for r in one.json()["data"]] == ["BTCUSDT"]
        none = c.get("/api/v2/mix/market/contracts", params={"productType": "usdt-futures", "symbol": "NOPE"})
        assert none.json()["data"] == []

        r = c.get("/api/v2/mix/market/contracts")
        assert r.status_code == 400 and r.json()["code"] == "40019" and r.json()["data"] is None
        r = c.get("/api/v2/mix/market/contracts", params={"productType": "coin-futures"})
        assert r.status_code == 400 and r.json()["code"] == "40017"
        r = c.get("/api/v2/nope")
        assert r.status_code == 404 and r.json()["code"] == "40404" and r.json()["data"] is None
    assert ("GET", "/api/v2/nope", {}) in rest.requests


def test_local_exchange_with_zero_skew_is_ok(rest):
    rest.clock_offset_ms = 0
    rows = by_name(exchange.exchange_checks(DoctorConfig(exchange_url=rest.url), env={}))
    assert rows["REST endpoint"].status == "ok"
    assert rows["clock skew"].status == "ok"
    assert abs(rows["clock skew"].data["skew_ms"]) < 1_000
    assert rows["contract BTCUSDT"].status == "ok" and "tick 0.1" in rows["contract BTCUSDT"].evidence
    assert rows["API keys (live)"].status == "ok"


@pytest.mark.parametrize(
    ("offset_ms", "status"), [(5_000, "warn"), (-5_000, "warn"), (60_000, "fail"), (-60_000, "fail")]
)
def test_skewed_exchange_clock_warns_then_fails(rest, offset_ms, status):
    rest.clock_offset_ms = offset_ms
    try:
        rows = by_name(exchange.exchange_checks(DoctorConfig(exchange_url=rest.url), env={}))
    finally:
        rest.clock_offset_ms = 0
    row = rows["clock skew"]
    assert row.status == status
    assert row.data["skew_ms"] == pytest.approx(offset_ms, abs=500)
    assert ("ahead of" if offset_ms > 0 else "behind") in row.evidence
    assert "NTP" in row.fix


def test_unreachable_configured_exchange_fails_without_traceback():
    url = closed_port_url()
    rows = exchange.exchange_checks(DoctorConfig(exchange_url=url), env={})
    first = rows[0]
    assert (first.name, first.status) == ("REST endpoint", "fail")
    assert "cannot connect" in first.evidence and url in first.evidence
    assert by_name(rows)["clock skew"].evidence.startswith("not measured")
    assert not any("Traceback" in r.evidence for r in rows)


def test_default_bitget_url_offline_is_a_warning_with_the_reason():
    rows = exchange.exchange_checks(DoctorConfig(), env={})
    first = rows[0]
    if first.status == "ok":  # a machine with internet reached the real Bitget
        return
    assert first.status == "warn"
    assert "api.bitget.com" in first.evidence and ("resolve" in first.evidence or "connect" in first.evidence)


def test_live_keys_present_missing_and_never_shown():
    row = exchange.key_check(True, FAKE_SECRETS)
    assert row.status == "ok"
    text = json.dumps(row.to_json()) + row.evidence + row.fix
    assert not any(v in text for v in FAKE_SECRETS.values())
    missing = exchange.key_check(True, {"BITGET_API_KEY": FAKE_SECRETS["BITGET_API_KEY"]})
    assert missing.status == "fail"
    assert "BITGET_API_SECRET missing" in missing.evidence and "BITGET_API_SECRET=..." in missing.fix
    padded = exchange.key_check(
        True, {**FAKE_SECRETS, "BITGET_API_SECRET": FAKE_SECRETS["BITGET_API_SECRET"] + "\n"}
    )
    assert padded.status == "warn" and FAKE_SECRETS["BITGET_API_SECRET"] not in padded.evidence
    assert exchange.key_check(False, {}).status == "ok"


# ---------------------------------------------------------------------------------------------------
# Kev against a real llama-server


def test_kev_rows_ok_against_the_real_server(llama_server):
    rows = by_name(kev.kev_checks(DoctorConfig(kev_url=llama_server.url, kev_engine_timeout_ms=60_000)))
    assert [r.status for r in rows.values()] == ["ok"] * 5, [r.evidence for r in rows.values()]
    props = rows["llama-server /props"].data
    assert props["total_slots"] == 1 and props["n_ctx"] == 2048
    assert props["model_path"].endswith(".gguf")
    req = rows["schema-constrained request"]
    assert req.data["latency_ms"] > 0 and "valid command" in req.evidence
    assert "total_slots=1" in rows["deterministic output"].evidence
    assert "cache_prompt:false" in rows["deterministic output"].evidence


def test_kev_server_with_two_slots_is_flagged_non_deterministic(tmp_path):
    from engine.kev.server import LlamaServer, ServerConfig

    cfg = ServerConfig(parallel_slots=2, cache_ram_mib=64)
    with LlamaServer(config=cfg, log_path=tmp_path / "np2.log") as srv:
        rows = by_name(kev.kev_checks(DoctorConfig(kev_url=srv.url)))
    row = rows["deterministic output"]
    assert row.status == "warn"
    assert "total_slots=2" in row.evidence and "-np 1" in row.fix
    assert rows["schema-constrained request"].status == "ok"


def test_determinism_logic_on_recorded_payloads():
    props = {"total_slots": 1, "default_generation_settings": {"n_ctx": 2048}}
    body = {"cache_prompt": False, "temperature": 0.0, "seed": 42}
    assert kev.assess_determinism(props, body, {"cache_n": 0.0})[0] == "ok"
    status, _, problems = kev.assess_determinism({**props, "total_slots": 4}, body, {})
    assert status == "warn" and "total_slots=4" in problems[0]
    status, _, problems = kev.assess_determinism(props, {**body, "cache_prompt": True}, {"cache_n": 57.0})
    assert status == "warn" and len(problems) == 2
    assert kev.assess_determinism(props, {**body, "temperature": 0.8}, {})[0] == "warn"


def test_kev_unreachable_configured_fails_default_warns(monkeypatch):
    url = closed_port_url()
    [row] = kev.kev_checks(DoctorConfig(kev_url=url))
    assert row.status == "fail" and "cannot be reached" in row.evidence and "-np 1" in row.fix
    monkeypatch.setattr(kev, "DEFAULT_KEV_URL", url)
    [row] = kev.kev_checks(DoctorConfig())
    assert row.status == "warn" and "default URL" in row.evidence


# ---------------------------------------------------------------------------------------------------
# Machine


def test_disk_headroom_against_the_recording_rate(tmp_path):
    free_mb = __import__("shutil").disk_usage(tmp_path).free / 1e6
    assert machine.disk_check(tmp_path, 1.0).status == "ok"
    assert machine.disk_check(tmp_path, free_mb / 10).status == "warn"  # ~10 h
    row = machine.disk_check(tmp_path / "not" / "yet", free_mb * 2)  # ~0.5 h
    assert row.status == "fail" and "nearest existing parent" in row.evidence
    assert row.data["headroom_h"] == pytest.approx(0.5, rel=0.05)


def test_clock_source_is_read_from_sysfs(tmp_path):
    row = machine.clocksource_check()
    path = machine.CLOCKSOURCE / "current_clocksource"
    if path.exists():
        assert row.data["current"] == path.read_text().strip()
        assert row.data["current"] in row.evidence
    assert row.data["time_ns_cost_ns"] > 0
    (tmp_path / "current_clocksource").write_text("hpet\n")
    (tmp_path / "available_clocksource").write_text("tsc hpet acpi_pm\n")
    slow = machine.clocksource_check(tmp_path)
    assert slow.status == "warn" and slow.fix.startswith("echo tsc")


def test_open_file_limit_is_getrlimit():
    row = machine.nofile_check()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert (row.data["soft"], row.data["hard"]) == (soft, hard)
    assert row.status == ("ok" if soft >= machine.NOFILE_WARN else "warn")


def test_cpus_vs_threads():
    cpus = len(os.sched_getaffinity(0))
    assert machine.cpu_check(cpus + 1).status == "fail"
    assert machine.cpu_check(cpus).status == "warn"
    if cpus > 1:
        assert machine.cpu_check(1).status == "ok"
    assert machine.cpu_check(None).data["threads"] == ch.default_threads()


def test_the_arrow_pool_row_says_which_allocator_arrow_really_uses():
    import pyarrow as pa

    row = machine.arrow_pool_check()
    assert row.data["backend"] == pa.default_memory_pool().backend_name in row.evidence
    assert row.status == "ok"  # this venv's pyarrow has jemalloc, and the project named it
    assert machine.arrow_pool_check("jemalloc", "jemalloc", True).status == "ok"
    assert machine.arrow_pool_check("system", "system", False).status == "ok"  # the user's choice stands
    late = machine.arrow_pool_check("mimalloc", "jemalloc", True)  # named, yet not what Arrow uses
    assert late.status == "warn" and "mimalloc" in late.evidence and late.fix
    assert machine.arrow_pool_check("mimalloc", None, False).status == "warn"


def test_an_area_that_raises_becomes_a_failed_row():
    def boom():
        raise RuntimeError("kaput")

    [row] = ch._guarded("machine", boom)
    assert row.status == "fail" and "RuntimeError: kaput" in row.evidence


# ---------------------------------------------------------------------------------------------------
# The CLI


def test_cli_json_report_parses_and_exit_code_follows_failures(llama_server, rest, tmp_path, capsys):
    rest.clock_offset_ms = 0
    code = main(
        [
            "doctor",
            "--json",
            "--kev-url",
            llama_server.url,
            "--exchange-url",
            rest.url,
            "--session-dir",
            str(tmp_path),
            "--threads",
            "1",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    statuses = [c["status"] for c in report["checks"]]
    assert code == report["exit_code"] == (1 if "fail" in statuses else 0)
    assert report["summary"] == {s: statuses.count(s) for s in ("ok", "warn", "fail")}
    names = {(c["area"], c["name"]) for c in report["checks"]}
    for expected in [
        ("onnxruntime", "package"),
        ("onnxruntime", "CUDA provider library"),
        ("gpu", "GPU (NVML)"),
        ("laya", "warm-up"),
        ("kev", "schema-constrained request"),
        ("exchange", "clock skew"),
        ("machine", "disk headroom"),
    ]:
        assert expected in names
    by = {(c["area"], c["name"]): c for c in report["checks"]}
    assert by[("kev", "deterministic output")]["status"] == "ok"
    assert by[("exchange", "clock skew")]["status"] == "ok"
    for c in report["checks"]:
        assert set(c) == {"area", "name", "status", "evidence", "fix", "data"}


def test_cli_fails_on_unreachable_endpoints_and_never_prints_secrets(monkeypatch, tmp_path, capsys):
    for k, v in FAKE_SECRETS.items():
        monkeypatch.setenv(k, v)
    args = [
        "doctor",
        "--live",
        "--kev-url",
        closed_port_url(),
        "--exchange-url",
        closed_port_url(),
        "--session-dir",
        str(tmp_path),
    ]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 1
    assert "BITGET_API_KEY set" in out and "Traceback" not in out + err
    code_json = main([*args, "--json"])
    out_json, err_json = capsys.readouterr()
    assert code_json == 1
    report = json.loads(out_json)
    keys = next(c for c in report["checks"] if c["name"] == "API keys (live)")
    assert keys["status"] == "ok" and keys["data"]["state"]["BITGET_API_SECRET"] == "set"
    for text in (out, err, out_json, err_json):
        for secret in FAKE_SECRETS.values():
            assert secret not in text
    monkeypatch.delenv("BITGET_API_PASSPHRASE")
    assert main([*args, "--json"]) == 1
    keys = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "API keys (live)")
    assert keys["status"] == "fail" and "BITGET_API_PASSPHRASE missing" in keys["evidence"]


def test_cli_rejects_bad_arguments(capsys):
    assert main(["doctor", "--record-rate-mb-per-h", "0"]) == 2
    assert "record_rate_mb_per_h" in capsys.readouterr().err
