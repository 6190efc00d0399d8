// Building the page: elements and text nodes only. Nothing here (or anywhere in the
// UI) assigns a string to innerHTML: job names, log lines and task output come from
// the cluster and are hostile. The server's CSP requires Trusted Types with no policy,
// so such an assignment would throw anyway.

/**
 * An element: `h("a", { href: "/ui/jobs", class: "x" }, "text", child, [more])`.
 * Strings become text nodes; `null`, `undefined` and `false` are skipped. Attributes
 * starting with `on` are event listeners (`onclick: fn`).
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") {
      el.addEventListener(k.slice(2), v);
    } else if (k === "class") {
      el.className = v;
    } else if (k === "dataset") {
      Object.assign(el.dataset, v);
    } else if (k === "href") {
      // Only our own paths and http(s): never `javascript:`.
      el.setAttribute("href", safeHref(v));
    } else {
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.append(c);
    else el.append(document.createTextNode(String(c)));
  }
}

function safeHref(v) {
  const s = String(v);
  if (s.startsWith("/") && !s.startsWith("//")) return s;
  try {
    const u = new URL(s, location.href);
    if (u.protocol === "http:" || u.protocol === "https:") return u.href;
  } catch (_) {
    /* not a URL */
  }
  return "#";
}

/** Removes every child of `el`. */
export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
}

/** A link to a path of the UI (`/ui/...`), routed without reloading. */
export function link(path, ...children) {
  return h("a", { href: path, dataset: { route: "" } }, ...children);
}

/** Path segments, escaped. */
export function path(...parts) {
  return "/" + parts.map((p, i) => (i === 0 ? p : encodeURIComponent(p))).join("/");
}

const STATUS_CLASS = {
  running: "ok",
  ready: "ok",
  healthy: "ok",
  successful: "ok",
  complete: "done",
  dead: "muted",
  stop: "muted",
  stopped: "muted",
  cancelled: "muted",
  pending: "warn",
  starting: "warn",
  queued: "warn",
  blocked: "warn",
  initializing: "warn",
  paused: "warn",
  draining: "warn",
  ineligible: "warn",
  failed: "bad",
  lost: "bad",
  down: "bad",
  unhealthy: "bad",
  disconnected: "bad",
  unknown: "muted",
};

/** A status as a coloured label. */
export function badge(status) {
  const s = String(status ?? "unknown");
  return h("span", { class: "badge " + (STATUS_CLASS[s.toLowerCase()] || "muted") }, s);
}

/** A short id (the first 8 characters, as Nomad shows them), full id in the tooltip. */
export function shortId(id) {
  const s = String(id ?? "");
  return h("code", { class: "id", title: s }, s.slice(0, 8));
}

/** Nanoseconds since the epoch (Nomad's times) or an RFC 3339 string, as local time. */
export function time(value) {
  const d = toDate(value);
  if (!d) return h("span", { class: "muted-text" }, "—");
  return h("time", { datetime: d.toISOString(), title: d.toISOString() }, ago(d));
}

export function toDate(value) {
  if (value === null || value === undefined || value === 0 || value === "") return null;
  let d;
  if (typeof value === "number") d = new Date(value / 1e6);
  else d = new Date(value);
  if (isNaN(d.getTime()) || d.getFullYear() < 1971) return null;
  return d;
}

function ago(d) {
  const s = Math.round((Date.now() - d.getTime()) / 1000);
  if (s < -5) return d.toLocaleString();
  if (s < 5) return "just now";
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return d.toLocaleString();
}

/**
 * A table: `columns` are `{ title, cell: row => node|string, class? }`; `class: "opt"`
 * columns are left out on narrow screens. Empty: `empty` in one row.
 */
export function table(columns, rows, empty = "Nothing here.", rowAttrs) {
  const head = h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.class }, c.title))));
  const body = h("tbody", {});
  if (!rows.length) {
    body.append(h("tr", {}, h("td", { class: "empty", colspan: columns.length }, empty)));
  }
  for (const r of rows) {
    body.append(
      h(
        "tr",
        rowAttrs ? rowAttrs(r) : {},
        columns.map((c) => h("td", { class: c.class, "data-title": c.title }, c.cell(r))),
      ),
    );
  }
  return h("div", { class: "table-wrap" }, h("table", {}, head, body));
}

/** A card with a title, and an optional node at the right of the title. */
export function section(title, body, aside) {
  return h(
    "section",
    { class: "card" },
    h("div", { class: "card-head" }, h("h2", {}, title), aside || null),
    body,
  );
}

/** Definition list of `[label, value]` pairs. */
export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v ?? "—"))),
  );
}

/**
 * Counts per state as a bar (and their numbers), e.g. a job's allocations:
 * `[["running", 2], ["failed", 1]]`.
 */
export function summaryBar(counts) {
  const total = counts.reduce((n, [, c]) => n + c, 0);
  const bar = h("div", { class: "bar", role: "img", "aria-label": counts.map(([k, c]) => `${c} ${k}`).join(", ") });
  for (const [k, c] of counts) {
    if (!c) continue;
    const seg = h("span", { class: "seg " + k, title: `${c} ${k}` });
    seg.style.flexGrow = String(c);
    bar.append(seg);
  }
  if (!total) bar.classList.add("empty");
  const legend = h(
    "span",
    { class: "legend" },
    counts.filter(([, c]) => c).map(([k, c]) => h("span", { class: "chip " + k }, `${c} ${k}`)),
  );
  if (!total) legend.append(h("span", { class: "muted-text" }, "no allocations"));
  return h("div", { class: "summary" }, bar, legend);
}
