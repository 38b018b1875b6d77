// Talking to the API: the bearer token from sessionStorage on every call, never in a URL;
// a 401 clears it and goes back to sign-in. Event streams are read with fetch() because
// EventSource cannot send an Authorization header; they resume with Last-Event-ID.

const TOKEN_KEY = "trainmaster.token";
const listeners = new Set();

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

// Called with no argument whenever the API says the token is no good.
export function onSignedOut(listener) {
  listeners.add(listener);
}

export class ApiError extends Error {
  constructor(status, name, detail) {
    super(`${status} ${name}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    this.status = status;
    this.name = name;
    this.detail = detail;
  }
}

function headers(extra = {}) {
  const value = token.get();
  return value ? { Authorization: `Bearer ${value}`, ...extra } : { ...extra };
}

async function failure(response) {
  let body = {};
  try {
    body = await response.json();
  } catch {
    body = { error: "HTTPError", detail: response.statusText };
  }
  if (response.status === 401) {
    token.clear();
    listeners.forEach((listener) => listener());
  }
  return new ApiError(response.status, body.error || "HTTPError", body.detail);
}

export async function api(path, { method = "GET", params, body, signal } = {}) {
  const url = new URL(path, location.origin);
  for (const [key, value] of Object.entries(params || {})) {
    if (value === undefined || value === null || value === "") continue;
    for (const one of Array.isArray(value) ? value : [value]) url.searchParams.append(key, String(one));
  }
  const init = { method, headers: headers(body ? { "Content-Type": "application/json" } : {}), signal };
  if (body) init.body = JSON.stringify(body);
  const response = await fetch(url, init);
  if (!response.ok) throw await failure(response);
  return response.status === 204 ? null : response.json();
}

// Check a token without keeping it: resolves to true, false (refused) or throws (API unreachable).
export async function tokenWorks(candidate) {
  const response = await fetch("/v1/jobs?limit=1", { headers: { Authorization: `Bearer ${candidate}` } });
  if (response.status === 401) return false;
  if (!response.ok) throw new ApiError(response.status, "HTTPError", response.statusText);
  return true;
}

function* parseEvents(buffer) {
  // Yields [event, rest] for every complete event in buffer ("\n\n" ends one).
  let start = 0;
  for (;;) {
    const end = buffer.indexOf("\n\n", start);
    if (end < 0) break;
    const block = buffer.slice(start, end);
    start = end + 2;
    const event = { event: "message", data: [], id: null };
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") event.event = value;
      else if (field === "data") event.data.push(value);
      else if (field === "id") event.id = value;
    }
    if (event.data.length) yield { ...event, data: JSON.parse(event.data.join("\n")) };
  }
  yield { rest: buffer.slice(start) };
}

// Follow an SSE endpoint until it sends `end` or `stop()` is called. `onEvent(event)` gets each
// event; `onState("live" | "reconnecting" | "ended")` tracks the connection. A dropped connection is
// retried with backoff, sending the last event id seen so nothing is missed or repeated.
export function follow(path, { lastEventId = null, onEvent, onState = () => {} }) {
  const controller = new AbortController();
  let stopped = false;
  let lastId = lastEventId;
  let failures = 0;

  async function once() {
    const extra = { Accept: "text/event-stream" };
    if (lastId !== null && lastId !== undefined) extra["Last-Event-ID"] = String(lastId);
    const response = await fetch(path, { headers: headers(extra), signal: controller.signal, cache: "no-store" });
    if (!response.ok) throw await failure(response);
    onState("live");
    failures = 0;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      buffer += value.replace(/\r\n?/g, "\n");
      for (const item of parseEvents(buffer)) {
        if ("rest" in item) {
          buffer = item.rest;
          break;
        }
        if (item.id !== null) lastId = item.id;
        onEvent(item);
        if (item.event === "end") return true;
      }
    }
  }

  (async () => {
    while (!stopped) {
      try {
        if (await once()) {
          onState("ended");
          return;
        }
      } catch (error) {
        if (stopped) return;
        if (error instanceof ApiError && error.status !== 429 && error.status < 500) {
          onState("ended");
          return;
        }
      }
      if (stopped) return;
      onState("reconnecting");
      failures += 1;
      await new Promise((resolve) => setTimeout(resolve, Math.min(250 * 2 ** Math.min(failures, 5), 5000)));
    }
  })();

  return {
    stop() {
      stopped = true;
      controller.abort();
    },
    get lastEventId() {
      return lastId;
    },
  };
}
