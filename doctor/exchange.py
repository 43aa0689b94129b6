"""Exchange checks: the Bitget REST endpoint answers, its clock agrees with ours, the contract is listed,
and (live mode) the API keys are in the environment.

Clock skew matters because signed requests carry ``ACCESS-TIMESTAMP`` (ms) and Bitget rejects stale
ones ("request timestamp expired", 40004/40008); the window is about 30 s. Skew is the exchange's
``serverTime`` minus the midpoint of our send and receive wall-clock times, give or take half the round
trip. Key values are never read into the report: only whether each variable is set.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

import httpx

from doctor.checks import Check, DoctorConfig, Status
from wire.bitget.bitget_v2 import REST_BASE_URL

SKEW_WARN_MS: Final = 1_000
SKEW_FAIL_MS: Final = 30_000  # Bitget's signed-request window
KEY_VARS: Final = ("BITGET_API_KEY", "BITGET_API_SECRET", "BITGET_API_PASSPHRASE")
TIME_PATH: Final = "/api/v2/public/time"
CONTRACTS_PATH: Final = "/api/v2/mix/market/contracts"
CLOCK_FIX: Final = (
    "synchronise the clock with NTP (`timedatectl set-ntp true`, or `chronyc makestep` under chrony); "
    "signed requests older than ~30 s are rejected"
)


def _describe_error(e: httpx.HTTPError, url: str) -> str:
    host = httpx.URL(url).host
    text = str(e) or type(e).__name__
    if isinstance(e, httpx.ConnectError) and (
        "Name or service not known" in text
        or "getaddrinfo" in text
        or "Temporary failure in name resolution" in text
    ):
        return f"cannot resolve {host} ({text}): no DNS/network here?"
    if isinstance(e, httpx.ConnectError):
        return f"cannot connect to {host}: {text}"
    if isinstance(e, httpx.TimeoutException):
        return f"no answer from {host} in time ({type(e).__name__})"
    return f"{type(e).__name__}: {text}"


def _get_envelope(client: httpx.Client, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
    """GET and unwrap Bitget's envelope; raises ValueError with what was wrong."""
    r = client.get(path, params=params)
    try:
        body = r.json()
    except ValueError:
        raise ValueError(f"HTTP {r.status_code}, body is not JSON: {r.text[:120]!r}") from None
    if not isinstance(body, dict) or "code" not in body:
        raise ValueError(f"HTTP {r.status_code}, not a Bitget envelope: {r.text[:120]!r}")
    if str(body["code"]) != "00000":
        raise ValueError(f"HTTP {r.status_code}, code {body['code']} {body.get('msg', '')!r}")
    return body


def skew_status(skew_ms: float) -> Status:
    a = abs(skew_ms)
    return "ok" if a <= SKEW_WARN_MS else ("warn" if a <= SKEW_FAIL_MS else "fail")


def key_check(live: bool, env: Mapping[str, str]) -> Check:
    """Presence of the API key variables; their values never leave this function."""
    if not live:
        return Check(
            area="exchange",
            name="API keys (live)",
            status="ok",
            evidence="not checked: not live mode (--live checks " + ", ".join(KEY_VARS) + ")",
        )
    state: dict[str, str] = {}
    for name in KEY_VARS:
        value = env.get(name)
        if value is None:
            state[name] = "missing"
        elif not value.strip():
            state[name] = "empty"
        elif value != value.strip():
            state[name] = "set, with leading/trailing whitespace"
        else:
            state[name] = "set"
    evidence = "; ".join(f"{k} {v}" for k, v in state.items()) + " (values not shown)"
    bad = [k for k, v in state.items() if v in ("missing", "empty")]
    padded = [k for k, v in state.items() if "whitespace" in v]
    if bad:
        return Check(
            area="exchange",
            name="API keys (live)",
            status="fail",
            evidence=evidence,
            fix="export "
            + " ".join(f"{k}=..." for k in bad)
            + " in the shell that runs dualhub (never in a file "
            "under version control)",
            data={"state": state},
        )
    if padded:
        return Check(
            area="exchange",
            name="API keys (live)",
            status="warn",
            evidence=evidence,
            fix=f"strip the whitespace from {', '.join(padded)}: it breaks the signature",
            data={"state": state},
        )
    return Check(
        area="exchange", name="API keys (live)", status="ok", evidence=evidence, data={"state": state}
    )


