// Single-page profile UI: Profiles, Dashboard and Timeline, routed by the URL hash.
import { fmtNs, fmtPct, fmtInt, fmtBytes, esc, colourFor } from "./format.js";
import { lineChart, histogramChart, stackedBar, horizontalBars, heatmap, busyColour, relativeColour, busyRGB, relativeRGB, disposeCharts } from "./charts.js";

const page = document.getElementById("page");
const state = { profileId: localStorage.getItem("profileId"), dashboard: null, opening: null, pollTimer: null, jobsTimer: null, jobsPolls: 0, timeline: null };
window.__ui = state; // read by the browser tests

// Every request carries the UI's header: the server refuses a POST without it (CSRF defence,
// ui/guards.py), which another site's page cannot add without a CORS preflight we never allow.
async function api(path, options = {}) {
  const headers = { "X-Trainium-UI": "1", ...(options.headers || {}) };
  const response = await fetch(path, { ...options, headers });
  if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
  return response.json();
}
const q = encodeURIComponent;

function setProfile(id) {
  state.profileId = id;
  state.dashboard = null;
  if (id) localStorage.setItem("profileId", id); else localStorage.removeItem("profileId");
  linkNav();
}

// Deep links: every view of a profile has a URL (#/dashboard?profile=<id>,
// #/timeline?profile=<id>&step=N), so a link in a status, an event or a chat opens that view.
function hashParams() {
  return new URLSearchParams(location.hash.split("?")[1] || "");
}
function viewLink(view, id, extra = {}) {
  const params = new URLSearchParams({ profile: id, ...extra });
  return `#/${view}?${params.toString()}`;
}
function linkNav() {
  for (const a of document.querySelectorAll("nav a")) {
    const view = a.dataset.page;
    a.setAttribute("href", state.profileId && view !== "profiles" ? viewLink(view, state.profileId) : `#/${view}`);
  }
}

function showCurrent(overview) {
  const el = document.getElementById("current-profile");
  el.innerHTML = overview
    ? `<b>${esc(overview.namespace ? overview.namespace + "/" : "")}${esc(overview.job_name)}</b> · ${overview.nodes.length} nodes · ${overview.ranks} ranks · ${fmtInt(overview.events)} events`
    : "No profile loaded";
}

function route() {
  const name = (location.hash.replace(/^#\/?/, "").split("?")[0]) || "profiles";
  const linked = hashParams().get("profile");
  if (linked && linked !== state.profileId) setProfile(linked);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === name);
  clearInterval(state.pollTimer);
  clearInterval(state.jobsTimer);
  disposeCharts();
  delete page.dataset.ready;
  if (state.timeline) { state.timeline.destroy(); state.timeline = null; }
  page.classList.toggle("wide", name === "timeline");
  const render = { profiles: renderProfiles, dashboard: renderDashboard, timeline: renderTimeline }[name] || renderProfiles;
  render().catch((err) => { page.innerHTML = `<div class="card empty">${esc(err.message)}</div>`; });
}
window.addEventListener("hashchange", route);

// ------------------------------------------------------------------ profiles

// The list's search (job name) and status filter, applied by the server (/api/profiles?q=&status=).
const filter = { q: "", status: "" };
window.__ui.filter = filter;

async function renderProfiles() {
  page.innerHTML = `
    <h1>Profiles</h1>
    <p class="sub" id="profiles-root"></p>
    <div class="filters">
      <input type="search" id="profile-search" data-testid="profile-search" placeholder="Search by job name" value="${esc(filter.q)}" autocomplete="off">
      <select id="profile-status" data-testid="profile-status"><option value="">All statuses</option></select>
      <span class="hint" id="profiles-count"></span>
    </div>
    <div id="profiles-body"></div>`;
  const search = document.getElementById("profile-search");
  let timer = null;
  search.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => { filter.q = search.value; refreshProfiles(); }, 150);
  });
  document.getElementById("profile-status").addEventListener("change", (event) => {
    filter.status = event.target.value;
    refreshProfiles();
  });
  await refreshProfiles();
}

