//! Taking over a plugin process an earlier host launched: identity is proven before
//! anything is sent to it, a dead or foreign process is never touched, and a reattached
//! process is watched like a child. Then the catalog doing it from its state store.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use drover_host::config::AgentConfig;
use drover_host::plugins::candidate::Builtin;
use drover_host::plugins::catalog::{Catalog, LoadContext};
use drover_host::state::{ErrorStore, Fail, MemStore, PluginRecord, StateStore};
use drover_plugin_sdk::client::{
    LaunchOptions, PluginProcess, ReattachConfig, ReattachError, process_start_time,
};
use drover_plugin_sdk::handshake::PluginAddr;
use drover_plugin_sdk::{DriverError, ExitOutcome};

/// Reattach budget: generous for a loaded machine (a hang is what the tests catch).
const BUDGET: Duration = Duration::from_secs(10);

async fn launch_skeleton(dir: &Path) -> PluginProcess {
    let mut opts = LaunchOptions::new("skeleton", workspace_bin("drover-skeleton-driver"));
    opts.socket_dir = Some(dir.to_owned());
    PluginProcess::launch(opts).await.expect("launch skeleton")
}

// A zombie still has /proc/<pid>; only a process that can run counts.
use drover_test_support::procs::alive;

async fn wait_dead(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn reattach_proves_identity_and_watches_the_process() {
    let root = tempfile::tempdir().unwrap();
    let launched = launch_skeleton(root.path()).await;
    let config = launched.reattach_config();
    assert_eq!(config.pid, launched.pid());
    assert!(config.start_time > 0);

    let p = PluginProcess::reattach("skeleton", config.clone(), BUDGET)
        .await
        .expect("reattach to a live plugin");
    assert!(p.is_reattached() && !launched.is_reattached());
    assert_eq!(p.pid(), launched.pid());
    let info = p.client().plugin_info().await.unwrap();
    assert_eq!(info.name, "skeleton");

    // The process dies: the reattached handle notices through its pidfd, and calls
    // fail with a typed error instead of hanging.
    nix_kill(launched.pid(), 9).unwrap();
    let how = tokio::time::timeout(Duration::from_secs(5), p.exited())
        .await
        .expect("exited() resolves for a reattached process");
    assert!(
        matches!(&how, ExitOutcome::Other(m) if m.contains("exit status unknown")),
        "{how}"
    );
    assert!(p.has_exited());
    assert_eq!(p.exit_status(), None);
    let err = p.client().plugin_info().await.unwrap_err();
    assert!(matches!(err, DriverError::Unavailable(_)), "{err:?}");
    launched.exited().await;

    // Now the pid is gone.
    let err = PluginProcess::reattach("skeleton", config, BUDGET)
        .await
        .unwrap_err();
    assert!(matches!(err, ReattachError::Gone { .. }), "{err}");
}

#[tokio::test]
async fn unproven_processes_are_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let plugin = launch_skeleton(root.path()).await;
    let good = plugin.reattach_config();

    // Right process, wrong name: it answers as "skeleton".
    let err = PluginProcess::reattach("rawexec", good.clone(), BUDGET)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ReattachError::WrongPlugin { found, .. } if found == "skeleton"),
        "{err}"
    );
    // The pid was reused (different start time).
    let mut reused = good.clone();
    reused.start_time += 1;
    let err = PluginProcess::reattach("skeleton", reused, BUDGET)
        .await
        .unwrap_err();
    assert!(matches!(err, ReattachError::PidReused { .. }), "{err}");
    // No start time recorded: nothing can be proven.
    let mut unknown = good.clone();
    unknown.start_time = 0;
    let err = PluginProcess::reattach("skeleton", unknown, BUDGET)
        .await
        .unwrap_err();
    assert!(matches!(err, ReattachError::NoStartTime { .. }), "{err}");
    assert!(alive(plugin.pid()), "a failed reattach touched the process");

    // A live process that is not a plugin at all (right pid and start time, nothing on
    // the socket): refused, and not signalled.
    let mut sleeper = std::process::Command::new("/bin/sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let foreign = ReattachConfig {
        addr: PluginAddr::Unix(root.path().join("nothing.sock")),
        pid: sleeper.id(),
        start_time: process_start_time(sleeper.id()).unwrap(),
        app_protocol_version: 1,
        path: "/bin/sleep".into(),
        tls: None,
        multiplex_grpc: false,
    };
    let err = PluginProcess::reattach("skeleton", foreign.clone(), BUDGET)
        .await
        .unwrap_err();
    assert!(matches!(err, ReattachError::Connect { .. }), "{err}");
    // The same process with a record naming the live plugin's socket (a record written
    // by a lying plugin): the socket is not served by that process's group, so the
    // reattach is refused before any RPC, instead of adopting the sleeper as
    // "skeleton".
    let borrowed = ReattachConfig {
        addr: good.addr.clone(),
        ..foreign
    };
    let err = PluginProcess::reattach("skeleton", borrowed, BUDGET)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ReattachError::Connect { error, .. }
            if error.contains("is not the plugin's socket")
                && error.contains(&format!("process group {}", plugin.pid()))),
        "{err}"
    );
    assert!(
        alive(sleeper.id()),
        "a process that is not a plugin was signalled"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();

    // Proven: shutdown asks it to exit, and it does.
    let p = PluginProcess::reattach("skeleton", good, BUDGET)
        .await
        .unwrap();
    let t = Instant::now();
    p.shutdown().await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    wait_dead(plugin.pid()).await;
}

