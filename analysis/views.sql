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
    -- the run's symbol (views below): a portfolio's other legs are in its Portfolio section
    WHERE o.kind = 'new' AND o.symbol = coalesce(getvariable('run_symbol'), o.symbol)
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
-- Tear sheet views (analysis/tearsheet.py reads them; docs/ANALYSIS.md "Tear sheet" defines each
-- number). Two knobs, read when a query runs (SET VARIABLE them any time; unset means the default):
--   sample_ns   equity sampling for Sharpe / Sortino (default 1000000000: 1 s)
--   markout_ms  markout horizons in ms (default [0, 100, 1000, 5000, 30000])
-- Everything below is for the run's symbol (config.symbol in a replay's manifest; a live run's config
-- lists its symbols and its manifest names the run's one symbol at the top).
SET VARIABLE run_symbol = (
    SELECT coalesce(json_extract_string(content, '$.config.symbol'), json_extract_string(content, '$.symbol'))
    FROM read_text(getvariable('run') || '/manifest.json')
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

-- ---------------------------------------------------------------------------------------------------
-- Portfolio views (analysis/portfolio.py reads them; docs/ANALYSIS.md "Portfolio" defines each).
-- A run trading several instruments writes each one's rows, named by `symbol`, into the same streams.
-- Knobs (SET VARIABLE them any time; unset means the default):
--   bucket_ns       risk refusals counted per bucket of this many ns (default 60000000000: 60 s)
--   beta_sample_ns  the pairs' mids sampled every this many ns for the realised beta (default 1 s)
--   beta_window     samples in the rolling beta's window (default 300)

-- The run's instruments: its config's symbol and symbols, and every symbol its event streams name.
-- More than one row: a portfolio run (the report then adds its Portfolio section).
CREATE VIEW run_symbols AS
WITH m AS (SELECT content FROM read_text(getvariable('run') || '/manifest.json'))
SELECT DISTINCT symbol FROM (
    SELECT json_extract_string(content, '$.config.symbol') AS symbol FROM m
    UNION ALL SELECT unnest(json_extract_string(content, '$.config.symbols[*]')) FROM m
    UNION ALL SELECT DISTINCT symbol FROM label
    UNION ALL SELECT DISTINCT symbol FROM kev_request
    UNION ALL SELECT DISTINCT symbol FROM command
    UNION ALL SELECT DISTINCT symbol FROM risk
    UNION ALL SELECT DISTINCT symbol FROM "order"
    UNION ALL SELECT DISTINCT symbol FROM fill
) WHERE symbol IS NOT NULL AND symbol <> '';
-- Whether the run trades several instruments: the report's tables (queries.sql) then carry a `symbol`
-- column (`CASE WHEN getvariable('by_symbol') THEN symbol END`), NULL in a single-symbol run, whose
-- report leaves that column out.
SET VARIABLE by_symbol = (SELECT count(*) > 1 FROM run_symbols);

-- The portfolio's span: the first and last book of any of its instruments.
CREATE VIEW portfolio_span AS
SELECT min(ts_recv) AS start_ns, max(ts_recv) AS end_ns, max(ts_recv) - min(ts_recv) AS span_ns
FROM books15 WHERE symbol IN (SELECT symbol FROM run_symbols);

-- Per instrument, at every one of its books with a finite mid (the last of several books at one
-- instant): position and cash (exact: sells - buys - fees) after its fills at or before the book, its
-- PnL marked to that mid (float), and its delta in USDT (position x mid).
CREATE VIEW symbol_equity AS
WITH f AS (
    SELECT symbol, ts_recv, position, cash FROM (
        SELECT symbol, ts_recv, position, cash,
               row_number() OVER (PARTITION BY symbol, ts_recv ORDER BY seq DESC) AS k
        FROM fills_pnl)
    WHERE k = 1
),
b AS (
    SELECT symbol, ts_recv, seq, (bid_px_0 + ask_px_0) / 2 AS mid FROM books15
    WHERE symbol IN (SELECT symbol FROM run_symbols) AND isfinite(bid_px_0 + ask_px_0)
    QUALIFY row_number() OVER (PARTITION BY symbol, ts_recv ORDER BY seq DESC) = 1
)
SELECT b.symbol, b.ts_recv, b.seq, b.mid, coalesce(f.position, 0) AS position,
       coalesce(f.cash, 0) AS cash,
       CAST(coalesce(f.cash, 0) AS DOUBLE) + coalesce(f.position, 0) * b.mid AS pnl,
       coalesce(f.position, 0) * b.mid AS delta_usd
FROM b ASOF LEFT JOIN f ON b.symbol = f.symbol AND b.ts_recv >= f.ts_recv;

-- The portfolio at every instant one of its instruments has a book: each instrument as of its last
-- book at or before (one with no book yet counts 0), summed: PnL, net delta (sum of position x mid)
-- and gross exposure (sum of |position x mid|), USDT; `marked` instruments with a book so far.
CREATE VIEW portfolio_equity AS
WITH t AS (SELECT DISTINCT ts_recv FROM symbol_equity),
g AS (SELECT t.ts_recv, s.symbol FROM t, run_symbols s),
j AS (
    SELECT g.ts_recv, g.symbol, e.pnl, e.delta_usd
    FROM g ASOF LEFT JOIN symbol_equity e ON g.symbol = e.symbol AND g.ts_recv >= e.ts_recv
)
SELECT ts_recv, coalesce(sum(pnl), 0) AS pnl, coalesce(sum(delta_usd), 0) AS net_delta_usd,
       coalesce(sum(abs(delta_usd)), 0) AS gross_usd, count(pnl) AS marked
FROM j GROUP BY ts_recv;

-- Per instrument at the run's end: fills, position, mark (its last book's finite mid, float), trading
-- cash (sells - buys) and fees, PnL = cash - fees + position x mark and its delta in USDT. Exact
-- decimals: sizes and the mark are read as the decimals their floats print as (a size parsed from an
-- exchange string is that string again; engine/portfolio.py books fills the same way). PnL is NULL
-- without a book. The report's `pnl` table is this for the run's symbol; `portfolio_pnl` adds the total.
CREATE VIEW symbol_pnl AS
WITH f AS (
    SELECT symbol, count(*) AS fills,
           sum(CASE WHEN side = 'buy' THEN 1 ELSE -1 END * CAST(CAST(qty AS VARCHAR) AS DECIMAL(38, 12)))
               AS position,
           sum(CASE WHEN side = 'sell' THEN notional ELSE -notional END) AS trading_cash,
           sum(fee) AS fees
    FROM fill GROUP BY symbol
),
m AS (
    SELECT symbol, (bid_px_0 + ask_px_0) / 2 AS mark FROM books15 WHERE isfinite(bid_px_0 + ask_px_0)
    QUALIFY row_number() OVER (PARTITION BY symbol ORDER BY ts_recv DESC, seq DESC) = 1
)
SELECT s.symbol, coalesce(f.fills, 0) AS fills, coalesce(f.position, 0) AS position, m.mark AS mark_px,
       coalesce(f.trading_cash, 0) AS trading_cash, coalesce(f.fees, 0) AS fees,
       coalesce(f.trading_cash, 0) - coalesce(f.fees, 0)
           + CAST(coalesce(f.position, 0) * CAST(CAST(m.mark AS VARCHAR) AS DECIMAL(38, 12)) AS DECIMAL(38, 12))
           AS pnl,
       CAST(coalesce(f.position, 0) AS DOUBLE) * m.mark AS delta_usd
