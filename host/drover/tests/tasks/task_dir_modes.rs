//! Task directories keep other host users out (issue 10, scenario 5, the task
//! directory half: they were 0755 with logs 0644 and `tmp/` 1777). Through the real
//! agent: a rawexec task and an exec task (running as `nobody`) get the layout and
//! modes of docs/architecture.md ("Task directories"), and the exec task can use its
//! own `tmp/`.

use crate::common;

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::Duration;

use common::tasks::*;
use common::*;
use drover_api::TaskLifecycle;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o7777
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

/// The modes that do not depend on the driver: the task dir, `logs/` and the logs.
fn check_agent_layout(dir: &Path) {
    let me = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    assert_eq!(mode(dir), 0o700, "task dir");
    assert_eq!(owner(dir), me, "task dir");
    assert_eq!(
        (mode(&dir.join("logs")), owner(&dir.join("logs"))),
        (0o700, me)
    );
    for f in ["stdout.0", "stderr.0"] {
        let p = dir.join("logs").join(f);
        assert_eq!((mode(&p), owner(&p).0), (0o600, me.0), "logs/{f}");
    }
}

#[test]
fn rawexec_task_dirs_and_logs_keep_other_users_out() {
    let (_root, agent) = agent();
    let task = run(
        &agent,
        serde_json::json!({
            "driver": "rawexec",
            "config": {"command": "/bin/sh", "args": ["-c", "echo out; echo err >&2; echo x > $DROVER_TASK_DIR/tmp/f"]},
        }),
    );
    let api = agent.api();
    let dead = api.block_on(api.wait_task(&task.id)).expect("wait");
    assert_eq!(dead.exit_code, Some(0), "{dead:#?}");
    let dir = Path::new(&dead.task_dir);
    check_agent_layout(dir);
    for (sub, m) in [("local", 0o755), ("secrets", 0o700), ("tmp", 0o700)] {
        assert_eq!(mode(&dir.join(sub)), m, "{sub}/");
    }
    assert!(
        dir.join("tmp/f").is_file(),
        "the task could not use its tmp/"
    );
}

#[test]
fn exec_task_gets_its_own_tmp_and_nobody_else_does() {
    if !rustix::process::geteuid().is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the exec driver needs root, and CI=true forbids skipping"
        );
        eprintln!("SKIPPED: the exec driver needs root");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let agent = Agent::start(root.path(), &plugins, &[]);
    agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "exec" && r["state"] == "healthy")
    });
    let task = run(
        &agent,
        serde_json::json!({
            "driver": "exec",
            "config": {"command": "/bin/sh", "args": ["-c",
                "echo out; echo err >&2; id -u > /tmp/who && cat /tmp/who"]},
        }),
    );
    let api = agent.api();
    let dead = api.block_on(api.wait_task(&task.id)).expect("wait");
    assert_eq!(dead.state, TaskLifecycle::Dead);
    assert_eq!(dead.exit_code, Some(0), "{dead:#?}\n{}", agent.log_text());
    let dir = Path::new(&dead.task_dir);
    // The task wrote its tmp/ as nobody.
    assert_eq!(
        std::fs::read_to_string(dir.join("tmp/who")).unwrap(),
        "65534\n"
    );
    check_agent_layout(dir);
    for (sub, m) in [("local", 0o755), ("secrets", 0o700), ("tmp", 0o700)] {
        let p = dir.join(sub);
        assert_eq!((mode(&p), owner(&p)), (m, (65534, 65534)), "{sub}/");
    }
    api.block_on(api.destroy_task(&task.id, true))
        .expect("destroy the task");
}
