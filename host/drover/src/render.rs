//! What the commands print for a person: tables, reports and one-line sentences built
//! from the agent's and the servers' typed answers, and the JSON printed with
//! `--json`. The functions that return a `String` are pure, so the tests read the
//! exact text; the `print_*` ones write to stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use drover_api::{PluginState, PluginStatus, StatsView, TaskEventView, TaskView};
use drover_server_api::{
    Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, JobPlanResponse, Node,
    NodeStatus, PlacementFailure,
};
use serde::Serialize;

pub mod deployments;

pub use deployments::{
    deployment_progress_lines, deployment_status_text, deployments_text, job_history_text,
    latest_deployment_text,
};

/// Print task events: time, type, message.
pub fn print_events(events: &[TaskEventView], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(events)?);
        return Ok(());
    }
    println!("{:<28} {:<16} MESSAGE", "TIME", "TYPE");
    for e in events {
        println!("{:<28} {:<16} {}", e.time, e.kind.as_str(), e.message);
    }
    Ok(())
}

/// Bytes as a short human size (KiB, MiB, GiB).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Entries of an allocation's directory, as `nomad alloc fs` prints them: mode, size,
/// modification time and name (a directory's with a `/`).
pub fn file_listing(entries: &[drover_server_api::client_fs::AllocFileInfo]) -> String {
    let mut out = String::new();
    let mode_width = entries
        .iter()
        .map(|e| e.file_mode.len())
        .chain([4])
        .max()
        .unwrap_or(4);
    let _ = writeln!(
        out,
        "{:<mode_width$}  {:>10}  {:<30}  Name",
        "Mode", "Size", "Modified Time"
    );
    for e in entries {
        let size = human_bytes(u64::try_from(e.size).unwrap_or(0));
        let slash = if e.is_dir { "/" } else { "" };
        // Names are the task's: keep control characters off the terminal.
        let name: String = e
            .name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        let _ = writeln!(
            out,
            "{:<mode_width$}  {size:>10}  {:<30}  {name}{slash}",
            e.file_mode, e.mod_time
        );
    }
    out
}

/// The header of the `task stats` table.
pub fn stats_header() -> String {
    format!(
        "{:<28} {:>8} {:>12} {:>10}",
        "TIME", "CPU %", "MEMORY", "CPU TIME"
    )
}

/// One sample as a row of the `task stats` table.
pub fn stats_row(sample: &StatsView) -> String {
    format!(
        "{:<28} {:>7.1}% {:>12} {:>9.2}s",
        sample.time,
        sample.cpu_percent,
        human_bytes(sample.memory_rss_bytes),
        sample.cpu_user_seconds + sample.cpu_system_seconds
    )
}

/// Print plugin status rows.
pub fn print_plugins(rows: &[PluginStatus], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rows)?);
        return Ok(());
    }
    println!(
        "{:<16} {:<9} {:<9} {:<10} {:<10} {:<8} {:<8} PATH / REASON",
        "NAME", "SOURCE", "PROTOCOL", "STATE", "VERSION", "API", "PID"
    );
    for r in rows {
        let pid = match r.pid {
            Some(p) => p.to_string(),
            None if r.in_process => "in-agent".into(),
            None => "-".into(),
        };
        let detail = if r.state == PluginState::Healthy {
            r.path.display().to_string()
        } else {
            format!("{}: {}", r.path.display(), r.reason)
        };
        println!(
            "{:<16} {:<9} {:<9} {:<10} {:<10} {:<8} {:<8} {}",
            r.name,
            r.source.as_str(),
            // Not known of a file that was skipped before it ever ran.
            if r.state == PluginState::Skipped && r.version.is_empty() {
                "-"
            } else {
                r.protocol.as_str()
            },
            r.state.as_str(),
            r.version,
            r.api_version,
            pid,
            detail
        );
    }
    Ok(())
}

/// Print what `drover plugin reload` changed, one line each.
pub fn print_reload(report: &drover_api::ReloadReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    if report.changes.is_empty() {
        println!("no plugin changed");
    }
    for c in &report.changes {
        println!(
            "{:<9} {:<16} {}: {}",
            c.kind.as_str(),
            c.name,
            c.path.display(),
            c.message
        );
    }
    Ok(())
}

