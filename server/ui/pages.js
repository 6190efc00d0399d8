// The pages. Each is `(main, params, ctx)`: it fills `main` and keeps it live until
// `ctx.signal` aborts (the user went elsewhere). Data comes from the API only.

import { get, live, setToken, token, ApiError } from "./api.js";
import { h, clear, link, path, badge, shortId, time, table, section, facts, summaryBar } from "./dom.js";
import { logViewer } from "./logs.js";
import { terminal } from "./terminal.js";

const STATES = ["running", "starting", "queued", "failed", "lost", "complete"];

function pageHead(title, sub, ...aside) {
  return h(
    "div",
    { class: "page-head" },
    h("div", {}, h("h1", {}, title), sub ? h("div", { class: "sub" }, sub) : null),
    aside.length ? h("div", { class: "page-actions" }, aside) : null,
  );
}

/** A spot for the page's live state: errors, or when it last changed. */
function liveState(ctx) {
  const el = h("div", { class: "notice hidden", role: "status" });
  return {
    el,
    error(e) {
      if (!e) {
        el.className = "notice hidden";
        return;
      }
      clear(el);
      el.className = "notice error";
      if (e instanceof ApiError && e.forbidden) {
        el.append(
          "Permission denied: this server needs an ACL token with access to this page. ",
          link("/ui/settings/tokens", "Set a token"),
          ".",
        );
      } else if (e instanceof ApiError && e.status === 404) {
        el.append(e.message || "Not found.");
      } else if (e instanceof ApiError) {
        el.append(`The server answered ${e.status}: ${e.message}`);
      } else {
        el.append("Cannot reach the server; retrying…");
      }
      ctx.onError?.(e);
    },
  };
}

function groupCounts(summary) {
  const totals = Object.fromEntries(STATES.map((s) => [s, 0]));
  for (const g of Object.values(summary || {})) {
    for (const s of STATES) totals[s] += g[s[0].toUpperCase() + s.slice(1)] || 0;
  }
  return STATES.map((s) => [s, totals[s]]);
}

function one(summary) {
  return STATES.map((s) => [s, (summary || {})[s[0].toUpperCase() + s.slice(1)] || 0]);
}

// ---------------------------------------------------------------------------- jobs

export function jobsPage(main, _params, ctx) {
  const state = liveState(ctx);
  const body = h("div", {});
  const count = h("span", { class: "count" });
  main.append(pageHead("Jobs", null, count), state.el, body);
  live(
    "/v1/jobs?namespace=*",
    ctx.signal,
    (jobs) => {
      jobs.sort((a, b) => String(a.ID).localeCompare(String(b.ID)));
      count.textContent = `${jobs.length} job${jobs.length === 1 ? "" : "s"}`;
      const t = table(
        [
          { title: "Name", cell: (j) => link(path("ui", "jobs", j.ID) + nsQuery(j.Namespace), j.Name || j.ID) },
          { title: "Status", cell: (j) => badge(j.Stop ? "stopped" : j.Status) },
          { title: "Type", cell: (j) => j.Type },
          { title: "Namespace", class: "opt", cell: (j) => j.Namespace },
          { title: "Priority", class: "opt num", cell: (j) => String(j.Priority) },
          {
            title: "Groups",
            class: "opt num",
            cell: (j) => String(Object.keys(j.JobSummary?.Summary || {}).length),
          },
          { title: "Allocations", class: "wide", cell: (j) => summaryBar(groupCounts(j.JobSummary?.Summary)) },
          { title: "Submitted", class: "opt", cell: (j) => time(j.SubmitTime) },
        ],
        jobs,
        "No jobs yet. Submit one with `drover job run` or the API.",
        (j) => ({ dataset: { job: j.ID } }),
      );
      body.replaceChildren(section("All jobs", t));
    },
    state.error,
  );
}

function nsQuery(ns) {
  return ns && ns !== "default" ? `?namespace=${encodeURIComponent(ns)}` : "";
}

function withNs(p, ns) {
  const sep = p.includes("?") ? "&" : "?";
  return ns ? `${p}${sep}namespace=${encodeURIComponent(ns)}` : p;
}

