// Number formatting shared by every page; mirrors analysis/report.py's format_ns so the
// browser shows exactly what `trainium-operator profile report` prints.
export function fmtNs(ns) {
  if (ns === null || ns === undefined || Number.isNaN(ns)) return "–";
  if (ns >= 1e9) return `${(ns / 1e9).toFixed(3)} s`;
  if (ns >= 1e6) return `${(ns / 1e6).toFixed(3)} ms`;
  if (ns >= 1e3) return `${(ns / 1e3).toFixed(1)} µs`;
  return `${Math.round(ns)} ns`;
}
export function fmtPct(share) { return `${(100 * share).toFixed(1)} %`; }
export function fmtInt(n) { return Number(n).toLocaleString("en-US"); }
export function fmtBytes(n) {
  if (n >= 1 << 30) return `${(n / (1 << 30)).toFixed(2)} GiB`;
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  if (n >= 1 << 10) return `${(n / (1 << 10)).toFixed(1)} KiB`;
  return `${n} B`;
}
export function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
// Stable colour per name, so a kernel has the same colour in every chart and track.
const PALETTE = ["#2563eb", "#0891b2", "#7c3aed", "#db2777", "#ea580c", "#16a34a", "#ca8a04", "#4f46e5",
  "#0d9488", "#c026d3", "#dc2626", "#65a30d", "#0284c7", "#9333ea", "#e11d48", "#059669"];
export function colourFor(name) {
  let h = 2166136261;
  for (let i = 0; i < name.length; i++) { h ^= name.charCodeAt(i); h = Math.imul(h, 16777619); }
  return PALETTE[(h >>> 0) % PALETTE.length];
}
export const CATEGORY_COLOURS = {
  compute: "#2563eb", collective: "#7c3aed", memcpy: "#0891b2", sync: "#ea580c", idle: "#cbd5e1",
  BF16: "#2563eb", FP32: "#0891b2", FP16: "#16a34a", FP8: "#7c3aed", INT8: "#ca8a04", MIXED: "#db2777", UNKNOWN: "#94a3b8",
};