FROM run_symbols s LEFT JOIN f ON f.symbol = s.symbol LEFT JOIN m ON m.symbol = s.symbol;

-- symbol_pnl and one row `symbol = 'TOTAL'` summing it (position and mark NULL there: sizes of
-- different instruments do not add), plus gross exposure (|delta|).
CREATE VIEW portfolio_pnl AS
SELECT symbol, fills, position, mark_px, trading_cash, fees, pnl, delta_usd, abs(delta_usd) AS gross_usd
FROM symbol_pnl
UNION ALL
SELECT 'TOTAL', CAST(sum(fills) AS BIGINT), NULL, NULL, sum(trading_cash), sum(fees), sum(pnl), sum(delta_usd),
       sum(abs(delta_usd))
FROM symbol_pnl;

-- Every risk refusal, with the rule that refused it (`reason`), its level (`portfolio` for the
-- portfolio-wide rules `portfolio_*`, else `instrument`) and its time bucket (`bucket_s`: seconds
-- from the portfolio's first book to the bucket's start; buckets of bucket_ns).
CREATE VIEW risk_refusals AS
WITH k AS (SELECT CAST(coalesce(getvariable('bucket_ns'), 60000000000) AS BIGINT) AS bucket_ns)
SELECT r.ts_recv, r.seq, r.client_oid, r.symbol, r.reason,
       CASE WHEN starts_with(r.reason, 'portfolio_') THEN 'portfolio' ELSE 'instrument' END AS level,
       r.intent, r.source, r.side, r.px, r.qty,
       (r.ts_recv - s.start_ns) // k.bucket_ns * k.bucket_ns / 1e9 AS bucket_s