function allocTable(allocs, { showJob = false, showNode = true } = {}) {
  allocs.sort((a, b) => (b.CreateIndex || 0) - (a.CreateIndex || 0));
  return table(
    [
      { title: "ID", cell: (a) => link(path("ui", "allocations", a.ID), shortId(a.ID)) },
      { title: "Name", cell: (a) => a.Name },
      showJob ? { title: "Job", cell: (a) => link(path("ui", "jobs", a.JobID) + nsQuery(a.Namespace), a.JobID) } : null,
      { title: "Status", cell: (a) => badge(a.ClientStatus) },
      { title: "Desired", class: "opt", cell: (a) => a.DesiredStatus },
      showNode
        ? { title: "Node", class: "opt", cell: (a) => link(path("ui", "nodes", a.NodeID), a.NodeName || shortId(a.NodeID)) }
        : null,
      { title: "Version", class: "opt num", cell: (a) => String(a.JobVersion ?? "") },
      { title: "Modified", class: "opt", cell: (a) => time(a.ModifyTime) },
    ].filter(Boolean),
    allocs,
    "No allocations.",
    (a) => ({ dataset: { alloc: a.ID } }),
  );
}

// ----------------------------------------------------------------------------- job

export function jobPage(main, { id }, ctx) {
  const ns = new URLSearchParams(location.search).get("namespace") || "";
  const state = liveState(ctx);
  const head = h("div", {});
  const body = h("div", { class: "stack" });
  main.append(h("nav", { class: "crumbs" }, link("/ui/jobs", "Jobs"), " / ", id), head, state.el, body);
  const base = path("v1", "job", id);
  live(
    withNs(base, ns),
    ctx.signal,
    async (job) => {
      const [allocs, evals, versions, deployments, summary] = await Promise.all([
        get(withNs(base + "/allocations", ns), { signal: ctx.signal }),
        get(withNs(base + "/evaluations", ns), { signal: ctx.signal }),
        get(withNs(base + "/versions", ns), { signal: ctx.signal }),
        get(withNs(base + "/deployments", ns), { signal: ctx.signal }),
        get(withNs(base + "/summary", ns), { signal: ctx.signal }),
      ]);
      if (ctx.signal.aborted) return;
      head.replaceChildren(
        pageHead(job.Name || job.ID, h("span", {}, badge(job.Stop ? "stopped" : job.Status), " ", job.Type, " job")),
        facts([
          ["Namespace", job.Namespace],
          ["Version", String(job.Version)],
          ["Priority", String(job.Priority)],
          ["Datacenters", (job.Datacenters || []).join(", ")],
          ["Submitted", time(job.SubmitTime)],
        ]),
      );
      const groupSummary = summary.data.Summary || {};
      const groups = table(
        [
          { title: "Group", cell: (g) => g.Name },
          { title: "Count", class: "num", cell: (g) => String(g.Count) },
          {
            title: "Tasks",
            cell: (g) =>
              h(
                "span",
                { class: "tasks" },
                (g.Tasks || []).map((t) => h("span", { class: "chip plain" }, `${t.Name} · ${t.Driver}`)),
              ),
          },
          { title: "Allocations", class: "wide", cell: (g) => summaryBar(one(groupSummary[g.Name])) },
        ],
        job.TaskGroups || [],
        "No groups.",
      );
      const evalTable = table(
        [
          { title: "ID", cell: (e) => shortId(e.ID) },
          { title: "Triggered by", cell: (e) => e.TriggeredBy },
          { title: "Status", cell: (e) => badge(e.Status) },
          {
            title: "Placement failures",
            class: "opt",
            cell: (e) => {
              const failed = Object.keys(e.FailedTGAllocs || {});
              return failed.length ? h("span", { class: "bad-text" }, failed.join(", ")) : "none";
            },
          },
          { title: "Created", class: "opt", cell: (e) => time(e.CreateTime) },
        ],
        evals.data.sort((a, b) => (b.CreateIndex || 0) - (a.CreateIndex || 0)),
        "No evaluations.",
      );
      const versionList = (versions.data.Versions || []).sort((a, b) => b.Version - a.Version);
      const versionTable = table(
        [
          { title: "Version", class: "num", cell: (v) => String(v.Version) },
          { title: "Stable", cell: (v) => (v.Stable ? "yes" : "no") },
          { title: "Groups", cell: (v) => (v.TaskGroups || []).map((g) => `${g.Name} ×${g.Count}`).join(", ") },
          { title: "Submitted", class: "opt", cell: (v) => time(v.SubmitTime) },
        ],
        versionList,
        "No versions.",
      );
      const deploymentTable = table(
        [
          { title: "ID", cell: (d) => shortId(d.ID) },
          { title: "Version", class: "num", cell: (d) => String(d.JobVersion) },
          { title: "Status", cell: (d) => badge(d.Status) },
          {
            title: "Progress",
            cell: (d) =>
              Object.entries(d.TaskGroups || {})
                .map(([g, s]) => `${g}: ${s.HealthyAllocs}/${s.DesiredTotal} healthy`)
                .join(", "),
          },
          { title: "Description", class: "opt", cell: (d) => d.StatusDescription },
        ],
        (deployments.data || []).sort((a, b) => (b.CreateIndex || 0) - (a.CreateIndex || 0)),
        "No deployments.",
      );
      body.replaceChildren(
        section("Task groups", groups),
        section("Allocations", allocTable(allocs.data), h("span", { class: "count" }, String(allocs.data.length))),
        section("Deployments", deploymentTable),
        section("Evaluations", evalTable),
        section("Versions", versionTable),
      );
    },
    state.error,
  );
}