async function refreshProfiles() {
  const data = await api(`/api/profiles?q=${q(filter.q)}&status=${q(filter.status)}`);
  const body = document.getElementById("profiles-body");
  if (!body) return; // navigated away
  const busy = data.profiles.some((p) => p.state === "loading" || (p.summaries && ["queued", "summarising"].includes(p.summaries.state)));
  const where = data.source === "s3" ? "in S3 under" : "under";
  document.getElementById("profiles-root").innerHTML = `Profiles ${where} <code>${esc(data.root)}</code>. Load one to open its dashboard and timeline.${data.source === "s3" ? " Only uploads whose manifest is there can be loaded." : ""}`;
  const select = document.getElementById("profile-status");
  const statuses = [...new Set([...data.statuses, filter.status].filter(Boolean))].sort();
  select.innerHTML = `<option value="">All statuses</option>` + statuses.map((s) => `<option value="${esc(s)}"${s === filter.status ? " selected" : ""}>${esc(s)}</option>`).join("");
  document.getElementById("profiles-count").textContent = `${data.profiles.length} of ${data.total} profiles`;
  body.innerHTML = `
    ${data.profiles_error ? `<div class="warnings" data-testid="profiles-error">Profiles could not be listed: ${esc(data.profiles_error)}</div>` : ""}
    <div id="jobs-card"></div>
    <div class="card">
      <div class="card-head"><h2>${data.source === "s3" ? "Profiles in S3" : "Profile directories"}</h2><span class="hint">${data.profiles.length} shown</span></div>
      ${data.profiles.length ? `<div class="scroll" style="max-height:none"><table data-testid="profiles-table">
        <thead><tr><th>Profile</th><th class="l">Job</th><th>Attempt</th><th class="l">Created</th><th>Nodes</th><th>Ranks</th><th>Size</th><th class="l">Status</th><th class="l">State</th><th></th></tr></thead>
        <tbody>${data.profiles.map(profileRow).join("")}</tbody></table></div>` : `<div class="empty">${data.total ? "No profile matches the search." : "No profiles here yet."}</div>`}
    </div>`;
  for (const button of body.querySelectorAll("[data-action]")) button.addEventListener("click", onProfileAction);
  renderJobs(data);
  clearInterval(state.jobsTimer);
  if (data.jobs !== null || data.jobs_error) state.jobsTimer = setInterval(pollJobs, JOBS_POLL_MS);
  clearInterval(state.pollTimer);
  if (busy) state.pollTimer = setInterval(() => { if (location.hash.startsWith("#/profiles") || !location.hash) refreshProfiles(); }, 1000);
}

// The TrainingJobs card: live progress and health, refreshed from /api/jobs every few seconds
// while the Profiles page is open (the profile list itself is not re-read). Every string from
// a job's status goes through esc(): it is data, never markup.
const JOBS_POLL_MS = 5000;
const HEALTH_LABELS = { healthy: "healthy", stalled: "stalled", straggler: "straggler", restarting: "restarting", inactive: "–" };

function jobsCard(data) {
  if (data.jobs_error) return `<div class="warnings" data-testid="jobs-error">TrainingJobs could not be listed: ${esc(data.jobs_error)}</div>`;
  return `<div class="card" style="margin-bottom:16px">
    <div class="card-head"><h2>TrainingJobs</h2><span class="hint" data-testid="jobs-updated">${data.jobs.length} jobs · live, every ${JOBS_POLL_MS / 1000} s · updated ${new Date().toLocaleTimeString("en-GB")}</span></div>
    ${data.jobs.length ? `<div class="scroll" style="max-height:none"><table data-testid="jobs-table"><thead><tr><th>Job</th><th class="l">Namespace</th><th class="l">Status</th><th class="l">Health</th><th>Step</th><th>Step p50</th><th>Rate</th><th>ETA</th><th>Last progress</th><th>Restarts</th><th></th></tr></thead><tbody>
    ${data.jobs.map(jobRow).join("")}
    </tbody></table></div>` : `<div class="empty">No TrainingJob here.</div>`}</div>`;
}

function fmtStep(j) {
  if (j.step === null || j.step === undefined) return "–";
  const total = j.total_steps !== null && j.total_steps !== undefined ? ` / ${fmtInt(j.total_steps)}` : "";
  const fastest = j.max_step !== null && j.max_step !== undefined && j.max_step !== j.step ? `<div class="hint">fastest ${fmtInt(j.max_step)}</div>` : "";
  return `${fmtInt(j.step)}${total}${fastest}`;
}

function fmtRate(j) {
  if (j.steps_per_second === null || j.steps_per_second === undefined) return "–";
  const extra = j.tokens_per_second ? `<div class="hint">${fmtInt(Math.round(j.tokens_per_second))} tokens/s</div>`
    : j.samples_per_second ? `<div class="hint">${fmtInt(Math.round(j.samples_per_second))} samples/s</div>` : "";
  return `${j.steps_per_second.toFixed(2)} steps/s${extra}`;
}

// "42 s ago" from an RFC 3339 time; the time itself is the cell's title.
function fmtAgo(time) {
  if (!time) return "–";
  const at = Date.parse(time);
  if (Number.isNaN(at)) return esc(time);
  const s = Math.max(0, Math.round((Date.now() - at) / 1000));
  const text = s < 90 ? `${s} s ago` : s < 5400 ? `${Math.round(s / 60)} min ago` : `${(s / 3600).toFixed(1)} h ago`;
  return `<span title="${esc(time)}">${text}</span>`;
}

function fmtRestarts(r) {
  if (!r || !r.total) return "0";
  const parts = [["application", r.application], ["infrastructure", r.infrastructure], ["stall", r.stall]].filter(([, n]) => n);
  return `${fmtInt(r.total)}<div class="hint">${parts.map(([kind, n]) => `${esc(kind)} ${fmtInt(n)}`).join(" · ")}</div>`;
}