FROM risk r, portfolio_span s, k WHERE NOT r.accepted;

-- Refusals per (time bucket, rule, instrument): which rule bound when.
CREATE VIEW risk_refusals_bucketed AS
SELECT bucket_s, reason, symbol, level, count(*) AS n
FROM risk_refusals GROUP BY ALL ORDER BY bucket_s, reason, symbol;

-- Per (rule, instrument): refusals, their share of all refusals, the first and last (seconds from
-- the portfolio's first book), and how many time buckets saw the rule bind.
CREATE VIEW risk_rule_stats AS
SELECT reason, symbol, level, count(*) AS refusals,
       count(*) / sum(count(*)) OVER () AS share,
       (min(ts_recv) - (SELECT start_ns FROM portfolio_span)) / 1e9 AS first_s,
       (max(ts_recv) - (SELECT start_ns FROM portfolio_span)) / 1e9 AS last_s,
       count(DISTINCT bucket_s) AS buckets
FROM risk_refusals GROUP BY reason, symbol, level ORDER BY refusals DESC, reason, symbol;

-- The pairs whose hedge ratio is compared with the market: the simulated session's pairs (its
-- manifest's simulator.pairs, leader and follower) when it has them, else the run's first symbol
-- (config.symbols[0], else config.symbol) leading each other instrument. Both legs in the run.
SET VARIABLE session_manifest = (
    -- a glob: a session without a manifest (a hand-built one) reads as no rows, not an error
    SELECT json_extract_string(content, '$.session.path') || '/manifest.jso[n]'
    FROM read_text(getvariable('run') || '/manifest.json')
);
CREATE VIEW session_pairs AS
SELECT p.leader, p.follower, p.regimes
FROM (
    SELECT unnest(from_json(json_extract(content, '$.simulator.pairs'),
                            '[{"leader": "VARCHAR", "follower": "VARCHAR",
                               "regimes": [{"start_ms": "BIGINT", "beta": "DOUBLE"}]}]')) AS p
    FROM read_text(getvariable('session_manifest'))
);
CREATE VIEW pairs AS
WITH sim AS (
    SELECT leader, follower FROM session_pairs
    WHERE leader IN (SELECT symbol FROM run_symbols) AND follower IN (SELECT symbol FROM run_symbols)
),
lead AS (
    SELECT coalesce(json_extract_string(content, '$.config.symbols[0]'),
                    json_extract_string(content, '$.config.symbol')) AS leader
    FROM read_text(getvariable('run') || '/manifest.json')
)
SELECT leader, follower FROM sim
UNION ALL
SELECT lead.leader, s.symbol FROM lead, run_symbols s
WHERE s.symbol <> lead.leader AND NOT EXISTS (SELECT 1 FROM sim)
ORDER BY leader, follower;

-- The true beta of each simulated pair per regime, from the session's manifest: the regime's start and
-- end (the next regime's start; NULL for the last) in ns.
CREATE VIEW pair_regimes AS
SELECT leader, follower, r.beta AS true_beta, r.start_ms * 1000000 AS start_ns,
       lead(r.start_ms * 1000000) OVER (PARTITION BY leader, follower ORDER BY r.start_ms) AS end_ns
FROM (SELECT leader, follower, unnest(regimes) AS r FROM session_pairs);

-- Each pair's mids sampled every beta_sample_ns from the later of the two legs' first books (the last
-- book at or before each instant, finite mids only): log mids and their log returns over the sample.
CREATE VIEW pair_samples AS
WITH k AS (SELECT CAST(coalesce(getvariable('beta_sample_ns'), 1000000000) AS BIGINT) AS step),
b AS (
    SELECT symbol, ts_recv, ln((bid_px_0 + ask_px_0) / 2) AS lmid FROM books15
    WHERE symbol IN (SELECT symbol FROM run_symbols) AND bid_px_0 + ask_px_0 > 0
      AND isfinite(bid_px_0 + ask_px_0)
    QUALIFY row_number() OVER (PARTITION BY symbol, ts_recv ORDER BY seq DESC) = 1
),
span AS (
    SELECT p.leader, p.follower,
           greatest((SELECT min(ts_recv) FROM b WHERE symbol = p.leader),
                    (SELECT min(ts_recv) FROM b WHERE symbol = p.follower)) AS t0,
           least((SELECT max(ts_recv) FROM b WHERE symbol = p.leader),
                 (SELECT max(ts_recv) FROM b WHERE symbol = p.follower)) AS t1
    FROM pairs p
),
g AS (
    SELECT leader, follower, unnest(generate_series(t0, t1, (SELECT step FROM k))) AS t_ns
    FROM span WHERE t0 <= t1
),
x AS (
    SELECT g.leader, g.follower, g.t_ns, bl.lmid AS lx
    FROM g ASOF JOIN b bl ON bl.symbol = g.leader AND g.t_ns >= bl.ts_recv
),
y AS (
    SELECT x.*, bf.lmid AS ly
    FROM x ASOF JOIN b bf ON bf.symbol = x.follower AND x.t_ns >= bf.ts_recv
)
SELECT leader, follower, t_ns, lx, ly,
       lx - lag(lx) OVER w AS rx, ly - lag(ly) OVER w AS ry
FROM y WINDOW w AS (PARTITION BY leader, follower ORDER BY t_ns);

-- The realised beta of each pair: OLS slope of the follower's log return on the leader's
-- (`beta_returns`) and of the follower's log mid on the leader's (`beta_levels`) over the last
-- beta_window samples, at every sample (NULL until the window holds two samples).
-- `beta_returns_se`: the returns slope's standard error, sqrt(residual variance / sum of the leader's
-- squared centred returns), residual variance over n - 2 (NULL below 3 returns): its band is the
-- rolling estimate's confidence band (the report draws +-1.96 se).
CREATE VIEW pair_beta AS
SELECT leader, follower, t_ns,
       regr_slope(ry, rx) OVER w AS beta_returns,
       regr_slope(ly, lx) OVER w AS beta_levels,
       count(rx) OVER w AS n,
       CASE WHEN regr_count(ry, rx) OVER w > 2 AND regr_sxx(ry, rx) OVER w > 0 THEN
           sqrt(greatest(regr_syy(ry, rx) OVER w - regr_slope(ry, rx) OVER w * regr_sxy(ry, rx) OVER w, 0)
                / (regr_count(ry, rx) OVER w - 2) / regr_sxx(ry, rx) OVER w)
       END AS beta_returns_se
FROM pair_samples
WINDOW w AS (PARTITION BY leader, follower ORDER BY t_ns
             ROWS BETWEEN CAST(coalesce(getvariable('beta_window'), 300) AS BIGINT) - 1 PRECEDING
             AND CURRENT ROW);

-- Kev's hedge ratio for each follower, one row per command naming it (the follower's row of a v2
-- command), beside the realised beta at that instant (the last sample at or before) and the
-- simulated pair's true beta then (NULL for a recorded session).
CREATE VIEW hedge_ratio AS
WITH c AS (
    SELECT p.leader, p.follower, c.ts_recv, c.seq, c.command_id, c.hedge_ratio, c.target_position
    FROM command c JOIN pairs p ON c.symbol = p.follower
)
SELECT c.leader, c.follower, c.ts_recv, c.seq, c.command_id, c.hedge_ratio, c.target_position,
       b.beta_returns, b.beta_levels, r.true_beta
