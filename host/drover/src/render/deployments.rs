//! What the deployment commands print: `deployment list|status`, the "Latest
//! Deployment" of `job status`, `job history`, and the progress lines of `job run`
//! following a deployment (Nomad's words and columns).

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use drover_server_api::{Deployment, Job};

use super::short;

/// A table: the cells of each row padded to their column's width, two spaces apart
/// (Nomad's `formatList`), trailing spaces cut.
fn table(rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

/// Unix nanoseconds as RFC 3339 to the second (UTC); `-` for 0 (none).
fn time_of(nanos: i64) -> String {
    match u64::try_from(nanos) {
        Ok(n) if n > 0 => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_nanos(n)).to_string()
        }
        _ => "-".to_owned(),
    }
}

/// `deployment list`: ID, Job ID, Job Version, Status, Description; newest first.
pub fn deployments_text(list: &[Deployment]) -> String {
    if list.is_empty() {
        return "No deployments found\n".to_owned();
    }
    let mut rows = vec![
        ["ID", "Job ID", "Job Version", "Status", "Description"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for d in list {
        rows.push(vec![
            short(&d.id).to_owned(),
            d.job_name.clone(),
            d.job_version.to_string(),
            d.status.as_str().to_owned(),
            d.status_description.clone(),
        ]);
    }
    table(&rows)
}

/// The "Deployed" table of a deployment: one row per group. `Auto Revert` shows when
/// some group reverts on failure, `Promoted` and `Canaries` when some group has
/// canaries (as Nomad's `deployment status`); the progress deadline is the time by
/// which the group must make progress (`-` when none is pending).
pub fn deployment_groups_text(d: &Deployment) -> String {
    let auto_revert = d.groups.values().any(|g| g.auto_revert);
    let canaries = d.groups.values().any(|g| g.desired_canaries > 0);
    let mut header = vec!["Task Group"];
    if auto_revert {
        header.push("Auto Revert");
    }
    if canaries {
        header.push("Promoted");
    }
    header.push("Desired");
    if canaries {
        header.push("Canaries");
    }
    header.extend(["Placed", "Healthy", "Unhealthy", "Progress Deadline"]);
    let mut rows = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
    for (name, g) in &d.groups {
        let mut row = vec![name.clone()];
        if auto_revert {
            row.push(g.auto_revert.to_string());
        }
        if canaries {
            row.push(if g.desired_canaries > 0 {
                g.promoted.to_string()
            } else {
                "N/A".to_owned()
            });
        }
        row.push(g.desired_total.to_string());
        if canaries {
            row.push(g.desired_canaries.to_string());
        }
        row.extend([
            g.placed_allocs.to_string(),
            g.healthy_allocs.to_string(),
            g.unhealthy_allocs.to_string(),
            time_of(g.require_progress_by),
        ]);
        rows.push(row);
    }
    table(&rows)
}

/// `deployment status ID`: the deployment, then its groups.
pub fn deployment_status_text(d: &Deployment) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "ID          = {}", d.id);
    let _ = writeln!(out, "Job ID      = {}", d.job_name);
    let _ = writeln!(out, "Job Version = {}", d.job_version);
    let _ = writeln!(out, "Status      = {}", d.status.as_str());
    let _ = writeln!(out, "Description = {}", d.status_description);
    if !d.groups.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "Deployed");
        out.push_str(&deployment_groups_text(d));
    }
    out
}

/// The "Latest Deployment" section of `job status NAME`.
pub fn latest_deployment_text(d: &Deployment) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Latest Deployment");
    let _ = writeln!(out, "ID          = {}", short(&d.id));
    let _ = writeln!(out, "Status      = {}", d.status.as_str());
    let _ = writeln!(out, "Description = {}", d.status_description);
    if !d.groups.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "Deployed");
        out.push_str(&deployment_groups_text(d));
    }
    out
}

/// `job history NAME`: one block per version kept, newest first (Nomad's).
pub fn job_history_text(versions: &[Job]) -> String {
    let mut out = String::new();
    for (i, j) in versions.iter().enumerate() {
        if i > 0 {
            let _ = writeln!(out);
        }
        let _ = writeln!(out, "Version     = {}", j.version);
        let _ = writeln!(out, "Stable      = {}", j.stable);
        let _ = writeln!(out, "Submit Date = {}", time_of(j.submit_time));
    }
    out
}