function jobRow(j) {
  const health = HEALTH_LABELS[j.health] ? j.health : "inactive";
  const profile = j.profile_id ? `<button class="btn small primary" data-action="load" data-id="${esc(j.profile_id)}">Load profile</button>`
    : `<span class="hint">${j.profiling === false ? "profiling off" : "no profile yet"}</span>`;
  return `<tr data-job="${esc(j.namespace)}/${esc(j.name)}" data-health="${esc(health)}"><td title="created ${esc(j.created)}">${esc(j.name)}</td><td class="l">${esc(j.namespace)}</td>
    <td class="l"><span class="pill status-${esc(String(j.status).toLowerCase())}">${esc(j.status)}</span></td>
    <td class="l health-cell"><span class="health ${esc(health)}" data-testid="job-health">${esc(HEALTH_LABELS[health])}</span>${j.health_reason ? `<div class="hint reason" data-testid="job-health-reason">${esc(j.health_reason)}</div>` : ""}</td>
    <td data-testid="job-step">${fmtStep(j)}</td>
    <td data-testid="job-p50">${j.step_time_p50_ms !== null && j.step_time_p50_ms !== undefined ? fmtNs(j.step_time_p50_ms * 1e6) : "–"}</td>
    <td data-testid="job-rate">${fmtRate(j)}</td>
    <td data-testid="job-eta">${j.eta_summary ? esc(j.eta_summary) : "–"}${j.eta ? `<div class="hint">${esc(j.eta)}</div>` : ""}</td>
    <td data-testid="job-last-progress">${fmtAgo(j.last_progress_time)}</td>
    <td data-testid="job-restarts">${fmtRestarts(j.restarts)}</td>
    <td>${profile}</td></tr>`;
}

function renderJobs(data) {
  const card = document.getElementById("jobs-card");
  if (!card) return;
  card.innerHTML = data.jobs !== null || data.jobs_error ? jobsCard(data) : "";
  for (const button of card.querySelectorAll("[data-action]")) button.addEventListener("click", onProfileAction);
  state.jobsPolls = (state.jobsPolls || 0) + 1; // read by the browser tests
}

async function pollJobs() {
  if (!document.getElementById("jobs-card")) return;
  try {
    renderJobs(await api(`/api/jobs?q=${q(filter.q)}&status=${q(filter.status)}`));
  } catch (err) { // keep the last rows; say the refresh failed
    const hint = document.querySelector("[data-testid=jobs-updated]");
    if (hint) hint.textContent = `refresh failed: ${err.message}`;
  }
}

function profileRow(p) {
  const label = p.namespace ? `${p.namespace}/${p.job_name}` : p.job_name;
  const actions = !p.loadable
    ? `<span class="hint" title="${esc(p.manifest_problem || "")}">not loadable</span>`
    : p.state === "loaded"
    ? `<button class="btn small primary" data-action="open" data-id="${esc(p.id)}">Open</button> <button class="btn small" data-action="unload" data-id="${esc(p.id)}">Unload</button>`
    : p.state === "loading" ? `<span class="spinner"></span>${p.progress && p.progress.total ? ` <span class="hint">${fmtInt(p.progress.done)}/${fmtInt(p.progress.total)}</span>` : ""}`
    : `<button class="btn small primary" data-action="load" data-id="${esc(p.id)}">Load</button>`;
  return `<tr data-profile="${esc(p.id)}"><td class="name" title="${esc(p.path)}">${esc(p.id)}</td><td class="l">${esc(label)}</td><td>${p.attempt}</td>
    <td class="l">${esc(p.created || "–")}</td><td>${p.nodes}</td><td>${p.ranks}</td><td>${fmtBytes(p.bytes)}</td>
    <td class="l"><span class="pill status-${esc(p.status.toLowerCase())}" data-testid="profile-status-badge" title="${esc(p.manifest_problem || "")}">${esc(p.status)}</span></td>
    <td class="l">${!p.loadable ? `<span class="badge error" title="${esc(p.manifest_problem || "")}">incomplete upload</span>` : `<span class="badge ${p.state}" title="${esc(p.error || "")}">${p.state}${p.state === "loaded" ? ` · ${fmtInt(p.events)} events` : ""}</span>${p.state === "unloaded" ? summariesHint(p.summaries) : ""}`}</td>
    <td>${actions}</td></tr>`;
}

// Profiles the UI summarises in the background before anyone opens them (ui/background.py).
function summariesHint(s) {
  if (!s) return "";
  const text = s.state === "summarising" ? `summarising${s.total ? ` ${fmtInt(s.done)}/${fmtInt(s.total)}` : ""}`
    : s.state === "queued" ? "queued to summarise" : s.state === "ready" ? "summarised" : "not summarised";
  return ` <span class="hint" data-testid="summaries-state" data-state="${esc(s.state)}">${text}</span>`;
}

async function onProfileAction(event) {
  const { action, id } = event.currentTarget.dataset;
  if (action === "load") {
    await api(`/api/profiles/load?id=${q(id)}`, { method: "POST" });
    setProfile(id);
    refreshProfiles();
  } else if (action === "unload") {
    await api(`/api/profiles/unload?id=${q(id)}`, { method: "POST" });
    if (state.profileId === id) { setProfile(null); showCurrent(null); }
    refreshProfiles();
  } else if (action === "open") {
    setProfile(id);
    location.hash = viewLink("dashboard", id);
  }
}