FROM c
ASOF LEFT JOIN pair_beta b ON b.leader = c.leader AND b.follower = c.follower AND c.ts_recv >= b.t_ns
LEFT JOIN pair_regimes r ON r.leader = c.leader AND r.follower = c.follower
     AND c.ts_recv >= r.start_ns AND (r.end_ns IS NULL OR c.ts_recv < r.end_ns)
ORDER BY c.leader, c.follower, c.ts_recv, c.seq;

-- Per pair and regime (a recorded session: the whole run, one row): the true beta, the realised OLS
-- beta over the regime's samples (returns and levels), and Kev's hedge ratios in it (commands, mean,
-- last). `start_s`/`end_s`: seconds from the portfolio's first book, clipped to the samples.
CREATE VIEW hedge_ratio_regimes AS
WITH r AS (
    SELECT p.leader, p.follower, r.true_beta, r.start_ns, r.end_ns
    FROM pairs p LEFT JOIN pair_regimes r ON r.leader = p.leader AND r.follower = p.follower
),
s AS (
    SELECT r.leader, r.follower, r.true_beta, r.start_ns, min(x.t_ns) AS t_first, max(x.t_ns) AS t_last,
           count(x.rx) AS samples, regr_slope(x.ry, x.rx) AS beta_returns, regr_slope(x.ly, x.lx) AS beta_levels
    FROM r JOIN pair_samples x ON x.leader = r.leader AND x.follower = r.follower
        AND (r.start_ns IS NULL OR x.t_ns >= r.start_ns) AND (r.end_ns IS NULL OR x.t_ns < r.end_ns)
    GROUP BY ALL
),
h AS (
    SELECT r.leader, r.follower, r.start_ns, count(h.seq) AS commands, avg(h.hedge_ratio) AS hedge_mean,
           arg_max(h.hedge_ratio, (h.ts_recv, h.seq)) AS hedge_last
    FROM r JOIN hedge_ratio h ON h.leader = r.leader AND h.follower = r.follower
        AND (r.start_ns IS NULL OR h.ts_recv >= r.start_ns) AND (r.end_ns IS NULL OR h.ts_recv < r.end_ns)
    GROUP BY ALL
)
SELECT s.leader, s.follower,
       (s.t_first - (SELECT start_ns FROM portfolio_span)) / 1e9 AS start_s,
       (s.t_last - (SELECT start_ns FROM portfolio_span)) / 1e9 AS end_s,
       s.true_beta, s.samples, s.beta_returns, s.beta_levels,
       coalesce(h.commands, 0) AS commands, h.hedge_mean, h.hedge_last
