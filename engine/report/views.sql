-- DuckDB views over one replay run: every event stream, the session's books, and derived views.
-- Plain SQL: set the run directory, then run this file (docs/ANALYSIS.md explains every view).
--     SET VARIABLE run = 'data/sessions/demo/runs/run-...';
-- `dualhub sql RUN [QUERY]` does exactly that (after checking the run's files against its manifest).
-- Times are integer ns; a *_ns duration is end - start on the replay's virtual clock.

-- The run's event streams (engine/eventlog.py OUTPUT_STREAMS, and the rows replay kept out).
CREATE VIEW label AS SELECT * FROM read_parquet(getvariable('run') || '/events/label.parquet');
CREATE VIEW kev_queue AS SELECT * FROM read_parquet(getvariable('run') || '/events/kev_queue.parquet');
CREATE VIEW kev_request AS SELECT * FROM read_parquet(getvariable('run') || '/events/kev_request.parquet');
CREATE VIEW kev_response AS SELECT * FROM read_parquet(getvariable('run') || '/events/kev_response.parquet');
CREATE VIEW kev_breaker AS SELECT * FROM read_parquet(getvariable('run') || '/events/kev_breaker.parquet');
CREATE VIEW command AS SELECT * FROM read_parquet(getvariable('run') || '/events/command.parquet');
CREATE VIEW risk AS SELECT * FROM read_parquet(getvariable('run') || '/events/risk.parquet');
CREATE VIEW "order" AS SELECT * FROM read_parquet(getvariable('run') || '/events/order.parquet');
CREATE VIEW fill AS SELECT * FROM read_parquet(getvariable('run') || '/events/fill.parquet');
CREATE VIEW latency AS SELECT * FROM read_parquet(getvariable('run') || '/events/latency.parquet');
CREATE VIEW input_quarantine AS
SELECT * FROM read_parquet(getvariable('run') || '/events/input_quarantine.parquet');

-- The replayed session's books: the books15 files the run's manifest names, under its session path.
SET VARIABLE books15_files = (
    SELECT list_sort(list_transform(
        list_filter(json_keys(content, '$.session.files'), lambda k: starts_with(k, 'books15/')),
        lambda k: json_extract_string(content, '$.session.path') || '/' || k))
    FROM read_text(getvariable('run') || '/manifest.json')
);
CREATE VIEW books15 AS SELECT * FROM read_parquet(getvariable('books15_files'));

-- One row per new order (a decision): what caused it and how long each step on its path took.
-- driver: 'label' (a Laya label: book feed -> Laya -> decide -> order entry -> fill), 'kev' (a Kev
-- reply: the label offered to Kev -> queue wait -> Kev lag -> decide -> order entry -> fill) or
-- 'requote' (a replacement quote sent when a cancel is acknowledged: decide -> order entry -> fill).
-- A stage that is not on the decision's path is NULL. fill_ns is ack (or send, before an ack) ->
-- first fill, 0 for an order filled before its ack arrived, and NULL for an order never filled: an
-- unfilled order has no fill stage, it is not a 0 ms one.
CREATE VIEW decisions AS
WITH news AS (
    SELECT o.client_oid, o.order_type, o.side, o.ts_recv AS new_ns, t.start_ns AS origin_ns
    FROM "order" o JOIN latency t ON t.name = 'tick_to_order' AND t.ref = o.client_oid
    WHERE o.kind = 'new'
),
lab AS (SELECT book_ts_recv, min(seq) AS seq FROM label GROUP BY book_ts_recv),
kreq AS (SELECT ts_event, min(request_id) AS request_id FROM kev_request GROUP BY ts_event),
acks AS (SELECT client_oid, min(ts_recv) AS ack_ns FROM "order" WHERE kind = 'ack' GROUP BY client_oid),
fills AS (SELECT client_oid, min(ts_recv) AS fill_ns FROM fill GROUP BY client_oid)
SELECT
    n.client_oid, n.order_type, n.side, n.new_ns, n.origin_ns,
    CASE WHEN lab.seq IS NOT NULL THEN 'label' WHEN kreq.request_id IS NOT NULL THEN 'kev'
         ELSE 'requote' END AS driver,
    coalesce(l1.label, l2.label) AS label,
    kreq.request_id,
    f.fill_ns IS NOT NULL AS filled,
    coalesce(l1.book_ts_recv - l1.ts_event, l2.book_ts_recv - l2.ts_event) AS feed_ns,
    coalesce(l1.ts_recv - l1.book_ts_recv, l2.ts_recv - l2.book_ts_recv) AS laya_ns,
    r.queue_wait_ns AS kev_queue_ns,
    kr.lag_ns AS kev_ns,
    n.new_ns - coalesce(l1.ts_recv, kr.ts_recv, n.origin_ns) AS decide_ns,
    a.ack_ns - n.new_ns AS order_entry_ns,
    -- not greatest(x, 0): DuckDB's greatest skips NULLs, which turned every unfilled order into 0 ms
    CASE WHEN f.fill_ns < coalesce(a.ack_ns, n.new_ns) THEN 0
         ELSE f.fill_ns - coalesce(a.ack_ns, n.new_ns) END AS fill_ns
FROM news n
LEFT JOIN lab ON lab.book_ts_recv = n.origin_ns
LEFT JOIN label l1 ON l1.seq = lab.seq
LEFT JOIN kreq ON kreq.ts_event = n.origin_ns AND lab.seq IS NULL
LEFT JOIN kev_request r ON r.request_id = kreq.request_id
LEFT JOIN label l2 ON l2.seq = r.label_seq
LEFT JOIN kev_response kr ON kr.request_id = kreq.request_id
LEFT JOIN acks a ON a.client_oid = n.client_oid
LEFT JOIN fills f ON f.client_oid = n.client_oid;

-- How many decisions each driver made, and how many of them were (never) filled; driver 'all' sums them.
CREATE VIEW decision_counts AS
SELECT coalesce(driver, 'all') AS driver, count(*) AS decisions,
       count(*) FILTER (WHERE filled) AS filled, count(*) FILTER (WHERE NOT filled) AS unfilled
FROM decisions GROUP BY GROUPING SETS ((driver), ()) ORDER BY driver = 'all', driver;

-- decisions in long form: one row per (decision, stage on its path), stages in path order.
CREATE VIEW latency_stages AS
SELECT client_oid, driver, replace(stage, '_ns', '') AS stage,
       list_position(['feed_ns', 'laya_ns', 'kev_queue_ns', 'kev_ns', 'decide_ns', 'order_entry_ns', 'fill_ns'],
                     stage) AS stage_no,
       dur_ns
FROM (
    UNPIVOT (SELECT client_oid, driver, feed_ns, laya_ns, kev_queue_ns, kev_ns, decide_ns, order_entry_ns, fill_ns
             FROM decisions)
    ON feed_ns, laya_ns, kev_queue_ns, kev_ns, decide_ns, order_entry_ns, fill_ns
    INTO NAME stage VALUE dur_ns
);  -- UNPIVOT leaves NULLs out: a stage off the path, and the fill of an unfilled order, are not rows

-- Per driver (and 'all') and stage: n decisions where the stage was measured (fill: filled orders
-- only; decision_counts has the unfilled ones) and its distribution in ms.
CREATE VIEW latency_stage_stats AS
SELECT coalesce(driver, 'all') AS driver, stage, count(*) AS n,
       round(quantile_cont(dur_ns, 0.50) / 1e6, 3) AS p50_ms,
       round(quantile_cont(dur_ns, 0.90) / 1e6, 3) AS p90_ms,
       round(quantile_cont(dur_ns, 0.99) / 1e6, 3) AS p99_ms,
       round(max(dur_ns) / 1e6, 3) AS max_ms
FROM latency_stages
GROUP BY GROUPING SETS ((driver, stage, stage_no), (stage, stage_no))
ORDER BY driver IS NULL, driver, stage_no;

-- Every fill with the position and cash after it (cash: sells - buys - fees, exact decimals; position
-- rounded to 1e-9, a float sum), the mid at the fill (the last book at or before it), the PnL marked
-- at that mid, and the fill's edge against that mid in USDT (+ = bought below / sold above the mid;
-- before fees).
CREATE VIEW fills_pnl AS
WITH f AS (
    SELECT *,
        round(sum(CASE WHEN side = 'buy' THEN qty ELSE -qty END) OVER w, 9) AS position,
        sum(CASE WHEN side = 'sell' THEN notional ELSE -notional END - fee) OVER w AS cash
    FROM fill WINDOW w AS (PARTITION BY symbol ORDER BY ts_recv, seq ROWS UNBOUNDED PRECEDING)
),
b AS (SELECT symbol, ts_recv, (bid_px_0 + ask_px_0) / 2 AS mid FROM books15)
SELECT f.ts_recv, f.seq, f.client_oid, f.symbol, f.side, f.px, f.qty, f.liquidity, f.notional, f.fee,
       f.position, f.cash, b.mid,
       CAST(f.cash AS DOUBLE) + f.position * b.mid AS pnl,
       (CASE WHEN f.side = 'buy' THEN b.mid - f.px ELSE f.px - b.mid END) * f.qty AS edge