// ---------------------------------------------------------------------- allocation

export function allocPage(main, { id }, ctx) {
  const state = liveState(ctx);
  const head = h("div", {});
  const tasksEl = h("div", {});
  const logsEl = h("div", {});
  const crumbs = h("nav", { class: "crumbs" }, link("/ui/jobs", "Jobs"), " / ");
  main.append(crumbs, head, state.el, tasksEl, logsEl);
  let viewer = false;
  live(
    path("v1", "allocation", id),
    ctx.signal,
    (a) => {
      crumbs.replaceChildren(
        link("/ui/jobs", "Jobs"),
        " / ",
        link(path("ui", "jobs", a.JobID) + nsQuery(a.Namespace), a.JobID),
        " / ",
        a.Name,
      );
      const taskNames = Object.keys(a.TaskStates || {}).sort();
      const groupTasks = (a.Job?.TaskGroups || []).find((g) => g.Name === a.TaskGroup)?.Tasks || [];
      for (const t of groupTasks) if (!taskNames.includes(t.Name)) taskNames.push(t.Name);
      head.replaceChildren(
        pageHead(
          a.Name,
          h("span", {}, badge(a.ClientStatus), " allocation ", h("code", { class: "id" }, a.ID)),
          taskNames.length
            ? link(path("ui", "allocations", a.ID, "exec") + `?task=${encodeURIComponent(taskNames[0])}`, "Terminal")
            : null,
        ),
        facts([
          ["Job", link(path("ui", "jobs", a.JobID) + nsQuery(a.Namespace), a.JobID)],
          ["Group", a.TaskGroup],
          ["Node", link(path("ui", "nodes", a.NodeID), a.NodeName || a.NodeID)],
          ["Desired", a.DesiredStatus],
          ["Version", String(a.JobVersion ?? "")],
          ["Created", time(a.CreateTime)],
          a.ClientDescription ? ["Description", a.ClientDescription] : null,
        ].filter(Boolean)),
      );
      const cards = taskNames.map((name) => {
        const st = (a.TaskStates || {})[name] || {};
        const events = [...(st.Events || [])].reverse();
        return section(
          h("span", {}, "Task ", h("strong", {}, name)),
          h(
            "div",
            {},
            facts([
              ["State", badge(st.State || "pending")],
              ["Started", time(st.StartedAt)],
              ["Finished", time(st.FinishedAt)],
              ["Restarts", String(st.Restarts ?? 0)],
              ["Failed", st.Failed ? h("span", { class: "bad-text" }, "yes") : "no"],
            ]),
            table(
              [
                { title: "Time", cell: (e) => time(e.Time) },
                { title: "Type", cell: (e) => e.Type },
                { title: "Message", class: "wide", cell: (e) => e.DisplayMessage || e.Message || "" },
              ],
              events,
              "No events yet.",
            ),
          ),
          link(path("ui", "allocations", a.ID, "exec") + `?task=${encodeURIComponent(name)}`, "Exec"),
        );
      });
      tasksEl.replaceChildren(h("div", { class: "stack" }, cards));
      if (!viewer && taskNames.length) {
        viewer = true;
        logsEl.replaceChildren(section("Logs", logViewer(a.ID, taskNames, ctx.signal)));
      }
    },
    state.error,
  );
}

