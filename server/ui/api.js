// The server's HTTP API (Nomad's paths), with the token the user gave the UI.
//
// The token lives in localStorage under `drover.token` (Nomad's UI keeps its own in
// localStorage too) and travels only in the `X-Nomad-Token` header: never in a URL,
// where logs, history and referrers would keep it.

const TOKEN_KEY = "drover.token";

export function token() {
  try {
    return localStorage.getItem(TOKEN_KEY) || "";
  } catch (_) {
    return "";
  }
}

export function setToken(secret) {
  if (secret) localStorage.setItem(TOKEN_KEY, secret);
  else localStorage.removeItem(TOKEN_KEY);
  window.dispatchEvent(new Event("drover-token"));
}

/** An answer that was not 2xx: its status and the server's plain-text message. */
export class ApiError extends Error {
  constructor(status, message, path) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.path = path;
  }
  get forbidden() {
    return this.status === 401 || this.status === 403;
  }
}

function headers() {
  const h = { Accept: "application/json" };
  const t = token();
  if (t) h["X-Nomad-Token"] = t;
  return h;
}

/** `fetch` of an API path with the token; throws `ApiError` on a non-2xx answer. */
export async function raw(path, { signal, method = "GET", body } = {}) {
  const resp = await fetch(path, {
    method,
    signal,
    headers: headers(),
    body,
    credentials: "omit",
    cache: "no-store",
    referrerPolicy: "no-referrer",
  });
  if (!resp.ok) {
    let text = "";
    try {
      text = (await resp.text()).trim();
    } catch (_) {
      /* the message is optional */
    }
    throw new ApiError(resp.status, text.slice(0, 500), path);
  }
  return resp;
}

/**
 * `GET path` as JSON, and the store index it was read at. With `index`, a blocking
 * query: the answer waits until something newer than `index` was committed (or
 * `wait` passed).
 */
export async function get(path, { signal, index, wait } = {}) {
  let url = path;
  if (index) {
    const sep = url.includes("?") ? "&" : "?";
    url += `${sep}index=${encodeURIComponent(index)}&wait=${encodeURIComponent(wait || "60s")}`;
  }
  const resp = await raw(url, { signal });
  const data = await resp.json();
  const idx = Number(resp.headers.get("X-Nomad-Index") || 0);
  return { data, index: idx };
}

export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    });
  });
}

/**
 * Keeps a view live: `render(data)` with `GET path` now, then again each time the
 * store moves past what was shown (Nomad's blocking queries: one request waits on the
 * server until a commit), until `signal` aborts. Failures go to `onError` (and a
 * later success to `onError(null)`) with a backoff, so that a restarting server is
 * waited for rather than hammered.
 */
export async function live(path, signal, render, onError) {
  let index = 0;
  let backoff = 500;
  while (!signal.aborted) {
    try {
      const r = await get(path, { signal, index });
      if (signal.aborted) return;
      if (r.index !== index || index === 0) {
        // An index going backwards is a new store (a restarted dev agent): start over.
        index = r.index < index ? 0 : r.index;
        await render(r.data);
      }
      onError?.(null);
      backoff = 500;
    } catch (e) {
      if (signal.aborted) return;
      onError?.(e);
      await sleep(backoff, signal);
      backoff = Math.min(backoff * 2, 15000);
    }
  }
}