FROM s LEFT JOIN h ON h.leader = s.leader AND h.follower = s.follower
    AND h.start_ns IS NOT DISTINCT FROM s.start_ns
ORDER BY s.leader, s.follower, s.t_first;

-- ---------------------------------------------------------------------------------------------------
-- The report's lead for a portfolio (analysis/portfolio_lead.py; docs/ANALYSIS.md "Portfolio"):
-- the portfolio and each leg as one row each, and its loss stops. `scope` is 'portfolio' or a symbol.

-- Every scope's equity at each of its instants: the portfolio's (portfolio_equity) and each leg's
-- (symbol_equity): PnL, net delta and gross exposure (USDT), and how long that state held (`dur_ns`:
-- to the scope's next instant, the last to the portfolio's last book).
CREATE VIEW scope_equity AS
WITH e AS (
    SELECT 'portfolio' AS scope, ts_recv, pnl, net_delta_usd AS net_usd, gross_usd FROM portfolio_equity
    UNION ALL
    SELECT symbol, ts_recv, pnl, delta_usd, abs(delta_usd) FROM symbol_equity
)
SELECT e.*, coalesce(lead(ts_recv) OVER w, (SELECT end_ns FROM portfolio_span)) - ts_recv AS dur_ns,
       pnl - max(pnl) OVER (w ROWS UNBOUNDED PRECEDING) AS drawdown
