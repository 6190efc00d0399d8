//! `drover job`, `node`, `alloc` and `eval`: the cluster commands, through the server's
//! HTTP API ([`drover_server_api::client::Client`]) at `--address`/`DROVER_ADDR`: a
//! server (`http://HOST:PORT`, `https://...` with `DROVER_CACERT`) or an agent's socket
//! (`unix:///.../api.sock`), which forwards to its servers. The token comes from
//! `DROVER_TOKEN`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use clap::Subcommand;
use drover_server_api::client::{Client, ClientOptions, Error as ClientError, QueryOptions};
use drover_server_api::{
    AllocLogsQuery, Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job,
    JobPlanResponse, JobRegisterResponse, Node, NodeStatus, PlacementFailure,
};
use serde::Serialize;

/// Exit code of `job run` when some copies could not be placed (as `nomad job run`).
pub const EXIT_PLACEMENT_FAILED: u8 = 2;

/// How long one blocking query of the monitor waits before asking again.
const MONITOR_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Submit a job file (TOML) and wait until its allocations are placed.
    Run {
        /// The job file.
        file: PathBuf,
        /// Return once the job is registered, without waiting for placement.
        #[arg(long)]
        detach: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show what submitting a job file would change; changes nothing.
    Plan {
        /// The job file.
        file: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a job (or every job without NAME): status, allocations, placement failures.
    Status {
        /// Job name.
        name: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop a job: its allocations are stopped.
    Stop {
        /// Job name.
        name: String,
        /// Also forget the job.
        #[arg(long)]
        purge: bool,
        /// Return at once instead of waiting until its allocations stopped.
        #[arg(long)]
        detach: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// List the nodes (or show one).
    Status {
        /// Node id or name.
        node: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Drain a node: nothing new is placed on it and its allocations move elsewhere.
    Drain {
        /// Node id or name.
        node: String,
        /// End the drain: the node takes allocations again.
        #[arg(long)]
        disable: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AllocCommand {
    /// Show an allocation: where it runs and its tasks' states.
    Status {
        /// Allocation id (or a unique prefix).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a task's output (ask the agent of the node the allocation runs on).
    Logs {
        /// Allocation id (or a unique prefix).
        alloc: String,
        /// Task name.
        task: String,
        /// Keep printing as the task writes, until it is dead.
        #[arg(short, long)]
        follow: bool,
        /// Print stderr instead of stdout.
        #[arg(long)]
        stderr: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Show an evaluation: its status and what it could not place.
    Status {
        /// Evaluation id (or a unique prefix).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The address the cluster commands use: `--address`/`DROVER_ADDR` as given (a bare
/// path is an agent's socket), else the local agent's socket as for `task` commands.
pub fn cluster_address(given: Option<&str>) -> anyhow::Result<String> {
    match given {
        Some(a)
            if a.starts_with("http://")
                || a.starts_with("https://")
                || a.starts_with("unix://") =>
        {
            Ok(a.to_owned())
        }
        Some(a) if a.starts_with("tcp://") => {
            bail!(
                "address {a:?}: use http://HOST:PORT for a server, unix:///path/api.sock for an agent"
            )
        }
        other => {
            let socket = crate::cli::resolve_address(other)?;
            Ok(format!("unix://{}", socket.display()))
        }
    }
}

/// A client for `address` with the token of `DROVER_TOKEN` and the CA of
/// `DROVER_CACERT` (client certificate: `DROVER_CLIENT_CERT` + `DROVER_CLIENT_KEY`).
pub fn client(address: &str, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Client> {
    let token = env("DROVER_TOKEN").filter(|t| !t.trim().is_empty());
    let client_cert = match (env("DROVER_CLIENT_CERT"), env("DROVER_CLIENT_KEY")) {
        (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
        (None, None) => None,
        _ => bail!("set both DROVER_CLIENT_CERT and DROVER_CLIENT_KEY, or neither"),
    };
    let options = ClientOptions {
        token,
        ca_file: env("DROVER_CACERT").map(PathBuf::from),
        client_cert,
    };
    Ok(Client::new(address, options)?)
}

/// A client error as the CLI reports it: an unreachable address says what to check.
pub fn cluster_error(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Connect { ref address, .. } if address.starts_with("unix://") => {
            anyhow!("{e} (is `drover agent` running? set --address or DROVER_ADDR)")
        }
        ClientError::Connect { .. } => {
            anyhow!("{e} (is `drover server` running there? set --address or DROVER_ADDR)")
        }
        ClientError::Status { status, .. } if status.as_u16() == 401 => {
            anyhow!("{e} (set DROVER_TOKEN to the cluster token)")
        }
        e => anyhow::Error::new(e),
    }
}

fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Read and check a job file: errors name the file, line and field.
pub fn read_job_file(file: &std::path::Path) -> anyhow::Result<drover_server_api::JobSpec> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read job file {}", file.display()))?;
    Ok(drover_server_api::jobfile::parse_and_validate(
        &text,
        &file.display().to_string(),
    )?)
}

// --- job --------------------------------------------------------------------------

/// Run a `job` subcommand.
pub async fn job_command(c: &Client, cmd: JobCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        JobCommand::Run { file, detach, json } => {
            let spec = read_job_file(&file)?;
            let registered = c.register_job(&spec).await.map_err(cluster_error)?;
            for w in &registered.warnings {
                eprintln!("warning: {w}");
            }
            if detach || registered.eval_id.is_empty() {
                if json {
                    print_json(&registered)?;
                } else {
                    println!("Job registration successful");
                    if !registered.eval_id.is_empty() {
                        println!("Evaluation ID: {}", registered.eval_id);
                    }
                }
                return Ok(ExitCode::SUCCESS);
            }
            let outcome = monitor(c, &spec.name, &registered, !json).await?;
            if json {
                print_json(&RunOutcomeJson {
                    register: &registered,
                    evaluation: &outcome.eval,
                    allocations: &outcome.placed,
                })?;
            }
            Ok(outcome.exit_code())
        }
        JobCommand::Plan { file, json } => {
            let spec = read_job_file(&file)?;
            let plan = c.plan_job(&spec).await.map_err(cluster_error)?;
            if json {
                print_json(&plan)?;
            } else {
                print!("{}", plan_text(&spec.name, &plan));
            }
            Ok(if plan.failed_tg_allocs.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_PLACEMENT_FAILED)
            })
        }
        JobCommand::Status { name: None, json } => {
            let jobs = c
                .jobs(&QueryOptions::default())
                .await
                .map_err(cluster_error)?;
            if json {
                print_json(&jobs.value)?;
            } else {
                println!(
                    "{:<24} {:<8} {:<9} {:<8} VERSION",
                    "ID", "TYPE", "PRIORITY", "STATUS"
                );
                for j in &jobs.value {
                    println!(
                        "{:<24} {:<8} {:<9} {:<8} {}",
                        j.name,
                        j.job_type.as_str(),
                        j.priority,
                        job_status_word(j.status, j.stop),
                        j.version
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        JobCommand::Status {
            name: Some(name),
            json,
        } => {
            let q = QueryOptions::default();
            let job = c.job(&name, &q).await.map_err(cluster_error)?.value;
            let allocations = c
                .job_allocations(&name, &q)
                .await
                .map_err(cluster_error)?
                .value;
            let evaluations = c
                .job_evaluations(&name, &q)
                .await
                .map_err(cluster_error)?
                .value;
            let view = JobStatusJson::new(job, allocations, evaluations);
            if json {
                print_json(&view)?;
            } else {
                print!("{}", job_status_text(&view));
            }
            Ok(ExitCode::SUCCESS)
        }
        JobCommand::Stop {
            name,
            purge,
            detach,
        } => {
            let stopped = c.stop_job(&name, purge).await.map_err(cluster_error)?;
            if !stopped.eval_id.is_empty() {
                println!("Evaluation ID: {}", stopped.eval_id);
            }
            if !detach {
                wait_stopped(c, &name).await?;
            }
            if purge {
                println!("Job {name} stopped and purged");
            } else {
                println!("Job {name} stopped");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// How long `job stop` waits for the allocations to end (their tasks' kill timeouts,
/// and the client's report): past it, it says what still runs and returns.
const STOP_WAIT: Duration = Duration::from_secs(120);

/// Wait until no allocation of `job` runs any more (every one terminal: complete,
/// failed or lost), so that `job stop` returning means its tasks are gone.
async fn wait_stopped(c: &Client, job: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + STOP_WAIT;
    let mut q = QueryOptions::default();
    loop {
        let answer = match c.job_allocations(job, &q).await {
            Ok(a) => a,
            // Purged, allocations and all.
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(cluster_error(e)),
        };
        let running: Vec<&Allocation> = answer
            .value
            .iter()
            .filter(|a| !a.client_status.is_terminal())
            .collect();
        if running.is_empty() {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            let ids: Vec<&str> = running.iter().map(|a| short(&a.id)).collect();
            eprintln!(
                "warning: allocations still stopping after {}s: {} (see `drover job status {job}`)",
                STOP_WAIT.as_secs(),
                ids.join(", ")
            );
            return Ok(());
        }
        q = QueryOptions::blocking(answer.index.max(q.index), left.min(MONITOR_WAIT));
    }
}

fn job_status_word(status: drover_server_api::JobStatus, stop: bool) -> &'static str {
    use drover_server_api::JobStatus;
    match (status, stop) {
        (JobStatus::Dead, _) => "dead",
        (_, true) => "stopped",
        (JobStatus::Pending, _) => "pending",
        (JobStatus::Running, _) => "running",
    }
}

#[derive(Serialize)]
struct RunOutcomeJson<'a> {
    #[serde(flatten)]
    register: &'a JobRegisterResponse,
    evaluation: &'a Evaluation,
    allocations: &'a [Allocation],
}

/// What the monitor of `job run` saw.
pub struct RunOutcome {
    /// The evaluation, finished.
    pub eval: Evaluation,
    /// The allocations it placed.
    pub placed: Vec<Allocation>,
}

impl RunOutcome {
    /// 0 when everything was placed, [`EXIT_PLACEMENT_FAILED`] when some copies wait
    /// in a blocked evaluation, 1 when the evaluation failed.
    pub fn exit_code(&self) -> ExitCode {
        match self.eval.status {
            EvalStatus::Failed | EvalStatus::Canceled => ExitCode::FAILURE,
            _ if !self.eval.failed_tg_allocs.is_empty() => ExitCode::from(EXIT_PLACEMENT_FAILED),
            _ => ExitCode::SUCCESS,
        }
    }
}

/// Follow the registration's evaluation until it is done, printing progress as
/// `nomad job run` does: the allocations it placed, and what it could not place.
async fn monitor(
    c: &Client,
    job: &str,
    registered: &JobRegisterResponse,
    print: bool,
) -> anyhow::Result<RunOutcome> {
    let say = |line: String| {
        if print {
            println!("{line}");
        }
    };
    say(format!(
        "==> Monitoring evaluation \"{}\"",
        short(&registered.eval_id)
    ));
    let mut q = QueryOptions::default();
    let mut last_status = None;
    let eval = loop {
        let answer = c
            .evaluation(&registered.eval_id, &q)
            .await
            .map_err(cluster_error)?;
        let eval = answer.value;
        if last_status != Some(eval.status) {
            say(format!(
                "    Evaluation triggered by job \"{job}\": status \"{}\"",
                eval_status_word(eval.status)
            ));
            last_status = Some(eval.status);
        }
        if eval.status != EvalStatus::Pending {
            break eval;
        }
        q = QueryOptions::blocking(answer.index.max(q.index), MONITOR_WAIT);
    };
    let placed: Vec<Allocation> = c
        .job_allocations(job, &QueryOptions::default())
        .await
        .map_err(cluster_error)?
        .value
        .into_iter()
        .filter(|a| a.eval_id == eval.id)
        .collect();
    for a in placed.iter().rev() {
        say(format!(
            "    Allocation \"{}\" created: node \"{}\", group \"{}\"",
            short(&a.id),
            a.node_name,
            a.group
        ));
    }
    if !eval.failed_tg_allocs.is_empty() {
        say("    Placement failures:".to_owned());
        for line in placement_failure_lines(&eval.failed_tg_allocs) {
            say(format!("      {line}"));
        }
        if let Some(b) = &eval.blocked_eval {
            say(format!(
                "    Evaluation \"{}\" waits for capacity to place the rest",
                short(b)
            ));
        }
    }
    match eval.status {
        EvalStatus::Failed => say(format!(
            "==> Evaluation \"{}\" failed: {}",
            short(&eval.id),
            eval.status_description
        )),
        _ => say(format!("==> Evaluation \"{}\" finished", short(&eval.id))),
    }
    Ok(RunOutcome { eval, placed })
}

fn eval_status_word(s: EvalStatus) -> &'static str {
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

fn alloc_row(a: &Allocation) -> String {
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

// --- node -------------------------------------------------------------------------

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
fn node_json(n: &Node) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(n)?;
    v["status"] = node_status_word(n).into();
    Ok(v)
}

/// Run a `node` subcommand.
pub async fn node_command(c: &Client, cmd: NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NodeCommand::Status { node: None, json } => {
            let nodes = c
                .nodes(&QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                let view = nodes
                    .iter()
                    .map(node_json)
                    .collect::<anyhow::Result<Vec<_>>>()?;
                print_json(&view)?;
            } else {
                print!("{}", nodes_text(&nodes));
            }
        }
        NodeCommand::Status {
            node: Some(id),
            json,
        } => {
            let node = c
                .node(&id, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                print_json(&node_json(&node)?)?;
            } else {
                print!("{}", nodes_text(std::slice::from_ref(&node)));
                let allocs = c
                    .node_allocations(&node.id, &QueryOptions::default())
                    .await
                    .map_err(cluster_error)?
                    .value;
                println!();
                println!("Allocations");
                for a in &allocs {
                    println!("{}", alloc_row(a));
                }
            }
        }
        NodeCommand::Drain { node, disable } => {
            c.drain_node(&node, !disable).await.map_err(cluster_error)?;
            if disable {
                println!("Node {node}: drain ended, it takes allocations again");
            } else {
                println!("Node {node}: draining, its allocations move to other nodes");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

// --- alloc and eval --------------------------------------------------------------

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

/// Run an `alloc` subcommand.
pub async fn alloc_command(c: &Client, cmd: AllocCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        AllocCommand::Status { id, json } => {
            let a = c
                .allocation(&id, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                print_json(&a)?;
            } else {
                print!("{}", alloc_text(&a));
            }
        }
        AllocCommand::Logs {
            alloc,
            task,
            follow,
            stderr,
        } => {
            // The full id: the agent finds its local allocations by it.
            let a = c
                .allocation(&alloc, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if !a.task_states.is_empty() && !a.task_states.contains_key(&task) {
                let names: Vec<&str> = a.task_states.keys().map(String::as_str).collect();
                bail!(
                    "allocation {} has no task named {task:?}; its tasks: {}",
                    a.id,
                    names.join(", ")
                );
            }
            let query = AllocLogsQuery {
                task,
                stream: if stderr {
                    drover_api::LogStream::Stderr
                } else {
                    drover_api::LogStream::Stdout
                },
                follow,
                tail: None,
                framed: true,
            };
            let mut frames = c.alloc_logs(&a.id, &query).await.map_err(cluster_error)?;
            let mut out = std::io::stdout().lock();
            while let Some(frame) = frames.next().await.map_err(cluster_error)? {
                match frame {
                    drover_api::Frame::Data(d) => {
                        match out.write_all(&d).and_then(|()| out.flush()) {
                            Ok(()) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                                return Ok(ExitCode::SUCCESS);
                            }
                            Err(e) => return Err(e).context("writing to stdout"),
                        }
                    }
                    drover_api::Frame::Skipped(n) => eprintln!("{}", drover_api::skipped_notice(n)),
                    drover_api::Frame::Error(e) => bail!("{e}"),
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Run an `eval` subcommand.
pub async fn eval_command(c: &Client, cmd: EvalCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        EvalCommand::Status { id, json } => {
            let e = c
                .evaluation(&id, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                print_json(&e)?;
            } else {
                print!("{}", eval_text(&e));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `drover server status`: the servers, the leader and the store, as the server at
/// `--address` (any of them, or an agent's socket) sees them.
pub async fn server_status(c: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let status = c.servers_status().await.map_err(cluster_error)?.value;
    if json {
        print_json(&status)?;
    } else {
        print!("{}", servers_status_text(&status));
    }
    Ok(ExitCode::SUCCESS)
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
mod tests {
    use super::*;
    use drover_server_api::{
        DriverInfo, EvalTrigger, JobStatus, JobType, NodeResources, TaskRunState, TaskState,
    };

    fn job() -> Job {
        let spec = drover_server_api::jobfile::parse_and_validate(
            "name = \"web\"\n[[group]]\nname = \"app\"\ncount = 3\n[[group.task]]\nname = \"main\"\ndriver = \"rawexec\"\nconfig = { command = \"/bin/true\" }\n",
            "web.toml",
        )
        .unwrap();
        Job {
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

    fn alloc(id: &str, status: ClientStatus, task: TaskRunState, exit: Option<i32>) -> Allocation {
        Allocation {
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

    fn eval(id: &str, status: EvalStatus, index: u64, failed: &[(&str, &str, u32)]) -> Evaluation {
        Evaluation {
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
    fn addresses_keep_servers_and_agents_apart() {
        assert_eq!(
            cluster_address(Some("http://127.0.0.1:4646")).unwrap(),
            "http://127.0.0.1:4646"
        );
        assert_eq!(
            cluster_address(Some("unix:///x/api.sock")).unwrap(),
            "unix:///x/api.sock"
        );
        // A bare path is an agent's socket, as for `task` commands.
        assert_eq!(
            cluster_address(Some("/x/api.sock")).unwrap(),
            "unix:///x/api.sock"
        );
        assert!(
            cluster_address(Some("tcp://h:1"))
                .unwrap_err()
                .to_string()
                .contains("http://HOST:PORT")
        );
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert!(client("http://127.0.0.1:1", env(&[("DROVER_TOKEN", "t")])).is_ok());
        let err = client("https://127.0.0.1:1", env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DROVER_CACERT"), "{err}");
        let err = client(
            "https://127.0.0.1:1",
            env(&[("DROVER_CACERT", "/nonexistent/ca.pem")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("cannot read the CA file /nonexistent/ca.pem"),
            "{err}"
        );
        let err = client("http://127.0.0.1:1", env(&[("DROVER_CLIENT_CERT", "c")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "set both DROVER_CLIENT_CERT and DROVER_CLIENT_KEY, or neither"
        );
        let err = client("ftp://h", env(&[])).unwrap_err().to_string();
        assert!(
            err.starts_with("address \"ftp://h\": expected http://"),
            "{err}"
        );
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
            id: format!("{name}-0123456789"),
            name: name.into(),
            status,
            status_description: String::new(),
            drain,
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
    fn run_exit_codes_follow_nomad() {
        let outcome = |e: Evaluation| RunOutcome {
            eval: e,
            placed: vec![],
        };
        assert_eq!(
            outcome(eval("e", EvalStatus::Complete, 1, &[])).exit_code(),
            ExitCode::SUCCESS
        );
        assert_eq!(
            outcome(eval(
                "e",
                EvalStatus::Complete,
                1,
                &[("app", "no node has driver qemu healthy", 2)]
            ))
            .exit_code(),
            ExitCode::from(EXIT_PLACEMENT_FAILED)
        );
        assert_eq!(
            outcome(eval("e", EvalStatus::Failed, 1, &[])).exit_code(),
            ExitCode::FAILURE
        );
    }

    #[test]
    fn plans_and_evaluations_read_as_sentences() {
        let plan = JobPlanResponse {
            job_version: 3,
            changed: true,
            groups: [(
                "app".to_owned(),
                drover_server_api::GroupPlanSummary {
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
