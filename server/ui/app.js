// The UI's shell: the header, the navigation and the router (paths under /ui/, moved
// between with the History API so that a live page never reloads).

import { token } from "./api.js";
import { h, link } from "./dom.js";
import { jobsPage, jobPage, allocPage, execPage, nodesPage, nodePage, servicesPage, tokenPage } from "./pages.js";

const ROUTES = [
  [/^\/ui\/?$/, null, "/ui/jobs"],
  [/^\/ui\/jobs\/?$/, jobsPage, "jobs"],
  [/^\/ui\/jobs\/(?<id>[^/]+)\/?$/, jobPage, "jobs"],
  [/^\/ui\/allocations\/(?<id>[^/]+)\/?$/, allocPage, "jobs"],
  [/^\/ui\/allocations\/(?<id>[^/]+)\/exec\/?$/, execPage, "jobs"],
  [/^\/ui\/nodes\/?$/, nodesPage, "nodes"],
  [/^\/ui\/nodes\/(?<id>[^/]+)\/?$/, nodePage, "nodes"],
  [/^\/ui\/services\/?$/, servicesPage, "services"],
  [/^\/ui\/settings\/tokens\/?$/, tokenPage, "token"],
];

const NAV = [
  ["jobs", "/ui/jobs", "Jobs"],
  ["nodes", "/ui/nodes", "Nodes"],
  ["services", "/ui/services", "Services"],
];

const navLinks = Object.fromEntries(NAV.map(([key, href, text]) => [key, link(href, text)]));
const tokenLink = link("/ui/settings/tokens", "");
const main = h("main", { id: "main", tabindex: "-1" });

function tokenLabel() {
  tokenLink.textContent = token() ? "Token set" : "Set token";
  tokenLink.className = token() ? "token-link set" : "token-link";
}

document.body.append(
  h(
    "header",
    { class: "top" },
    h(
      "div",
      { class: "top-inner" },
      link("/ui/jobs", h("img", { src: document.querySelector("link[rel=icon]").href, alt: "", class: "logo" }), h("span", { class: "brand" }, "Drover")),
      h("nav", { class: "nav", "aria-label": "Main" }, Object.values(navLinks)),
      h("span", { class: "spacer" }),
      tokenLink,
    ),
  ),
  main,
);
tokenLabel();
window.addEventListener("drover-token", () => {
  tokenLabel();
});

let current = null;

function render() {
  current?.abort();
  current = new AbortController();
  main.replaceChildren();
  const where = location.pathname;
  for (const [re, page, section] of ROUTES) {
    const m = re.exec(where);
    if (!m) continue;
    if (!page) {
      history.replaceState(null, "", section);
      return render();
    }
    const params = Object.fromEntries(
      Object.entries(m.groups || {}).map(([k, v]) => {
        try {
          return [k, decodeURIComponent(v)];
        } catch (_) {
          return [k, v];
        }
      }),
    );
    for (const [key, a] of Object.entries(navLinks)) a.classList.toggle("active", key === section);
    tokenLink.classList.toggle("active", section === "token");
    document.title = `${params.id ? params.id + " · " : ""}${section[0].toUpperCase()}${section.slice(1)} · Drover`;
    page(main, params, { signal: current.signal });
    return;
  }
  main.append(h("div", { class: "notice error" }, "No such page. ", link("/ui/jobs", "Go to the jobs.")));
}

// Links within the UI move without reloading: the pages stay live.
document.addEventListener("click", (e) => {
  const a = e.target.closest?.("a[data-route]");
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  e.preventDefault();
  const to = a.getAttribute("href");
  if (to !== location.pathname + location.search) history.pushState(null, "", to);
  render();
  window.scrollTo(0, 0);
});
window.addEventListener("popstate", render);
render();