// Opens a profile: POST /api/profiles/open answers its dashboard once the profile is loaded,
// or 202 with how far it is (its rank files being summarised, on the first open of a profile
// the UI has not summarised ahead); the page shows that and asks again. The first answer may
// already be on its way, asked for by open.js while the page loaded.
async function openDashboard(id, onProgress) {
  const early = window.__opening;
  window.__opening = null;
  let pending = early && early.id === id ? early.answer : null;
  for (;;) {
    const response = await (pending || fetch(`/api/profiles/open?id=${q(id)}`, { method: "POST", headers: { "X-Trainium-UI": "1" } }));
    pending = null;
    if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
    const body = await response.json();
    if (response.status !== 202) return body;
    onProgress(body.progress);
  }
}

const PHASES = {
  waiting: () => "Waiting for another profile to finish opening…",
  downloading: () => "Downloading the rank files…",
  summarising: (p) => `Summarising rank files: ${fmtInt(p.done)} of ${fmtInt(p.total)} (once per profile; later opens read the summaries)`,
  composing: () => "Composing the dashboard…",
  done: () => "Drawing…",
};
function showProgress(progress) {
  const el = document.getElementById("opening");
  if (!el || !progress) return;
  el.textContent = (PHASES[progress.phase] || PHASES.waiting)(progress);
  const bar = document.getElementById("opening-bar");
  if (bar && progress.total) { bar.max = progress.total; bar.value = progress.done; bar.hidden = false; }
}
function openingPlaceholder(what) {
  return `<div class="empty"><span class="spinner"></span> <span id="opening" data-testid="opening">Opening ${what}…</span><div><progress id="opening-bar" data-testid="opening-progress" hidden></progress></div></div>`;
}

// The current profile's dashboard, opening the profile first when it is not loaded (a deep
// link, or a profile the server let go of to stay within its memory budget). One open at a
// time per profile, whoever asks.
async function currentDashboard() {
  if (!state.profileId) return null;
  if (!state.dashboard) {
    const id = state.profileId;
    if (!state.opening || state.opening.id !== id) state.opening = { id, promise: openDashboard(id, showProgress) };
    let dashboard;
    try { dashboard = await state.opening.promise; }
    catch (err) {
      if (state.opening && state.opening.id === id) state.opening = null;
      if (state.profileId === id) { state.loadError = `Profile ${id} cannot be opened: ${err.message}`; setProfile(null); }
      return null;
    }
    if (state.opening && state.opening.id === id) state.opening = null;
    if (state.profileId !== id) return null; // another profile was chosen meanwhile
    state.dashboard = dashboard;
  }
  state.loadError = null;
  showCurrent(state.dashboard.overview);
  return state.dashboard;
}

function needProfile() {
  const why = state.loadError ? `<div class="warnings" data-testid="load-error">${esc(state.loadError)}</div>` : "";
  page.innerHTML = `${why}<div class="card empty">No profile loaded. <a class="link" href="#/profiles">Choose one on the Profiles page.</a></div>`;
}

// ------------------------------------------------------------------ dashboard

