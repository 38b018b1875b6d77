// A job's metric points in the browser: a downsampled first load (min and max of each bucket, so a
// one-step spike survives), then the live stream from the last sequence seen. Zooming a chart
// re-fetches just that step range with finer resolution.

import { api, follow } from "./api.js";
import { ChartView, LineChart } from "./charts.js";
import { el, replace } from "./dom.js";
import { PointSet } from "./points.js";

export const MAX_POINTS = 2000;
const SYSTEM = /^sys\//;
const COLLECTIVES = /^coll\//;

export class JobMetrics {
  constructor(jobId) {
    this.jobId = jobId;
    this.sets = new Map(); // "rank|name" -> PointSet
    this.listeners = new Set();
    this.stream = null;
  }

  set(name, rank = 0) {
    const key = `${rank}|${name}`;
    if (!this.sets.has(key)) this.sets.set(key, new PointSet());
    return this.sets.get(key);
  }

  names(pattern = null, exclude = null) {
    const names = new Set();
    for (const key of this.sets.keys()) {
      const name = key.slice(key.indexOf("|") + 1);
      if ((!pattern || pattern.test(name)) && !(exclude && exclude.test(name))) names.add(name);
    }
    return [...names].sort();
  }

  ranks(name) {
    return [...this.sets.keys()].filter((k) => k.endsWith(`|${name}`)).map((k) => Number(k.split("|")[0])).sort((a, b) => a - b);
  }

  add(points) {
    for (const point of points) this.set(point.name, point.rank).add(point);
    this.listeners.forEach((listener) => listener(points));
  }

  async load() {
    if (window.trainmaster && window.trainmaster.metricsRequestedAt === null) window.trainmaster.metricsRequestedAt = performance.now();
    const first = await api(`/v1/jobs/${this.jobId}/metrics`, { params: { rank: 0, max_points: MAX_POINTS } });
    this.add(first.items);
    const system = this.names(SYSTEM);
    if (system.length) {
      const all = await api(`/v1/jobs/${this.jobId}/metrics`, { params: { name: system, max_points: MAX_POINTS } });
      this.add(all.items);
    }
    return first.items.length;
  }

  // Resume after the newest point every series already holds (the lowest of their last sequences),
  // so the live stream fills whatever the downsampled load left out; repeats replace themselves.
  resumeAfter() {
    const lasts = [...this.sets.values()].map((set) => set.maxSeq());
    return lasts.length ? Math.min(...lasts) : null;
  }

  follow(onState) {
    this.stream = follow(`/v1/jobs/${this.jobId}/metrics/stream`, {
      lastEventId: this.resumeAfter(),
      onState,
      onEvent: (event) => {
        if (event.event === "metrics") this.add(event.data.items);
      },
    });
    return this.stream;
  }

  stop() {
    if (this.stream) this.stream.stop();
  }
}

// The metrics tab: one chart per metric of rank 0, with shared smoothing / log-y / x controls.
export function metricsTab(metrics, { pattern = null, exclude = new RegExp(`${SYSTEM.source}|${COLLECTIVES.source}`), perRank = false } = {}) {
  const grid = el("div", { class: "chart-grid" });
  const charts = new Map();
  const view = new ChartView((what) => charts.forEach((chart) => (what === "smoothing" ? chart.draw() : chart.rebuild())));
  const empty = el("p", { class: "muted" }, "No metrics yet.");
  const root = el("div", { class: "metrics-tab" }, perRank ? null : view.controls(), empty, grid);
  const syncKey = `job-${metrics.jobId}-${perRank ? "sys" : "metrics"}`;

  function seriesOf(name) {
    if (perRank) return metrics.ranks(name).map((rank) => ({ label: `rank ${rank}`, set: metrics.set(name, rank) }));
    const chart = charts.get(name);
    const coarse = metrics.set(name, 0);
    const fine = chart && chart.fine;
    return [{ label: name, set: fine ? PointSet.overlay(coarse, fine.set, fine.low, fine.high) : coarse }];
  }

  async function zoom(chart, low, high) {
    const coarse = metrics.set(chart.title, 0);
    let [since, until] = [low, high];
    if (view.xMode === "time") {
      const inRange = coarse.steps.filter((step, i) => step !== null && coarse.times[i] >= low && coarse.times[i] <= high);
      if (!inRange.length) return;
      [since, until] = [Math.min(...inRange), Math.max(...inRange)];
    }
    since = Math.max(0, Math.floor(since));
    until = Math.max(since, Math.ceil(until));
    const params = { name: chart.title, rank: 0, since_step: since, until_step: until, max_points: MAX_POINTS };
    const page = await api(`/v1/jobs/${metrics.jobId}/metrics`, { params });
    const set = new PointSet();
    page.items.forEach((point) => set.add(point));
    chart.fine = { set, low: since, high: until };
    chart.root.dataset.zoomPoints = String(set.length);
    chart.setSeries(seriesOf(chart.title));
  }

  function zoomOut(chart) {
    chart.fine = null;
    delete chart.root.dataset.zoomPoints;
    chart.setSeries(seriesOf(chart.title));
    chart.rebuild();
  }

  function update(points) {
    const names = metrics.names(pattern, perRank ? null : exclude);
    empty.hidden = names.length > 0;
    const touched = new Set(points ? points.map((p) => p.name) : names);
    for (const name of names) {
      if (!charts.has(name)) {
        const chart = new LineChart(grid, {
          title: name,
          view,
          syncKey,
          smoothable: !perRank,
          onZoom: perRank ? null : zoom,
          onZoomOut: perRank ? null : zoomOut,
        });
        charts.set(name, chart);
        touched.add(name);
      }
      if (!touched.has(name)) continue;
      const chart = charts.get(name);
      if (chart.fine && points) {
        for (const point of points) {
          if (point.name === name && point.rank === 0 && point.step >= chart.fine.low && point.step <= chart.fine.high) chart.fine.set.add(point);
        }
      }
      chart.setSeries(seriesOf(name));
    }
  }

  metrics.listeners.add(update);
  update(null);
  return {
    root,
    stop() {
      metrics.listeners.delete(update);
      charts.forEach((chart) => chart.destroy());
    },
    refresh() {
      charts.forEach((chart) => chart.rebuild());
    },
  };
}

export function systemTab(metrics) {
  return metricsTab(metrics, { pattern: SYSTEM, exclude: null, perRank: true });
}

export function liveBadge() {
  const badge = el("span", { class: "badge", id: "live-badge", dataset: { state: "connecting" } }, "Connecting");
  const words = { live: "Live", reconnecting: "Reconnecting", ended: "Ended", connecting: "Connecting" };
  return {
    badge,
    set(state) {
      badge.dataset.state = state;
      replace(badge, words[state] || state);
    },
  };
}
