// One job: what it is and where it stands (pending reason beside what it asks for and what the
// cluster has free), its attempts and events, and tabs for metrics, logs, system metrics,
// checkpoints, the spec and, for builtin:collectives, the benchmark table.

import { api } from "../api.js";
import { collectivesTab } from "../collectives.js";
import { el, formatNumber, jobDuration, replace, requested, resources, statusBadge, time } from "../dom.js";
import { logsTab } from "../logs.js";
import { JobMetrics, liveBadge, metricsTab, systemTab } from "../metrics.js";

const TERMINAL = ["succeeded", "failed", "cancelled", "timed_out"];
const REFRESH_MS = 2000;

export function jobPage(view, jobId, params) {
  const header = el("div", { class: "job-header" });
  const summary = el("div", { class: "job-summary" });
  const attempts = el("div", { class: "attempts" });
  const timeline = el("ol", { class: "timeline", id: "timeline" });
  const tabBar = el("div", { class: "tabs", role: "tablist" });
  const tabBody = el("div", { class: "tab-body" });
  const error = el("p", { class: "error", role: "alert" });
  const metricsBadge = liveBadge();
  replace(
    view,
    error,
    header,
    summary,
    el("div", { class: "columns" }, el("section", {}, el("h2", {}, "Attempts"), attempts), el("section", {}, el("h2", {}, "Events"), timeline)),
    tabBar,
    tabBody,
  );

  let job = null;
  let events = [];
  let timer = null;
  let stopped = false;
  const metrics = new JobMetrics(jobId);
  const tabs = new Map();
  let current = params.get("tab") || "metrics";

  function tabNames() {
    const names = ["metrics", "logs", "system", "checkpoints", "spec"];
    if (job && (String(job.spec.entrypoint) === "builtin:collectives" || metrics.names(/^coll\//).length)) names.splice(3, 0, "collectives");
    return names;
  }

  function makeTab(name) {
    if (name === "metrics") return metricsTab(metrics);
    if (name === "system") return systemTab(metrics);
    if (name === "collectives") return collectivesTab(metrics);
    if (name === "logs") return logsTab(jobId, () => events, () => {});
    if (name === "checkpoints") return checkpointsTab(jobId);
    return { root: el("pre", { class: "spec", id: "spec" }, JSON.stringify(job.spec, null, 2)) };
  }

  function showTab(name) {
    current = name;
    if (!tabs.has(name)) tabs.set(name, makeTab(name));
    for (const [key, tab] of tabs) tab.root.hidden = key !== name;
    if (!tabs.get(name).root.isConnected) tabBody.append(tabs.get(name).root);
    renderTabBar();
    if (tabs.get(name).refresh) tabs.get(name).refresh();
    const query = new URLSearchParams({ tab: name });
    history.replaceState(null, "", `#/jobs/${jobId}?${query}`);
  }

  function renderTabBar() {
    replace(
      tabBar,
      tabNames().map((name) =>
        el("button", { type: "button", role: "tab", class: name === current ? "active" : "", "aria-selected": String(name === current), dataset: { tab: name }, onclick: () => showTab(name) }, name),
      ),
    );
  }

  function renderHeader() {
    replace(
      header,
      el("h1", {}, el("span", { class: "job-name", id: "job-name" }, job.name), " ", statusBadge(job.status), " ", metricsBadge.badge),
      el("p", { class: "muted mono" }, `${job.id} · project ${job.project} · ${job.spec.entrypoint}`),
      TERMINAL.includes(job.status) ? null : el("button", { type: "button", id: "cancel-job", onclick: cancel }, "Cancel"),
    );
  }

  function renderSummary() {
    const ask = requested(job.spec);
    const facts = [
      ["created", time(job.created_at)],
      ["duration", jobDuration(job)],
      ["workers", `${ask.workers} × ${resources(ask.perWorker)}`],
      ["latest", job.latest_metrics ? Object.entries(job.latest_metrics).map(([k, v]) => `${k} ${formatNumber(v)}`).join(" · ") : ""],
    ];
    if (job.error) facts.push(["error", job.error]);
    const list = el("dl", { class: "facts" }, facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { class: k === "error" ? "error-text" : "" }, v)]));
    if (job.status !== "queued") {
      replace(summary, list);
      return;
    }
    const free = el("span", { id: "free" }, "…");
    replace(
      summary,
      el(
        "div",
        { class: "pending", id: "pending" },
        el("strong", {}, job.queue_position ? `#${job.queue_position} in the queue` : "queued"),
        el("p", { class: "pending-reason" }, job.pending_reason || ""),
        el("p", {}, "asks for ", el("span", { id: "requested" }, resources(ask.total)), "; the cluster has ", free, " free"),
      ),
      list,
    );
    // Asking Ray for free resources can be slow: fill it in when it comes, holding up nothing.
    api("/v1/cluster")
      .then((cluster) => replace(free, cluster.reachable ? resources(cluster.free) : `Ray unreachable (${cluster.error || ""})`))
      .catch(() => replace(free, "unknown"));
  }

  function renderAttempts() {
    if (!job.attempts.length) {
      replace(attempts, el("p", { class: "muted" }, "none yet"));
      return;
    }
    replace(
      attempts,
      el(
        "table",
        { id: "attempts-table" },
        el("thead", {}, el("tr", {}, ["#", "status", "started", "finished", "Ray submission", "error"].map((h) => el("th", {}, h)))),
        el(
          "tbody",
          {},
          job.attempts.map((a) =>
            el("tr", { dataset: { attempt: a.n } }, el("td", {}, a.n), el("td", {}, a.status), el("td", {}, time(a.started_at)), el("td", {}, time(a.finished_at)), el("td", { class: "mono" }, a.ray_submission_id), el("td", { class: "error-text" }, a.error || "")),
          ),
        ),
      ),
    );
  }

  function renderTimeline() {
    replace(
      timeline,
      events.map((e) =>
        el(
          "li",
          { dataset: { eventId: e.id, kind: e.kind, status: e.status || "" }, title: JSON.stringify(e.data) },
          el("time", { datetime: e.created_at }, new Date(e.created_at).toLocaleTimeString()),
          " ",
          el("span", { class: "event-kind" }, e.status || e.kind),
          e.message ? [" ", el("span", { class: "event-message" }, e.message)] : null,
        ),
      ),
    );
  }

  async function cancel() {
    try {
      await api(`/v1/jobs/${jobId}/cancel`, { method: "POST" });
      refresh();
    } catch (problem) {
      replace(error, problem.message);
    }
  }

  async function refresh() {
    try {
      [job, events] = await Promise.all([api(`/v1/jobs/${jobId}`), allEvents(jobId)]);
      renderHeader();
      renderSummary();
      renderAttempts();
      renderTimeline();
      renderTabBar();
      if (tabs.has("logs")) tabs.get("logs").refresh();
      replace(error);
    } catch (problem) {
      if (problem.status === 401) return;
      replace(error, problem.message);
    }
    if (!stopped && !(job && TERMINAL.includes(job.status))) timer = setTimeout(refresh, REFRESH_MS);
  }

  (async () => {
    const loading = metrics.load().catch((problem) => replace(error, problem.message));
    await refresh();
    await loading;
    if (!job || stopped) return;
    showTab(tabNames().includes(current) ? current : "metrics");
    metrics.follow((state) => {
      metricsBadge.set(state);
      if (state === "ended") refresh();
    });
  })();

  return () => {
    stopped = true;
    clearTimeout(timer);
    metrics.stop();
    tabs.forEach((tab) => tab.stop && tab.stop());
  };
}

