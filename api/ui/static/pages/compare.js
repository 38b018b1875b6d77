// Several jobs' curves of one metric overlaid, one named series per job (#/compare?ids=a,b&metric=loss),
// or every trial of a sweep (#/compare?sweep=<id>), on the sweep's metric.

import { api } from "../api.js";
import { ChartView, LineChart } from "../charts.js";
import { el, replace, shortId } from "../dom.js";
import { MAX_POINTS } from "../metrics.js";
import { PointSet } from "../points.js";

export function comparePage(view, params) {
  const UUID = /^[0-9a-f-]{36}$/;
  let ids = (params.get("ids") || "").split(",").filter((id) => UUID.test(id));
  const sweepId = UUID.test(params.get("sweep") || "") ? params.get("sweep") : null;
  let metric = params.get("metric") || "";
  const error = el("p", { class: "error", role: "alert" });
  const grid = el("div", { class: "chart-grid" });
  let chart = null;
  const chartView = new ChartView((what) => chart && (what === "smoothing" ? chart.draw() : chart.rebuild()));
  const metricSelect = el("select", { id: "compare-metric" });
  replace(
    view,
    el("div", { class: "toolbar" }, el("h1", {}, "Compare"), el("label", {}, "metric ", metricSelect)),
    chartView.controls(),
    error,
    grid,
  );
  if (ids.length < 1 && !sweepId) {
    replace(error, "Pick jobs to compare on the Jobs page (tick two or more and press Compare selected).");
    return () => {};
  }

  let jobs = [];
  async function draw() {
    if (chart) chart.destroy();
    chart = new LineChart(grid, { title: metric, view: chartView, syncKey: "compare" });
    const series = await Promise.all(
      jobs.map(async (job) => {
        const page = await api(`/v1/jobs/${job.id}/metrics`, { params: { name: metric, rank: 0, max_points: MAX_POINTS } });
        const set = new PointSet();
        page.items.forEach((point) => set.add(point));
        return { label: `${job.name} (${shortId(job.id)})`, set };
      }),
    );
    chart.setSeries(series);
  }

  (async () => {
    try {
      if (sweepId) {
        const sweep = await api(`/v1/sweeps/${sweepId}`);
        ids = [...sweep.trials].sort((a, b) => a.n - b.n).map((trial) => trial.job_id);
        metric = metric || sweep.metric;
      }
      jobs = await Promise.all(ids.map((id) => api(`/v1/jobs/${id}`)));
    } catch (problem) {
      replace(error, problem.message);
      return;
    }
    const names = [...new Set(jobs.flatMap((job) => Object.keys(job.latest_metrics || {}).filter((n) => n !== "step")))].sort();
    if (!metric || !names.includes(metric)) metric = names.includes("loss") ? "loss" : names[0] || "";
    replace(metricSelect, names.map((name) => el("option", { value: name, selected: name === metric }, name)));
    metricSelect.addEventListener("change", () => {
      metric = metricSelect.value;
      const which = sweepId ? `sweep=${sweepId}` : `ids=${ids.join(",")}`;
      history.replaceState(null, "", `#/compare?${which}&metric=${encodeURIComponent(metric)}`);
      draw();
    });
    if (metric) await draw();
    else replace(error, "These jobs have no metrics yet.");
  })();
  return () => chart && chart.destroy();
}
