// The sweeps page: the signed-in user's sweeps, a sweep's trials and charts, the GPU pool
// (who holds each GPU, GPU-hours), promoted models.
// Plain JS against the tuner's REST API with the hub login cookie (same origin); it polls
// quickly while something runs and slowly otherwise.
"use strict";

const BASE = location.pathname.replace(/[^/]*$/, ""); // .../services/tuner/
const API = BASE + "api/v1/";
const HUB = BASE.replace(/services\/[^/]+\/$/, "") + "hub/";
const XSRF = document.querySelector('meta[name="xsrf-token"]').content;
const ACTIVE = new Set(["queued", "running", "cancelling", "pending"]);
const FAST_MS = 2000;
const SLOW_MS = 15000;

const state = { sweeps: [], selected: null, timer: null };

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

async function getJSON(path) {
  const response = await fetch(API + path, {
    credentials: "same-origin",
    // The hub login cookie counts for script requests only with the page's XSRF token.
    headers: { Accept: "application/json", "X-XSRFToken": XSRF },
  });
  if (response.status === 401 || response.status === 403) {
    // The login expired or lacks the tuner scopes: go through the hub's login again.
    location.reload();
    throw new Error("not signed in");
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      message = (await response.json()).error || message;
    } catch (_) { /* not JSON */ }
    throw new Error(`${path}: ${message}`);
  }
  return response.json();
}

// --- formatting ---------------------------------------------------------------------------

function fmtValue(value) {
  if (value === null || value === undefined) return "–";
  if (Math.abs(value) >= 1000 || (Math.abs(value) < 0.001 && value !== 0)) {
    return value.toExponential(3);
  }
  return value.toFixed(4);
}

function fmtTime(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  return date.toLocaleString(undefined, {
    month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
  });
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} m ${Math.round(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} m`;
}

function fmtParams(params) {
  return Object.entries(params || {})
    .map(([k, v]) => `${k}=${typeof v === "number" && !Number.isInteger(v) ? fmtValue(v) : v}`)
    .join(", ");
}

function badge(text) {
  return el("span", { class: `badge state-${text}` }, text);
}

// --- sweeps list --------------------------------------------------------------------------

function renderSweeps() {
  const body = $("sweeps").querySelector("tbody");
  body.replaceChildren();
  $("no-sweeps").hidden = state.sweeps.length > 0;
  $("sweeps").hidden = state.sweeps.length === 0;
  for (const sweep of state.sweeps) {
    const done = sweep.completed + sweep.pruned + sweep.failed;
    const pct = sweep.trials ? Math.round((100 * done) / sweep.trials) : 0;
    const row = el(
      "tr",
      {
        class: sweep.id === state.selected ? "selected" : "",
        dataset: { sweepId: sweep.id },
        tabindex: "0",
        onclick: () => select(sweep.id),
        onkeydown: (e) => { if (e.key === "Enter") select(sweep.id); },
      },
      el("td", {}, sweep.id),
      el("td", {}, el("a", { href: `#sweep=${sweep.id}` }, sweep.name)),
      el("td", {}, sweep.owner),
      el("td", {}, badge(sweep.state)),
      el("td", {},
        el("div", { class: "progress", title: `${done} of ${sweep.trials} trials` },
          el("div", { class: "bar", style: `width:${pct}%` })),
        el("span", { class: "muted small" }, ` ${done}/${sweep.trials}`)),
      el("td", {}, sweep.best_value === null ? "–"
        : `${fmtValue(sweep.best_value)} (#${sweep.best_trial})`),
      el("td", {}, fmtTime(sweep.created_at)),
    );
    body.append(row);
  }
}

function select(id) {
  state.selected = id;
  if (location.hash !== `#sweep=${id}`) history.replaceState(null, "", `#sweep=${id}`);
  refresh();
}

// --- one sweep ----------------------------------------------------------------------------

