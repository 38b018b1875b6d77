// The cluster: Ray nodes with total and free resources, each project's quota, holdings, borrowing and
// lending (GET /v1/queues), the queue in admission order (priority, then fair share between projects,
// then age), refreshed every 3 s; and the last 30 days' usage per project (GET /v1/usage), read once.

import { api } from "../api.js";
import { el, replace, requested, resources, shortId, statusBadge } from "../dom.js";

export function clusterPage(view) {
  const summary = el("div", { class: "cluster-summary", id: "cluster-summary" });
  const nodes = el("tbody");
  const queue = el("tbody");
  const projects = el("tbody");
  const usage = el("tbody");
  const error = el("p", { class: "error", role: "alert" });
  replace(
    view,
    el("h1", {}, "Cluster"),
    error,
    summary,
    el("h2", {}, "Nodes"),
    el("table", { id: "nodes-table" }, el("thead", {}, el("tr", {}, ["node", "total", "free"].map((h) => el("th", {}, h)))), nodes),
    el("h2", {}, "Projects"),
    el("table", { id: "projects-table" }, el("thead", {}, el("tr", {}, ["project", "cohort", "quota", "holds", "borrowed", "lent", "fair share", "waiting"].map((h) => el("th", {}, h)))), projects),
    el("h2", {}, "Usage, last 30 days"),
    el("table", { id: "usage-table" }, el("thead", {}, el("tr", {}, ["project", "GPU-hours", "CPU-hours", "productive", "lost", "queued hours", "goodput"].map((h) => el("th", {}, h)))), usage),
    el("h2", {}, "Queue"),
    el("table", { id: "queue-table" }, el("thead", {}, el("tr", {}, ["#", "id", "name", "status", "asks for", "reason"].map((h) => el("th", {}, h)))), queue),
  );
  let timer = null;
  let stopped = false;
  const hours = (h) => h.toFixed(2);
  api("/v1/usage")
    .then((report) =>
      replace(
        usage,
        report.items.map((row) => {
          const basis = row.gpu_hours.allocated > 0 ? row.gpu_hours : row.cpu_hours;
          return el(
            "tr",
            { dataset: { project: row.key } },
            el("td", {}, row.key),
            el("td", {}, hours(row.gpu_hours.allocated)),
            el("td", {}, hours(row.cpu_hours.allocated)),
            el("td", {}, hours(basis.productive)),
            el("td", {}, hours(basis.lost)),
            el("td", {}, hours(row.queue_hours)),
            el("td", { class: "goodput" }, row.goodput == null ? "" : `${Math.round(row.goodput * 100)}%`),
          );
        }),
      ),
    )
    .catch((problem) => {
      if (problem.status !== 401) replace(error, problem.message);
    });

  async function refresh() {
    try {
      const [cluster, queued, queues] = await Promise.all([
        api("/v1/cluster"),
        api("/v1/jobs", { params: { status: "queued", limit: 200 } }),
        api("/v1/queues", { params: { limit: 0 } }),
      ]);
      replace(
        projects,
        queues.items.map((p) =>
          el(
            "tr",
            { dataset: { project: p.project } },
            el("td", {}, p.project),
            el("td", {}, p.cohort || ""),
            el("td", {}, resources(p.quota) || "no limit"),
            el("td", {}, resources(p.usage)),
            el("td", {}, resources(p.borrowed)),
            el("td", {}, resources(p.lent)),
            el("td", { title: "its share of the cluster, averaged over a half-life, plus what it holds now; smaller is admitted first" }, `${Math.round(p.fair_share * 100)}%`),
            el("td", {}, String(p.waiting)),
          ),
        ),
      );
      replace(
        summary,
        cluster.reachable
          ? el("p", {}, `total ${resources(cluster.total)} · free ${resources(cluster.free)} · `, `${cluster.queue_depth} queued (${cluster.project_queue_depth} yours)`)
          : el("p", { class: "error-text" }, `Ray unreachable: ${cluster.error || ""} · ${cluster.queue_depth} queued`),
      );
      replace(nodes, cluster.nodes.map((n) => el("tr", {}, el("td", { class: "mono" }, shortId(n.node_id)), el("td", {}, resources(n.total)), el("td", {}, resources(n.free)))));
      const ordered = [...queued.items].sort((a, b) => (a.queue_position ?? 1e9) - (b.queue_position ?? 1e9));
      replace(
        queue,
        ordered.map((job) =>
          el(
            "tr",
            { dataset: { jobId: job.id } },
            el("td", {}, job.queue_position ?? ""),
            el("td", { class: "mono" }, el("a", { href: `#/jobs/${job.id}` }, shortId(job.id))),
            el("td", {}, job.name),
            el("td", {}, statusBadge(job.status)),
            el("td", {}, resources(requested(job.spec).total)),
            el("td", { class: "pending-reason" }, job.pending_reason || ""),
          ),
        ),
      );
      replace(error);
    } catch (problem) {
      if (problem.status !== 401) replace(error, problem.message);
    }
    if (!stopped) timer = setTimeout(refresh, 3000);
  }
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
