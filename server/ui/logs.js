// A task's stdout or stderr, live: Nomad's logs endpoint with `follow=true` and
// `plain=true` streams the bytes as the task writes them; they are appended to a
// <pre> as text (never markup).

import { raw, sleep } from "./api.js";
import { h, clear } from "./dom.js";

/** How much of the log is fetched first (bytes from its end). */
const TAIL_BYTES = 64 * 1024;
/** How much text the view keeps: beyond it the oldest is dropped. */
const MAX_CHARS = 1024 * 1024;

/**
 * The log viewer of allocation `allocId` for `tasks` (names), stopped when `signal`
 * aborts (leaving the page).
 */
export function logViewer(allocId, tasks, signal) {
  let task = tasks[0];
  let stream = "stdout";
  let current = null; // the AbortController of the stream shown

  const out = h("pre", { class: "log", "aria-live": "off", tabindex: "0", "data-testid": "log" });
  const state = h("span", { class: "log-state" }, "connecting…");
  const follow = h("input", { type: "checkbox", checked: true, id: "log-follow" });
  const tabs = h("div", { class: "tabs", role: "tablist" });
  const taskSelect =
    tasks.length > 1
      ? h(
          "select",
          { "aria-label": "Task", onchange: (e) => ((task = e.target.value), restart()) },
          tasks.map((t) => h("option", { value: t }, t)),
        )
      : null;
  for (const s of ["stdout", "stderr"]) {
    tabs.append(
      h(
        "button",
        {
          type: "button",
          role: "tab",
          class: "tab",
          "aria-selected": String(s === stream),
          dataset: { stream: s },
          onclick: () => {
            stream = s;
            for (const b of tabs.children) b.setAttribute("aria-selected", String(b.dataset.stream === s));
            restart();
          },
        },
        s,
      ),
    );
  }

  let chars = 0;
  let pending = "";
  let scheduled = false;
  // Text arrives in chunks, often many a second: one DOM write per frame.
  function write(text) {
    pending += text;
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      if (!pending) return;
      out.append(document.createTextNode(pending));
      chars += pending.length;
      pending = "";
      while (chars > MAX_CHARS && out.firstChild) {
        chars -= out.firstChild.textContent.length;
        out.firstChild.remove();
      }
      if (follow.checked) out.scrollTop = out.scrollHeight;
    });
  }

  async function run(ctrl) {
    const q = new URLSearchParams({
      task,
      type: stream,
      follow: "true",
      plain: "true",
      origin: "end",
      offset: String(TAIL_BYTES),
    });
    const path = `/v1/client/fs/logs/${encodeURIComponent(allocId)}?${q}`;
    while (!ctrl.signal.aborted) {
      try {
        const resp = await raw(path, { signal: ctrl.signal });
        state.textContent = "live";
        state.className = "log-state live";
        const reader = resp.body.getReader();
        const decoder = new TextDecoder("utf-8");
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          write(decoder.decode(value, { stream: true }));
        }
        write(decoder.decode());
        // The stream ends when the task is dead and everything was read.
        state.textContent = "ended";
        state.className = "log-state";
        return;
      } catch (e) {
        if (ctrl.signal.aborted) return;
        state.textContent = e.status ? `error ${e.status}: ${e.message}` : "disconnected, retrying…";
        state.className = "log-state error";
        await sleep(3000, ctrl.signal);
        if (ctrl.signal.aborted) return;
        // Start over: a retried tail would repeat what is shown.
        clear(out);
        chars = 0;
      }
    }
  }

  function restart() {
    current?.abort();
    current = new AbortController();
    signal.addEventListener("abort", () => current.abort(), { once: true });
    clear(out);
    chars = 0;
    pending = "";
    state.textContent = "connecting…";
    state.className = "log-state";
    run(current);
  }

  restart();
  return h(
    "div",
    { class: "logs" },
    h(
      "div",
      { class: "log-bar" },
      taskSelect,
      tabs,
      h("span", { class: "spacer" }),
      state,
      h("label", { class: "check", for: "log-follow" }, follow, " follow"),
    ),
    out,
  );
}
