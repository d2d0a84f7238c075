// tokenmill dashboard: polls the JSON routes every second, no libraries, no build step.
"use strict";
const FINAL = new Set(["succeeded", "completed_with_errors", "cancelled", "failed"]);
const POLL_MS = 1000, SERIES_MAX = 300;
const state = { key: "", selected: null, jobs: new Map(), series: new Map(), last: new Map() };

function keyFromPage() {
  const m = location.hash.match(/key=([^&]+)/);
  if (m) { localStorage.setItem("tokenmill-key", decodeURIComponent(m[1])); history.replaceState(null, "", location.pathname); }
  return localStorage.getItem("tokenmill-key") || "";
}

async function api(path) {
  const res = await fetch(path, { headers: { Authorization: "Bearer " + state.key } });
  const body = await res.json();
  if (!res.ok) throw new Error((body.error && body.error.message) || res.statusText);
  return body;
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%"; }

function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const [k, v] of Object.entries(attrs || {})) tr.dataset[k] = v;
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  return tr;
}

function statusCell(status) { return el("td", status, "status s-" + status); }

function fill(tbody, rows) { tbody.replaceChildren(...rows); }

function track(job) {
  // output tokens/s between two polls; a chart point per poll while the job runs
  const p = job.progress, now = Date.now() / 1000, prev = state.last.get(job.id);
  state.last.set(job.id, { t: now, tokens: p.output_tokens });
  if (!prev || FINAL.has(job.status) && prev.final) return;
  const dt = now - prev.t, rate = dt > 0 ? Math.max(0, (p.output_tokens - prev.tokens) / dt) : 0;
  const series = state.series.get(job.id) || [];
  series.push({ t: now, v: rate });
  if (series.length > SERIES_MAX) series.shift();
  state.series.set(job.id, series);
  if (FINAL.has(job.status)) state.last.get(job.id).final = true;
}

function liveGauges(job) {
  const running = job.shards.filter(s => s.kv_usage !== null && s.kv_usage !== undefined);
  const latest = running.sort((a, b) => (a.updated_s_ago ?? 1e9) - (b.updated_s_ago ?? 1e9))[0];
  return latest ? { kv: latest.kv_usage, hits: latest.prefix_hit_rate } : { kv: null, hits: null };
}

function drawChart(series) {
  const canvas = document.getElementById("chart"), ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 44, B = 20;
  ctx.clearRect(0, 0, W, H);
  ctx.strokeStyle = "#d8dde4"; ctx.fillStyle = "#6e7781"; ctx.font = "11px system-ui";
  const max = Math.max(1, ...series.map(p => p.v));
  for (let i = 0; i <= 4; i++) {
    const y = H - B - (H - B - 8) * i / 4;
    ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(W - 4, y); ctx.stroke();
    ctx.fillText((max * i / 4).toFixed(max < 8 ? 1 : 0), 4, y + 4);
  }
  if (series.length < 2) { ctx.fillText("waiting for data", L + 8, H / 2); return; }
  const t0 = series[0].t, span = Math.max(1, series[series.length - 1].t - t0);
  ctx.fillText("0 s", L, H - 4); ctx.fillText(span.toFixed(0) + " s", W - 40, H - 4);
  ctx.strokeStyle = "#0969da"; ctx.lineWidth = 2; ctx.beginPath();
  series.forEach((p, i) => {
    const x = L + (W - L - 8) * (p.t - t0) / span, y = H - B - (H - B - 8) * p.v / max;
    i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
  });
  ctx.stroke();
}

function renderJobs() {
  const rows = [...state.jobs.values()].map(job => {
    const p = job.progress || {}, g = job.shards ? liveGauges(job) : { kv: null, hits: null };
    const done = (p.shards_done || 0) + (p.shards_skipped || 0);
    const tr = row([el("td", job.id), el("td", job.kind), statusCell(job.status),
      el("td", job.shards ? `${done} / ${p.shards_total}` : "–"), el("td", p.rows_done ?? "–"),
      el("td", p.tokens_per_s ?? "–"), el("td", pct(g.kv)), el("td", pct(g.hits))],
      { jobId: job.id, status: job.status });
    if (job.id === state.selected) tr.className = "selected";
    tr.onclick = () => { state.selected = job.id; render(); };
    return tr;
  });
  fill(document.querySelector("#jobs tbody"), rows);
}

