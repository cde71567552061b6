// Chart helpers on uPlot (vendored, MIT) plus plain-DOM bars for categorical data.
import { fmtNs, fmtPct, esc, CATEGORY_COLOURS } from "./format.js";

const live = new Set();
export function disposeCharts() { for (const c of live) c.destroy(); live.clear(); }
window.addEventListener("resize", () => { for (const c of live) c.setSize({ width: c.root.parentElement.clientWidth, height: c.height }); });

function make(el, opts, data) {
  el.innerHTML = "";
  const chart = new uPlot({ width: el.clientWidth || 600, height: 240, ...opts }, data, el);
  live.add(chart);
  el.uplot = chart; // the axis-label layout tests measure the drawn chart through it
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

// Duration axes (ns values) name their unit once, in the axis title, chosen by the largest
// value, and each tick shows only the decimals the tick step needs: "0.2 … 1.2" under
// "step time (s)" rather than "200.000 ms … 1.200 s", which collided. Ticks are at least one
// label width apart, so labels cannot overlap however narrow the chart is.
const DURATION_UNITS = [[1e9, "s"], [1e6, "ms"], [1e3, "µs"], [1, "ns"]];
// 1-2-5 steps only: a larger step then never needs more decimals than a smaller one (2.5
// would), which is what lets durationSpace size labels before uPlot picks the step.
const DURATION_INCRS = [];
for (let exponent = -3; exponent <= 13; exponent++) for (const m of [1, 2, 5]) DURATION_INCRS.push(m * 10 ** exponent);
// Labels this short may sit closer than uPlot's default 50 px, so a narrow chart keeps a few.
const MIN_TICK_SPACE = 30;
const LABEL_GAP = 16;

function durationUnit(maxNs) {
  return DURATION_UNITS.find(([scale]) => maxNs >= scale) || DURATION_UNITS[DURATION_UNITS.length - 1];
}
function decimalsOf(step) {
  for (let d = 0; d < 3; d++) if (Math.abs(step * 10 ** d - Math.round(step * 10 ** d)) < 1e-6) return d;
  return 3;
}
function durationTicks(values, step, scale) {
  const decimals = decimalsOf(step / scale);
  return values.map((v) => (v == null ? null : (v / scale).toFixed(decimals)));
}
const measure = document.createElement("canvas").getContext("2d");
function durationSpace(scale) {
  return (u, axisIdx, min, max, plotDim) => {
    if (!(max > min) || !(plotDim > 0)) return MIN_TICK_SPACE;
    // The smallest step uPlot could pick; the one it picks is no smaller, so its labels have
    // no more decimals than these.
    const smallest = DURATION_INCRS.find((step) => (step * plotDim) / (max - min) >= MIN_TICK_SPACE) || DURATION_INCRS[DURATION_INCRS.length - 1];
    const [font, devicePx, cssPx] = u.axes[axisIdx].font;
    measure.font = font;
    // The widest label has the most integer digits, the maximum's; "0" is the widest digit in most fonts.
    const widest = durationTicks([max], smallest, scale)[0].replace(/\d/g, "0");
    return Math.max(MIN_TICK_SPACE, (measure.measureText(widest).width * cssPx) / devicePx + LABEL_GAP);
  };
}

export function histogramChart(el, { edges, counts, colour, xLabel }) {
  if (!counts.length) { el.innerHTML = `<div class="empty">No data</div>`; return null; }
  const mids = counts.map((_, i) => (edges[i] + edges[i + 1]) / 2);
  const width = edges.length > 1 ? edges[1] - edges[0] : 1;
  const bars = uPlot.paths.bars({ size: [0.92, Infinity], align: 0 });
  const [scale, unit] = durationUnit(edges[edges.length - 1]);
  const opts = {
    height: 220,
    scales: { x: { time: false, range: () => [edges[0], edges[edges.length - 1]] }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
    axes: [
      {
        label: `${xLabel} (${unit})`, stroke: "#667085", grid: { stroke: "#eef2f6" },
        space: durationSpace(scale), incrs: DURATION_INCRS, values: (u, v, axisIdx, space, step) => durationTicks(v, step, scale),
      },
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

const categoryColour = (key) => CATEGORY_COLOURS[key] || "#94a3b8";

export function stackedBar(el, entries, testid, colourOf = categoryColour) {
  // entries: [{key, share, abs}]
  if (!entries.length) { el.innerHTML = `<div class="empty" data-testid="${testid}">None recorded</div>`; return; }
  const visible = entries.filter((e) => e.share > 0);
  el.innerHTML = `
    <div class="stacked">${visible.map((e) => `<div title="${esc(e.key)} ${fmtPct(e.share)}" style="width:${100 * e.share}%;background:${colourOf(e.key)}"></div>`).join("")}</div>
    <div class="legend" data-testid="${testid}">${entries.map((e) => `
      <div><span class="sw" style="background:${colourOf(e.key)}"></span>${esc(e.key)}</div>
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

// Canvas heatmap: one row per entity (NeuronCore, rank), one column per time bucket or step.
// values[r][c] is null where there is no data; rgb(v) maps a value to [r, g, b] (0..255).
// The cells are written as the pixels of a cols x rows image, scaled onto the canvas
// unsmoothed: a fillRect per cell, each with a CSS colour to parse, took tens of ms for
// 128 x 240 cells.
const NO_DATA = [242, 244, 247];
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
const pixel = ([r, g, b]) => (LITTLE_ENDIAN ? ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0 : ((r << 24) | (g << 16) | (b << 8) | 255) >>> 0);
export function heatmap(el, { rowLabels, colLabels, values, rgb, describe, onCell, legend }) {
  const rows = rowLabels.length, cols = colLabels.length;
  if (!rows || !cols) { el.innerHTML = `<div class="empty">No data</div>`; return; }
  const labelW = 150, rowH = Math.max(3, Math.min(14, Math.floor(360 / rows))), axisH = 18;
  el.innerHTML = `<canvas></canvas><div class="heat-legend">${legend || ""}</div>`;
  const canvas = el.querySelector("canvas");
  const width = Math.max(300, el.clientWidth || 600), height = rows * rowH + axisH;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = width * dpr; canvas.height = height * dpr;
  canvas.style.width = `${width}px`; canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.scale(dpr, dpr);
  const cellW = (width - labelW) / cols;
  const cells = new ImageData(cols, rows);
  const words = new Uint32Array(cells.data.buffer);
  const empty = pixel(NO_DATA);
  for (let r = 0; r < rows; r++) {
    const line = values[r];
    for (let c = 0; c < cols; c++) {
      const v = line[c];
      words[r * cols + c] = v == null ? empty : pixel(rgb(v));
    }
  }
  const bitmap = document.createElement("canvas");
  bitmap.width = cols; bitmap.height = rows;
  bitmap.getContext("2d").putImageData(cells, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(bitmap, labelW, 0, width - labelW, rows * rowH);
  if (rowH > 5) for (let r = 1; r <= rows; r++) ctx.clearRect(labelW, r * rowH - 1, width - labelW, 1); // a gap between rows tall enough
  ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle"; ctx.fillStyle = "#475467";
  const labelEvery = Math.ceil(11 / rowH);
  for (let r = 0; r < rows; r += labelEvery) ctx.fillText(rowLabels[r], 4, r * rowH + rowH / 2, labelW - 8);
  const colEvery = Math.ceil(60 / cellW);
  ctx.textBaseline = "top";
  for (let c = 0; c < cols; c += colEvery) ctx.fillText(colLabels[c], labelW + c * cellW, rows * rowH + 4);
  const cellAt = (event) => {
    const box = canvas.getBoundingClientRect();
    const c = Math.floor((event.clientX - box.left - labelW) / cellW), r = Math.floor((event.clientY - box.top) / rowH);
    return r >= 0 && r < rows && c >= 0 && c < cols ? [r, c] : null;
  };
  canvas.addEventListener("mousemove", (event) => {
    const cell = cellAt(event);
    canvas.title = cell ? describe(cell[0], cell[1], values[cell[0]][cell[1]]) : "";
    canvas.style.cursor = cell && onCell ? "pointer" : "default";
  });
  if (onCell) canvas.addEventListener("click", (event) => { const cell = cellAt(event); if (cell) onCell(cell[0], cell[1]); });
  el.dataset.rows = rows; el.dataset.cols = cols;
}

// Sequential scale for 0..1 (white -> blue) and a diverging one around 1 (blue < 1 < red), as
// [r, g, b] for the heatmaps' pixels and as CSS colours for their legends.
export function busyRGB(v) {
  const t = Math.max(0, Math.min(1, v));
  return [Math.round(239 - 202 * t), Math.round(246 - 147 * t), Math.round(255 - 20 * t)];
}
export function relativeRGB(v) {
  const t = Math.max(-1, Math.min(1, (v - 1) / 0.15));
  if (t >= 0) return [Math.round(248 - 28 * t), Math.round(250 - 212 * t), Math.round(252 - 214 * t)];
  return [Math.round(248 + 211 * t), Math.round(250 + 120 * t), Math.round(252 + 17 * t)];
}
const css = ([r, g, b]) => `rgb(${r},${g},${b})`;
export function busyColour(v) { return css(busyRGB(v)); }
export function relativeColour(v) { return css(relativeRGB(v)); }
