// The jobs page: status, name, project, workers and GPUs, queue position or pending reason,
// attempts, duration and a sparkline of the main metric. Filters live in the URL (#/jobs?status=…)
// so a reload or a shared link keeps them; the list refreshes every 2 s.

import { api } from "../api.js";
import { el, jobDuration, replace, requested, shortId, statusBadge } from "../dom.js";
import { drawSparkline, mainMetric } from "../sparkline.js";

const STATUSES = ["queued", "starting", "running", "cancelling", "succeeded", "failed", "cancelled", "timed_out"];
const REFRESH_MS = 2000;
const SPARK_REFRESH_MS = 10000;

export function jobsPage(view, params) {
  const filters = { status: params.get("status") || "", label: params.get("label") || "" };
  const selected = new Set();
  const sparkCache = new Map(); // job id -> {at, values}
  const body = el("tbody");
  const count = el("span", { class: "muted", id: "job-count" });
  const compare = el("button", { type: "button", id: "compare-selected", disabled: true, onclick: openCompare }, "Compare selected");
  const statusSelect = el(
    "select",
    { id: "status-filter", onchange: () => setFilter("status", statusSelect.value) },
    el("option", { value: "" }, "all statuses"),
    STATUSES.map((status) => el("option", { value: status, selected: status === filters.status }, status)),
  );
  const labelInput = el("input", {
    id: "label-filter",
    placeholder: "label key:value",
    value: filters.label,
    onchange: () => setFilter("label", labelInput.value.trim()),
  });
  const error = el("p", { class: "error", role: "alert" });
  replace(
    view,
    el("div", { class: "toolbar" }, el("h1", {}, "Jobs"), statusSelect, labelInput, compare, count),
    error,
    el(
      "table",
      { class: "jobs", id: "jobs-table" },
      el(
        "thead",
        {},
        el("tr", {}, ["", "id", "name", "status", "project", "workers", "queue", "attempts", "duration", "metric"].map((h) => el("th", {}, h))),
      ),
      body,
    ),
  );

  function setFilter(key, value) {
    filters[key] = value;
    const query = new URLSearchParams(Object.entries(filters).filter(([, v]) => v));
    const hash = query.toString() ? `#/jobs?${query}` : "#/jobs";
    if (location.hash !== hash) location.hash = hash; // the router renders the page again
  }

  function openCompare() {
    location.hash = `#/compare?ids=${[...selected].join(",")}`;
  }

  function row(job) {
    const { workers, total } = requested(job.spec);
    const gpus = total.GPU ? ` · ${total.GPU} GPU` : "";
    const queue = job.status === "queued"
      ? [job.queue_position ? el("span", { class: "queue-position" }, `#${job.queue_position}`) : null, " ", el("span", { class: "pending-reason" }, job.pending_reason || "")]
      : job.error ? el("span", { class: "error-text" }, job.error) : "";
    const box = el("input", {
      type: "checkbox",
      checked: selected.has(job.id),
      "aria-label": "select for compare",
      onchange: () => {
        if (box.checked) selected.add(job.id);
        else selected.delete(job.id);
        compare.disabled = selected.size < 2;
      },
    });
    const spark = el("canvas", { class: "spark", width: 100, height: 24 });
    paintSpark(job, spark);
    return el(
      "tr",
      { dataset: { jobId: job.id, status: job.status } },
      el("td", {}, box),
      el("td", { class: "mono" }, el("a", { href: `#/jobs/${job.id}` }, shortId(job.id))),
      el("td", { class: "name" }, el("a", { href: `#/jobs/${job.id}` }, job.name)),
      el("td", {}, statusBadge(job.status)),
      el("td", {}, job.project),
      el("td", {}, `${workers}${gpus}`),
      el("td", { class: "queue" }, queue),
      el("td", {}, String(job.attempts.length)),
      el("td", {}, jobDuration(job)),
      el("td", {}, spark),
    );
  }

  async function paintSpark(job, canvas) {
    const name = mainMetric(job.latest_metrics);
    if (!name) return;
    const cached = sparkCache.get(job.id);
    const active = !["succeeded", "failed", "cancelled", "timed_out"].includes(job.status);
    if (!cached || (active && Date.now() - cached.at > SPARK_REFRESH_MS)) {
      const entry = { at: Date.now(), values: cached ? cached.values : [], name };
      sparkCache.set(job.id, entry);
      try {
        const points = await api(`/v1/jobs/${job.id}/metrics`, { params: { name, rank: 0, max_points: 60 } });
        entry.values = points.items.map((p) => p.value).filter((v) => v !== null);
      } catch {
        return;
      }
    }
    canvas.title = name;
    drawSparkline(canvas, sparkCache.get(job.id).values);
  }

  let timer = null;
  let stopped = false;
  async function refresh() {
    try {
      const page = await api("/v1/jobs", { params: { status: filters.status, label: filters.label, limit: 100 } });
      replace(body, page.items.map(row));
      replace(count, `${page.items.length}${page.next_cursor ? "+" : ""} job(s)`);
      replace(error);
    } catch (problem) {
      if (problem.status === 401) return;
      replace(error, problem.message);
    }
    if (!stopped) timer = setTimeout(refresh, REFRESH_MS);
  }
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
