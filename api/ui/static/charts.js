// uPlot line charts: one per metric, cursors synced across a page, drag to zoom (the owner
// re-fetches the range finer), double-click to zoom out. Redraws are batched to at most one every
// REDRAW_MS however fast points arrive.

import uPlot from "./vendor/uplot-1.6.32/uPlot.esm.js";
import { el, replace } from "./dom.js";
import { smooth } from "./points.js";

export const REDRAW_MS = 200;
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
const registry = new Set();

// For people debugging a page (and the browser tests): what every chart on it currently plots.
window.trainmaster = {
  metricsRequestedAt: null, // performance.now() when a job page first asked for its metrics
  charts: () =>
    [...registry].map((chart) => ({
      title: chart.title,
      xMode: chart.view.xMode,
      logY: chart.view.logY,
      smoothing: chart.view.smoothing,
      series: chart.plot ? chart.plot.series.slice(1).map((s) => s.label) : [],
      data: chart.plot ? chart.plot.data.map((column) => Array.from(column)) : [[]],
      scaleDistr: chart.plot ? chart.plot.scales.y.distr : null,
      drawMs: chart.drawMs,
      firstDrawAt: chart.firstDrawAt,
      drawnAt: chart.drawnAt,
      zoom: chart.zoom,
    })),
};

// The controls every chart on a page shares: smoothing, log-y and the x axis.
export class ChartView {
  constructor(onChange) {
    this.smoothing = 0;
    this.logY = false;
    this.xMode = "step";
    this.onChange = onChange;
  }

  controls() {
    const slider = el("input", { type: "range", min: 0, max: 0.99, step: 0.01, value: "0", id: "smoothing" });
    const label = el("output", { id: "smoothing-value" }, "0");
    slider.addEventListener("input", () => {
      this.smoothing = Number(slider.value);
      replace(label, slider.value);
      this.onChange("smoothing");
    });
    const logY = el("input", { type: "checkbox", id: "log-y" });
    logY.addEventListener("change", () => {
      this.logY = logY.checked;
      this.onChange("logY");
    });
    const xMode = el("select", { id: "x-axis" }, el("option", { value: "step" }, "step"), el("option", { value: "time" }, "time"));
    xMode.addEventListener("change", () => {
      this.xMode = xMode.value;
      this.onChange("xMode");
    });
    return el(
      "div",
      { class: "chart-controls" },
      el("label", {}, "smoothing ", slider, " ", label),
      el("label", {}, logY, " log y"),
      el("label", {}, "x ", xMode),
    );
  }
}

// One chart. `series` is [{label, set}] of PointSets; `view` the shared ChartView.
export class LineChart {
  constructor(container, { title, view, syncKey, onZoom, onZoomOut, smoothable = true }) {
    this.title = title;
    this.view = view;
    this.syncKey = syncKey;
    this.onZoom = onZoom;
    this.onZoomOut = onZoomOut;
    this.smoothable = smoothable;
    this.series = [];
    this.plot = null;
    this.zoom = null;
    this.drawMs = null;
    this.firstDrawAt = null;
    this.drawnAt = {};
    this.pending = null;
    this.root = el("div", { class: "chart", dataset: { metric: title } });
    container.append(this.root);
    registry.add(this);
  }

  destroy() {
    clearTimeout(this.pending);
    registry.delete(this);
    if (this.plot) this.plot.destroy();
    this.root.remove();
  }

  setSeries(series) {
    this.series = series;
    this.schedule();
  }

  // Ask for a redraw; several requests within REDRAW_MS make one.
  schedule() {
    if (this.firstDrawAt === null) {
      this.draw(); // the first data shows at once; later redraws are batched
      return;
    }
    if (this.pending) return;
    this.pending = setTimeout(() => {
      this.pending = null;
      this.draw();
    }, REDRAW_MS);
  }

  rebuild() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
    this.draw();
  }

  columns() {
    const time = this.view.xMode === "time";
    const tables = [];
    const labels = [];
    const smoothing = this.smoothable ? this.view.smoothing : 0;
    for (const { label, set } of this.series) {
      const xs = time ? set.times : set.keys;
      let ys = this.view.logY ? set.values.map((v) => (v !== null && v > 0 ? v : null)) : set.values;
      const order = time ? xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b]) : null;
      const sortedX = order ? order.map((i) => xs[i]) : xs;
      ys = order ? order.map((i) => ys[i]) : ys;
      if (smoothing > 0) {
        tables.push([sortedX, ys, smooth(ys, smoothing)]);
        labels.push(`${label} (raw)`, label);
      } else {
        tables.push([sortedX, ys]);
        labels.push(label);
      }
    }
    if (!tables.length) return { data: [[]], labels };
    return { data: tables.length === 1 ? tables[0] : uPlot.join(tables), labels };
  }

  draw() {
    const started = performance.now();
    const { data, labels } = this.columns();
    const shape = JSON.stringify([labels, this.view.logY, this.view.xMode]);
    if (this.plot && this.shape === shape) {
      this.plot.setData(data, !this.zoom);
    } else {
      if (this.plot) this.plot.destroy();
      this.shape = shape;
      this.plot = new uPlot(this.options(labels), data, this.root);
    }
    this.drawMs = performance.now() - started;
    if (this.firstDrawAt === null && data[0].length) this.firstDrawAt = performance.now(); // ms since the page began
    this.root.dataset.points = String(data[0].length);
    this.root.dataset.drawMs = this.drawMs.toFixed(1);
    const now = Date.now();
    for (const { set } of this.series) {
      for (let i = Math.max(0, set.length - 50); i < set.length; i += 1) {
        if (!(set.keys[i] in this.drawnAt)) this.drawnAt[set.keys[i]] = now;
      }
    }
  }

  options(labels) {
    const smoothing = this.smoothable && this.view.smoothing > 0;
    const series = [{ label: this.view.xMode === "time" ? "time" : "step" }];
    labels.forEach((label, i) => {
      const color = COLORS[(smoothing ? Math.floor(i / 2) : i) % COLORS.length];
      const raw = smoothing && i % 2 === 0;
      series.push({ label, stroke: raw ? `${color}44` : color, width: raw ? 1 : 1.5, spanGaps: true }); // uPlot shows points when they are few
    });
    const width = Math.max(320, this.root.clientWidth || this.root.parentElement?.clientWidth || 600);
    return {
      title: this.title,
      width,
      height: 220,
      series,
      scales: { x: { time: this.view.xMode === "time" }, y: { distr: this.view.logY ? 3 : 1 } },
      axes: [{}, { size: 60 }],
      legend: { live: true },
      cursor: { sync: { key: this.syncKey, setSeries: false }, drag: { x: true, y: false, setScale: true } },
      hooks: {
        setSelect: [
          (u) => {
            if (u.select.width < 2) return;
            const low = u.posToVal(u.select.left, "x");
            const high = u.posToVal(u.select.left + u.select.width, "x");
            this.zoom = { low, high };
            if (this.onZoom) this.onZoom(this, low, high);
          },
        ],
        ready: [
          (u) =>
            u.over.addEventListener("dblclick", () => {
              this.zoom = null;
              if (this.onZoomOut) this.onZoomOut(this);
            }),
        ],
      },
    };
  }
}