/// An optional number as table text: `-` when absent.
fn or_dash(value: Option<i32>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// Print one task.
pub fn print_task(task: &TaskView, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(task)?);
        return Ok(());
    }
    println!("ID          = {}", task.id);
    println!("Name        = {}", task.name);
    println!("Driver      = {}", task.driver);
    println!("State       = {}", task.state);
    println!("Exit Code   = {}", or_dash(task.exit_code));
    if let Some(signal) = task.signal {
        println!("Signal      = {signal}");
    }
    if let Some(error) = &task.error {
        println!("Error       = {error}");
    }
    println!("Task Dir    = {}", task.task_dir.display());
    println!("Events:");
    for e in &task.events {
        println!("  {}  {:<14} {}", e.time, e.kind.as_str(), e.message);
    }
    Ok(())
}

/// Print a task list.
pub fn print_tasks(tasks: &[TaskView], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(tasks)?);
        return Ok(());
    }
    println!(
        "{:<34} {:<16} {:<10} {:<8} EXIT",
        "ID", "NAME", "DRIVER", "STATE"
    );
    for t in tasks {
        // A task killed by a signal has exit code 0; show the signal instead.
        let exit = match t.signal {
            Some(sig) => format!("signal {sig}"),
            None => or_dash(t.exit_code),
        };
        println!(
            "{:<34} {:<16} {:<10} {:<8} {exit}",
            t.id,
            t.name,
            t.driver,
            t.state.as_str()
        );
    }
    Ok(())
}

pub fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

pub fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub fn job_status_word(status: drover_server_api::JobStatus, stop: bool) -> &'static str {
    use drover_server_api::JobStatus;
    match (status, stop) {
        (JobStatus::Dead, _) => "dead",
        (_, true) => "stopped",
        (JobStatus::Pending, _) => "pending",
        (JobStatus::Running, _) => "running",
    }
}

pub fn eval_status_word(s: EvalStatus) -> &'static str {
    match s {
        EvalStatus::Pending => "pending",
        EvalStatus::Blocked => "blocked",
        EvalStatus::Complete => "complete",
        EvalStatus::Failed => "failed",
        EvalStatus::Canceled => "canceled",
    }
}

/// `Group "app": memory exhausted on 3 of 3 nodes (2 unplaced)`, one per group.
pub fn placement_failure_lines(failed: &BTreeMap<String, PlacementFailure>) -> Vec<String> {
    failed
        .iter()
        .map(|(group, f)| format!("Group \"{group}\": {} ({} unplaced)", f.reason, f.unplaced))
        .collect()
}

/// `job plan`'s report.
pub fn plan_text(job: &str, plan: &JobPlanResponse) -> String {
    let mut out = String::new();
    let verb = if plan.changed {
        "would become version"
    } else {
        "unchanged at version"
    };
    let _ = writeln!(out, "Job \"{job}\" {verb} {}", plan.job_version);
    for (group, g) in &plan.groups {
        let _ = writeln!(
            out,
            "  Group \"{group}\": {} place, {} update, {} stop, {} unchanged",
            g.place, g.update, g.stop, g.ignore
        );
    }
    if !plan.failed_tg_allocs.is_empty() {
        let _ = writeln!(out, "Placement failures:");
        for line in placement_failure_lines(&plan.failed_tg_allocs) {
            let _ = writeln!(out, "  {line}");
        }
    }
    let _ = writeln!(out, "Job modify index: {}", plan.job_modify_index);
    out
}

/// `job status --json`: the job's fields (`name`, `type`, `status`, ...) with its
/// allocations, evaluations, and what the newest evaluation to finish could not place.
#[derive(Debug, Serialize)]
pub struct JobStatusJson {
    /// The job.
    #[serde(flatten)]
    pub job: Job,
    /// Its allocations, newest first.
    pub allocations: Vec<Allocation>,
    /// Its evaluations, newest first.
    pub evaluations: Vec<Evaluation>,
    /// Per group, what could not be placed (from the newest evaluation to finish).
    pub placement_failures: BTreeMap<String, PlacementFailure>,
    /// The job's newest deployment, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latest_deployment: Option<drover_server_api::Deployment>,
}