async function renderDashboard() {
  page.innerHTML = openingPlaceholder("the dashboard");
  const d = await currentDashboard();
  if (!d) return needProfile();
  const o = d.overview;
  const busy = d.utilisation.device_mean_busy;
  const meanBusy = busy.length ? busy.reduce((a, b) => a + b, 0) / busy.length : 0;
  const st = d.steps.stats;
  const perNode = (key) => (d.cpu.length ? d.cpu.reduce((a, c) => a + c[key], 0) / d.cpu.length : 0);
  const hostCores = perNode("host_mean_cores"), processCores = perNode("process_mean_cores");
  // A run without accelerator activity (CPU-only) says so, and shows the host operations of
  // the torch.profiler window where device kernels would be, instead of zeros.
  const acc = d.accelerator || { recorded: true };
  const cpuOnly = !acc.recorded;
  const windowText = acc.window ? ` (steps ${acc.window[0]}–${acc.window[1]})` : "";
  const notApplicable = (what) => `<div class="empty" data-testid="not-applicable">Not applicable: ${esc(what)} (no accelerator activity recorded).</div>`;
  page.innerHTML = `
    <h1>${esc(o.namespace ? o.namespace + "/" : "")}${esc(o.job_name)}</h1>
    <p class="sub">${o.nodes.length} nodes · ${o.ranks} ranks · ${fmtInt(o.events)} events over ${fmtNs(o.duration_ns)} · created ${esc(o.created || "–")}${o.step_window ? ` · detailed steps ${o.step_window[0]}–${o.step_window[1]}` : ""}</p>
    ${o.warnings.length ? `<div class="warnings" data-testid="warnings">${o.warnings.map(esc).join("<br>")}</div>` : ""}
    ${cpuOnly ? `<div class="notice" data-testid="no-accelerator"><b>No accelerator activity recorded.</b> Why: ${esc(acc.reason)}. Device panels show the host operations of the torch.profiler window${windowText} instead.</div>` : ""}
    <div class="kpis">
      ${kpi("Steps", fmtInt(st.count), "with step markers", "kpi-steps")}
      ${kpi("Step time p50", fmtNs(st.p50_ns), `p99 ${fmtNs(st.p99_ns)}`, "kpi-step-p50")}
      ${cpuOnly ? kpi("Accelerator", "none recorded", "CPU-only run: see the note above", "kpi-busy") : kpi("Device busy", fmtPct(meanBusy), `${busy.length} NeuronCores, whole profile`, "kpi-busy")}
      ${cpuOnly ? kpi("Host ops time", fmtNs(d.host_ops.total_ns), `torch.profiler window${windowText}, all ranks`, "kpi-active") : kpi("Device active", fmtPct(d.device_time.active_share), `active ${fmtNs(d.device_time.active_ns)} · idle ${fmtNs(d.device_time.idle_ns)}`, "kpi-active")}
      ${kpi("Host CPU", `${hostCores.toFixed(1)} cores`, `training processes ${processCores.toFixed(1)} cores / node`, "kpi-cpu")}
      ${cpuOnly ? kpi("Host op runs", fmtInt(d.host_ops.count), `${d.host_ops.distinct} distinct host ops`, "kpi-kernels") : kpi("Kernel runs", fmtInt(d.kernels.count), `${d.kernels.distinct} distinct`, "kpi-kernels")}
      ${cpuOnly ? kpi("Launch latency", "n/a", "no device launches to link", "kpi-latency") : kpi("Launch latency p50", fmtNs(d.launch_latency.stats.p50_ns), `p99 ${fmtNs(d.launch_latency.stats.p99_ns)}`, "kpi-latency")}
      ${kpi("Dropped events", fmtInt(o.dropped_events), "ring overflow at capture", "kpi-dropped")}
    </div>
    <div class="grid">
      <section class="card span-12"><div class="card-head"><h2>Utilisation over time</h2><span class="hint">${cpuOnly ? "host CPU cores per node (no accelerator activity recorded)" : "device busy % per node (mean over its NeuronCores) · host CPU cores"} · drag to zoom</span></div><div class="chart" id="util-chart" data-testid="util-chart"></div></section>
      <section class="card span-12"><div class="card-head"><h2>Utilisation per NeuronCore</h2><span class="hint">busy share of each time bucket, one row per NeuronCore in use</span></div><div id="device-heatmap" data-testid="device-heatmap">${cpuOnly ? notApplicable("no NeuronCore was used") : ""}</div></section>
      <section class="card span-6"><div class="card-head"><h2>${cpuOnly ? "Host operations" : "Device activity"}</h2><span class="hint">${cpuOnly ? `share of host-op time in the torch.profiler window${windowText}` : "share of each rank's capture window"}</span></div><div id="activity"></div></section>
      <section class="card span-6"><div class="card-head"><h2>Kernel precision</h2><span class="hint">share of kernel time</span></div><div id="precision">${cpuOnly ? notApplicable("no device kernels") : ""}</div></section>
      <section class="card span-6"><div class="card-head"><h2>Memory operations</h2><span class="hint">share of memory-operation time</span></div><div id="memory-mix"></div>
        ${transferTable(d.memory_ops, "memory-table")}</section>
      <section class="card span-6"><div class="card-head"><h2>Host CPU and collectives</h2><span class="hint">busy cores, mean over the sampled span</span></div>
        <div class="scroll"><table data-testid="cpu-table"><thead><tr><th class="l">Node</th><th>Training processes</th><th>Whole host</th><th>Process CPU time</th></tr></thead><tbody>
        ${d.cpu.map((c) => `<tr><td class="l name">${esc(c.node)}</td><td>${c.process_mean_cores.toFixed(2)} cores</td><td>${c.host_active_ns ? `${c.host_mean_cores.toFixed(2)} cores` : "–"}</td><td>${(c.process_active_ns / 1e9).toFixed(2)} core-s</td></tr>`).join("")}
        </tbody></table></div>${transferTable(d.collectives, "collectives-table")}</section>
      <section class="card span-7"><div class="card-head"><h2>Step time histogram</h2><span class="hint">step time = slowest rank</span></div><div class="chart" id="step-hist" data-testid="step-hist"></div>
        <div class="stats" data-testid="step-stats">${statsLine(st)}</div></section>
      <section class="card span-5"><div class="card-head"><h2>Steps</h2><span class="hint">click a step to open it in the timeline</span></div>
        <div class="scroll" style="max-height:300px"><table data-testid="steps-table"><thead><tr><th>Step</th><th>Time</th><th>Mean</th><th>Min</th><th>Slowest rank</th></tr></thead><tbody>
        ${d.steps.rows.map((r) => `<tr data-step="${r.step}"><td><a class="link" href="${viewLink("timeline", state.profileId, { step: r.step })}">${r.step}</a></td><td>${fmtNs(r.max_ns)}</td><td>${fmtNs(r.mean_ns)}</td><td>${fmtNs(r.min_ns)}</td><td>${r.slowest_rank}</td></tr>`).join("")}
        </tbody></table></div></section>
      <section class="card span-12"><div class="card-head"><h2>Rank × step</h2><span class="hint controls">
        <select id="heat-mode" data-testid="heat-mode"><option value="relative">relative to the step's median rank</option><option value="duration">step time</option></select> · click a cell to open the step in the timeline</span></div>
        <div class="grid"><div class="span-8" id="rank-step-heatmap" data-testid="rank-step-heatmap"></div>
        <div class="span-4"><div class="scroll"><table data-testid="stragglers"><thead><tr><th>Rank</th><th class="l">Node</th><th>Mean relative</th><th>Slowest in</th></tr></thead><tbody>
        ${d.steps.stragglers.map((r) => `<tr data-rank="${r.rank}"><td>${r.rank}</td><td class="l name">${esc(o.nodes[r.node])}</td><td>${r.mean_relative.toFixed(3)}×</td><td>${fmtInt(r.slowest_count)} steps</td></tr>`).join("")}
        </tbody></table></div></div></div></section>
      <section class="card span-12"><div class="card-head"><h2>Top kernels and ops</h2>
        <span class="hint controls"><select id="ops-source" data-testid="ops-source">${cpuOnly ? `<option value="host_ops" selected>host ops (torch.profiler window)</option><option value="kernels" disabled>device kernels: none recorded</option>` : `<option value="kernels">device kernels</option><option value="host_ops">host ops</option>`}</select>
        by <select id="ops-order" data-testid="ops-order"><option value="by_time">total time</option><option value="by_count">count</option></select>
        · show <select id="topk">${[5, 10, 15, 25, 50].map((k) => `<option ${k === 15 ? "selected" : ""}>${k}</option>`).join("")}</select></span></div>
        <div class="grid"><div class="span-5" id="kernel-bars"></div><div class="span-7"><div class="scroll"><table data-testid="kernels-table"><thead><tr><th>Name</th><th>Count</th><th>Total</th><th>Mean</th><th>p50</th><th>p99</th><th>Share</th></tr></thead><tbody id="kernel-rows"></tbody></table></div></div></div></section>
      <section class="card span-6"><div class="card-head"><h2>Launch → execution latency</h2><span class="hint">${fmtInt(d.launch_latency.matched)} linked launches${d.launch_latency.unmatched_launches ? ` · ${fmtInt(d.launch_latency.unmatched_launches)} unlinked` : ""}</span></div>
        <div class="chart" id="latency-hist" data-testid="latency-hist">${cpuOnly ? notApplicable("no device launches to link to executions") : ""}</div><div class="stats" data-testid="latency-stats">${cpuOnly ? "" : statsLine(d.launch_latency.stats)}</div></section>
      <section class="card span-6"><div class="card-head"><h2>Custom annotations</h2><span class="hint">
        <select id="annotation-picker" data-testid="annotation-picker">${d.annotations.map((a) => `<option value="${esc(a.name)}">${esc(a.name)} (${fmtInt(a.stats.count)})</option>`).join("")}</select></span></div>
        <div class="chart" id="annotation-hist" data-testid="annotation-hist"></div><div class="stats" id="annotation-stats" data-testid="annotation-stats"></div></section>
    </div>`;

  const u = d.utilisation;
  const x = u.bucket_start_ns.map((t) => (t + u.bucket_ns / 2) / 1e9);
  const short = (node) => node.split(".")[0];
  const hm = d.steps.heatmap;
  const stepLabel = (c) => (hm.first_step[c] === hm.last_step[c] ? `step ${hm.first_step[c]}` : `steps ${hm.first_step[c]}–${hm.last_step[c]}`);
  const renderHeat = () => {
    const relative = document.getElementById("heat-mode").value === "relative";
    const values = relative ? hm.relative : hm.duration_ns;
    const finite = hm.duration_ns.flat().filter((v) => v != null);
    const low = Math.min(...finite), high = Math.max(...finite);
    heatmap(document.getElementById("rank-step-heatmap"), {
      rowLabels: hm.ranks.map((r) => `rank ${r}`),
      colLabels: hm.first_step.map((s) => String(s)),
      values,
      rgb: relative ? relativeRGB : (v) => busyRGB((v - low) / Math.max(high - low, 1)),
      describe: (r, c, v) => `rank ${hm.ranks[r]}, ${stepLabel(c)}: ${fmtNs(hm.duration_ns[r][c])}${hm.relative[r][c] == null ? "" : ` (${hm.relative[r][c].toFixed(3)}× the median rank)`}`,
      onCell: (r, c) => { location.hash = viewLink("timeline", state.profileId, { step: hm.first_step[c] }); },
      legend: relative
        ? `0.85×<span class="ramp" style="background:linear-gradient(90deg,${relativeColour(0.85)},${relativeColour(1)},${relativeColour(1.15)})"></span>1.15× the step's median rank (red: slower)`
        : `${fmtNs(low)}<span class="ramp" style="background:linear-gradient(90deg,${busyColour(0)},${busyColour(1)})"></span>${fmtNs(high)}`,
    });
  };
  const renderKernels = () => {
    const k = Number(document.getElementById("topk").value);
    const source = d[document.getElementById("ops-source").value];
    const rows = source[document.getElementById("ops-order").value].slice(0, k);
    horizontalBars(document.getElementById("kernel-bars"), rows.map((r) => ({ label: r.name, value: r.total_ns, text: fmtPct(r.share) })), colourFor);
    document.getElementById("kernel-rows").innerHTML = rows.map((r) => `<tr data-kernel="${esc(r.name)}"><td class="name">${esc(r.name)}</td><td>${fmtInt(r.count)}</td><td>${fmtNs(r.total_ns)}</td><td>${fmtNs(r.mean_ns)}</td><td>${fmtNs(r.p50_ns)}</td><td>${fmtNs(r.p99_ns)}</td><td>${fmtPct(r.share)}</td></tr>`).join("");
  };
  // Each panel's drawing, by the element it draws in: those on screen are drawn before the
  // first paint, the others right after it.
  const draws = [
    ["util-chart", () => {
      const series = [];
      if (!cpuOnly) o.nodes.forEach((node, i) => series.push({ label: `${node} busy`, stroke: ["#2563eb", "#7c3aed", "#0891b2", "#db2777"][i % 4], width: 1.6, fill: i === 0 ? "#2563eb18" : undefined, data: u.node_busy[i].map((v) => (v == null ? null : 100 * v)), value: (uu, v) => (v == null ? "–" : `${v.toFixed(1)}%`) }));
      o.nodes.forEach((node, i) => series.push({ label: `${node} CPU`, scale: "cores", stroke: ["#ea580c", "#ca8a04", "#16a34a", "#dc2626"][i % 4], width: 1, dash: [4, 3], data: u.node_cpu_cores[i], spanGaps: true, value: (uu, v) => (v == null ? "–" : `${v.toFixed(2)} cores`) }));
      lineChart(document.getElementById("util-chart"), { x, series, yLabel: cpuOnly ? "" : "device busy", y2Label: "CPU cores", xLabel: "seconds since profile start" });
    }],
    ["device-heatmap", () => {
      if (cpuOnly) return;
      heatmap(document.getElementById("device-heatmap"), {
        rowLabels: u.devices.map((dv) => `${short(o.nodes[dv.node])} · NC ${dv.device}`),
        colLabels: x.map((t) => `${t.toFixed(2)} s`),
        values: u.device_busy, rgb: busyRGB,
        describe: (r, c, v) => `${o.nodes[u.devices[r].node]} NeuronCore ${u.devices[r].device} at ${x[c].toFixed(3)} s: ${v == null ? "–" : fmtPct(v)} busy`,
        legend: `0 %<span class="ramp" style="background:linear-gradient(90deg,${busyColour(0)},${busyColour(1)})"></span>100 % busy`,
      });
    }],
    ["activity", () => {
      if (cpuOnly) {
        const ops = d.host_ops.by_time.slice(0, 7);
        const rest = Math.max(0, 1 - ops.reduce((a, r) => a + r.share, 0));
        const parts = ops.map((r) => ({ key: r.name, share: r.share, abs: `${fmtInt(r.count)} runs · ${fmtNs(r.total_ns)}` }));
        if (rest > 0.0005) parts.push({ key: "other host ops", share: rest, abs: "" });
        stackedBar(document.getElementById("activity"), parts, "activity-legend", colourFor);
      } else {
        const activity = ["compute", "collective", "memcpy", "sync", "idle"].map((k) => ({ key: k, share: d.activity.shares[k] || 0, abs: fmtNs(d.activity.totals_ns[k] || 0) }));
        stackedBar(document.getElementById("activity"), activity, "activity-legend");
      }
    }],
    ["precision", () => {
      if (!cpuOnly) stackedBar(document.getElementById("precision"), d.precision.map((p) => ({ key: p.precision, share: p.share, abs: `${fmtInt(p.count)} runs · ${fmtNs(p.total_ns)}` })), "precision-legend");
    }],
    ["memory-mix", () => stackedBar(document.getElementById("memory-mix"), d.memory_ops.map((m) => ({ key: m.name, share: m.share, abs: `${fmtInt(m.count)} ops · ${fmtBytes(m.bytes)}` })), "memory-legend", colourFor)],
    ["step-hist", () => histogramChart(document.getElementById("step-hist"), { ...d.steps.histogram, colour: "#2563eb", xLabel: "step time" })],
    ["rank-step-heatmap", renderHeat],
    ["kernel-bars", renderKernels],
    ["latency-hist", () => {
      if (!cpuOnly) histogramChart(document.getElementById("latency-hist"), { ...d.launch_latency.histogram, colour: "#0891b2", xLabel: "launch → start of execution" });
    }],
  ];
  const fold = window.innerHeight;
  const later = [];
  for (const [id, draw] of draws) {
    if (document.getElementById(id).closest("section").getBoundingClientRect().top < fold) draw(); else later.push(draw);
  }
  document.getElementById("heat-mode").addEventListener("change", renderHeat);
  for (const id of ["topk", "ops-source", "ops-order"]) document.getElementById(id).addEventListener("change", renderKernels);

  const picker = document.getElementById("annotation-picker");
  const renderAnnotation = async () => {
    if (!picker.value) { document.getElementById("annotation-hist").innerHTML = `<div class="empty">No annotations in this profile</div>`; return; }
    const a = await api(`/api/annotation?id=${q(state.profileId)}&name=${q(picker.value)}`);
    histogramChart(document.getElementById("annotation-hist"), { ...a.histogram, colour: "#7c3aed", xLabel: `${a.name} duration` });
    document.getElementById("annotation-stats").innerHTML = a.stats ? statsLine(a.stats) : "";
    document.getElementById("annotation-stats").dataset.name = a.name;
  };
  picker.addEventListener("change", renderAnnotation);
  // The dashboard's first paint (every panel on screen drawn and painted), for the benchmark:
  // performance.getEntriesByName("dashboard-painted"). Then the panels below the fold.
  await afterNextPaint();
  performance.mark("dashboard-painted");
  if (!page.contains(picker)) return; // the user went to another page meanwhile
  for (const draw of later) draw();
  await renderAnnotation();
  page.dataset.ready = "dashboard";
}