def exchange_checks(cfg: DoctorConfig, *, env: Mapping[str, str]) -> list[Check]:
    url = (cfg.exchange_url or REST_BASE_URL).rstrip("/")
    unreachable: Status = "fail" if cfg.exchange_url else "warn"
    default_note = "" if cfg.exchange_url else " (default; pass --exchange-url for the local exchange)"
    rows: list[Check] = []
    with httpx.Client(base_url=url, timeout=httpx.Timeout(cfg.exchange_timeout_s, connect=3.0)) as client:
        try:
            t0_ns = time.time_ns()
            p0 = time.perf_counter_ns()
            body = _get_envelope(client, TIME_PATH)
            rtt_ms = (time.perf_counter_ns() - p0) / 1e6
            server_ms = int(body["data"]["serverTime"])
        except httpx.HTTPError as e:
            why = _describe_error(e, url)
            rows.append(
                Check(
                    area="exchange",
                    name="REST endpoint",
                    status=unreachable,
                    evidence=f"{url}{TIME_PATH}{default_note}: {why}",
                    fix="check network/DNS/proxy, or point --exchange-url at the local exchange "
                    "(venue.bitget.rest_server)",
                    data={"url": url, "error": why},
                )
            )
        except (ValueError, KeyError, TypeError) as e:
            rows.append(
                Check(
                    area="exchange",
                    name="REST endpoint",
                    status=unreachable,
                    evidence=f"{url}{TIME_PATH}{default_note}: unexpected answer: {e}",
                    fix="is this a Bitget v2 endpoint?",
                    data={"url": url, "error": str(e)},
                )
            )
        else:
            local_mid_ms = t0_ns / 1e6 + rtt_ms / 2
            skew_ms = server_ms - local_mid_ms
            rows.append(
                Check(
                    area="exchange",
                    name="REST endpoint",
                    status="ok",
                    evidence=f"{url}{TIME_PATH} answered code 00000 in {rtt_ms:.1f} ms",
                    data={"url": url, "rtt_ms": rtt_ms},
                )
            )
            status = skew_status(skew_ms)
            side = "ahead of" if skew_ms >= 0 else "behind"
            rows.append(
                Check(
                    area="exchange",
                    name="clock skew",
                    status=status,
                    evidence=f"exchange clock {abs(skew_ms):.0f} ms {side} local (±{rtt_ms / 2:.1f} ms); "
                    f"limits: warn > {SKEW_WARN_MS} ms, fail > {SKEW_FAIL_MS} ms (signed-request window)",
                    fix="" if status == "ok" else CLOCK_FIX,
                    data={"skew_ms": skew_ms, "uncertainty_ms": rtt_ms / 2, "server_time_ms": server_ms},
                )
            )
            rows.append(_contract_check(client, url, cfg.symbol))
    if rows[0].status != "ok":
        rows.append(
            Check(
                area="exchange",
                name="clock skew",
                status="warn",
                evidence="not measured: the endpoint did not answer",
            )
        )
    rows.append(key_check(cfg.live, env))
    return rows


def _contract_check(client: httpx.Client, url: str, symbol: str) -> Check:
    params = {"productType": "usdt-futures", "symbol": symbol}
    try:
        body = _get_envelope(client, CONTRACTS_PATH, params)
        rows = body.get("data") or []
        row = next((r for r in rows if isinstance(r, dict) and r.get("symbol") == symbol), None)
    except httpx.HTTPError as e:
        return Check(
            area="exchange",
            name=f"contract {symbol}",
            status="fail",
            evidence=f"{CONTRACTS_PATH}: {_describe_error(e, url)}",
        )
    except ValueError as e:
        return Check(
            area="exchange",
            name=f"contract {symbol}",
            status="fail",
            evidence=f"{CONTRACTS_PATH}: {e}",
            fix="is this a Bitget v2 USDT-M endpoint?",
        )
    if row is None:
        return Check(
            area="exchange",
            name=f"contract {symbol}",
            status="fail",
            evidence=f"{CONTRACTS_PATH}?productType=usdt-futures&symbol={symbol} returned no row",
            fix="check the symbol (--symbol), e.g. BTCUSDT",
        )
    try:
        tick = float(row["priceEndStep"]) * 10 ** -int(row["pricePlace"])
        facts = (
            f"tick {tick:g}, size step {row['sizeMultiplier']}, min size {row['minTradeNum']}, "
            f"fees maker {row['makerFeeRate']} / taker {row['takerFeeRate']}"
        )
    except (KeyError, ValueError, TypeError) as e:
        return Check(
            area="exchange",
            name=f"contract {symbol}",
            status="fail",
            evidence=f"contract row lacks a field: {e!r}",
            data={"row": row},
        )
    status_field = row.get("symbolStatus")
    return Check(
        area="exchange",
        name=f"contract {symbol}",
        status="ok" if status_field == "normal" else "warn",
        evidence=f"symbolStatus {status_field}, {facts}",
        fix="" if status_field == "normal" else f"{symbol} is not trading normally ({status_field})",
        data={"row": row},
    )