impl JobStatusJson {
    /// The view of `job`, `allocations` and `evaluations`.
    pub fn new(job: Job, allocations: Vec<Allocation>, evaluations: Vec<Evaluation>) -> Self {
        // The scheduler's last word on the job: every evaluation reconciles the whole
        // job, so the newest one to finish says what is still unplaced (and a blocked
        // evaluation holds the same reasons as the one that made it). Not "the newest
        // blocked evaluation": while capacity changes, the blocked one is canceled and
        // its retry is still pending, and the reasons must not blink out meanwhile.
        let placement_failures = evaluations
            .iter()
            .filter(|e| matches!(e.status, EvalStatus::Complete | EvalStatus::Blocked))
            .max_by_key(|e| (e.modify_index, e.status == EvalStatus::Blocked))
            .map(|e| e.failed_tg_allocs.clone())
            .unwrap_or_default();
        JobStatusJson {
            job,
            allocations,
            evaluations,
            placement_failures,
            latest_deployment: None,
        }
    }
}

/// `job status NAME`'s report.
pub fn job_status_text(v: &JobStatusJson) -> String {
    let mut out = String::new();
    let j = &v.job;
    let _ = writeln!(out, "ID            = {}", j.spec.name);
    let _ = writeln!(out, "Type          = {}", j.spec.job_type.as_str());
    let _ = writeln!(out, "Priority      = {}", j.spec.priority);
    let _ = writeln!(out, "Status        = {}", job_status_word(j.status, j.stop));
    let _ = writeln!(out, "Version       = {}", j.version);
    let _ = writeln!(out);
    let _ = writeln!(out, "Summary");
    let _ = writeln!(
        out,
        "{:<16} {:>6} {:>7} {:>7} {:>8} {:>6} {:>4}",
        "Group", "Queued", "Pending", "Running", "Complete", "Failed", "Lost"
    );
    for g in &j.spec.groups {
        let count = |s: ClientStatus| {
            v.allocations
                .iter()
                .filter(|a| a.group == g.name && a.client_status == s)
                .count()
        };
        let queued = v.placement_failures.get(&g.name).map_or(0, |f| f.unplaced);
        let _ = writeln!(
            out,
            "{:<16} {:>6} {:>7} {:>7} {:>8} {:>6} {:>4}",
            g.name,
            queued,
            count(ClientStatus::Pending),
            count(ClientStatus::Running),
            count(ClientStatus::Complete),
            count(ClientStatus::Failed),
            count(ClientStatus::Lost)
        );
    }
    if !v.placement_failures.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "Placement Failures");
        for line in placement_failure_lines(&v.placement_failures) {
            let _ = writeln!(out, "{line}");
        }
    }
    if let Some(d) = &v.latest_deployment {
        let _ = writeln!(out);
        out.push_str(&latest_deployment_text(d));
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Allocations");
    let _ = writeln!(
        out,
        "{:<8}  {:<16} {:<12} {:>7}  {:<7}  {:<8}  TASKS",
        "ID", "Node", "Group", "Version", "Desired", "Status"
    );
    for a in &v.allocations {
        let _ = writeln!(out, "{}", alloc_row(a));
    }
    out
}

fn desired_word(d: DesiredStatus) -> &'static str {
    match d {
        DesiredStatus::Run => "run",
        DesiredStatus::Stop => "stop",
    }
}

fn task_state_word(t: &drover_server_api::TaskState) -> String {
    use drover_server_api::TaskRunState;
    match (t.state, t.exit_code) {
        (TaskRunState::Pending, _) => "pending".into(),
        (TaskRunState::Running, _) => "running".into(),
        (TaskRunState::Dead, Some(code)) => format!("dead({code})"),
        (TaskRunState::Dead, None) => "dead".into(),
    }
}

pub fn alloc_row(a: &Allocation) -> String {
    let tasks: Vec<String> = a
        .task_states
        .iter()
        .map(|(name, t)| format!("{name}={}", task_state_word(t)))
        .collect();
    format!(
        "{:<8}  {:<16} {:<12} {:>7}  {:<7}  {:<8}  {}",
        short(&a.id),
        a.node_name,
        a.group,
        a.job_version,
        desired_word(a.desired_status),
        a.client_status.as_str(),
        tasks.join(" ")
    )
}

