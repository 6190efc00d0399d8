//! `drover job`: submit a job file (and follow its evaluation until its allocations
//! are placed), plan one, show jobs and stop them, through the servers' HTTP API.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use drover_server_api::client::{Client, QueryOptions};
use drover_server_api::{
    Allocation, Deployment, DeploymentStatus, EvalStatus, Evaluation, JobRegisterResponse, JobType,
};
use serde::Serialize;

use super::cluster_error;
use super::jobspec::{self, JobFileArgs};
use crate::render::{
    JobStatusJson, deployment_progress_lines, eval_status_word, job_history_text, job_status_text,
    job_status_word, placement_failure_lines, plan_text, print_json, short,
};

/// Exit code of `job run` when some copies could not be placed (as `nomad job run`).
pub const EXIT_PLACEMENT_FAILED: u8 = 2;

/// Exit code of `job run` when the deployment it followed failed (as Nomad's
/// deployment monitor).
pub const EXIT_DEPLOYMENT_FAILED: u8 = 2;

/// How long `job run` waits, after its evaluation finished, for the deployment of the
/// version it registered to show up (the scheduler creates it with the placements, so
/// it is there at once when there is one; this covers a slow follower's view).
const DEPLOYMENT_APPEAR_WAIT: Duration = Duration::from_secs(3);