FROM e WINDOW w AS (PARTITION BY scope ORDER BY ts_recv);

-- Every scope's PnL sampled every sample_ns from the portfolio's first book (the last instant at or
-- before; a leg before its first book: 0) and its change over the sample: Sharpe's input.
CREATE VIEW scope_equity_sampled AS
WITH g AS (
    SELECT unnest(generate_series(start_ns, end_ns, CAST(coalesce(getvariable('sample_ns'), 1000000000) AS BIGINT)))
           AS t_ns
    FROM portfolio_span WHERE start_ns IS NOT NULL
),
s AS (SELECT DISTINCT scope FROM scope_equity),
gs AS (SELECT s.scope, g.t_ns FROM s, g),
x AS (
    SELECT gs.scope, gs.t_ns, coalesce(e.pnl, 0) AS pnl
    FROM gs ASOF LEFT JOIN scope_equity e ON gs.scope = e.scope AND gs.t_ns >= e.ts_recv
)
SELECT scope, t_ns, pnl, pnl - lag(pnl) OVER (PARTITION BY scope ORDER BY t_ns) AS ret FROM x;

-- One row per scope, the portfolio first: PnL (mark to mid at the last book, float), max drawdown
-- (from the running peak, at every instant), Sharpe of the sampled PnL changes per sample and
-- annualised (x sqrt(samples in 365 days)), net delta and gross exposure time-weighted over the
-- portfolio's span (a leg counts 0 before its first book) and at their largest, fills and fees.
CREATE VIEW scope_performance AS
WITH k AS (
    SELECT CAST(coalesce(getvariable('sample_ns'), 1000000000) AS BIGINT) AS sample_ns,
           (SELECT span_ns FROM portfolio_span) AS span_ns
),
r AS (
    SELECT scope, count(ret) AS samples, avg(ret) AS mean, stddev_samp(ret) AS sd
    FROM scope_equity_sampled GROUP BY scope
),
e AS (
    SELECT scope, arg_max(pnl, ts_recv) AS pnl, min(drawdown) AS max_drawdown,
           sum(net_usd * dur_ns) AS net_int, sum(abs(net_usd) * dur_ns) AS abs_net_int,
           max(abs(net_usd)) AS net_abs_max, sum(gross_usd * dur_ns) AS gross_int, max(gross_usd) AS gross_max
    FROM scope_equity GROUP BY scope
),
f AS (
    SELECT coalesce(symbol, 'portfolio') AS scope, count(*) AS fills, sum(fee) AS fees
    FROM fill GROUP BY GROUPING SETS ((symbol), ())
)
SELECT e.scope, e.pnl, e.max_drawdown, k.sample_ns, r.samples,
       r.mean / nullif(r.sd, 0) AS sharpe_per_sample,
       r.mean / nullif(r.sd, 0) * sqrt(365 * 86400e9 / k.sample_ns) AS sharpe_annualised,
       e.net_int / nullif(k.span_ns, 0) AS net_delta_twa, e.abs_net_int / nullif(k.span_ns, 0) AS abs_net_delta_twa,
       e.net_abs_max, e.gross_int / nullif(k.span_ns, 0) AS gross_twa, e.gross_max,
       coalesce(f.fills, 0) AS fills, coalesce(f.fees, 0) AS fees