/// The status a person reads: `draining` while a drain is on.
pub fn node_status_word(n: &Node) -> &'static str {
    if n.drain && n.status != NodeStatus::Down {
        "draining"
    } else {
        n.status.as_str()
    }
}

/// `node status`'s table.
pub fn nodes_text(nodes: &[Node]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:<8}  {:<20} {:<9} DRIVERS", "ID", "Name", "Status");
    for n in nodes {
        let drivers: Vec<&str> = n
            .drivers
            .iter()
            .filter(|(_, d)| d.detected && d.healthy)
            .map(|(name, _)| name.as_str())
            .collect();
        let _ = writeln!(
            out,
            "{:<8}  {:<20} {:<9} {}",
            short(&n.id),
            n.name,
            node_status_word(n),
            drivers.join(",")
        );
    }
    out
}

/// `node status --json`: each node with `status` as `node status` shows it
/// (`draining` while a drain is on).
pub fn node_json(n: &Node) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(n)?;
    v["status"] = node_status_word(n).into();
    Ok(v)
}

/// `alloc status`'s report.
pub fn alloc_text(a: &Allocation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "ID                  = {}", a.id);
    let _ = writeln!(out, "Name                = {}", a.name);
    let _ = writeln!(out, "Node                = {} ({})", a.node_name, a.node_id);
    let _ = writeln!(
        out,
        "Job                 = {} (version {})",
        a.job_name, a.job_version
    );
    let _ = writeln!(out, "Group               = {}", a.group);
    let _ = writeln!(
        out,
        "Desired Status      = {}",
        desired_word(a.desired_status)
    );
    if !a.desired_description.is_empty() {
        let _ = writeln!(out, "Desired Description = {}", a.desired_description);
    }
    let _ = writeln!(out, "Client Status       = {}", a.client_status.as_str());
    if !a.client_description.is_empty() {
        let _ = writeln!(out, "Client Description  = {}", a.client_description);
    }
    let _ = writeln!(out, "Evaluation          = {}", a.eval_id);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<16} {:<9} {:>5} {:>8}  {:<34} MESSAGE",
        "Task", "State", "Exit", "Restarts", "Task ID"
    );
    for (name, t) in &a.task_states {
        let _ = writeln!(
            out,
            "{:<16} {:<9} {:>5} {:>8}  {:<34} {}",
            name,
            task_state_word(t),
            t.exit_code.map_or_else(|| "-".into(), |c| c.to_string()),
            t.restarts,
            if t.task_id.is_empty() {
                "-"
            } else {
                &t.task_id
            },
            t.message
        );
    }
    out
}