// Every row of a job's list (events, checkpoints): the API ends a page at the bytes one may hold and
// says where the next starts.
async function allOf(path) {
  const rows = [];
  let after = 0;
  for (;;) {
    const page = await api(path, { params: { after_id: after } });
    rows.push(...page.items);
    if (page.next_after_id == null) return rows;
    after = page.next_after_id;
  }
}

const allEvents = (jobId) => allOf(`/v1/jobs/${jobId}/events`);

function checkpointsTab(jobId) {
  const root = el("div", { class: "checkpoints-tab" }, el("p", { class: "muted" }, "loading…"));
  const load = async () => {
    const list = { items: await allOf(`/v1/jobs/${jobId}/checkpoints`) };
    replace(
      root,
      list.items.length
        ? el(
            "table",
            { id: "checkpoints-table" },
            el("thead", {}, el("tr", {}, ["attempt", "step", "path", "metrics", "recorded"].map((h) => el("th", {}, h)))),
            el("tbody", {}, list.items.map((c) => el("tr", {}, el("td", {}, c.attempt ?? ""), el("td", {}, c.step ?? ""), el("td", { class: "mono" }, c.path), el("td", {}, JSON.stringify(c.metrics)), el("td", {}, time(c.created_at))))),
          )
        : el("p", { class: "muted" }, "No checkpoints reported."),
    );
  };
  load().catch((problem) => replace(root, problem.message));
  return { root, refresh: () => load().catch(() => {}) };
}