export function execPage(main, { id }, ctx) {
  const state = liveState(ctx);
  const want = new URLSearchParams(location.search).get("task") || "";
  const holder = h("div", {});
  main.append(
    h("nav", { class: "crumbs" }, link("/ui/jobs", "Jobs"), " / ", link(path("ui", "allocations", id), id.slice(0, 8)), " / terminal"),
    pageHead("Terminal", "Runs a command in the task's sandbox over the exec WebSocket."),
    state.el,
    holder,
  );
  get(path("v1", "allocation", id), { signal: ctx.signal }).then(
    ({ data: a }) => {
      const tasks = Object.keys(a.TaskStates || {}).sort();
      holder.replaceChildren(section(a.Name, terminal(a.ID, tasks.length ? tasks : [want], want, ctx.signal)));
    },
    (e) => state.error(e),
  );
}

// --------------------------------------------------------------------------- nodes

function driverChips(drivers) {
  return h(
    "span",
    { class: "tasks" },
    Object.entries(drivers || {})
      .filter(([, d]) => d.Detected)
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([name, d]) =>
        h("span", { class: "chip " + (d.Healthy ? "running" : "failed"), title: d.HealthDescription || "" }, name),
      ),
  );
}

export function nodesPage(main, _params, ctx) {
  const state = liveState(ctx);
  const body = h("div", {});
  main.append(pageHead("Nodes"), state.el, body);
  live(
    "/v1/nodes",
    ctx.signal,
    (nodes) => {
      nodes.sort((a, b) => String(a.Name).localeCompare(String(b.Name)));
      body.replaceChildren(
        section(
          "Client nodes",
          table(
            [
              { title: "Name", cell: (n) => link(path("ui", "nodes", n.ID), n.Name || shortId(n.ID)) },
              { title: "ID", class: "opt", cell: (n) => shortId(n.ID) },
              { title: "Status", cell: (n) => badge(n.Status) },
              {
                title: "Eligibility",
                class: "opt",
                cell: (n) => (n.Drain ? badge("draining") : n.SchedulingEligibility === "eligible" ? "eligible" : badge("ineligible")),
              },
              { title: "Datacenter", class: "opt", cell: (n) => n.Datacenter },
              { title: "Drivers", class: "wide", cell: (n) => driverChips(n.Drivers) },
            ],
            nodes,
            "No client nodes have registered.",
          ),
        ),
      );
    },
    state.error,
  );
}

export function nodePage(main, { id }, ctx) {
  const state = liveState(ctx);
  const head = h("div", {});
  const body = h("div", { class: "stack" });
  main.append(h("nav", { class: "crumbs" }, link("/ui/nodes", "Nodes"), " / ", id.slice(0, 8)), head, state.el, body);
  live(
    path("v1", "node", id),
    ctx.signal,
    async (n) => {
      const allocs = await get(path("v1", "node", id, "allocations"), { signal: ctx.signal });
      if (ctx.signal.aborted) return;
      head.replaceChildren(
        pageHead(n.Name, h("span", {}, badge(n.Status), " node ", h("code", { class: "id" }, n.ID))),
        facts([
          ["Datacenter", n.Datacenter],
          ["Class", n.NodeClass || "—"],
          ["Eligibility", n.SchedulingEligibility],
          ["Drain", n.Drain ? "yes" : "no"],
          ["Address", n.HTTPAddr || "—"],
          ["CPU", n.NodeResources?.Cpu?.CpuShares ? `${n.NodeResources.Cpu.CpuShares} MHz` : "—"],
          ["Memory", n.NodeResources?.Memory?.MemoryMB ? `${n.NodeResources.Memory.MemoryMB} MiB` : "—"],
        ]),
      );
      const drivers = Object.entries(n.Drivers || {}).sort(([a], [b]) => a.localeCompare(b));
      body.replaceChildren(
        section(
          "Drivers",
          table(
            [
              { title: "Driver", cell: ([name]) => name },
              { title: "Detected", cell: ([, d]) => (d.Detected ? "yes" : "no") },
              { title: "Health", cell: ([, d]) => badge(d.Healthy ? "healthy" : d.Detected ? "unhealthy" : "unknown") },
              { title: "Description", class: "wide", cell: ([, d]) => d.HealthDescription || "" },
            ],
            drivers,
            "No drivers.",
          ),
        ),
        section("Allocations", allocTable(allocs.data, { showJob: true, showNode: false })),
      );
    },
    state.error,
  );
}

