// The logs tab: stored lines first, then the live stream; a virtualised list (only the rows in
// view are in the DOM, so 100k lines scroll smoothly), a rank filter and a download of the whole log.
// Worker lines come from Ray as "(RayTrainWorker pid=N) …"; the `workers_started` events say which
// rank each pid of each attempt is.

import { api, follow } from "./api.js";
import { el, replace } from "./dom.js";

const ROW_PX = 18;
const PAGE = 10000;
const WORKER_LINE = /^\((?:RayTrainWorker|[A-Za-z_]+Worker[A-Za-z_]*) pid=(\d+)(?:, ip=[^)]*)?\)/;

export function rankOf(line, attempt, pidRanks) {
  const match = WORKER_LINE.exec(line);
  if (!match) return null;
  const rank = pidRanks.get(`${attempt}|${match[1]}`) ?? pidRanks.get(`*|${match[1]}`);
  return rank === undefined ? null : rank;
}

export function pidRanksFrom(events) {
  const ranks = new Map();
  for (const event of events) {
    if (event.kind !== "workers_started") continue;
    for (const worker of event.data.workers || []) {
      if (typeof worker.rank !== "number" || !worker.pid) continue;
      ranks.set(`${event.data.attempt ?? "*"}|${worker.pid}`, worker.rank);
      ranks.set(`*|${worker.pid}`, worker.rank);
    }
  }
  return ranks;
}

async function allStored(jobId) {
  const lines = [];
  let after = 0;
  for (;;) {
    const page = await api(`/v1/jobs/${jobId}/logs`, { params: { after_seq: after, limit: PAGE } });
    lines.push(...page.items);
    // A page ends at PAGE lines or at the bytes one page may hold; the API says where the next starts.
    if (page.next_after_seq == null) return lines;
    after = page.next_after_seq;
  }
}

export function logsTab(jobId, getEvents, onState) {
  let lines = [];
  let visible = [];
  let filter = "all";
  let stream = null;
  let follow_ = true;
  const spacer = el("div", { class: "log-spacer" });
  const rows = el("div", { class: "log-rows" });
  const viewport = el("div", { class: "log-viewport", id: "log-viewport", tabindex: 0 }, spacer, rows);
  const count = el("span", { class: "muted", id: "log-count" });
  const rankSelect = el("select", { id: "rank-filter" }, el("option", { value: "all" }, "all output"));
  const download = el("button", { type: "button", id: "download-logs" }, "Download");
  const root = el("div", { class: "logs-tab" }, el("div", { class: "toolbar" }, rankSelect, download, count), viewport);

  function pidRanks() {
    return pidRanksFrom(getEvents());
  }

  function classify(items) {
    const ranks = pidRanks();
    for (const item of items) item.rank = rankOf(item.line, item.attempt, ranks);
  }

  function refilter() {
    visible = filter === "all" ? lines : lines.filter((l) => (filter === "driver" ? l.rank === null : l.rank === Number(filter)));
    spacer.style.height = `${visible.length * ROW_PX}px`;
    replace(count, `${visible.length} of ${lines.length} line(s)`);
    viewport.dataset.lines = String(visible.length);
    if (follow_) viewport.scrollTop = viewport.scrollHeight;
    paint();
  }

  function paint() {
    // scrollTop can still hold the old, longer list's offset right after a filter shortens it (the
    // browser clamps it only at its next layout): never start past the rows a full view can show.
    const inView = Math.ceil((viewport.clientHeight || 480) / ROW_PX);
    const first = Math.max(0, Math.min(Math.floor(viewport.scrollTop / ROW_PX), visible.length - inView) - 20);
    const last = Math.min(visible.length, first + inView + 40);
    rows.style.transform = `translateY(${first * ROW_PX}px)`;
    const nodes = [];
    for (let i = first; i < last; i += 1) {
      const line = visible[i];
      nodes.push(el("div", { class: "log-line", dataset: { seq: line.seq, rank: line.rank ?? "driver" } }, line.line));
    }
    replace(rows, nodes);
  }

  function rankOptions() {
    const ranks = new Set(lines.map((l) => l.rank).filter((r) => r !== null));
    const wanted = ["all", "driver", ...[...ranks].sort((a, b) => a - b).map(String)];
    const have = [...rankSelect.options].map((o) => o.value);
    if (wanted.join() === have.join()) return;
    replace(rankSelect, wanted.map((v) => el("option", { value: v, selected: v === filter }, v === "all" ? "all output" : v === "driver" ? "driver and Ray" : `rank ${v}`)));
  }

  function append(items) {
    classify(items);
    const last = lines.length ? lines[lines.length - 1].seq : 0;
    lines.push(...items.filter((item) => item.seq > last));
    rankOptions();
    refilter();
  }

  viewport.addEventListener("scroll", () => {
    follow_ = viewport.scrollTop + viewport.clientHeight >= viewport.scrollHeight - ROW_PX * 2;
    paint();
  });
  rankSelect.addEventListener("change", () => {
    filter = rankSelect.value;
    follow_ = true; // a new filter shows its newest lines, as the unfiltered view does
    refilter();
  });
  download.addEventListener("click", async () => {
    const whole = await allStored(jobId); // the whole log, whatever the filter shows
    const blob = new Blob(whole.map((l) => `${l.line}\n`), { type: "text/plain" });
    const link = el("a", { href: URL.createObjectURL(blob), download: `${jobId}.log` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  });

  (async () => {
    try {
      append(await allStored(jobId));
    } catch (problem) {
      replace(count, problem.message);
      return;
    }
    stream = follow(`/v1/jobs/${jobId}/logs/stream`, {
      lastEventId: lines.length ? lines[lines.length - 1].seq : null,
      onState,
      onEvent: (event) => {
        if (event.event === "logs") append(event.data.items);
      },
    });
  })();

  return {
    root,
    refresh: () => {
      classify(lines);
      rankOptions();
      refilter();
    },
    stop: () => stream && stream.stop(),
  };
}