FROM f ASOF LEFT JOIN b ON f.symbol = b.symbol AND f.ts_recv >= b.ts_recv;

-- ---------------------------------------------------------------------------------------------------
-- Tear sheet views (engine/report/tearsheet.py reads them; docs/ANALYSIS.md "Tear sheet" defines each
-- number). Two knobs, read when a query runs (SET VARIABLE them any time; unset means the default):
--   sample_ns   equity sampling for Sharpe / Sortino (default 1000000000: 1 s)
--   markout_ms  markout horizons in ms (default [0, 100, 1000, 5000, 30000])
-- Everything below is for the run's symbol (config.symbol in its manifest).
SET VARIABLE run_symbol = (
    SELECT json_extract_string(content, '$.config.symbol') FROM read_text(getvariable('run') || '/manifest.json')
);

-- The run's span: its symbol's first and last book (ts_recv).
CREATE VIEW run_span AS
SELECT getvariable('run_symbol') AS symbol, min(ts_recv) AS start_ns, max(ts_recv) AS end_ns,
       max(ts_recv) - min(ts_recv) AS span_ns
FROM books15 WHERE symbol = getvariable('run_symbol');

-- Mark-to-mid equity at every book with a finite mid: position and cash (sells - buys - fees) after
-- every fill at or before the book, PnL = cash + position * mid (float), its running peak and the
-- drawdown from that peak (<= 0). PnL starts at 0 at the first book.
CREATE VIEW equity AS
WITH f AS (
    SELECT ts_recv, position, CAST(cash AS DOUBLE) AS cash FROM (
        SELECT ts_recv, position, cash, row_number() OVER (PARTITION BY ts_recv ORDER BY seq DESC) AS k
        FROM fills_pnl WHERE symbol = getvariable('run_symbol'))
    WHERE k = 1  -- several fills at one instant: the book after them sees all of them
),
b AS (
    SELECT ts_recv, seq, (bid_px_0 + ask_px_0) / 2 AS mid FROM books15
    WHERE symbol = getvariable('run_symbol') AND isfinite(bid_px_0 + ask_px_0)
),
e AS (
    SELECT b.ts_recv, b.seq, b.mid, coalesce(f.position, 0) AS position, coalesce(f.cash, 0) AS cash,
           coalesce(f.cash, 0) + coalesce(f.position, 0) * b.mid AS pnl
    FROM b ASOF LEFT JOIN f ON b.ts_recv >= f.ts_recv
)
SELECT *, max(pnl) OVER w AS peak, pnl - max(pnl) OVER w AS drawdown
FROM e WINDOW w AS (ORDER BY ts_recv, seq ROWS UNBOUNDED PRECEDING);