// ------------------------------------------------------------------------ services

export function servicesPage(main, _params, ctx) {
  const state = liveState(ctx);
  const body = h("div", {});
  main.append(pageHead("Services"), state.el, body);
  live(
    "/v1/services?namespace=*",
    ctx.signal,
    async (spaces) => {
      const rows = [];
      for (const ns of spaces || []) {
        for (const s of ns.Services || []) rows.push({ ns: ns.Namespace, ...s });
      }
      rows.sort((a, b) => String(a.ServiceName).localeCompare(String(b.ServiceName)));
      const instances = await Promise.all(
        rows.map((r) =>
          get(withNs(path("v1", "service", r.ServiceName), r.ns), { signal: ctx.signal }).then(
            (x) => x.data,
            () => [],
          ),
        ),
      );
      if (ctx.signal.aborted) return;
      rows.forEach((r, i) => (r.instances = instances[i] || []));
      body.replaceChildren(
        section(
          "Registered services",
          table(
            [
              { title: "Service", cell: (r) => r.ServiceName },
              { title: "Namespace", class: "opt", cell: (r) => r.ns },
              { title: "Tags", class: "opt", cell: (r) => (r.Tags || []).map((t) => h("span", { class: "chip plain" }, t)) },
              {
                title: "Instances",
                class: "wide",
                cell: (r) =>
                  h(
                    "div",
                    { class: "instances" },
                    r.instances.map((s) =>
                      h(
                        "div",
                        {},
                        h("code", {}, `${s.Address}:${s.Port}`),
                        " ",
                        link(path("ui", "allocations", s.AllocID), shortId(s.AllocID)),
                        " ",
                        s.JobID ? link(path("ui", "jobs", s.JobID) + nsQuery(s.Namespace), s.JobID) : null,
                      ),
                    ),
                  ),
              },
            ],
            rows,
            "No services are registered. Jobs register them with a service block (provider = \"nomad\").",
          ),
        ),
      );
    },
    state.error,
  );
}

// -------------------------------------------------------------------------- tokens

export function tokenPage(main, _params, ctx) {
  const input = h("input", {
    id: "token-secret",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    placeholder: "Secret ID",
    value: token(),
  });
  const result = h("div", { class: "notice hidden", role: "status" });
  async function check() {
    clear(result);
    if (!token()) {
      result.className = "notice";
      result.append("No token: requests are anonymous.");
      return;
    }
    try {
      // A read every token that may see anything can do; without ACLs (the shared
      // token of a dev agent) there is no /v1/acl/token/self to ask.
      await get("/v1/jobs", { signal: ctx.signal });
      result.className = "notice ok";
      result.append("Token accepted: the server answers with it.");
    } catch (e) {
      if (ctx.signal.aborted) return;
      result.className = "notice error";
      result.append(
        e instanceof ApiError ? `The server refused the token: ${e.status} ${e.message}` : "Cannot reach the server.",
      );
    }
  }
  const form = h(
    "form",
    {
      class: "token-form",
      onsubmit: (e) => {
        e.preventDefault();
        setToken(input.value.trim());
        check();
      },
    },
    h("label", { for: "token-secret" }, "Secret ID"),
    input,
    h("div", { class: "row" }, h("button", { type: "submit", class: "primary", id: "token-save" }, "Save token"),
      h(
        "button",
        {
          type: "button",
          onclick: () => {
            input.value = "";
            setToken("");
            check();
          },
        },
        "Clear",
      ),
    ),
  );
  main.append(
    pageHead("ACL token"),
    section(
      "Token",
      h(
        "div",
        {},
        h(
          "p",
          { class: "hint" },
          "The token is kept in this browser's local storage and sent in the X-Nomad-Token header of every API request. A dev agent's token is in $TMPDIR/drover-dev-$UID/server/dev-token.",
        ),
        form,
        result,
      ),
    ),
  );
  if (token()) check();
}