/// What `job run` prints while it follows a deployment, when the counts change: one
/// line per group.
pub fn deployment_progress_lines(d: &Deployment) -> Vec<String> {
    d.groups
        .iter()
        .map(|(name, g)| {
            let mut line = format!(
                "    Group \"{name}\": {}/{} placed, {} healthy, {} unhealthy",
                g.placed_allocs, g.desired_total, g.healthy_allocs, g.unhealthy_allocs
            );
            if g.desired_canaries > 0 {
                let _ = write!(
                    line,
                    ", {} canaries{}",
                    g.desired_canaries,
                    if g.promoted {
                        " (promoted)"
                    } else {
                        " (awaiting promotion)"
                    }
                );
            }
            line
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use drover_server_api::{DeploymentGroup, DeploymentStatus};

    pub(crate) fn deployment(
        status: DeploymentStatus,
        groups: &[(&str, DeploymentGroup)],
    ) -> Deployment {
        Deployment {
            namespace: "default".into(),
            id: "0b23b149-7b2c-4c3c-8f3e-0123456789ab".to_owned(),
            job_name: "web".to_owned(),
            job_version: 1,
            job_modify_index: 10,
            job_create_index: 5,
            status,
            status_description: match status {
                DeploymentStatus::Successful => "Deployment completed successfully".to_owned(),
                DeploymentStatus::Failed => "Failed due to unhealthy allocations".to_owned(),
                _ => "Deployment is running".to_owned(),
            },
            groups: groups
                .iter()
                .map(|(n, g)| ((*n).to_owned(), g.clone()))
                .collect(),
            create_index: 11,
            modify_index: 12,
            create_time: 0,
            modify_time: 0,
        }
    }

    pub(crate) fn group(desired: u32, placed: u32, healthy: u32) -> DeploymentGroup {
        DeploymentGroup {
            desired_total: desired,
            placed_allocs: placed,
            healthy_allocs: healthy,
            progress_deadline: Duration::from_secs(600),
            ..Default::default()
        }
    }

    #[test]
    fn a_deployment_without_canaries_shows_nomads_plain_table() {
        let d = deployment(DeploymentStatus::Successful, &[("app", group(3, 3, 3))]);
        assert_eq!(
            deployment_status_text(&d),
            "ID          = 0b23b149-7b2c-4c3c-8f3e-0123456789ab\n\
             Job ID      = web\n\
             Job Version = 1\n\
             Status      = successful\n\
             Description = Deployment completed successfully\n\
             \n\
             Deployed\n\
             Task Group  Desired  Placed  Healthy  Unhealthy  Progress Deadline\n\
             app         3        3       3        0          -\n"
        );
    }

    #[test]
    fn canaries_and_auto_revert_add_their_columns() {
        let mut canary = group(3, 1, 1);
        canary.desired_canaries = 1;
        canary.auto_revert = true;
        // 2026-01-01T00:00:00Z
        canary.require_progress_by = 1_767_225_600_000_000_000;
        let plain = group(2, 0, 0);
        let d = deployment(DeploymentStatus::Running, &[("api", canary), ("db", plain)]);
        let text = deployment_groups_text(&d);
        assert_eq!(
            text,
            "Task Group  Auto Revert  Promoted  Desired  Canaries  Placed  Healthy  Unhealthy  Progress Deadline\n\
             api         true         false     3        1         1       1        0          2026-01-01T00:00:00Z\n\
             db          false        N/A       2        0         0       0        0          -\n"
        );
        let lines = deployment_progress_lines(&d);
        assert_eq!(
            lines,
            [
                "    Group \"api\": 1/3 placed, 1 healthy, 0 unhealthy, 1 canaries (awaiting promotion)",
                "    Group \"db\": 0/2 placed, 0 healthy, 0 unhealthy",
            ]
        );
    }

    #[test]
    fn lists_and_latest_deployment_name_the_essentials() {
        let d = deployment(DeploymentStatus::Failed, &[("app", group(1, 1, 0))]);
        assert_eq!(
            deployments_text(std::slice::from_ref(&d)),
            "ID        Job ID  Job Version  Status  Description\n\
             0b23b149  web     1            failed  Failed due to unhealthy allocations\n"
        );
        assert_eq!(deployments_text(&[]), "No deployments found\n");
        let latest = latest_deployment_text(&d);
        assert!(
            latest.starts_with(
                "Latest Deployment\nID          = 0b23b149\nStatus      = failed\n\
             Description = Failed due to unhealthy allocations\n\nDeployed\n"
            ),
            "{latest}"
        );
    }

    #[test]
    fn history_lists_versions_newest_first_with_stability() {
        let mut v1 = super::super::tests::job();
        v1.version = 1;
        v1.stable = false;
        v1.submit_time = 1_767_225_600_000_000_000;
        let mut v0 = super::super::tests::job();
        v0.version = 0;
        v0.stable = true;
        assert_eq!(
            job_history_text(&[v1, v0]),
            "Version     = 1\nStable      = false\nSubmit Date = 2026-01-01T00:00:00Z\n\n\
             Version     = 0\nStable      = true\nSubmit Date = -\n"
        );
    }
}