/// `eval status`'s report.
pub fn eval_text(e: &Evaluation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "ID           = {}", e.id);
    let _ = writeln!(out, "Job          = {}", e.job_name);
    let _ = writeln!(out, "Status       = {}", eval_status_word(e.status));
    if !e.status_description.is_empty() {
        let _ = writeln!(out, "Description  = {}", e.status_description);
    }
    let trigger = serde_json::to_value(e.triggered_by)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let _ = writeln!(out, "Triggered By = {trigger}");
    if let Some(n) = &e.node_id {
        let _ = writeln!(out, "Node         = {n}");
    }
    if let Some(b) = &e.blocked_eval {
        let _ = writeln!(out, "Blocked Eval = {b}");
    }
    if let Some(p) = &e.previous_eval {
        let _ = writeln!(out, "Previous     = {p}");
    }
    if !e.failed_tg_allocs.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "Placement Failures");
        for line in placement_failure_lines(&e.failed_tg_allocs) {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// The text of `drover server status`.
pub fn servers_status_text(s: &drover_server_api::ServersStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "This server  {}", s.this);
    let _ = match &s.leader {
        Some(l) if l.term > 0 => writeln!(out, "Leader       {} (term {})", l.name, l.term),
        Some(l) => writeln!(out, "Leader       {}", l.name),
        None => writeln!(out, "Leader       none elected"),
    };
    let _ = writeln!(out, "Store        {}", s.store.kind);
    for e in &s.store.endpoints {
        let mut line = format!(
            "  {}  {}",
            e.endpoint,
            if e.healthy { "healthy" } else { "unhealthy" }
        );
        if let Some(v) = &e.version {
            let _ = write!(line, "  version {v}");
        }
        if let Some(size) = e.db_size {
            let _ = write!(line, "  db {} KiB", size.div_ceil(1024));
        }
        if e.is_leader {
            line.push_str("  raft leader");
        }
        if let Some(err) = &e.error {
            let _ = write!(line, "  error: {err}");
        }
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out);
    let rows: Vec<[String; 6]> = s
        .servers
        .iter()
        .map(|m| {
            let started = std::time::UNIX_EPOCH + Duration::from_secs(m.started);
            [
                m.name.clone(),
                if m.leader { "leader" } else { "follower" }.to_owned(),
                m.rpc_addr.clone(),
                m.http_addr.clone(),
                m.version.clone(),
                humantime::format_rfc3339_seconds(started).to_string(),
            ]
        })
        .collect();
    let header = ["NAME", "ROLE", "RPC", "HTTP", "VERSION", "STARTED"];
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.len());
        }
    }
    let mut line = |cells: &[&str]| {
        let text: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(&header);
    for r in &rows {
        line(&r.each_ref().map(String::as_str));
    }
    if s.servers.is_empty() {
        out.push_str("(no server is registered in the store)\n");
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use drover_server_api::{
        DriverInfo, EvalTrigger, Job, JobStatus, JobType, NodeResources, TaskRunState, TaskState,
    };

    pub(crate) fn job() -> Job {
        let spec = drover_server_api::jobfile::parse_and_validate(
            "name = \"web\"\n[[group]]\nname = \"app\"\ncount = 3\n[[group.task]]\nname = \"main\"\ndriver = \"rawexec\"\nconfig = { command = \"/bin/true\" }\n",
            "web.toml",
        )
        .unwrap();
        Job {
            stable: Default::default(),
            spec,
            version: 2,
            stop: false,
            status: JobStatus::Running,
            submit_time: 0,
            create_index: 1,
            modify_index: 5,
            job_modify_index: 5,
        }
    }

    pub(crate) fn alloc(
        id: &str,
        status: ClientStatus,
        task: TaskRunState,
        exit: Option<i32>,
    ) -> Allocation {
        Allocation {
            task_devices: Default::default(),
            namespace: "default".into(),
            deployment_id: Default::default(),
            deployment_status: Default::default(),
            ports: Default::default(),
            reschedule_events: Vec::new(),
            id: id.into(),
            name: "web.app[0]".into(),
            index: 0,
            job_name: "web".into(),
            job_version: 2,
            group: "app".into(),
            node_id: "node-1-id".into(),
            node_name: "node-1".into(),
            resources: Default::default(),
            desired_status: DesiredStatus::Run,
            desired_description: String::new(),
            client_status: status,
            client_description: String::new(),
            task_states: [(
                "main".to_owned(),
                TaskState {
                    state: task,
                    exit_code: exit,
                    ..Default::default()
                },
            )]
            .into(),
            eval_id: "eval-1".into(),
            previous_allocation: None,
            next_allocation: None,
            create_index: 3,
            modify_index: 4,
            alloc_modify_index: 3,
            create_time: 0,
            modify_time: 0,
        }
    }

    pub(crate) fn eval(
        id: &str,
        status: EvalStatus,
        index: u64,
        failed: &[(&str, &str, u32)],
    ) -> Evaluation {
        Evaluation {
            namespace: "default".into(),
            wait_until: None,
            id: id.into(),
            job_name: "web".into(),
            job_type: JobType::Service,
            priority: 50,
            triggered_by: EvalTrigger::JobRegister,
            status,
            status_description: String::new(),
            node_id: None,
            failed_tg_allocs: failed
                .iter()
                .map(|(g, reason, unplaced)| {
                    (
                        (*g).to_owned(),
                        PlacementFailure {
                            unplaced: *unplaced,
                            reason: (*reason).to_owned(),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            queued_allocations: Default::default(),
            blocked_eval: None,
            previous_eval: None,
            job_modify_index: 5,
            create_index: index,
            modify_index: index,
            create_time: 0,
            modify_time: 0,
        }
    }

    #[test]
    fn small_helpers() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
    }

    #[test]
    fn job_status_shows_allocations_and_the_reasons_that_still_stand() {
        let view = JobStatusJson::new(
            job(),
            vec![
                alloc(
                    "aaaaaaaa-1111",
                    ClientStatus::Running,
                    TaskRunState::Running,
                    None,
                ),
                alloc(
                    "bbbbbbbb-2222",
                    ClientStatus::Failed,
                    TaskRunState::Dead,
                    Some(3),
                ),
            ],
            vec![
                eval(
                    "e-old",
                    EvalStatus::Complete,
                    2,
                    &[("app", "no node has driver qemu healthy", 3)],
                ),
                eval(
                    "e-new",
                    EvalStatus::Complete,
                    6,
                    &[("app", "memory exhausted on 3 of 3 nodes", 1)],
                ),
                // The blocked evaluation e-new made, canceled because capacity
                // changed; its retry has not run yet. The reasons still stand.
                eval(
                    "e-blocked",
                    EvalStatus::Canceled,
                    7,
                    &[("app", "memory exhausted on 3 of 3 nodes", 1)],
                ),
                eval("e-retry", EvalStatus::Pending, 7, &[]),
            ],
        );
        let text = job_status_text(&view);
        assert!(text.contains("Status        = running"), "{text}");
        assert!(
            text.contains(
                "Placement Failures\nGroup \"app\": memory exhausted on 3 of 3 nodes (1 unplaced)"
            ),
            "{text}"
        );
        assert!(!text.contains("qemu"), "{text}");
        let summary = text.lines().find(|l| l.starts_with("app ")).unwrap();
        let counts: Vec<&str> = summary.split_whitespace().collect();
        assert_eq!(counts, ["app", "1", "0", "1", "0", "1", "0"], "{text}");
        assert!(text.contains("aaaaaaaa  node-1"), "{text}");
        assert!(text.contains("main=dead(3)"), "{text}");
        // JSON: the job's fields at the top, allocations with their task states.
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["name"], "web");
        assert_eq!(json["status"], "running");
        assert_eq!(json["allocations"][0]["node_name"], "node-1");
        assert_eq!(json["allocations"][0]["desired_status"], "run");
        assert_eq!(json["allocations"][1]["client_status"], "failed");
        assert_eq!(
            json["allocations"][1]["task_states"]["main"]["state"],
            "dead"
        );
        assert_eq!(
            json["allocations"][1]["task_states"]["main"]["exit_code"],
            3
        );
        assert_eq!(
            json["placement_failures"]["app"]["reason"],
            "memory exhausted on 3 of 3 nodes"
        );
    }

    #[test]
    fn job_status_drops_the_reasons_once_an_evaluation_places_everything() {
        let failed = [("app", "no node has driver qemu healthy", 3)];
        let blocked = JobStatusJson::new(
            job(),
            vec![],
            vec![
                eval("e-1", EvalStatus::Complete, 4, &failed),
                eval("e-1b", EvalStatus::Blocked, 4, &failed),
            ],
        );
        assert_eq!(blocked.placement_failures["app"].unplaced, 3);
        let placed = JobStatusJson::new(
            job(),
            vec![],
            vec![
                eval("e-1", EvalStatus::Complete, 4, &failed),
                eval("e-1b", EvalStatus::Canceled, 9, &failed),
                eval("e-2", EvalStatus::Complete, 9, &[]),
            ],
        );
        assert!(placed.placement_failures.is_empty());
        assert!(!job_status_text(&placed).contains("Placement Failures"));
    }

    #[test]
    fn nodes_show_draining_and_healthy_drivers() {
        let node = |name: &str, status: NodeStatus, drain: bool| Node {
            devices: Default::default(),
            host_volumes: Default::default(),
            csi_plugins: Default::default(),
            network: Default::default(),
            datacenter: drover_server_api::DEFAULT_DATACENTER.to_owned(),
            id: format!("{name}-0123456789"),
            name: name.into(),
            status,
            status_description: String::new(),
            drain,
            ineligible: false,
            attributes: Default::default(),
            meta: Default::default(),
            resources: NodeResources::default(),
            drivers: [
                (
                    "rawexec".to_owned(),
                    DriverInfo {
                        detected: true,
                        healthy: true,
                        ..Default::default()
                    },
                ),
                (
                    "docker".to_owned(),
                    DriverInfo {
                        detected: true,
                        healthy: false,
                        ..Default::default()
                    },
                ),
                (
                    "exec".to_owned(),
                    DriverInfo {
                        detected: true,
                        healthy: true,
                        ..Default::default()
                    },
                ),
            ]
            .into(),
            status_updated_at: 0,
            create_index: 1,
            modify_index: 1,
        };
        let text = nodes_text(&[
            node("n1", NodeStatus::Ready, false),
            node("n2", NodeStatus::Ready, true),
            node("n3", NodeStatus::Down, true),
        ]);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[0], ["n1-01234", "n1", "ready", "exec,rawexec"]);
        assert_eq!(rows[1][2], "draining");
        assert_eq!(rows[2][2], "down");
        let json = node_json(&node("n2", NodeStatus::Ready, true)).unwrap();
        assert_eq!(json["status"], "draining");
        assert_eq!(json["drivers"]["rawexec"]["healthy"], true);
    }

    #[test]
    fn plans_and_evaluations_read_as_sentences() {
        let plan = JobPlanResponse {
            job_version: 3,
            changed: true,
            groups: [(
                "app".to_owned(),
                drover_server_api::GroupPlanSummary {
                    canary: Default::default(),
                    place: 2,
                    stop: 0,
                    update: 1,
                    ignore: 0,
                },
            )]
            .into(),
            failed_tg_allocs: [(
                "app".to_owned(),
                PlacementFailure {
                    unplaced: 1,
                    reason: "cpu exhausted on 2 of 2 nodes".into(),
                    ..Default::default()
                },
            )]
            .into(),
            job_modify_index: 9,
        };
        let text = plan_text("web", &plan);
        assert!(text.starts_with("Job \"web\" would become version 3\n  Group \"app\": 2 place, 1 update, 0 stop, 0 unchanged\n"), "{text}");
        assert!(
            text.contains("  Group \"app\": cpu exhausted on 2 of 2 nodes (1 unplaced)"),
            "{text}"
        );
        let mut e = eval(
            "e-1",
            EvalStatus::Blocked,
            1,
            &[("app", "no node has driver qemu healthy", 3)],
        );
        e.triggered_by = EvalTrigger::NodeUpdate;
        let text = eval_text(&e);
        assert!(text.contains("Status       = blocked"), "{text}");
        assert!(text.contains("Triggered By = node-update"), "{text}");
        assert!(
            text.contains("Group \"app\": no node has driver qemu healthy (3 unplaced)"),
            "{text}"
        );
        let text = alloc_text(&alloc(
            "abc",
            ClientStatus::Failed,
            TaskRunState::Dead,
            Some(7),
        ));
        assert!(
            text.contains("Node                = node-1 (node-1-id)"),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l
                .split_whitespace()
                .take(4)
                .eq(["main", "dead(7)", "7", "0"])),
            "{text}"
        );
    }

    #[test]
    fn server_status_text_names_the_leader_and_each_server() {
        let s = drover_server_api::ServersStatus {
            this: "s2".into(),
            leader: Some(drover_server_api::LeaderStatus {
                name: "s1".into(),
                term: 42,
            }),
            servers: vec![drover_server_api::ServerMember {
                name: "s1".into(),
                rpc_addr: "10.0.0.1:4647".into(),
                http_addr: "10.0.0.1:4646".into(),
                version: "0.1.0".into(),
                started: 0,
                leader: true,
            }],
            store: drover_server_api::StoreStatus {
                kind: "etcd".into(),
                endpoints: vec![drover_server_api::StoreEndpointHealth {
                    endpoint: "http://127.0.0.1:2379".into(),
                    healthy: false,
                    version: None,
                    db_size: None,
                    is_leader: false,
                    error: Some("connection refused".into()),
                }],
            },
        };
        let text = servers_status_text(&s);
        assert!(text.contains("This server  s2"), "{text}");
        assert!(text.contains("Leader       s1 (term 42)"), "{text}");
        assert!(
            text.contains("http://127.0.0.1:2379  unhealthy  error: connection refused"),
            "{text}"
        );
        assert!(
            text.contains(
                "s1    leader  10.0.0.1:4647  10.0.0.1:4646  0.1.0    1970-01-01T00:00:00Z"
            ),
            "{text}"
        );
    }
}
