// Canvas timeline: node -> rank -> host thread / NeuronCore queue / counter tracks.
// The server answers windowed level-of-detail queries, so drawing cost depends on the
// canvas width, not on the number of events; old data is redrawn under the new view
// while a query is in flight, so pan and zoom never wait for the network.
import { fmtNs, esc, colourFor } from "./format.js";

const LABEL_W = 250, AXIS_H = 28, ROW_H = 16, NODE_H = 26, RANK_H = 24, COUNTER_H = 34, PAD = 4;
const KIND = { ANNOTATION: 1, STEP: 2, HOST_OP: 3, LAUNCH: 4, KERNEL: 5, MEMCPY: 6, COLLECTIVE: 7, SYNC: 8 };
const KIND_NAMES = Object.fromEntries(Object.entries(KIND).map(([k, v]) => [v, k]));
const FIXED_COLOURS = { [KIND.LAUNCH]: "#64748b", [KIND.SYNC]: "#ea580c", [KIND.MEMCPY]: "#0891b2", [KIND.COLLECTIVE]: "#7c3aed", [KIND.HOST_OP]: "#94a3b8" };

function niceStep(span, target) {
  const raw = span / target, power = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
  return 10 * power;
}

export class Timeline {
  constructor({ profileId, tracks, api, scroll, canvas, spacer, side, tip, rangeLabel }) {
    Object.assign(this, { profileId, meta: tracks, api, scroll, canvas, spacer, side, tip, rangeLabel });
    this.names = tracks.names;
    this.endNs = Math.max(1, tracks.end_ns);
    this.view = { start: 0, end: this.endNs };
    this.collapsedNodes = new Set();
    this.expandedRanks = new Set(tracks.nodes.map((n) => n.ranks[0] && n.ranks[0].rank));
    this.data = new Map();
    this.flows = [];
    this.showFlows = true;
    this.selected = null;
    this.hits = [];
    this.labelHits = [];
    this.seq = 0;
    this.pending = null;
    this.stats = { queries: 0, lastQueryMs: 0, drawnEvents: 0, drawnCells: 0, drawnFlows: 0 };
    this.ctx = canvas.getContext("2d");
    this.layout();
    this.bind();
    this.resize();
  }

  destroy() {
    window.removeEventListener("resize", this.onResize);
    window.removeEventListener("keydown", this.onKey);
    this.dead = true;
  }

  // ---------------------------------------------------------------- layout

  layout() {
    const rows = [];
    let y = 0;
    for (const node of this.meta.nodes) {
      rows.push({ type: "node", y, h: NODE_H, node });
      y += NODE_H;
      if (this.collapsedNodes.has(node.index)) continue;
      for (const rank of node.ranks) {
        const devices = rank.tracks.filter((t) => t.kind === "device").map((t) => t.id);
        const expanded = this.expandedRanks.has(rank.rank);
        rows.push({ type: "rank", y, h: RANK_H, node, rank, summary: expanded ? [] : devices });
        y += RANK_H;
        if (!expanded) continue;
        for (const track of rank.tracks) {
          const h = track.kind === "counter" ? COUNTER_H : track.rows * ROW_H + PAD;
          rows.push({ type: "track", y, h, node, rank, track });
          y += h;
        }
      }
    }
    this.rows = rows;
    this.totalHeight = y + AXIS_H + 20;
    this.spacer.style.height = `${Math.max(0, this.totalHeight - this.scroll.clientHeight)}px`;
  }

  visibleRows() {
    const top = this.scroll.scrollTop, bottom = top + this.scroll.clientHeight - AXIS_H;
    return this.rows.filter((r) => r.y + r.h >= top && r.y <= bottom);
  }

  // ---------------------------------------------------------------- view