function renderDetail(sweep, trials, versions) {
  $("detail").hidden = false;
  $("detail-title").textContent = `Sweep ${sweep.id}: ${sweep.name}`;
  const stateBadge = $("detail-state");
  stateBadge.textContent = sweep.state;
  stateBadge.className = `badge state-${sweep.state}`;
  const best = sweep.best_value === null ? "no result yet"
    : `best ${sweep.metric} ${fmtValue(sweep.best_value)} (trial #${sweep.best_trial})`;
  $("detail-summary").textContent =
    `${sweep.direction} ${sweep.metric} · ${sweep.completed} completed, ${sweep.pruned} pruned, ` +
    `${sweep.failed} failed of ${sweep.trials} · ${best} · owner ${sweep.owner}`;
  const reason = $("detail-reason");
  reason.hidden = !sweep.reason;
  reason.replaceChildren();
  if (sweep.reason) reason.append(sweep.reason);
  if (sweep.cold_start) {
    reason.hidden = false;
    reason.append(el("div", { class: "muted" }, `Note: ${sweep.cold_start}`));
  }
  for (const v of versions) {
    reason.hidden = false;
    reason.append(el("span", { class: "model-chip" },
      `${v.model} v${v.version}`, v.stage ? el("b", {}, ` ${v.stage}`) : null));
  }

  const body = $("trials").querySelector("tbody");
  body.replaceChildren();
  for (const t of trials) {
    const isBest = t.number === sweep.best_trial && t.state === "completed";
    body.append(el("tr", { class: isBest ? "best" : "", dataset: { trial: t.number } },
      el("td", {}, t.number),
      el("td", {}, badge(t.state)),
      el("td", { class: "num" }, fmtValue(t.value)),
      el("td", { class: "params" }, fmtParams(t.params)),
      el("td", { class: "num" }, t.attempts),
      el("td", { class: "num" }, fmtDuration(t.duration_seconds)),
      gpuUseCell(t.gpu_use),
      el("td", { class: "muted" }, t.reason || (isBest ? "best" : "")),
    ));
  }
  drawHistory(sweep, trials);
  drawCurves(sweep, trials);
  drawPareto(sweep, trials, versions);
}

// A trial's measured GPU use: "unused" (flagged: it asked for a GPU and runs on the CPU),
// the share of its measured GPU time it used, or "–" without a GPU or figures.
function gpuUseCell(use) {
  if (!use) return el("td", { class: "muted" }, "–");
  if (use.unused) {
    return el("td", { class: "gpu-unused", title:
      `GPU ${use.unused_gpus.join(", ")}: no process on it, utilisation under the threshold` },
      badge("unused"));
  }
  if (!use.measured_seconds) return el("td", { class: "muted", title: use.absent || "" }, "–");
  return el("td", { class: "num" }, `${Math.round((100 * use.used_seconds) / use.measured_seconds)} % used`);
}

function fmtBytes(n) {
  return n === null || n === undefined ? "–" : `${(n / 2 ** 30).toFixed(1)} GiB`;
}

const PLOT_LAYOUT = {
  margin: { l: 56, r: 16, t: 8, b: 44 },
  height: 280,
  paper_bgcolor: "rgba(0,0,0,0)",
  plot_bgcolor: "rgba(0,0,0,0)",
  font: { family: "system-ui, sans-serif", size: 12, color: "#333" },
  legend: { orientation: "h", y: -0.25 },
  xaxis: { gridcolor: "#eee", zeroline: false },
  yaxis: { gridcolor: "#eee", zeroline: false },
};

function plot(id, traces, xTitle, yTitle) {
  if (!window.Plotly) return;
  const layout = structuredClone(PLOT_LAYOUT);
  layout.xaxis.title = { text: xTitle };
  layout.yaxis.title = { text: yTitle };
  Plotly.react($(id), traces, layout, { displaylogo: false, responsive: true });
}

function drawHistory(sweep, trials) {
  // Like optuna.visualization.plot_optimization_history: each trial's value and the best so far.
  const done = trials.filter((t) => t.state === "completed" && t.value !== null)
    .sort((a, b) => a.number - b.number);
  const better = sweep.direction === "minimize" ? Math.min : Math.max;
  let best = null;
  const bestSoFar = done.map((t) => (best = best === null ? t.value : better(best, t.value)));
  plot("history-chart", [
    { x: done.map((t) => t.number), y: done.map((t) => t.value), mode: "markers",
      name: "trial value", marker: { color: "#1f77b4", size: 8 },
      hovertemplate: "trial %{x}<br>%{y}<extra></extra>" },
    { x: done.map((t) => t.number), y: bestSoFar, mode: "lines", name: "best so far",
      line: { color: "#d62728", shape: "hv" } },
  ], "trial", sweep.metric || "value");
}