FROM e JOIN r USING (scope) CROSS JOIN k LEFT JOIN f USING (scope)
ORDER BY e.scope <> 'portfolio', e.scope;

-- The loss stops, one row each: every leg's own (risk reason 'loss_stop', limit
-- config.risk.daily_loss_stop_usd) and the portfolio's ('portfolio_loss_stop', on the summed PnL;
-- limit config.risk.portfolio_loss_stop_usd, NULL: unbound). Hit: the rule refused an order; `stop_ns`
-- the first refusal. At that instant the scope's PnL (`pnl_at_stop`, its last instant at or before)
-- and at the end (`pnl_end`); `after_stop` = pnl_end - pnl_at_stop: what the scope made (+) or lost
-- (-) while the stop held, its cost when negative (the legs left open moving, the reducing orders'
-- fees and slippage). The scope's fills from the stop on: `fills_after`, their fees and their
-- slippage against the mid (fees + slippage: the unwinding's cost, USDT, + = paid).
CREATE VIEW loss_stops AS
WITH m AS (SELECT content FROM read_text(getvariable('run') || '/manifest.json')),
s AS (
    SELECT symbol AS scope, 'loss_stop' AS rule,
           CAST(json_extract(m.content, '$.config.risk.daily_loss_stop_usd') AS DOUBLE) AS limit_usd
    FROM run_symbols, m
    UNION ALL
    SELECT 'portfolio', 'portfolio_loss_stop',
           CAST(json_extract(m.content, '$.config.risk.portfolio_loss_stop_usd') AS DOUBLE) FROM m
),
h AS (
    SELECT s.scope, s.rule, s.limit_usd, min(r.ts_recv) AS stop_ns, count(r.seq) AS refusals
    FROM s LEFT JOIN risk r ON NOT r.accepted AND r.reason = s.rule AND (s.scope = 'portfolio' OR r.symbol = s.scope)
    GROUP BY ALL
),
p AS (
    SELECT h.*, e.pnl AS pnl_at_stop
    FROM h ASOF LEFT JOIN scope_equity e ON e.scope = h.scope AND h.stop_ns >= e.ts_recv
),
a AS (
    SELECT p.scope, count(f.seq) AS fills_after, coalesce(sum(CAST(f.fee AS DOUBLE)), 0) AS fees_after,
           coalesce(-sum(f.edge), 0) AS slippage_after
    FROM p LEFT JOIN fills_pnl f ON p.stop_ns IS NOT NULL AND f.ts_recv >= p.stop_ns
        AND (p.scope = 'portfolio' OR f.symbol = p.scope)
    GROUP BY p.scope
),
z AS (SELECT scope, arg_max(pnl, ts_recv) AS pnl_end FROM scope_equity GROUP BY scope)
SELECT p.scope, p.rule, p.limit_usd, p.stop_ns IS NOT NULL AS hit, p.stop_ns,
       (p.stop_ns - (SELECT start_ns FROM portfolio_span)) / 1e9 AS stop_s, p.refusals, p.pnl_at_stop,
       z.pnl_end, z.pnl_end - p.pnl_at_stop AS after_stop,
       CASE WHEN p.stop_ns IS NOT NULL THEN a.fills_after END AS fills_after,
       CASE WHEN p.stop_ns IS NOT NULL THEN a.fees_after END AS fees_after,
       CASE WHEN p.stop_ns IS NOT NULL THEN a.slippage_after END AS slippage_after
FROM p JOIN a USING (scope) LEFT JOIN z USING (scope)
ORDER BY p.scope = 'portfolio' DESC, p.scope;