  get plotWidth() { return Math.max(50, this.cssWidth - LABEL_W); }
  setView(start, end) {
    const minSpan = 1000;
    let span = Math.max(minSpan, Math.min(end - start, this.endNs * 1.05));
    start = Math.max(-this.endNs * 0.02, Math.min(start, this.endNs * 1.02 - span));
    this.view = { start: Math.round(start), end: Math.round(start + span) };
    this.rangeLabel.textContent = `${fmtNs(Math.max(0, this.view.start))} – ${fmtNs(this.view.end)} · span ${fmtNs(span)}`;
    this.draw();
    this.requestData();
  }
  zoomBy(factor, anchorX) {
    const { start, end } = this.view, span = end - start;
    const frac = anchorX === undefined ? 0.5 : Math.min(1, Math.max(0, (anchorX - LABEL_W) / this.plotWidth));
    const at = start + span * frac, next = span * factor;
    this.setView(at - next * frac, at - next * frac + next);
  }
  panBy(fraction) { const span = this.view.end - this.view.start; this.setView(this.view.start + span * fraction, this.view.end + span * fraction); }
  zoomToStep(step) {
    const s = this.meta.steps.find((x) => x.step === step);
    if (!s) return;
    const margin = (s.end_ns - s.start_ns) * 0.03;
    this.zoomedStep = step;
    this.setView(s.start_ns - margin, s.end_ns + margin);
  }
  setFlows(on) { this.showFlows = on; this.draw(); }
  xOf(t) { return LABEL_W + ((t - this.view.start) / (this.view.end - this.view.start)) * this.plotWidth; }

  // ---------------------------------------------------------------- data

  requestData() {
    clearTimeout(this.pending);
    this.pending = setTimeout(() => this.fetchWindow(), 40);
  }
  async fetchWindow() {
    const ids = new Set();
    for (const row of this.visibleRows()) {
      if (row.type === "track") ids.add(row.track.id);
      if (row.type === "rank") for (const id of row.summary) ids.add(id);
    }
    if (!ids.size) { this.draw(); return; }
    const seq = ++this.seq, began = performance.now();
    const { start, end } = this.view;
    const url = `/api/window?id=${encodeURIComponent(this.profileId)}&start=${start}&end=${end}&width=${Math.round(this.plotWidth)}&tracks=${[...ids].join(",")}`;
    const result = await this.api(url);
    if (seq !== this.seq || this.dead) return;
    this.stats.queries += 1;
    this.stats.lastQueryMs = performance.now() - began;
    this.data = new Map(result.tracks.map((t) => [t.id, { ...t, qStart: result.start, qEnd: result.end, qWidth: result.width }]));
    this.flows = result.flows;
    this.draw();
    this.loadedView = { ...this.view };
  }

  // ---------------------------------------------------------------- drawing

  resize() {
    const ratio = window.devicePixelRatio || 1;
    this.cssWidth = this.scroll.clientWidth;
    this.cssHeight = this.scroll.clientHeight;
    this.canvas.width = this.cssWidth * ratio;
    this.canvas.height = this.cssHeight * ratio;
    this.canvas.style.width = `${this.cssWidth}px`;
    this.canvas.style.height = `${this.cssHeight}px`;
    this.ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    this.layout();
    this.draw();
    this.requestData();
  }

  draw() {
    const ctx = this.ctx, W = this.cssWidth, H = this.cssHeight, top = this.scroll.scrollTop;
    this.hits = []; this.labelHits = []; this.positions = new Map();
    this.stats.drawnEvents = 0; this.stats.drawnCells = 0; this.stats.drawnFlows = 0;
    ctx.clearRect(0, 0, W, H);
    ctx.fillStyle = "#ffffff"; ctx.fillRect(0, 0, W, H);
    ctx.font = "12px system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif";
    ctx.textBaseline = "middle";
    const rowY = new Map();
    for (const row of this.visibleRows()) {
      const y = row.y - top + AXIS_H;
      this.drawRow(ctx, row, y);
      if (row.type === "track") rowY.set(row.track.id, { y, h: row.h });
      if (row.type === "rank") for (const id of row.summary) rowY.set(id, { y, h: row.h, summary: true });
    }
    if (this.showFlows) this.drawFlows(ctx, rowY);
    this.drawAxis(ctx, W);
    // Label column divider on top of everything.
    ctx.fillStyle = "#e3e8ef"; ctx.fillRect(LABEL_W - 1, 0, 1, H);
  }