#[tokio::test]
async fn hung_process_cannot_stall_a_reattach() {
    // Something listens on the recorded socket but never speaks HTTP/2.
    let root = tempfile::tempdir().unwrap();
    let sock = root.path().join("hung.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let mut sleeper = std::process::Command::new("/bin/sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let config = ReattachConfig {
        addr: PluginAddr::Unix(sock),
        pid: sleeper.id(),
        start_time: process_start_time(sleeper.id()).unwrap(),
        app_protocol_version: 1,
        path: "/bin/sleep".into(),
        tls: None,
        multiplex_grpc: false,
    };
    let t = Instant::now();
    let err = PluginProcess::reattach("skeleton", config, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}: {err}",
        t.elapsed()
    );
    assert!(alive(sleeper.id()));
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

fn context(root: &Path) -> (AgentConfig, Vec<Builtin>, Arc<LoadContext>) {
    let plugin_dir = root.join("plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let run_dir = root.join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let config = AgentConfig {
        plugin_dir: Some(plugin_dir),
        data_dir: Some(root.to_owned()),
        ..AgentConfig::default()
    };
    let builtins = vec![Builtin {
        name: "raw_exec".into(),
        command: drover(),
        args: ["plugin", "serve", "raw_exec"].map(Into::into).to_vec(),
    }];
    let ctx = Arc::new(LoadContext {
        timeout: BUDGET,
        socket_dir: run_dir,
        accepted: drover_plugin_sdk::version::supported_api_range(),
        agent: drover_plugin_sdk::AgentInfo::new(String::new())
            .with_alloc_dir(root.join("alloc"))
            .with_plugin_state_dir(root.join("plugin-state")),
        // raw_exec runs nothing unless enabled.
        settings: std::collections::BTreeMap::from([(
            "raw_exec".to_owned(),
            drover_host::config::PluginSettings {
                config: serde_json::json!({ "enabled": true }),
                ..Default::default()
            },
        )]),
        plugin_pass_env: Vec::new(),
        plugin_auto_mtls: false,
        nomad: None,
    });
    (config, builtins, ctx)
}

async fn load(
    store: Arc<dyn StateStore>,
    root: &Path,
) -> (Arc<Catalog>, tokio_util::sync::CancellationToken) {
    let (config, builtins, ctx) = context(root);
    let catalog = Arc::new(Catalog::new(store));
    let stop = tokio_util::sync::CancellationToken::new();
    catalog.load(&config, &builtins, ctx, stop.clone()).await;
    (catalog, stop)
}

#[tokio::test]
async fn catalog_reattaches_from_its_records_and_launches_once() {
    let root = tempfile::tempdir().unwrap();
    let store: Arc<dyn StateStore> = Arc::new(MemStore::default());

    let (first, stop) = load(store.clone(), root.path()).await;
    assert!(first.loading_done());
    let plugin = first.wait_loaded("raw_exec").await.expect("rawexec loaded");
    assert!(first.wait_loaded("docker").await.is_none());
    let pid = plugin.client().plugin_info().await.map(|_| ()).ok();
    assert!(pid.is_some());
    let row = first
        .status()
        .into_iter()
        .find(|r| r.name == "raw_exec")
        .unwrap();
    let pid = row.pid.unwrap();
    assert!(!row.reattached);
    let recs: Vec<PluginRecord> = store.plugins().unwrap();
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0].reattach.pid, pid);
    assert_eq!(recs[0].args, ["plugin", "serve", "raw_exec"]);
    assert_eq!(
        recs[0].sha256,
        drover_host::plugins::trust::sha256_file(&drover()).unwrap()
    );
    // The "agent" goes away without stopping its plugins.
    stop.cancel();
    drop(first);

    let (second, stop2) = load(store.clone(), root.path()).await;
    let row = second
        .status()
        .into_iter()
        .find(|r| r.name == "raw_exec")
        .unwrap();
    assert_eq!(row.pid, Some(pid), "not the same process: {row:?}");
    assert!(row.reattached);
    assert!(
        second
            .get("raw_exec")
            .unwrap()
            .client()
            .capabilities()
            .await
            .is_ok()
    );

    // Drain: the plugin is stopped and its record forgotten.
    stop2.cancel();
    second.shutdown_all().await;
    wait_dead(pid).await;
    assert!(store.plugins().unwrap().is_empty());
}

