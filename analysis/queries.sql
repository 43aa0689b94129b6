-- Report queries over a run's event log. Each block starts with a "name:" comment line (id | title).
-- Views: analysis/views.sql (label, kev_queue, kev_request, kev_response, kev_breaker, command,
-- risk, "order", fill, latency, input_quarantine: the run's events; books15: the replayed session's
-- books; and the derived views). A table of one instrument's rows carries `CASE WHEN
-- getvariable('by_symbol') THEN symbol END AS symbol` first: the symbol in a run of several instruments
-- (views.sql by_symbol), NULL in a single-symbol run, whose report leaves that column out.

-- name: labels | Laya labels
SELECT symbol, label, n, round(100.0 * n / sum(n) OVER (PARTITION BY symbol), 2) AS pct
FROM (SELECT CASE WHEN getvariable('by_symbol') THEN symbol END AS symbol, label, count(*) AS n
      FROM label GROUP BY ALL)
ORDER BY symbol, n DESC, label;

-- name: kev | Kev requests, lag and queue
SELECT
    (SELECT count(*) FROM kev_request) AS requests,
    (SELECT count(*) FROM kev_response WHERE ok) AS ok,
    (SELECT count(*) FROM kev_response WHERE NOT ok) AS failed,
    (SELECT count(*) FROM kev_response WHERE failure = 'timeout') AS timeouts,
    (SELECT count(*) FROM kev_queue WHERE kind = 'late_reply') AS late,
    (SELECT count(*) FROM kev_response WHERE failure = 'schema') AS schema_invalid,
    (SELECT count(*) FROM kev_response WHERE failure = 'breaker_open') AS breaker_open,
    (SELECT count(*) FROM kev_response
     WHERE failure IN ('transport', 'http_5xx', 'http_4xx', 'invalid_json', 'malformed', 'truncated'))
        AS server_errors,
    (SELECT count(*) FROM kev_queue WHERE kind = 'dropped_overflow') AS dropped_overflow,
    (SELECT count(*) FROM kev_queue WHERE kind = 'dropped_stale') AS dropped_stale,
    (SELECT round(quantile_cont(lag_ns, 0.05) / 1e6, 1) FROM kev_response) AS lag_p5_ms,
    (SELECT round(quantile_cont(lag_ns, 0.50) / 1e6, 1) FROM kev_response) AS lag_p50_ms,
    (SELECT round(quantile_cont(lag_ns, 0.95) / 1e6, 1) FROM kev_response) AS lag_p95_ms,
    (SELECT round(quantile_cont(queue_wait_ns, 0.95) / 1e6, 1) FROM kev_request) AS queue_wait_p95_ms;

-- name: kev_failures | Kev failures by kind (engine/kev/failures.py)
SELECT failure, count(*) AS n, any_value(error) AS example
FROM kev_response WHERE NOT ok GROUP BY failure ORDER BY n DESC, failure;

-- name: kev_answered_by | Who answered Kev (cassette: a recorded hit; cassette>rules, cassette>llm: a fallback)
SELECT advisor, failure = 'cassette_miss' AS cassette_miss, count(*) AS n, count(*) FILTER (WHERE ok) AS ok
FROM kev_response GROUP BY ALL ORDER BY n DESC, advisor;

-- name: kev_breaker | Kev circuit breaker changes
SELECT state, count(*) AS n, min(ts_recv) AS first_ts_recv, max(ts_recv) AS last_ts_recv
FROM kev_breaker GROUP BY state ORDER BY state;

-- name: commands | Portfolio commands by action
SELECT CASE WHEN getvariable('by_symbol') THEN symbol END AS symbol, action, count(*) AS n,
       round(avg(target_position), 4) AS avg_target
FROM command GROUP BY ALL ORDER BY symbol, n DESC, action;

-- name: risk | Risk decisions by reason
SELECT CASE WHEN getvariable('by_symbol') THEN symbol END AS symbol, intent, reason, accepted, count(*) AS n
FROM risk GROUP BY ALL ORDER BY symbol, accepted, n DESC, reason;

-- name: orders | Orders by lifecycle step
SELECT CASE WHEN getvariable('by_symbol') THEN symbol END AS symbol, kind, order_type, count(*) AS n
FROM "order" GROUP BY ALL ORDER BY symbol, order_type, kind;

-- name: fills | Fills
SELECT CASE WHEN getvariable('by_symbol') THEN symbol END AS symbol, liquidity, side, count(*) AS n,
       round(sum(qty), 6) AS qty,
       CAST(sum(notional) AS DECIMAL(18, 2)) AS notional_usdt, CAST(sum(fee) AS DECIMAL(18, 6)) AS fees_usdt
FROM fill GROUP BY ALL ORDER BY symbol, liquidity, side;

-- name: pnl | PnL (exact decimals, position marked at the last mid)
-- the run's symbol (views.sql symbol_pnl; a portfolio's instruments: the Portfolio section)
SELECT
    CASE WHEN getvariable('by_symbol') THEN symbol END AS symbol,
    round(CAST(position AS DOUBLE), 6) AS position,
    mark_px,
    CAST(trading_cash AS DECIMAL(18, 4)) AS trading_cash_usdt,
    CAST(fees AS DECIMAL(18, 4)) AS fees_usdt,
    CAST(pnl AS DECIMAL(18, 4)) AS pnl_usdt
FROM symbol_pnl
WHERE symbol = coalesce(getvariable('run_symbol'), (SELECT min(symbol) FROM run_symbols)) AND mark_px IS NOT NULL;

-- name: latency | Per-decision latency (ms)
WITH o AS (SELECT client_oid, any_value(symbol) AS symbol FROM "order" GROUP BY client_oid),
spans AS (
    -- the span "order_entry" is send to ack: entry plus response latency, named so here; a span's
    -- instrument: its order's (ref: client_oid), or for Kev's the label's that asked (ref: kev:ID)
    SELECT coalesce(o.symbol, k.symbol) AS symbol,
           CASE name WHEN 'order_entry' THEN 'order_sent_to_ack' ELSE name END AS name, dur_ns
    FROM latency l LEFT JOIN o ON o.client_oid = l.ref
    LEFT JOIN kev_request k ON starts_with(l.ref, 'kev:') AND k.request_id = TRY_CAST(l.ref[5:] AS BIGINT)
    UNION ALL SELECT symbol, 'laya', ts_recv - book_ts_recv FROM label
    UNION ALL SELECT symbol, 'feed_recorded', ts_recv - ts_event FROM books15
)
SELECT CASE WHEN getvariable('by_symbol') THEN symbol END AS symbol, name, count(*) AS n,
       round(quantile_cont(dur_ns, 0.50) / 1e6, 3) AS p50_ms,
       round(quantile_cont(dur_ns, 0.90) / 1e6, 3) AS p90_ms,
       round(quantile_cont(dur_ns, 0.99) / 1e6, 3) AS p99_ms,
       round(max(dur_ns) / 1e6, 3) AS max_ms
FROM spans GROUP BY ALL ORDER BY symbol, name;