function drawCurves(sweep, trials) {
  const traces = trials
    .filter((t) => (t.intermediate_values || []).length > 0)
    .map((t) => ({
      x: t.intermediate_values.map((p) => p.step),
      y: t.intermediate_values.map((p) => p.value),
      mode: "lines+markers",
      name: `#${t.number} ${t.state}`,
      opacity: t.state === "pruned" ? 0.45 : 1,
      line: { dash: t.state === "pruned" ? "dot" : "solid" },
      marker: { size: 4 },
    }));
  plot("curves-chart", traces, "step", sweep.metric || "value");
}

// The Pareto front of a sweep that trades its metric against a cost (several metrics, or a
// promotion budget), drawn as tuner/sdk/pareto.py draws it for sweep.plot(): the metric on y,
// the first budgeted cost (else the second metric) on x, the budget as a dashed line, and the
// model promoted from this sweep as a star.

function paretoAxes(spec) {
  const budget = (spec.promote && spec.promote.constraints) || {};
  const costs = Object.keys(budget).filter((m) => m !== spec.metric)
    .concat((spec.metrics || []).slice(1).map((o) => o.name));
  if (!costs.length) return null;
  const x = costs[0];
  const declared = (spec.metrics || []).find((o) => o.name === x);
  const xDirection = declared ? declared.direction : "minimize";
  return { x, y: spec.metric, xDirection, bound: x in budget ? budget[x] : null };
}

function paretoFront(points, xDirection, yDirection) {
  const sx = xDirection === "minimize" ? 1 : -1;
  const sy = yDirection === "minimize" ? 1 : -1;
  const front = [];
  let bestY = null;
  for (const p of [...points].sort((a, b) => sx * (a.x - b.x) || sy * (a.y - b.y))) {
    if (bestY === null || sy * p.y < bestY) {
      front.push(p);
      bestY = sy * p.y;
    }
  }
  return front;
}

function drawPareto(sweep, trials, versions) {
  const axes = paretoAxes(sweep.spec || {});
  $("pareto-figure").hidden = axes === null;
  if (axes === null) return;
  const points = trials.filter((t) => t.state === "completed" && t.value !== null)
    .map((t) => ({ n: t.number, x: { ...(t.metrics || {}), [axes.y]: t.value }[axes.x], y: t.value }))
    .filter((p) => typeof p.x === "number");
  const front = paretoFront(points, axes.xDirection, sweep.direction);
  const traces = [
    { x: points.map((p) => p.x), y: points.map((p) => p.y), mode: "markers", name: "trials",
      marker: { color: "#999", size: 8 }, text: points.map((p) => `trial ${p.n}`) },
    { x: front.map((p) => p.x), y: front.map((p) => p.y), mode: "lines+markers",
      name: "Pareto front", line: { color: "#1f77b4", shape: "hv" },
      text: front.map((p) => `trial ${p.n}`) },
  ];
  const chosen = versions.length ? points.find((p) => p.n === versions[0].trial_number) : null;
  if (chosen) {
    traces.push({ x: [chosen.x], y: [chosen.y], mode: "markers", name: `chosen: trial ${chosen.n}`,
      marker: { color: "#2ca02c", size: 16, symbol: "star" } });
  }
  if (axes.bound !== null && points.length) {
    const ys = points.map((p) => p.y);
    traces.push({ x: [axes.bound, axes.bound], y: [Math.min(...ys), Math.max(...ys)],
      mode: "lines", name: `budget ${axes.x} ${axes.bound}`,
      line: { color: "#d62728", dash: "dash" } });
  }
  const chart = $("pareto-chart");
  chart.dataset.front = front.map((p) => p.n).join(",");
  chart.dataset.chosen = chosen ? String(chosen.n) : "";
  chart.dataset.budget = axes.bound === null ? "" : `${axes.x} ${axes.bound}`;
  plot("pareto-chart", traces, `${axes.x} (${axes.xDirection})`, `${axes.y} (${sweep.direction})`);
}

