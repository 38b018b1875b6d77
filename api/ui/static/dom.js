// Building the page from data. Every string from the API or the user goes in as text
// (textContent via document.createTextNode), never as HTML: a job named "<img onerror=…>" stays text.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

export const shortId = (id) => String(id).slice(0, 8);

export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

export function jobDuration(job) {
  if (!job.started_at) return "";
  const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
  return duration((end - Date.parse(job.started_at)) / 1000);
}

export function time(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

export function statusBadge(status) {
  return el("span", { class: `status status-${status}`, dataset: { status } }, status);
}

export function formatNumber(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  return Math.abs(value) >= 1e4 || Math.abs(value) < 1e-3 ? value.toExponential(3) : value.toPrecision(5);
}

export function formatBytes(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value >= 10 || unit === 0 ? Math.round(value) : value.toFixed(1)} ${units[unit]}`;
}

export function resources(map) {
  if (!map) return "";
  return Object.entries(map)
    .map(([name, amount]) => (name === "memory" ? `${formatBytes(amount)} memory` : `${amount} ${name}`))
    .join(", ");
}

// The resources a job asks for in all: workers x per-worker resources, as the dispatcher counts them
// (an elastic gang, {min, max}, is admitted and counted at its minimum until it resizes).
export function requested(spec) {
  const scaling = spec.scaling || {};
  const size = scaling.num_workers || 1;
  const workers = typeof size === "object" ? size.min : size;
  const perWorker = { CPU: 1, ...(scaling.resources_per_worker || {}) };
  if (scaling.use_gpu && perWorker.GPU === undefined) perWorker.GPU = 1;
  const total = {};
  for (const [name, amount] of Object.entries(perWorker)) total[name] = amount * workers;
  return { workers, perWorker, total };
}
