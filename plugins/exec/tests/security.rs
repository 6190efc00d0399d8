//! Hardening of exec tasks (issue 10), inside real exec tasks: the task's open-file
//! limit.

mod common;

use common::*;
use serde_json::json;

/// The plugin raises its own open-file limit; a task gets the one the plugin was
/// started with (the operator's), not the raised one.
#[tokio::test]
async fn a_task_gets_the_operators_open_file_limit_not_the_plugins() {
    if !isolation_possible() {
        return;
    }
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.expect("a finite open-file hard limit");
    assert!(hard > 1024, "hard open-file limit {hard}: too low to tell");
    // The plugin inherits this soft limit, and raises its own towards the hard one.
    // (Process-wide: the other tests of this binary get 1024 descriptors, plenty.)
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(1024),
            maximum: Some(hard),
        },
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = Plugin::launch(dir.path(), json!({})).await;
    p.start("nofile", sh("ulimit -n")).await;
    let plugin = std::fs::read_to_string(format!("/proc/{}/limits", p.process.pid())).unwrap();
    let plugin_soft = plugin
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap()
        .to_owned();
    assert!(p.wait("nofile").await.successful());
    assert_eq!(
        p.stdout("nofile").trim(),
        "1024",
        "the plugin runs with {plugin_soft}"
    );
}