-- Equity sampled every sample_ns from the run's first book (the last book at or before each instant)
-- and its change over the sample (ret, USDT; NULL for the first sample): Sharpe and Sortino's input.
CREATE VIEW equity_sampled AS
WITH g AS (
    SELECT unnest(generate_series(start_ns, end_ns, CAST(coalesce(getvariable('sample_ns'), 1000000000) AS BIGINT)))
           AS t_ns
    FROM run_span WHERE start_ns IS NOT NULL
),
s AS (SELECT g.t_ns, e.pnl, e.position, e.mid FROM g ASOF LEFT JOIN equity e ON g.t_ns >= e.ts_recv)
SELECT t_ns, pnl, position, mid, pnl - lag(pnl) OVER (ORDER BY t_ns) AS ret FROM s;

-- One row: PnL, max drawdown (USDT, <= 0, at book resolution), and Sharpe / Sortino of the sampled
-- equity changes: per sample (mean / stdev; mean / root-mean-square of the negative changes, target
-- 0) and annualised (x sqrt(samples in 365 days): crypto trades around the clock). NULL when undefined
-- (fewer than 2 samples, or no variation / no losing sample).
CREATE VIEW performance AS
WITH r AS (SELECT ret FROM equity_sampled WHERE ret IS NOT NULL),
k AS (SELECT CAST(coalesce(getvariable('sample_ns'), 1000000000) AS BIGINT) AS sample_ns),
s AS (
    SELECT count(*) AS n, avg(ret) AS mean, stddev_samp(ret) AS sd, sqrt(avg(CASE WHEN ret < 0 THEN ret * ret ELSE 0 END)) AS dd
    FROM r
)
SELECT
    k.sample_ns,
    s.n AS samples,
    (SELECT pnl FROM equity ORDER BY ts_recv DESC, seq DESC LIMIT 1) AS pnl,
    (SELECT min(drawdown) FROM equity) AS max_drawdown,
    s.mean / nullif(s.sd, 0) AS sharpe_per_sample,
    s.mean / nullif(s.dd, 0) AS sortino_per_sample,
    s.mean / nullif(s.sd, 0) * sqrt(365 * 86400e9 / k.sample_ns) AS sharpe_annualised,
    s.mean / nullif(s.dd, 0) * sqrt(365 * 86400e9 / k.sample_ns) AS sortino_annualised