// Resolves once the frame now being prepared has been painted (a task queued from the
// animation frame callback runs after that frame's paint).
function afterNextPaint() {
  return new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
}

function kpi(label, value, note, testid) {
  return `<div class="kpi" data-testid="${testid}"><div class="label">${esc(label)}</div><div class="value">${esc(value)}</div><div class="note">${esc(note)}</div></div>`;
}
function transferTable(rows, testid) {
  if (!rows.length) return `<div class="empty" data-testid="${testid}">None recorded</div>`;
  return `<div class="scroll gap"><table data-testid="${testid}"><thead><tr><th class="l">Operation</th><th>Count</th><th>Time</th><th>Share</th><th>Bytes</th><th>GB/s</th></tr></thead><tbody>
    ${rows.map((r) => `<tr data-name="${esc(r.name)}"><td class="l name">${esc(r.name)}</td><td>${fmtInt(r.count)}</td><td>${fmtNs(r.total_ns)}</td><td>${fmtPct(r.share)}</td><td>${fmtBytes(r.bytes)}</td><td>${r.gbytes_per_s.toFixed(2)}</td></tr>`).join("")}
    </tbody></table></div>`;
}
function statsLine(s) {
  if (!s || !s.count) return "no data";
  return `<span>count <b>${fmtInt(s.count)}</b></span><span>mean <b>${fmtNs(s.mean_ns)}</b></span><span>p50 <b>${fmtNs(s.p50_ns)}</b></span><span>p90 <b>${fmtNs(s.p90_ns)}</b></span><span>p99 <b>${fmtNs(s.p99_ns)}</b></span><span>max <b>${fmtNs(s.max_ns)}</b></span>`;
}

