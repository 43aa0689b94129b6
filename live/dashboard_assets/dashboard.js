// The live dashboard: polls /api/state (a snapshot the run publishes every 250 ms), fills the page and
// draws the history it has seen with uPlot (bundled, MIT). Values go in with textContent only.
"use strict";
(function () {
  const POLL_MS = 500;
  const KEEP = 600; // points of history per chart (5 minutes at the poll rate)
  const token = new URLSearchParams(location.search).get("token") || "";
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const $ = (id) => document.getElementById(id);
  const fmt = (v, d) => (v === null || v === undefined || Number.isNaN(v) ? "-" : Number(v).toFixed(d));
  const set = (id, text) => { const el = $(id); if (el) el.textContent = text; };
  let lastSeq = -1, lastAt = Date.now(), symbols = [];
  const hist = { t: [], pnl: [], pos: {}, p50: [], p99: [] };
  let pnlChart = null, latChart = null;

  function rows(tbodyParent, items, cells) {
    const tbody = $(tbodyParent).tBodies[0];
    const frag = document.createDocumentFragment();
    for (const item of items) {
      const tr = document.createElement("tr");
      for (const [text, cls, attrs] of cells(item)) {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.className = cls;
        if (attrs) for (const k in attrs) td.setAttribute(k, attrs[k]);
        tr.appendChild(td);
      }
      frag.appendChild(tr);
    }
    tbody.replaceChildren(frag);
  }

  function size(el) { return { width: Math.max(300, el.clientWidth - 4), height: 210 }; }

  function makeCharts() {
    const pnlEl = $("chart-pnl"), latEl = $("chart-lat");
    const series = [{}, { label: "PnL", stroke: "#1565c0", scale: "usd" }];
    const axes = [{}, { scale: "usd", label: "USD" }, { scale: "pos", side: 1, label: "position", grid: { show: false } }];
    const colours = ["#2e7d32", "#c62828", "#6a1b9a", "#ef6c00"];
    symbols.forEach((s, i) => series.push({ label: s + " pos", stroke: colours[i % colours.length], scale: "pos" }));
    pnlChart = new uPlot({ ...size(pnlEl), series, axes, scales: { x: { time: true } } }, [[], ...series.slice(1).map(() => [])], pnlEl);
    latChart = new uPlot({
      ...size(latEl),
      series: [{}, { label: "p50", stroke: "#1565c0" }, { label: "p99", stroke: "#c62828" }],
      axes: [{}, { label: "us (log)" }], scales: { x: { time: true }, y: { distr: 3 } },
    }, [[], [], []], latEl);
  }

  function push(arr, v) { arr.push(v); if (arr.length > KEEP) arr.shift(); }

  function chart(d) {
    if (!window.uPlot) return;
    if (!pnlChart) makeCharts();
    push(hist.t, d.ts_ns / 1e9);
    push(hist.pnl, d.portfolio.pnl);
    for (const s of symbols) { hist.pos[s] = hist.pos[s] || []; push(hist.pos[s], d.instruments[s] ? d.instruments[s].position : null); }
    push(hist.p50, d.tick_to_order_us.p50);
    push(hist.p99, d.tick_to_order_us.p99);
    pnlChart.setData([hist.t, hist.pnl, ...symbols.map((s) => hist.pos[s])]);
    latChart.setData([hist.t, hist.p50, hist.p99]);
  }

  function show(d) {
    if (!symbols.length) symbols = d.symbols || [];
    set("mode", d.mode);
    set("uptime", fmt(d.uptime_s, 0));
    set("seq", d.seq);
    const run = $("run-state");
    run.textContent = d.running ? "running" : "stopped" + (d.stop_reason ? " (" + d.stop_reason + ")" : "");
    run.className = "badge " + (d.running ? "ok" : "bad");
    const kill = $("kill-state");
    kill.textContent = d.kill.engaged ? "KILL SWITCH ENGAGED" + (d.kill.source ? " (" + d.kill.source + ")" : "") : "kill switch off";
    kill.className = "badge " + (d.kill.engaged ? "bad" : "ok");
    kill.dataset.engaged = d.kill.engaged ? "1" : "0";
    const err = $("error");
    err.hidden = !d.error; err.textContent = d.error ? "snapshot: " + d.error : "";
    set("pf-pnl", fmt(d.portfolio.pnl, 4)); set("pf-fees", fmt(d.portfolio.fees, 4)); set("pf-gross", fmt(d.portfolio.gross_usd, 2));
    const t = d.tick_to_order_us;
    set("t2o-p50", fmt(t.p50, 1)); set("t2o-p90", fmt(t.p90, 1)); set("t2o-p99", fmt(t.p99, 1)); set("t2o-n", t.window);
    set("label-rate", fmt(d.labels.rate_per_s, 1)); set("label-total", d.labels.total);
    set("kev-queue", d.kev.queue_depth); set("kev-inflight", d.kev.in_flight); set("kev-answers", d.kev.answers);
    set("kev-lag", fmt(d.kev.lag_ms.last, 1)); set("kev-lag-p50", fmt(d.kev.lag_ms.p50, 1));
    set("feed-frames", d.feed.frames); set("feed-age", fmt(d.feed.age_s, 1)); set("feed-quar", d.feed.quarantined);
    rows("instruments", Object.entries(d.instruments), ([s, i]) => [
      [s], [fmt(i.position, 4), null, { "data-sym": s, "data-k": "position" }], [fmt(i.mid, 2)],
      [fmt(i.pnl, 4), null, { "data-sym": s, "data-k": "pnl" }], [fmt(i.fees, 4)], [i.open_orders, null, { "data-sym": s, "data-k": "open" }],
      [i.label], [i.kev_queue], [i.kev_in_flight], [i.kill_switch ? "on" : "off"],
    ]);
    rows("venue", Object.entries(d.venue), ([name, l]) => [[name], [l.state, "state-" + l.state], [l.detail]]);
    set("risk-decisions", d.risk.decisions); set("risk-accepted", d.risk.accepted);
    rows("refusals", Object.entries(d.risk.by_rule).sort((a, b) => b[1] - a[1]), ([rule, n]) => [[rule], [n, null, { "data-rule": rule }]]);
    set("resting-n", d.resting_total);
    rows("resting", d.resting, (o) => [[o.client_oid], [o.symbol], [o.side, o.side], [fmt(o.px, 2)], [fmt(o.qty, 4)], [fmt(o.filled, 4)], [o.state], [fmt(o.age_s, 1)]]);
    rows("fills", d.fills, (f) => [
      [new Date(f.ts_event / 1e6).toISOString().slice(11, 23)], [f.client_oid], [f.symbol], [f.side, f.side],
      [fmt(f.px, 2)], [fmt(f.qty, 4)], [f.liquidity], [fmt(f.fee, 6)], [fmt(f.position_after, 4)],
    ]);
    chart(d);
  }

  async function poll() {
    try {
      const r = await fetch("/api/state", { headers, cache: "no-store" });
      if (r.ok) {
        const d = await r.json();
        if (d.seq !== lastSeq) { lastSeq = d.seq; lastAt = Date.now(); show(d); }
      } else {
        set("error", "state: HTTP " + r.status); $("error").hidden = false;
      }
    } catch (e) {
      set("error", "state: " + e); $("error").hidden = false;
    }
    $("stale").hidden = Date.now() - lastAt < 3000;
    setTimeout(poll, POLL_MS);
  }

  $("kill-token").value = token;
  $("kill-button").addEventListener("click", async () => {
    const tok = $("kill-token").value;
    if (!tok) { set("kill-result", "the token is needed"); return; }
    if (!window.confirm("Engage the kill switch? No new orders, resting ones cancelled, the run stops.")) return;
    const r = await fetch("/api/kill", {
      method: "POST", headers: { Authorization: "Bearer " + tok, "Content-Type": "application/json" },
      body: JSON.stringify({ confirm: "KILL" }),
    });
    const body = await r.json().catch(() => ({}));
    set("kill-result", r.status + " " + (body.kill || body.error || ""));
  });
  window.addEventListener("resize", () => {
    if (pnlChart) pnlChart.setSize(size($("chart-pnl")));
    if (latChart) latChart.setSize(size($("chart-lat")));
  });
  poll();
})();