  drawRow(ctx, row, y) {
    const W = this.cssWidth;
    if (row.type === "node") {
      ctx.fillStyle = "#1f2937"; ctx.fillRect(0, y, W, row.h);
      ctx.fillStyle = "#f9fafb"; ctx.font = "600 12.5px system-ui, 'DejaVu Sans', sans-serif";
      const mark = this.collapsedNodes.has(row.node.index) ? "▸" : "▾";
      ctx.fillText(`${mark}  ${row.node.name}  ·  ${row.node.ranks.length} ranks`, 10, y + row.h / 2);
      ctx.font = "12px system-ui, 'DejaVu Sans', sans-serif";
      this.labelHits.push({ y, h: row.h, toggle: () => this.toggleNode(row.node.index) });
      return;
    }
    if (row.type === "rank") {
      ctx.fillStyle = "#f1f5f9"; ctx.fillRect(0, y, W, row.h);
      ctx.fillStyle = "#e2e8f0"; ctx.fillRect(0, y + row.h - 1, W, 1);
      ctx.fillStyle = "#1d2433"; ctx.font = "600 12px system-ui, 'DejaVu Sans', sans-serif";
      const mark = this.expandedRanks.has(row.rank.rank) ? "▾" : "▸";
      ctx.fillText(`${mark}  rank ${row.rank.rank}  (local ${row.rank.local_rank})`, 22, y + row.h / 2);
      ctx.font = "12px system-ui, 'DejaVu Sans', sans-serif";
      this.labelHits.push({ y, h: row.h, toggle: () => this.toggleRank(row.rank.rank) });
      for (const id of row.summary) this.drawSpans(ctx, id, y + 3, row.h - 6, true);
      return;
    }
    const track = row.track;
    ctx.fillStyle = "#e8edf3"; ctx.fillRect(0, y + row.h - 1, W, 1);
    ctx.fillStyle = "#475467";
    const label = track.kind === "counter" ? `${track.label}${track.unit ? ` (${track.unit})` : ""}` : track.label;
    ctx.fillText(this.clip(ctx, label, LABEL_W - 46), 40, y + Math.min(row.h, ROW_H + PAD) / 2);
    if (track.kind === "counter") this.drawCounter(ctx, track, y, row.h);
    else this.drawSpans(ctx, track.id, y + 2, ROW_H, false);
  }