// ------------------------------------------------------------------ timeline

async function renderTimeline() {
  page.innerHTML = openingPlaceholder("the timeline");
  const [d, { Timeline }] = await Promise.all([currentDashboard(), import("./timeline.js")]);
  if (!d) return needProfile();
  const tracks = await api(`/api/tracks?id=${q(state.profileId)}`);
  page.innerHTML = `
    <div class="tl-toolbar">
      <button class="btn small" id="tl-reset" title="Whole profile">Reset zoom</button>
      <button class="btn small" id="tl-in" title="Zoom in (W)">+</button><button class="btn small" id="tl-out" title="Zoom out (S)">−</button>
      <select id="tl-step" data-testid="step-picker"><option value="">Zoom to step…</option>${tracks.steps.map((s) => `<option value="${s.step}">step ${s.step} · ${fmtNs(s.end_ns - s.start_ns)}</option>`).join("")}</select>
      <label class="hint"><input type="checkbox" id="tl-flows" checked> launch → execution arrows</label>
      <span class="spacer"></span>
      <span class="range" id="tl-range" data-testid="timeline-range"></span>
      <span class="hint"><kbd>W</kbd>/<kbd>S</kbd> zoom · <kbd>A</kbd>/<kbd>D</kbd> pan · wheel zoom · drag pan · <kbd>F</kbd> fit selection</span>
    </div>
    <div class="tl-body">
      <div class="tl-scroll" id="tl-scroll"><canvas id="tl-canvas" data-testid="timeline-canvas"></canvas><div id="tl-spacer"></div></div>
      <aside class="tl-side" id="tl-side" data-testid="event-details"><h2>Details</h2><p class="sub">Click an event to see its details; a launch and its device execution are joined by an arrow.</p></aside>
    </div><div class="tl-tip" id="tl-tip"></div>`;
  const timeline = new Timeline({
    profileId: state.profileId, tracks, api,
    scroll: document.getElementById("tl-scroll"), canvas: document.getElementById("tl-canvas"),
    spacer: document.getElementById("tl-spacer"), side: document.getElementById("tl-side"),
    tip: document.getElementById("tl-tip"), rangeLabel: document.getElementById("tl-range"),
  });
  state.timeline = timeline;
  window.__timeline = timeline;
  document.getElementById("tl-reset").onclick = () => timeline.setView(0, tracks.end_ns);
  document.getElementById("tl-in").onclick = () => timeline.zoomBy(0.5);
  document.getElementById("tl-out").onclick = () => timeline.zoomBy(2);
  document.getElementById("tl-flows").onchange = (e) => timeline.setFlows(e.target.checked);
  const stepPicker = document.getElementById("tl-step");
  stepPicker.onchange = () => { if (stepPicker.value !== "") timeline.zoomToStep(Number(stepPicker.value)); };
  const wanted = hashParams().get("step");
  if (wanted !== null) { stepPicker.value = wanted; timeline.zoomToStep(Number(wanted)); }
  else timeline.setView(0, tracks.end_ns);
  page.dataset.ready = "timeline";
}

(() => {
  const linked = hashParams().get("profile");
  if (linked) setProfile(linked);
  linkNav();
  route();
  // The header names the current profile on every page (the dashboard opens it anyway).
  if (state.profileId) currentDashboard().then((d) => { if (!d) showCurrent(null); }, () => showCurrent(null));
})();