// --- models -------------------------------------------------------------------------------

async function loadPromotedVersions() {
  const models = await getJSON("models");
  const names = models.map((m) => (typeof m === "string" ? m : m.name || m.model));
  const lists = await Promise.all(names.map((n) => getJSON(`models/${encodeURIComponent(n)}`)));
  return lists.flat();
}

function renderModels(versions) {
  const promoted = versions.filter((v) => v.stage)
    .sort((a, b) => a.model.localeCompare(b.model) || b.version - a.version);
  $("no-models").hidden = promoted.length > 0;
  $("models").hidden = promoted.length === 0;
  const body = $("models").querySelector("tbody");
  body.replaceChildren();
  for (const v of promoted) {
    body.append(el("tr", { dataset: { model: v.model, version: v.version } },
      el("td", {}, v.model),
      el("td", { class: "num" }, v.version),
      el("td", {}, badge(v.stage)),
      el("td", {}, `${v.metric} ${fmtValue(v.metric_value)}`),
      el("td", {}, v.sweep_id === null ? "–" : el("a", { href: `#sweep=${v.sweep_id}` },
        `sweep ${v.sweep_id}, trial #${v.trial_number}`)),
      el("td", {}, fmtTime(v.promoted_at)),
      el("td", { class: "path" }, v.path),
    ));
  }
}

// --- the GPU pool (everyone's holders: public inside the lab) -----------------------------

const USAGE_DAYS = 30;

async function loadPool() {
  const since = new Date(Date.now() - USAGE_DAYS * 86400e3).toISOString().slice(0, 19);
  const [pool, usage] = await Promise.all([
    getJSON("pool"), getJSON(`usage?since=${encodeURIComponent(since)}`),
  ]);
  $("pool-summary").textContent =
    `${pool.held} of ${pool.total} GPUs held (${pool.gpu_source})`;
  const body = $("pool-gpus").querySelector("tbody");
  body.replaceChildren(...pool.gpus.map((g) => {
    const h = g.holder;
    return el("tr", { dataset: { gpu: g.gpu } },
      el("td", {}, g.gpu), el("td", {}, badge(g.state)),
      el("td", {}, h ? h.person : "–"),
      el("td", {}, h ? h.what : (g.state === "held" ? "unknown" : "–")),
      el("td", {}, g.since_iso ? `${fmtTime(g.since_iso)} (${fmtDuration(g.held_seconds)})` : "–"),
      el("td", { title: g.measure_absent || "" }, g.utilization === null || g.utilization === undefined
        ? "–" : `${Math.round(g.utilization * 100)} %`),
      el("td", {}, g.memory_used_bytes === null || g.memory_used_bytes === undefined ? "–"
        : `${fmtBytes(g.memory_used_bytes)} of ${fmtBytes(g.memory_total_bytes)}`));
  }));
  renderFlavors(pool);
  renderPoolQueue(pool);
  const rows = [];
  for (const by of ["person", "group", "sweep", "notebook"]) {
    for (const [name, hours] of Object.entries(usage[by] || {})) {
      const used = (usage.used && usage.used[by] && usage.used[by][name]) || 0;
      rows.push(el("tr", {}, el("td", {}, by), el("td", {}, name),
        el("td", {}, hours.toFixed(2)), el("td", {}, used.toFixed(2))));
    }
  }
  $("pool-usage").querySelector("tbody").replaceChildren(...rows);
  $("pool-usage").hidden = rows.length === 0;
  $("no-usage").hidden = rows.length > 0;
}