FROM s, k;

-- PnL split at the run's last book (USDT, float): spread capture (the fills' edge against the mid
-- when they happened), inventory (each fill's signed size times the mid's move from that fill to the
-- last book: mark-to-market of what was held) and fees (paid: negative). They add up to the equity's
-- last pnl. turnover_usdt: traded notional.
CREATE VIEW pnl_attribution AS
WITH last AS (SELECT mid FROM equity ORDER BY ts_recv DESC, seq DESC LIMIT 1),
f AS (SELECT * FROM fills_pnl WHERE symbol = getvariable('run_symbol'))
SELECT
    coalesce(sum(f.edge), 0) AS spread_capture,
    coalesce(sum(CASE WHEN f.side = 'buy' THEN f.qty ELSE -f.qty END * (last.mid - f.mid)), 0) AS inventory,
    -coalesce(sum(CAST(f.fee AS DOUBLE)), 0) AS fees,
    spread_capture + inventory + fees AS total,
    coalesce(sum(CAST(f.notional AS DOUBLE)), 0) AS turnover_usdt,
    count(f.seq) AS fills
FROM f, last;

-- The first loss-stop rejection (risk reason 'loss_stop': the daily loss stop halted new orders),
-- when it came (seconds from the first book) and the fraction of the run after it. One row; the stop
-- columns are NULL when the stop never hit.
CREATE VIEW loss_stop AS
WITH r AS (SELECT min(ts_recv) AS stop_ns FROM risk WHERE reason = 'loss_stop')
SELECT s.start_ns, s.end_ns, r.stop_ns, (r.stop_ns - s.start_ns) / 1e9 AS stop_s,
       CASE WHEN r.stop_ns >= s.end_ns THEN 0.0
            ELSE (s.end_ns - r.stop_ns) / nullif(s.span_ns, 0) END AS after_frac
FROM run_span s, r;

-- Fee-adjusted markouts: for every fill and horizon h, how far the mid moved in the fill's favour
-- from its price by h ms after it (the last book at or before), in bps of the fill price, minus its
-- fee in bps of its notional (+ = the fill made money after fees). Fills whose horizon runs past the
-- run's last book are left out.
CREATE VIEW markouts AS
WITH h AS (SELECT unnest(coalesce(getvariable('markout_ms'), [0, 100, 1000, 5000, 30000])) AS h_ms),
b AS (SELECT ts_recv, (bid_px_0 + ask_px_0) / 2 AS mid FROM books15 WHERE symbol = getvariable('run_symbol')),
x AS (
    SELECT f.ts_recv, f.seq, f.client_oid, f.side, f.liquidity, f.px, f.qty, h.h_ms,
           CAST(f.fee AS DOUBLE) / nullif(CAST(f.notional AS DOUBLE), 0) * 1e4 AS fee_bps,
           f.ts_recv + CAST(round(h.h_ms * 1e6) AS BIGINT) AS t_ns
    FROM fill f, h WHERE f.symbol = getvariable('run_symbol')
)
SELECT x.ts_recv, x.seq, x.client_oid, x.side, x.liquidity, x.h_ms, x.px, b.mid,
       (CASE WHEN x.side = 'buy' THEN b.mid - x.px ELSE x.px - b.mid END) / x.px * 1e4 AS gross_bps,
       x.fee_bps, gross_bps - x.fee_bps AS markout_bps
FROM x ASOF JOIN b ON x.t_ns >= b.ts_recv
WHERE x.t_ns <= (SELECT end_ns FROM run_span);

-- Per liquidity (and 'all') and horizon: fills counted, mean fee-adjusted markout (bps) and its 95%
-- confidence interval (mean +- 1.96 standard errors: a normal approximation; NULL below 2 fills).
CREATE VIEW markout_stats AS
SELECT coalesce(liquidity, 'all') AS liquidity, h_ms, count(*) AS n,
       avg(markout_bps) AS mean_bps,
       avg(markout_bps) - 1.96 * stddev_samp(markout_bps) / sqrt(count(*)) AS ci95_lo_bps,
       avg(markout_bps) + 1.96 * stddev_samp(markout_bps) / sqrt(count(*)) AS ci95_hi_bps,
       avg(fee_bps) AS fee_bps
FROM markouts GROUP BY GROUPING SETS ((liquidity, h_ms), (h_ms))
ORDER BY liquidity IS NULL, liquidity, h_ms;