  clip(ctx, text, width) {
    if (ctx.measureText(text).width <= width) return text;
    let lo = 0, hi = text.length;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (ctx.measureText(text.slice(0, mid) + "…").width <= width) lo = mid; else hi = mid - 1; }
    return text.slice(0, lo) + "…";
  }

  colour(kind, nameId) {
    return FIXED_COLOURS[kind] || colourFor(this.names[nameId] || "");
  }

  drawSpans(ctx, trackId, y0, rowH, summary) {
    const d = this.data.get(trackId);
    if (!d) return;
    ctx.save();
    ctx.beginPath(); ctx.rect(LABEL_W, y0 - 2, this.plotWidth, 10000); ctx.clip();
    const scale = this.plotWidth / (this.view.end - this.view.start);
    // Folded cells: one pixel column of many short events, shaded by how busy it was.
    const cellNs = (d.qEnd - d.qStart) / d.qWidth;
    for (let i = 0; i < d.agg.px.length; i++) {
      const row = summary ? 0 : d.agg.row[i];
      const x = this.xOf(d.qStart + d.agg.px[i] * cellNs);
      const w = Math.max(1, cellNs * scale);
      ctx.globalAlpha = 0.35 + 0.65 * (d.agg.busy[i] / 1000);
      ctx.fillStyle = colourFor(this.names[d.agg.name[i]] || "");
      ctx.fillRect(x, y0 + row * rowH, w, rowH - 2);
    }
    this.stats.drawnCells += d.agg.px.length;
    ctx.globalAlpha = 1;
    for (let i = 0; i < d.ids.length; i++) {
      const row = summary ? 0 : d.row[i];
      const x = this.xOf(d.start[i]);
      const w = Math.max(1, d.dur[i] * scale);
      if (x + w < LABEL_W || x > this.cssWidth) continue;
      const y = y0 + row * rowH, h = rowH - 2;
      const kind = d.kind[i];
      if (kind === KIND.STEP) {
        ctx.fillStyle = (d.value && d.value[i] % 2) ? "#475569" : "#334155";
      } else ctx.fillStyle = this.colour(kind, d.name[i]);
      ctx.fillRect(x, y, w, h);
      if (d.ids[i] === this.selected) { ctx.strokeStyle = "#111827"; ctx.lineWidth = 2; ctx.strokeRect(x + 1, y + 1, Math.max(1, w - 2), h - 2); }
      if (w > 36 && !summary) {
        const text = kind === KIND.STEP && d.value ? `step ${d.value[i]}` : this.names[d.name[i]];
        ctx.fillStyle = "#ffffff";
        const left = Math.max(x, LABEL_W) + 4;
        ctx.fillText(this.clip(ctx, text, Math.min(x + w, this.cssWidth) - left - 4), left, y + h / 2 + 0.5);
      }
      this.hits.push({ x, y, w, h, id: d.ids[i], name: this.names[d.name[i]], dur: d.dur[i], kind });
      this.positions.set(d.ids[i], { x, y: y + h / 2 });
    }
    this.stats.drawnEvents += d.ids.length;
    ctx.restore();
  }

  drawCounter(ctx, track, y, h) {
    const d = this.data.get(track.id);
    if (!d || !d.t.length) return;
    const max = Math.max(...(d.max || d.v), 1e-9);
    ctx.save();
    ctx.beginPath(); ctx.rect(LABEL_W, y, this.plotWidth, h); ctx.clip();
    ctx.beginPath();
    ctx.moveTo(this.xOf(d.t[0]), y + h - 3);
    for (let i = 0; i < d.t.length; i++) ctx.lineTo(this.xOf(d.t[i]), y + h - 3 - ((h - 8) * d.v[i]) / max);
    ctx.lineTo(this.xOf(d.t[d.t.length - 1]), y + h - 3);
    ctx.closePath();
    ctx.fillStyle = "#2563eb26"; ctx.fill();
    ctx.strokeStyle = "#2563eb"; ctx.lineWidth = 1.2; ctx.stroke();
    ctx.fillStyle = "#667085"; ctx.font = "11px system-ui, 'DejaVu Sans', sans-serif";
    const peak = track.unit === "bytes" ? `${(max / 2 ** 30).toFixed(2)} GiB` : `${max.toFixed(2)} ${track.unit}`;
    ctx.fillText(`max ${peak}`, LABEL_W + 6, y + 9);
    ctx.restore();
  }

  drawFlows(ctx, rowY) {
    ctx.save();
    ctx.beginPath(); ctx.rect(LABEL_W, AXIS_H, this.plotWidth, this.cssHeight); ctx.clip();
    ctx.strokeStyle = "#06b6d4"; ctx.fillStyle = "#06b6d4"; ctx.lineWidth = 1.2;
    for (const [launchId, launchTrack, launchTs, kernelId, kernelTrack, kernelTs] of this.flows) {
      const a = this.positions.get(launchId) || this.trackCentre(rowY, launchTrack, launchTs);
      const b = this.positions.get(kernelId) || this.trackCentre(rowY, kernelTrack, kernelTs);
      if (!a || !b) continue;
      const bx = this.xOf(kernelTs), ax = this.xOf(launchTs);
      if (Math.abs(bx - ax) < 0.5 && Math.abs(b.y - a.y) < 1) continue;
      ctx.beginPath();
      ctx.moveTo(ax, a.y);
      const midY = (a.y + b.y) / 2;
      ctx.bezierCurveTo(ax, midY, bx, midY, bx, b.y);
      ctx.stroke();
      ctx.beginPath(); ctx.moveTo(bx, b.y); ctx.lineTo(bx - 3, b.y - 6 * Math.sign(b.y - a.y || 1)); ctx.lineTo(bx + 3, b.y - 6 * Math.sign(b.y - a.y || 1)); ctx.closePath(); ctx.fill();
      this.stats.drawnFlows += 1;
    }
    ctx.restore();
  }
  trackCentre(rowY, trackId, ts) {
    const r = rowY.get(trackId);
    return r ? { x: this.xOf(ts), y: r.y + Math.min(r.h, ROW_H) / 2 + 2 } : null;
  }

  drawAxis(ctx, W) {
    ctx.fillStyle = "#fafbfc"; ctx.fillRect(0, 0, W, AXIS_H);
    ctx.fillStyle = "#e3e8ef"; ctx.fillRect(0, AXIS_H - 1, W, 1);
    const span = this.view.end - this.view.start;
    const step = niceStep(span, Math.max(2, this.plotWidth / 110));
    ctx.fillStyle = "#667085"; ctx.font = "11px system-ui, 'DejaVu Sans', sans-serif";
    for (let t = Math.ceil(this.view.start / step) * step; t <= this.view.end; t += step) {
      const x = this.xOf(t);
      ctx.fillRect(x, AXIS_H - 7, 1, 6);
      ctx.fillText(fmtNs(t), x + 3, AXIS_H / 2);
    }
    ctx.fillStyle = "#1d2433"; ctx.font = "600 12px system-ui, 'DejaVu Sans', sans-serif";
    ctx.fillText("time since profile start", 12, AXIS_H / 2);
  }

  // ---------------------------------------------------------------- interaction

  toggleNode(index) { if (this.collapsedNodes.has(index)) this.collapsedNodes.delete(index); else this.collapsedNodes.add(index); this.relayout(); }
  toggleRank(rank) { if (this.expandedRanks.has(rank)) this.expandedRanks.delete(rank); else this.expandedRanks.add(rank); this.relayout(); }
  relayout() { this.layout(); this.draw(); this.requestData(); }

  hitAt(x, y) {
    for (let i = this.hits.length - 1; i >= 0; i--) {
      const h = this.hits[i];
      if (x >= h.x - 1 && x <= h.x + h.w + 1 && y >= h.y && y <= h.y + h.h) return h;
    }
    return null;
  }

  bind() {
    this.onResize = () => this.resize();
    window.addEventListener("resize", this.onResize);
    this.scroll.addEventListener("scroll", () => { this.draw(); this.requestData(); });
    this.onKey = (e) => {
      if (e.target.tagName === "INPUT" || e.target.tagName === "SELECT") return;
      const key = e.key.toLowerCase();
      if (key === "w") this.zoomBy(0.7, this.mouseX);
      else if (key === "s") this.zoomBy(1 / 0.7, this.mouseX);
      else if (key === "a") this.panBy(-0.2);
      else if (key === "d") this.panBy(0.2);
      else if (key === "f" && this.selectedSpan) { const m = this.selectedSpan.dur * 0.1 + 1000; this.setView(this.selectedSpan.start - m, this.selectedSpan.start + this.selectedSpan.dur + m); }
      else return;
      e.preventDefault();
    };
    window.addEventListener("keydown", this.onKey);
    this.canvas.addEventListener("wheel", (e) => {
      if (e.ctrlKey || e.metaKey) { e.preventDefault(); this.zoomBy(Math.exp(e.deltaY * 0.002), e.offsetX); }
      else if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) { e.preventDefault(); this.panBy((e.deltaX || e.deltaY) / this.plotWidth); }
    }, { passive: false });
    let drag = null;
    this.canvas.addEventListener("mousedown", (e) => { drag = { x: e.offsetX, start: this.view.start, end: this.view.end, moved: false }; });
    window.addEventListener("mouseup", () => { setTimeout(() => { drag = null; }, 0); });
    this.canvas.addEventListener("mousemove", (e) => {
      this.mouseX = e.offsetX;
      if (drag && e.buttons === 1 && drag.x > LABEL_W) {
        const dx = e.offsetX - drag.x;
        if (Math.abs(dx) > 2) drag.moved = true;
        const ns = (dx / this.plotWidth) * (drag.end - drag.start);
        if (drag.moved) this.setView(drag.start - ns, drag.end - ns);
        this.tip.style.display = "none";
        return;
      }
      const hit = e.offsetX > LABEL_W ? this.hitAt(e.offsetX, e.offsetY) : null;
      if (hit) {
        this.tip.innerHTML = `<b>${esc(hit.name)}</b><br>${KIND_NAMES[hit.kind] || ""} · ${fmtNs(hit.dur)}`;
        this.tip.style.display = "block";
        this.tip.style.left = `${e.clientX + 14}px`; this.tip.style.top = `${e.clientY + 12}px`;
      } else this.tip.style.display = "none";
    });
    this.canvas.addEventListener("mouseleave", () => { this.tip.style.display = "none"; });
    this.canvas.addEventListener("click", (e) => {
      if (drag && drag.moved) return;
      if (e.offsetX < LABEL_W) {
        const label = this.labelHits.find((l) => e.offsetY >= l.y && e.offsetY < l.y + l.h);
        if (label) label.toggle();
        return;
      }
      const hit = this.hitAt(e.offsetX, e.offsetY);
      if (hit) this.select(hit.id);
    });
  }

  async select(id) {
    this.selected = id;
    this.draw();
    const ev = await this.api(`/api/event?id=${encodeURIComponent(this.profileId)}&event=${id}`);
    this.selectedSpan = { start: ev.start_ns, dur: ev.duration_ns };
    const value = ev.kind === "MEMCPY" || ev.kind === "COLLECTIVE" ? `${ev.value.toLocaleString("en-US")} bytes`
      : ev.kind === "STEP" ? `step ${ev.value}` : ev.value ? String(ev.value) : "–";
    this.side.innerHTML = `<h2 data-testid="event-name">${esc(ev.name)}</h2>
      <dl>
        <dt>Kind</dt><dd>${esc(ev.kind)}</dd>
        <dt>Node</dt><dd>${esc(ev.node)}</dd>
        <dt>Rank</dt><dd>${ev.rank}</dd>
        <dt>Track</dt><dd>${esc(ev.track)}</dd>
        <dt>Start</dt><dd>${fmtNs(ev.start_ns)} <span class="hint">after profile start</span></dd>
        <dt>Duration</dt><dd data-testid="event-duration">${fmtNs(ev.duration_ns)}</dd>
        <dt>Wall clock</dt><dd>${esc(ev.wall_time)}</dd>
        <dt>Precision</dt><dd>${esc(ev.precision)}</dd>
        <dt>Value</dt><dd>${esc(value)}</dd>
        <dt>Depth</dt><dd>${ev.depth}</dd>
        ${ev.flow_id ? `<dt>Flow id</dt><dd>${ev.flow_id}</dd>` : ""}
      </dl>
      ${ev.linked ? `<div class="card" style="padding:10px"><b>${ev.kind === "LAUNCH" ? "Launched" : "Launched by"}</b> ${esc(ev.linked.name)}<br>
        <span class="hint">launch → execution latency</span> <b data-testid="event-latency">${fmtNs(ev.linked.launch_latency_ns)}</b><br>
        <a class="link" id="tl-linked">Select ${ev.kind === "LAUNCH" ? "execution" : "launch"}</a></div>` : ""}
      <p class="hint" style="margin-top:12px">Press <kbd>F</kbd> to zoom to this event.</p>`;
    const link = document.getElementById("tl-linked");
    if (link) link.onclick = () => this.select(ev.linked.id);
  }
}