// Kubernetes: each Kueue flavor's quota and use, and the parts of the cluster the tuner could
// not read (absent on one machine).
function renderFlavors(pool) {
  const flavors = pool.flavors || [];
  $("pool-flavors").querySelector("tbody").replaceChildren(...flavors.map((f) =>
    el("tr", { dataset: { flavor: f.flavor } },
      el("td", {}, f.flavor), el("td", {}, f.resource), el("td", {}, String(f.nominal)),
      el("td", {}, String(f.used)), el("td", {}, String(f.borrowed)),
      el("td", {}, String(f.free)))));
  $("pool-flavors").hidden = flavors.length === 0;
  const errors = pool.errors || [];
  $("pool-errors").textContent = errors.map((e) => `not read: ${e}`).join("; ");
  $("pool-errors").hidden = errors.length === 0;
}

// The queue by position (who, what, why) and each person's and group's weight and cap: only
// the tuner service keeps them (absent on a pool without one).
function renderPoolQueue(pool) {
  const queue = pool.queue || [];
  $("pool-queue").querySelector("tbody").replaceChildren(...queue.map((q) =>
    el("tr", { dataset: { position: q.position, person: q.person } },
      el("td", {}, String(q.position)), el("td", {}, q.person), el("td", {}, q.what),
      el("td", {}, String(q.gpus)), el("td", {}, q.priority || "notebook"),
      el("td", {}, q.reason))));
  $("pool-queue").hidden = queue.length === 0;
  $("no-queue").hidden = queue.length > 0;
  const cap = (n) => (n === null || n === undefined ? "–" : String(n));
  const shares = (pool.shares || []).map((r) =>
    el("tr", { dataset: { person: r.person } },
      el("td", {}, r.person), el("td", {}, r.account), el("td", {}, String(r.weight)),
      el("td", {}, cap(r.max_gpus)), el("td", {}, String(r.held_gpus)),
      el("td", {}, String(r.waiting_gpus)), el("td", {}, r.share.toFixed(2)),
      el("td", {}, `${r.fair_share_gpus} GPUs`)));
  for (const g of pool.groups || []) {
    shares.push(el("tr", { dataset: { group: g.group } },
      el("td", {}, `group ${g.group}`),
      el("td", {}, g.members ? `members: ${g.members.join(", ") || "none"}` : "–"),
      el("td", {}, String(g.weight)),
      el("td", {}, cap(g.max_gpus)), el("td", {}, String(g.held_gpus)), el("td", {}, "–"),
      el("td", {}, "–"), el("td", {}, "–")));
  }
  $("pool-shares").querySelector("tbody").replaceChildren(...shares);
  $("pool-shares").hidden = shares.length === 0;
  $("shares-error").textContent = pool.shares_error || "";
  $("shares-error").hidden = !pool.shares_error;
}

// --- refresh loop -------------------------------------------------------------------------

async function refresh() {
  clearTimeout(state.timer);
  let busy = false;
  try {
    state.sweeps = await getJSON("sweeps");
    state.sweeps.sort((a, b) => b.id - a.id);
    if (state.selected === null && state.sweeps.length) state.selected = state.sweeps[0].id;
    renderSweeps();
    busy = state.sweeps.some((s) => ACTIVE.has(s.state));
    await loadPool();
    const versions = await loadPromotedVersions();
    renderModels(versions);
    const sweep = state.sweeps.find((s) => s.id === state.selected);
    if (sweep) {
      const trials = await getJSON(`sweeps/${sweep.id}/trials`);
      renderDetail(sweep, trials, versions.filter((v) => v.sweep_id === sweep.id && v.stage));
    } else {
      $("detail").hidden = true;
    }
    $("error").hidden = true;
    $("refresh-status").textContent =
      `updated ${new Date().toLocaleTimeString()}${busy ? " · live" : ""}`;
  } catch (err) {
    $("error").textContent = `Could not load: ${err.message}`;
    $("error").hidden = false;
  }
  state.timer = setTimeout(refresh, busy ? FAST_MS : SLOW_MS);
}

function selectFromHash() {
  const match = location.hash.match(/sweep=(\d+)/);
  if (match) state.selected = Number(match[1]);
}

window.addEventListener("hashchange", () => { selectFromHash(); refresh(); });
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
document.addEventListener("DOMContentLoaded", () => {
  for (const a of document.querySelectorAll('a[href="/hub/home"]')) a.href = HUB + "home";
  selectFromHash();
  refresh();
});