#[tokio::test]
async fn failing_store_costs_reattach_not_service() {
    let root = tempfile::tempdir().unwrap();
    let inner: Arc<dyn StateStore> = Arc::new(MemStore::default());
    let store = Arc::new(ErrorStore::new(inner.clone(), Fail::All));
    let (catalog, stop) = load(store.clone(), root.path()).await;
    let plugin = catalog
        .wait_loaded("raw_exec")
        .await
        .expect("a failing store does not stop plugins from loading");
    assert!(plugin.client().capabilities().await.is_ok());
    assert!(store.calls() > 0);
    assert!(inner.plugins().unwrap().is_empty());
    stop.cancel();
    catalog.shutdown_all().await;
}

#[tokio::test]
async fn record_of_a_foreign_or_hung_process_is_dropped_within_the_budget() {
    let root = tempfile::tempdir().unwrap();
    let store: Arc<dyn StateStore> = Arc::new(MemStore::default());
    // A record that claims a live, hung process is the rawexec plugin.
    let sock = root.path().join("hung.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let mut sleeper = std::process::Command::new("/bin/sleep")
        .arg("60")
        .spawn()
        .unwrap();
    store
        .put_plugin(&PluginRecord {
            name: "raw_exec".into(),
            version: "0.1.0".into(),
            api_version: "1.0.0".into(),
            args: vec!["plugin".into(), "serve".into(), "raw_exec".into()],
            sha256: drover_host::plugins::trust::sha256_file(&drover()).unwrap(),
            reattach: ReattachConfig {
                addr: PluginAddr::Unix(sock),
                pid: sleeper.id(),
                start_time: process_start_time(sleeper.id()).unwrap(),
                app_protocol_version: 1,
                path: drover(),
                tls: None,
                multiplex_grpc: false,
            },
        })
        .unwrap();
    let t = Instant::now();
    let (catalog, stop) = load(store.clone(), root.path()).await;
    let took = t.elapsed();
    assert!(
        took < BUDGET * 2 + Duration::from_secs(2),
        "load took {took:?}"
    );
    let row = catalog
        .status()
        .into_iter()
        .find(|r| r.name == "raw_exec")
        .unwrap();
    assert!(!row.reattached, "{row:?}");
    assert_ne!(row.pid, Some(sleeper.id()));
    assert!(alive(sleeper.id()), "an unproven process was signalled");
    let recs = store.plugins().unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(Some(recs[0].reattach.pid), row.pid, "record not replaced");
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    stop.cancel();
    catalog.shutdown_all().await;
}
