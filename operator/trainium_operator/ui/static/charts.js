// Chart helpers on uPlot (vendored, MIT) plus plain-DOM bars for categorical data.
import { fmtNs, fmtPct, esc, CATEGORY_COLOURS } from "./format.js";

const live = new Set();
export function disposeCharts() { for (const c of live) c.destroy(); live.clear(); }
window.addEventListener("resize", () => { for (const c of live) c.setSize({ width: c.root.parentElement.clientWidth, height: c.height }); });

function make(el, opts, data) {
  el.innerHTML = "";
  const chart = new uPlot({ width: el.clientWidth || 600, height: 240, ...opts }, data, el);
  live.add(chart);
  return chart;
}

export function lineChart(el, { x, series, yLabel, y2Label, xLabel }) {
  const opts = {
    scales: { x: { time: false }, y: { range: [0, 100] }, cores: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
    axes: [
      { label: xLabel, values: (u, v) => v.map((s) => `${s.toFixed(s < 10 ? 2 : 1)}`), stroke: "#667085", grid: { stroke: "#eef2f6" } },
      { label: yLabel, stroke: "#667085", grid: { stroke: "#eef2f6" }, values: (u, v) => v.map((s) => `${s}%`) },
      ...(y2Label ? [{ side: 1, scale: "cores", label: y2Label, stroke: "#667085", grid: { show: false } }] : []),
    ],
    series: [{ label: "time (s)", value: (u, v) => (v == null ? "–" : `${v.toFixed(3)} s`) }, ...series],
    legend: { live: true },
    cursor: { drag: { x: true, y: false } },
  };
  return make(el, opts, [x, ...series.map((s) => s.data)]);
}

export function histogramChart(el, { edges, counts, colour, xLabel }) {
  if (!counts.length) { el.innerHTML = `<div class="empty">No data</div>`; return null; }
  const mids = counts.map((_, i) => (edges[i] + edges[i + 1]) / 2);
  const width = edges.length > 1 ? edges[1] - edges[0] : 1;
  const bars = uPlot.paths.bars({ size: [0.92, Infinity], align: 0 });
  const opts = {
    height: 220,
    scales: { x: { time: false, range: () => [edges[0], edges[edges.length - 1]] }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
    axes: [
      { label: xLabel, stroke: "#667085", grid: { stroke: "#eef2f6" }, values: (u, v) => v.map((s) => fmtNs(s)) },
      { label: "count", stroke: "#667085", grid: { stroke: "#eef2f6" } },
    ],
    series: [
      { label: "bin", value: (u, v, si, i) => (i == null ? "–" : `${fmtNs(edges[i])} – ${fmtNs(edges[i + 1])}`) },
      { label: "count", fill: colour + "cc", stroke: colour, paths: bars, points: { show: false } },
    ],
    legend: { live: true },
  };
  return make(el, opts, [mids.map((m) => m - width / 2), counts]);
}

export function stackedBar(el, entries, testid) {
  // entries: [{key, share, abs}]
  const visible = entries.filter((e) => e.share > 0);
  el.innerHTML = `
    <div class="stacked">${visible.map((e) => `<div title="${esc(e.key)} ${fmtPct(e.share)}" style="width:${100 * e.share}%;background:${CATEGORY_COLOURS[e.key] || "#94a3b8"}"></div>`).join("")}</div>
    <div class="legend" data-testid="${testid}">${entries.map((e) => `
      <div><span class="sw" style="background:${CATEGORY_COLOURS[e.key] || "#94a3b8"}"></span>${esc(e.key)}</div>
      <div class="abs">${esc(e.abs)}</div>
      <div class="pct" data-key="${esc(e.key)}">${fmtPct(e.share)}</div>`).join("")}
    </div>`;
}

export function horizontalBars(el, rows, colourOf) {
  const max = Math.max(...rows.map((r) => r.value), 1);
  el.innerHTML = `<div class="bars">${rows.map((r) => `
    <div class="row"><div class="label" title="${esc(r.label)}">${esc(r.label)}</div>
    <div class="track"><div class="fill" style="width:${(100 * r.value) / max}%;background:${colourOf(r.label)}"></div></div>
    <div class="v">${esc(r.text)}</div></div>`).join("")}</div>`;
}
