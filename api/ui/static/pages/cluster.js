// The cluster: Ray nodes with total and free resources, and the queue in admission order
// (priority, then fair share between projects, then age), refreshed every 3 s.

import { api } from "../api.js";
import { el, replace, requested, resources, shortId, statusBadge } from "../dom.js";

export function clusterPage(view) {
  const summary = el("div", { class: "cluster-summary", id: "cluster-summary" });
  const nodes = el("tbody");
  const queue = el("tbody");
  const error = el("p", { class: "error", role: "alert" });
  replace(
    view,
    el("h1", {}, "Cluster"),
    error,
    summary,
    el("h2", {}, "Nodes"),
    el("table", { id: "nodes-table" }, el("thead", {}, el("tr", {}, ["node", "total", "free"].map((h) => el("th", {}, h)))), nodes),
    el("h2", {}, "Queue"),
    el("table", { id: "queue-table" }, el("thead", {}, el("tr", {}, ["#", "id", "name", "status", "asks for", "reason"].map((h) => el("th", {}, h)))), queue),
  );
  let timer = null;
  let stopped = false;

  async function refresh() {
    try {
      const [cluster, queued] = await Promise.all([api("/v1/cluster"), api("/v1/jobs", { params: { status: "queued", limit: 200 } })]);
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
