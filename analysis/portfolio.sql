-- The Portfolio section of the report: a run with more than one instrument (views.sql run_symbols).
-- Each block starts with a "name:" comment line (id | title), as in queries.sql; the views are the
-- portfolio views of views.sql (docs/ANALYSIS.md "Portfolio").

-- name: portfolio_pnl | Portfolio PnL per instrument and in total (exact decimals; each marked at its last mid)
SELECT symbol, fills, CAST(position AS DOUBLE) AS position, mark_px,
       CAST(trading_cash AS DECIMAL(18, 4)) AS trading_cash_usdt, CAST(fees AS DECIMAL(18, 4)) AS fees_usdt,
       CAST(pnl AS DECIMAL(18, 4)) AS pnl_usdt, round(delta_usd, 2) AS delta_usdt, round(gross_usd, 2) AS gross_usdt
FROM portfolio_pnl ORDER BY symbol = 'TOTAL', symbol;

-- name: portfolio_exposure | Net delta and gross exposure over the run (USDT, at every book of any instrument)
SELECT count(*) AS instants,
       round(arg_max(net_delta_usd, ts_recv), 2) AS net_delta_last,
       round(min(net_delta_usd), 2) AS net_delta_min, round(max(net_delta_usd), 2) AS net_delta_max,
       round(max(abs(net_delta_usd)), 2) AS net_delta_abs_max,
       round(arg_max(gross_usd, ts_recv), 2) AS gross_last, round(max(gross_usd), 2) AS gross_max,
       round(min(pnl), 4) AS pnl_min, round(arg_max(pnl, ts_recv), 4) AS pnl_last
FROM portfolio_equity;

-- name: hedge_ratio | Kev's hedge ratio against the realised beta (OLS of log returns / log mids), per pair and regime
SELECT leader, follower, round(start_s, 1) AS start_s, round(end_s, 1) AS end_s, round(true_beta, 4) AS true_beta,
       samples, round(beta_returns, 4) AS beta_returns, round(beta_levels, 4) AS beta_levels, commands,
       round(hedge_mean, 4) AS kev_hedge_mean, round(hedge_last, 4) AS kev_hedge_last
FROM hedge_ratio_regimes ORDER BY leader, follower, start_s;

-- name: risk_rules | Which risk rule bound: refusals by rule and instrument (seconds from the first book)
SELECT reason, symbol, level, refusals, round(share, 4) AS share, round(first_s, 3) AS first_s,
       round(last_s, 3) AS last_s, buckets
FROM risk_rule_stats ORDER BY refusals DESC, reason, symbol;