function renderDetail() {
  const job = state.jobs.get(state.selected), section = document.getElementById("detail");
  section.hidden = !job || !job.shards;
  if (section.hidden) return;
  document.getElementById("detail-id").textContent = job.id;
  const badge = document.getElementById("detail-status");
  badge.textContent = job.status; badge.className = "badge s-" + job.status;
  const g = liveGauges(job), p = job.progress;
  const gauges = [["rows done", p.rows_done], ["row errors", p.errors], ["output tokens", p.output_tokens],
    ["mean output tok/s", p.tokens_per_s], ["KV in use", pct(g.kv)], ["prefix-cache hit rate", pct(g.hits)],
    ["elapsed", p.elapsed_s + " s"]];
  fill(document.getElementById("gauges"), gauges.flatMap(([k, v]) => [el("dt", k), el("dd", v)]));
  fill(document.querySelector("#shards tbody"), job.shards.map(s => row(
    [el("td", s.index), statusCell(s.state), el("td", s.rows_done), el("td", s.errors), el("td", s.output_tokens),
     el("td", s.worker || ""), el("td", s.reason || "")], { shard: s.index, state: s.state })));
  drawChart(state.series.get(job.id) || []);
}

function renderFailed() {
  const rows = [];
  for (const job of state.jobs.values())
    for (const s of job.shards || [])
      if (s.state === "failed") rows.push(row([el("td", job.id), el("td", s.index), el("td", s.reason || "")]));
  fill(document.querySelector("#failed tbody"), rows);
}

function renderBatches(batches) {
  fill(document.querySelector("#batches tbody"), batches.map(b => {
    const c = b.request_counts || {};
    const tr = row([el("td", b.id), statusCell(b.status), el("td", c.completed), el("td", c.failed), el("td", c.total),
      el("td", b.output_file_id || ""), el("td", b.error_file_id || ""),
      el("td", new Date(b.created_at * 1000).toLocaleTimeString())], { batchId: b.id, status: b.status });
    if (b.tokenmill_job_id) tr.onclick = () => { state.selected = b.tokenmill_job_id; render(); };
    return tr;
  }));
}

function render() { renderJobs(); renderDetail(); renderFailed(); }

async function poll() {
  const error = document.getElementById("error");
  try {
    if (!state.key) throw new Error("enter an API key above");
    const [jobs, batches] = await Promise.all([api("/v1/jobs"), api("/v1/batches?limit=100")]);
    for (const summary of jobs.data) {
      const known = state.jobs.get(summary.id);
      if (known && known.shards && FINAL.has(known.status)) continue;  // finished: nothing moves any more
      try {
        const job = await api("/v1/jobs/" + encodeURIComponent(summary.id));
        track(job);
        state.jobs.set(summary.id, job);
      } catch (e) { state.jobs.set(summary.id, { ...summary, progress: {} }); }
    }
    if (!state.selected || !state.jobs.has(state.selected)) {
      const active = [...state.jobs.values()].find(j => !FINAL.has(j.status));
      state.selected = (active || jobs.data[0] || {}).id || null;
    }
    render();
    renderBatches(batches.data);
    error.hidden = true;
  } catch (e) {
    error.textContent = e.message; error.hidden = false;
  }
  setTimeout(poll, POLL_MS);
}

async function health() {
  try {
    const h = await (await fetch("/healthz")).json();
    document.getElementById("health").textContent = `${h.mode} · model ${h.model}`;
  } catch (e) { /* the poll shows errors */ }
}

document.getElementById("keyform").onsubmit = ev => {
  ev.preventDefault();
  state.key = document.getElementById("apikey").value.trim();
  localStorage.setItem("tokenmill-key", state.key);
};
state.key = keyFromPage();
document.getElementById("apikey").value = state.key;
health();
poll();