/// How long one blocking query of the monitor waits before asking again.
const MONITOR_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Submit a job file (Nomad HCL or TOML) and wait until its allocations are placed.
    Run {
        #[command(flatten)]
        job: JobFileArgs,
        /// Return once the job is registered, without waiting for placement.
        #[arg(long)]
        detach: bool,
        /// Wait for the placement only, not for the deployment of the new version to
        /// turn healthy.
        #[arg(long)]
        no_follow: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show what submitting a job file would change; changes nothing.
    Plan {
        #[command(flatten)]
        job: JobFileArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check a job file as the server would (syntax, fields, values); needs no server.
    Validate {
        #[command(flatten)]
        job: JobFileArgs,
    },
    /// Write an example job file (HCL) that runs on a dev agent as it is.
    Init {
        /// Where (default example.nomad.hcl); an existing file is not overwritten.
        file: Option<PathBuf>,
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
    /// List the versions of a job kept by the servers, newest first.
    History {
        /// Job name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Register an earlier version of a job again as its newest.
    Revert {
        /// Job name.
        name: String,
        /// The version to go back to (see `drover job history`).
        version: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set the count of one group of a job.
    Scale {
        /// Job name.
        name: String,
        /// Group name.
        group: String,
        /// The new count.
        count: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl JobCommand {
    /// Whether the command needs no server (`validate`, `init`).
    pub fn is_local(&self) -> bool {
        matches!(self, JobCommand::Validate { .. } | JobCommand::Init { .. })
    }
}

/// Read and check a job file (HCL or TOML, see [`jobspec`]), printing the warnings of
/// its conversion: errors name the file and the line or field.
pub fn read_job_file(job: &JobFileArgs) -> anyhow::Result<drover_server_api::JobSpec> {
    let loaded = jobspec::load(job)?;
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    Ok(loaded.spec)
}

/// A job file that names no namespace (it says `default`) goes to the client's
/// (`-namespace`, `NOMAD_NAMESPACE`); one that names its own keeps it, as with
/// `nomad job run`.
fn in_namespace(c: &Client, mut spec: drover_server_api::JobSpec) -> drover_server_api::JobSpec {
    if let Some(ns) = c.namespace()
        && ns != "*"
        && spec.namespace == drover_server_api::DEFAULT_NAMESPACE
    {
        spec.namespace = ns.to_owned();
    }
    spec
}

/// Run `job validate` or `job init`, which need no server: 0, or 1 after the error.
pub fn local_job_command(cmd: JobCommand) -> ExitCode {
    let result = match cmd {
        JobCommand::Validate { job } => {
            read_job_file(&job).map(|_| "Job validation successful".to_owned())
        }
        JobCommand::Init { file } => jobspec::init(file.as_deref())
            .map(|p| format!("Example job file written to {}", p.display())),
        _ => Err(anyhow::anyhow!("this job command needs a server")),
    };
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("drover: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Run a `job` subcommand.
pub async fn job_command(c: &Client, cmd: JobCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        JobCommand::Run {
            job,
            detach,
            no_follow,
            json,
        } => {
            let spec = in_namespace(c, read_job_file(&job)?);
            // What follows (monitoring, the deployment) reads the job's namespace.
            let c = &c.with_namespace(&spec.namespace);
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
            let mut outcome = monitor(c, &spec.name, &registered, !json).await?;
            if !no_follow && outcome.exit_code() == ExitCode::SUCCESS {
                outcome.deployment = follow_deployment(c, &spec.name, &registered, !json).await?;
            }
            if json {
                print_json(&RunOutcomeJson {
                    register: &registered,
                    evaluation: &outcome.eval,
                    allocations: &outcome.placed,
                    deployment: outcome.deployment.as_ref(),
                })?;
            }
            Ok(outcome.exit_code())
        }
        JobCommand::Plan { job, json } => {
            let spec = in_namespace(c, read_job_file(&job)?);
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
        cmd @ (JobCommand::Validate { .. } | JobCommand::Init { .. }) => Ok(local_job_command(cmd)),
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
            let latest = c
                .latest_job_deployment(&name, &q)
                .await
                .map_err(cluster_error)?
                .value;
            let mut view = JobStatusJson::new(job, allocations, evaluations);
            view.latest_deployment = latest;
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
        JobCommand::History { name, json } => {
            let versions = c
                .job_versions(&name, &QueryOptions::default())
                .await
                .map_err(cluster_error)?
                .value;
            if json {
                print_json(&versions)?;
            } else {
                print!("{}", job_history_text(&versions));
            }
            Ok(ExitCode::SUCCESS)
        }
        JobCommand::Revert {
            name,
            version,
            json,
        } => {
            let r = c
                .revert_job(&name, version, None)
                .await
                .map_err(cluster_error)?;
            if json {
                print_json(&r)?;
            } else {
                println!("Job {name} reverted to version {version}");
                if !r.eval_id.is_empty() {
                    println!("Evaluation ID: {}", r.eval_id);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        JobCommand::Scale {
            name,
            group,
            count,
            json,
        } => {
            let r = c
                .scale_job(&name, &group, count)
                .await
                .map_err(cluster_error)?;
            if json {
                print_json(&r)?;
            } else {
                println!("Job {name} group {group:?} scaled to {count}");
                if !r.eval_id.is_empty() {
                    println!("Evaluation ID: {}", r.eval_id);
                }
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

#[derive(Serialize)]
struct RunOutcomeJson<'a> {
    #[serde(flatten)]
    register: &'a JobRegisterResponse,
    evaluation: &'a Evaluation,
    allocations: &'a [Allocation],
    #[serde(skip_serializing_if = "Option::is_none")]
    deployment: Option<&'a Deployment>,
}

/// What the monitor of `job run` saw.
pub struct RunOutcome {
    /// The evaluation, finished.
    pub eval: Evaluation,
    /// The allocations it placed.
    pub placed: Vec<Allocation>,
    /// The deployment of the version registered, as it ended, when followed.
    pub deployment: Option<Deployment>,
}

impl RunOutcome {
    /// 0 when everything was placed (and the deployment followed, if any, succeeded),
    /// [`EXIT_PLACEMENT_FAILED`] when some copies wait in a blocked evaluation or the
    /// deployment failed (as `nomad job run`), 1 when the evaluation failed or the
    /// deployment was cancelled (a newer version replaced it).
    pub fn exit_code(&self) -> ExitCode {
        match self.eval.status {
            EvalStatus::Failed | EvalStatus::Canceled => return ExitCode::FAILURE,
            _ if !self.eval.failed_tg_allocs.is_empty() => {
                return ExitCode::from(EXIT_PLACEMENT_FAILED);
            }
            _ => {}
        }
        match self.deployment.as_ref().map(|d| d.status) {
            Some(DeploymentStatus::Failed) => ExitCode::from(EXIT_DEPLOYMENT_FAILED),
            Some(DeploymentStatus::Cancelled) => ExitCode::FAILURE,
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
    Ok(RunOutcome {
        eval,
        placed,
        deployment: None,
    })
}

/// After the registration's evaluation finished: when the version registered is rolled
/// out as a deployment (a service job whose groups deploy), follow it until it ends,
/// printing the groups' counts as they change; the deployment as it ended. `None`
/// when there is none to follow (a batch or system job, `max_parallel = 0`, a job
/// changed again meanwhile, or none showed up in [`DEPLOYMENT_APPEAR_WAIT`]).
async fn follow_deployment(
    c: &Client,
    job: &str,
    registered: &JobRegisterResponse,
    print: bool,
) -> anyhow::Result<Option<Deployment>> {
    let current = c
        .job(job, &QueryOptions::default())
        .await
        .map_err(cluster_error)?
        .value;
    let deploys = current.spec.job_type == JobType::Service
        && current
            .spec
            .groups
            .iter()
            .any(|g| current.spec.update_of(g).deploys());
    // Another registration came after ours: its deployment is not ours to follow.
    if !deploys || current.stop || current.job_modify_index != registered.job_modify_index {
        return Ok(None);
    }
    let version = current.version;
    let appear_by = tokio::time::Instant::now() + DEPLOYMENT_APPEAR_WAIT;
    let mut q = QueryOptions::default();
    let mut d = loop {
        let answer = c
            .latest_job_deployment(job, &q)
            .await
            .map_err(cluster_error)?;
        match answer.value {
            Some(d) if d.job_version == version => break d,
            // A newer version's: ours was replaced before it got one.
            Some(d) if d.job_version > version => return Ok(None),
            _ => {}
        }
        let left = appear_by.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        q = QueryOptions::blocking(answer.index.max(q.index), left);
    };
    let say = |line: String| {
        if print {
            println!("{line}");
        }
    };
    say(format!("==> Monitoring deployment \"{}\"", short(&d.id)));
    let mut last_lines = Vec::new();
    let mut index = 0;
    loop {
        let lines = deployment_progress_lines(&d);
        if lines != last_lines {
            for l in &lines {
                say(l.clone());
            }
            last_lines = lines;
        }
        if !d.status.is_active() {
            break;
        }
        let answer = c
            .deployment(&d.id, &QueryOptions::blocking(index, MONITOR_WAIT))
            .await
            .map_err(cluster_error)?;
        index = answer.index.max(index);
        d = answer.value;
    }
    say(format!(
        "==> Deployment \"{}\" {}: {}",
        short(&d.id),
        d.status.as_str(),
        d.status_description
    ));
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::tests::eval;

    #[test]
    fn run_exit_codes_follow_nomad() {
        let outcome = |e: Evaluation| RunOutcome {
            eval: e,
            placed: vec![],
            deployment: None,
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
    fn a_followed_deployment_decides_the_exit_code() {
        use crate::render::deployments::tests::{deployment, group};
        let followed = |status: DeploymentStatus| RunOutcome {
            eval: eval("e", EvalStatus::Complete, 1, &[]),
            placed: vec![],
            deployment: Some(deployment(status, &[("app", group(1, 1, 1))])),
        };
        assert_eq!(
            followed(DeploymentStatus::Successful).exit_code(),
            ExitCode::SUCCESS
        );
        assert_eq!(
            followed(DeploymentStatus::Failed).exit_code(),
            ExitCode::from(EXIT_DEPLOYMENT_FAILED)
        );
        assert_eq!(
            followed(DeploymentStatus::Cancelled).exit_code(),
            ExitCode::FAILURE
        );
    }
}
