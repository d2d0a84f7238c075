// tokenmill dashboard: polls the JSON routes every second, no libraries, no build step.
"use strict";
const FINAL = new Set(["succeeded", "completed_with_errors", "cancelled", "failed"]);
const POLL_MS = 1000, SERIES_MAX = 300, WINDOW_S = 3;
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
  // output tokens/s over the last WINDOW_S seconds of polls (workers report about once a second)
  const now = Date.now() / 1000, tokens = job.progress.output_tokens;
  const polls = state.last.get(job.id) || [];
  polls.push({ t: now, tokens });
  while (polls.length > 2 && now - polls[1].t >= WINDOW_S) polls.shift();
  state.last.set(job.id, polls);
  if (polls.length < 2) return;
  const first = polls[0], rate = Math.max(0, (tokens - first.tokens) / Math.max(1e-3, now - first.t));
  const series = state.series.get(job.id) || [];
  series.push({ t: now, v: rate });
  if (series.length > SERIES_MAX) series.shift();
  state.series.set(job.id, series);
}

function liveGauges(job) {
  // KV use: the latest reading a worker reported for this job; prefix hits: the job's cached prompt share
  const read = job.shards.filter(s => s.kv_usage !== null && s.kv_usage !== undefined);
  const latest = read.sort((a, b) => (a.updated_s_ago ?? 1e9) - (b.updated_s_ago ?? 1e9))[0];
  const p = job.progress || {};
  return { kv: latest ? latest.kv_usage : null, hits: p.prompt_tokens ? p.cached_prompt_tokens / p.prompt_tokens : null };
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
  const jobs = [...state.jobs.values()].sort((a, b) => (b.created_at || 0) - (a.created_at || 0));
  const rows = jobs.map(job => {
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
    ["mean output tok/s", p.tokens_per_s], ["KV in use (latest)", pct(g.kv)],
    ["prompt tokens from the prefix cache", pct(g.hits)],
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
