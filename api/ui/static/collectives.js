// A builtin:collectives job: its nccl-tests style table and bus bandwidth against message size.
// Each row was logged at step = row index as coll/<backend>/<op>/<mode>/<field>.

import uPlot from "./vendor/uplot-1.6.32/uPlot.esm.js";
import { el, formatBytes, formatNumber, replace } from "./dom.js";

const FIELDS = ["size_bytes", "count", "time_us", "algbw", "busbw", "wrong"];

export function collectiveRows(metrics) {
  const rows = new Map(); // "backend/op/mode/step" -> row
  for (const name of metrics.names(/^coll\//)) {
    const [, backend, op, mode, field] = name.split("/");
    if (!FIELDS.includes(field)) continue;
    const set = metrics.set(name, 0);
    for (let i = 0; i < set.length; i += 1) {
      const key = `${backend}/${op}/${mode}/${set.steps[i]}`;
      if (!rows.has(key)) rows.set(key, { backend, op, mode, step: set.steps[i] });
      rows.get(key)[field] = set.values[i];
    }
  }
  return [...rows.values()].sort((a, b) => a.step - b.step);
}

export function collectivesTab(metrics) {
  const table = el("tbody");
  const chartBox = el("div", { class: "chart", id: "busbw-chart" });
  const root = el(
    "div",
    { class: "collectives-tab" },
    chartBox,
    el(
      "table",
      { class: "collectives", id: "collectives-table" },
      el("thead", {}, el("tr", {}, ["backend", "op", "mode", "size", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "wrong"].map((h) => el("th", {}, h)))),
      table,
    ),
  );
  let plot = null;
  let pending = null;

  function draw() {
    pending = null;
    const rows = collectiveRows(metrics);
    replace(
      table,
      rows.map((r) =>
        el(
          "tr",
          {},
          [r.backend, r.op, r.mode, formatBytes(r.size_bytes ?? 0), r.count, formatNumber(r.time_us), formatNumber(r.algbw), formatNumber(r.busbw), r.wrong].map((v) =>
            el("td", {}, v ?? ""),
          ),
        ),
      ),
    );
    const curves = new Map();
    for (const r of rows) {
      if (r.mode !== "out" || !(r.size_bytes > 0)) continue;
      const label = `${r.backend} ${r.op}`;
      if (!curves.has(label)) curves.set(label, [[], []]);
      curves.get(label)[0].push(r.size_bytes);
      curves.get(label)[1].push(r.busbw);
    }
    if (plot) plot.destroy();
    plot = null;
    if (!curves.size) return;
    const data = uPlot.join([...curves.values()]);
    plot = new uPlot(
      {
        title: "bus bandwidth (GB/s) by message size, out of place",
        width: Math.max(320, root.clientWidth || 700),
        height: 260,
        scales: { x: { time: false, distr: 3 } },
        axes: [{ values: (u, splits) => splits.map((v) => formatBytes(v)) }, {}],
        series: [{ label: "size", value: (u, v) => (v === null ? "" : formatBytes(v)) }, ...[...curves.keys()].map((label, i) => ({ label, stroke: ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"][i % 8], spanGaps: true }))],
      },
      data,
      chartBox,
    );
  }

  const listener = () => {
    if (!pending) pending = setTimeout(draw, 250);
  };
  metrics.listeners.add(listener);
  draw();
  return {
    root,
    refresh: draw,
    stop() {
      metrics.listeners.delete(listener);
      clearTimeout(pending);
      if (plot) plot.destroy();
    },
  };
}
