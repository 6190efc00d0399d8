//! CSI (issue 27, acceptance 4) with the real kubernetes-csi hostpath plugin (a test
//! peer from `../shared/csi/`) run by a dev agent from its config
//! (`[csi_plugin.hostpath]`, a monolith: controller and node): the agent launches,
//! probes and fingerprints it (the node and Nomad's `/v1/plugins?type=csi`,
//! `/v1/plugin/csi/:id` show it); `volume create` makes a volume through the plugin's
//! controller; a job mounts it (NodeStage, NodePublish: a real bind mount) and writes;
//! a second job on the single-node-writer volume is blocked while the first runs, and
//! reads the data once it stopped; `volume delete` is refused while claimed and works
//! after.

use crate::common;

use std::time::Duration;

use common::Agent;
use common::cluster::{allocs_with, free_port, job_file, wait_dev_node_ready, wait_job};

fn root_or_skip() -> bool {
    // The hostpath plugin mounts: it needs root, as the agent that runs it.
    let uid = std::fs::metadata("/proc/self").map(|m| {
        use std::os::unix::fs::MetadataExt as _;
        m.uid()
    });
    if uid.is_ok_and(|u| u == 0) {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("the CSI tests need root (the plugin mounts): CI=true, a failure");
    }
    eprintln!("SKIPPED: the CSI tests need root (the plugin mounts)");
    false
}

#[test]
fn configured_hostpath_plugin_is_fingerprinted_healthy_to_the_server() {
    let Some(peers) = drover_test_support::csi::peers() else {
        return;
    };
    if !root_or_skip() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("hostpath-state");
    let config = format!(
        r#"
[csi_plugin.hostpath]
type = "monolith"
command = "{}"
args = ["-endpoint", "{{endpoint}}", "-nodeid", "{{node_id}}", "-statedir", "{}"]
"#,
        peers.hostpath().display(),
        state.display()
    );
    let config_file = root.path().join("csi.toml");
    std::fs::write(&config_file, config).unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = Agent::start(
        root.path(),
        &plugins,
        &[
            "--dev",
            "--dev-http-addr",
            &addr,
            "--config",
            config_file.to_str().unwrap(),
        ],
    );
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &[], Duration::from_secs(30));
    let nodes = agent.cli_json(&["node", "status", "--json"]);
    let node_id = nodes[0]["id"].as_str().unwrap().to_owned();

    // The plugin becomes healthy and the node registers it again with its facts.
    let mut node = serde_json::Value::Null;
    drover_test_support::until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(200),
        "the node showing the hostpath plugin healthy",
        || {
            node = agent.cli_json(&["node", "status", &node_id, "--json"]);
            node["csi_plugins"]["hostpath"]["healthy"] == true
        },
    );
    let f = &node["csi_plugins"]["hostpath"];
    assert_eq!(f["type"], "monolith", "{f:#}");
    assert_eq!(f["provider"], "hostpath.csi.k8s.io", "{f:#}");
    assert_eq!(
        f["node_id"],
        node_id.as_str(),
        "{{node_id}} is the Drover node id: {f:#}"
    );
    assert_eq!(f["node"]["stage_unstage"], true, "{f:#}");
    assert_eq!(f["controller"]["create_delete"], true, "{f:#}");
    let text = agent.cli(&["node", "status", &node_id]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("CSI Plugins")
            && text.contains("hostpath  monolith  hostpath.csi.k8s.io  healthy"),
        "{text}"
    );

    // Nomad's plugin endpoints.
    let token = std::fs::read_to_string(agent.data_dir.join("server/dev-token")).unwrap();
    let api = common::nomad_http::NomadApi::new(port).with_token(token.trim());
    let list = api.get_ok("/v1/plugins?type=csi");
    assert_eq!(list[0]["ID"], "hostpath", "{list:#}");
    assert_eq!(list[0]["Provider"], "hostpath.csi.k8s.io", "{list:#}");
    assert_eq!(list[0]["NodesHealthy"], 1, "{list:#}");
    assert_eq!(list[0]["ControllersHealthy"], 1, "{list:#}");
    let plugin = api.get_ok("/v1/plugin/csi/hostpath");
    let info = &plugin["Nodes"][node_id.as_str()];
    assert_eq!(info["Healthy"], true, "{plugin:#}");
    assert_eq!(info["NodeInfo"]["ID"], node_id.as_str(), "{plugin:#}");
    assert_eq!(
        info["NodeInfo"]["RequiresNodeStageVolume"], true,
        "{plugin:#}"
    );
    assert_eq!(
        plugin["Controllers"][node_id.as_str()]["ControllerInfo"]["SupportsCreateDelete"],
        true,
        "{plugin:#}"
    );

    // Nomad 1.0.18's own CLI reads the plugin, and deregisters and registers (its
    // spec's top-level access_mode) a volume Drover created.
    let Some(nomad) = drover_test_support::nomad::peers() else {
        return;
    };
    let nomad_cli = |args: &[&str]| {
        let out = std::process::Command::new(nomad.nomad())
            .args(args)
            .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
            .env("NOMAD_TOKEN", token.trim())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "nomad {}: {text}", args.join(" "));
        text
    };
    let out = nomad_cli(&["plugin", "status", "hostpath"]);
    assert!(
        out.contains("hostpath.csi.k8s.io") && out.contains("Nodes Healthy        = 1"),
        "{out}"
    );
    let spec = root.path().join("v.hcl");
    std::fs::write(
        &spec,
        "id = \"v\"\ntype = \"csi\"\nplugin_id = \"hostpath\"\n\
         capability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}\n",
    )
    .unwrap();
    let out = agent.cli(&["volume", "create", spec.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vol = agent.cli_json(&["volume", "status", "v", "--json"]);
    let external = vol["ExternalID"].as_str().unwrap().to_owned();
    nomad_cli(&["volume", "deregister", "v"]);
    assert_eq!(
        agent.cli_json(&["volume", "status", "--json"]),
        serde_json::json!([])
    );
    let old_spec = root.path().join("v-nomad10.hcl");
    std::fs::write(
        &old_spec,
        format!(
            "id = \"v\"\nname = \"v\"\ntype = \"csi\"\nexternal_id = \"{external}\"\n\
             plugin_id = \"hostpath\"\naccess_mode = \"single-node-writer\"\n\
             attachment_mode = \"file-system\"\n"
        ),
    )
    .unwrap();
    nomad_cli(&["volume", "register", old_spec.to_str().unwrap()]);
    let out = nomad_cli(&["volume", "status", "v"]);
    assert!(
        out.contains(&external) && out.contains("Schedulable          = true"),
        "{out}"
    );
    // Another namespace cannot register the same storage under a volume of its own
    // (it would reach this namespace's data, and count claims apart).
    let out = agent.cli(&["namespace", "apply", "other"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = agent.cli(&[
        "--namespace",
        "other",
        "volume",
        "register",
        old_spec.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("already registered as volume \"v\" in namespace \"default\""),
        "{err}"
    );
    let out = agent.cli(&["volume", "delete", "v"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!state.join(&external).exists());
}

/// A dev agent running the hostpath plugin as `[csi_plugin.hostpath]` with its
/// volumes under `state`, ready with exec and the plugin healthy: the agent, its HTTP
/// port and its node id.
fn hostpath_agent(
    root: &std::path::Path,
    hostpath: &std::path::Path,
    state: &std::path::Path,
) -> (Agent, u16, String) {
    let config = format!(
        r#"
[csi_plugin.hostpath]
type = "monolith"
command = "{}"
args = ["-endpoint", "{{endpoint}}", "-nodeid", "{{node_id}}", "-statedir", "{}"]
"#,
        hostpath.display(),
        state.display()
    );
    let config_file = root.join("csi.toml");
    std::fs::write(&config_file, config).unwrap();
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = Agent::start(
        root,
        &plugins,
        &[
            "--dev",
            "--dev-http-addr",
            &addr,
            "--config",
            config_file.to_str().unwrap(),
        ],
    );
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["exec"], Duration::from_secs(30));
    let nodes = agent.cli_json(&["node", "status", "--json"]);
    let node_id = nodes[0]["id"].as_str().unwrap().to_owned();
    drover_test_support::until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(200),
        "the node showing the hostpath plugin healthy",
        || {
            let node = agent.cli_json(&["node", "status", &node_id, "--json"]);
            node["csi_plugins"]["hostpath"]["healthy"] == true
        },
    );
    (agent, port, node_id)
}

fn cli_ok(agent: &Agent, args: &[&str]) -> String {
    let out = agent.cli(args);
    assert!(
        out.status.success(),
        "drover {}: {}\nagent log:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr),
        common::cluster::tail(&agent.log_text())
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The mount points under `dir` (from /proc/self/mountinfo).
fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let prefix = dir.to_string_lossy().into_owned();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("<{}: {e}>", path.display()))
}

/// Acceptance 4.
#[test]
fn csi_volume_is_created_mounted_kept_claimed_once_and_deleted() {
    let Some(peers) = drover_test_support::csi::peers() else {
        return;
    };
    if !root_or_skip() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("hostpath-state");
    let (agent, _port, _node_id) = hostpath_agent(root.path(), &peers.hostpath(), &state);

    // `volume create` through the plugin's controller.
    let spec = root.path().join("shared.hcl");
    std::fs::write(
        &spec,
        r#"
id           = "shared"
name         = "shared"
type         = "csi"
plugin_id    = "hostpath"
capacity_min = "1MiB"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
"#,
    )
    .unwrap();
    cli_ok(&agent, &["volume", "create", spec.to_str().unwrap()]);
    let vol = agent.cli_json(&["volume", "status", "shared", "--json"]);
    let external = vol["ExternalID"].as_str().unwrap().to_owned();
    assert!(!external.is_empty(), "{vol:#}");
    assert_eq!(vol["PluginID"], "hostpath", "{vol:#}");
    assert_eq!(vol["Provider"], "hostpath.csi.k8s.io", "{vol:#}");
    assert_eq!(vol["Schedulable"], true, "{vol:#}");
    // The plugin keeps the volume's data in a directory of its state dir. Who may
    // write into a volume is the storage's business: exec tasks run as nobody.
    let data = state.join(&external);
    assert!(data.is_dir(), "the plugin made {}", data.display());
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let mount_dir = agent.data_dir.join("csi/hostpath/mounts");

    // A service job mounts it (NodeStage, NodePublish) and writes.
    let writer = r#"
name = "writer"
type = "service"

[[group]]
name = "g"

[group.volume.data]
type = "csi"
source = "shared"
access_mode = "single-node-writer"
attachment_mode = "file-system"

[[group.task]]
name = "t"
driver = "exec"
config = { command = "/bin/sh", args = ["-c", 'echo "kept by $NOMAD_ALLOC_ID" > /data/note; exec sleep 600'] }
resources = { cpu = 100, memory_mb = 64 }

[[group.task.volume_mount]]
volume = "data"
destination = "/data"
"#;
    let file = job_file(root.path(), "writer", writer);
    cli_ok(&agent, &["job", "run", "--detach", file.to_str().unwrap()]);
    let status = wait_job(&agent, "writer", "the writer running", |v| {
        allocs_with(v, "running").len() == 1
    });
    let writer_alloc = allocs_with(&status, "running")[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    drover_test_support::until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(100),
        "the writer's note in the plugin's volume",
        || read(&data.join("note")).contains("kept by"),
    );
    assert_eq!(
        read(&data.join("note")).trim(),
        format!("kept by {writer_alloc}")
    );
    // A real bind mount at the allocation's target.
    let target = mount_dir.join(format!("per-alloc/{writer_alloc}/default/shared"));
    let mounts = mounts_under(&mount_dir);
    assert!(
        mounts.contains(&target.to_string_lossy().into_owned()),
        "{} among {mounts:?}",
        target.display()
    );
    // ... nosuid,nodev: the agent asks the plugin for them whatever the volume says.
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(&*target.to_string_lossy()))
        .unwrap_or_default();
    let opts = line.split(' ').nth(5).unwrap_or_default();
    assert!(
        opts.split(',').any(|o| o == "nosuid") && opts.split(',').any(|o| o == "nodev"),
        "the published mount's options: {line}"
    );
    // The volume shows its claim.
    let vol = agent.cli_json(&["volume", "status", "shared", "--json"]);
    assert_eq!(vol["CurrentWriters"], 1, "{vol:#}");
    assert_eq!(
        vol["Allocations"][0]["ID"],
        writer_alloc.as_str(),
        "{vol:#}"
    );

    // Deleting (or deregistering) it while claimed is refused, naming the claim.
    for verb in ["delete", "deregister"] {
        let out = agent.cli(&["volume", verb, "shared"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "volume {verb} while claimed");
        assert!(
            err.contains("in use") && err.contains(&writer_alloc),
            "{err}"
        );
    }

    // A second writer of the single-node-writer volume waits, with the reason.
    let reader = r#"
name = "reader"
type = "batch"

[[group]]
name = "g"

[group.volume.data]
type = "csi"
source = "shared"
access_mode = "single-node-writer"
attachment_mode = "file-system"

[[group.task]]
name = "t"
driver = "exec"
config = { command = "/bin/sh", args = ["-c", 'cat /data/note > /data/read-back'] }
resources = { cpu = 100, memory_mb = 64 }

[[group.task.volume_mount]]
volume = "data"
destination = "/data"
"#;
    let file = job_file(root.path(), "reader", reader);
    cli_ok(&agent, &["job", "run", "--detach", file.to_str().unwrap()]);
    let v = wait_job(&agent, "reader", "the reader blocked on the volume", |v| {
        v["placement_failures"]["g"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("CSI volume \"shared\" has no free write claim"))
    });
    assert!(v["allocations"].as_array().unwrap().is_empty(), "{v:#}");

    // The writer stops: its volume is unpublished, its claim ends, and the reader
    // runs and reads what the writer wrote.
    cli_ok(&agent, &["job", "stop", "writer"]);
    let v = wait_job(&agent, "reader", "the reader complete", |v| {
        allocs_with(v, "complete").len() == 1
    });
    let writer_status = agent.cli_json(&["job", "status", "writer", "--json"]);
    assert!(
        allocs_with(&writer_status, "running").is_empty(),
        "the reader ran while the writer ran: {writer_status:#}\n{v:#}"
    );
    assert_eq!(
        read(&data.join("read-back")).trim(),
        format!("kept by {writer_alloc}")
    );
    drover_test_support::until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(100),
        "every publish of the volume undone",
        || mounts_under(&mount_dir).is_empty(),
    );

    // No claim left: `volume delete` deletes it through the controller.
    drover_test_support::until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(200),
        "the volume without claims",
        || {
            let vol = agent.cli_json(&["volume", "status", "shared", "--json"]);
            vol["Allocations"].as_array().is_some_and(Vec::is_empty)
        },
    );
    cli_ok(&agent, &["volume", "delete", "shared"]);
    assert!(!data.exists(), "the plugin deleted {}", data.display());
    let list = agent.cli_json(&["volume", "status", "--json"]);
    assert_eq!(list, serde_json::json!([]), "{list:#}");
}

/// The CSI test suite's mock driver advertises PUBLISH_UNPUBLISH_VOLUME and refuses
/// NodeStageVolume without the `device` that ControllerPublishVolume puts in the
/// publish context: a job on its volume runs only if the node's agent had the
/// controller publish it first (through the server, which routes the call to the
/// controller's agent); stopping the job unpublishes it, and the volume is deleted.
#[test]
fn a_plugin_that_needs_controller_publish_gets_it_before_the_node_stages() {
    let Some(peers) = drover_test_support::csi::peers() else {
        return;
    };
    if !root_or_skip() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[csi_plugin.mock]
type = "monolith"
command = "{}"
env = {{ CSI_ENDPOINT = "{{socket}}" }}
"#,
        peers.mock().display()
    );
    let config_file = root.path().join("csi.toml");
    std::fs::write(&config_file, config).unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = Agent::start(
        root.path(),
        &plugins,
        &[
            "--dev",
            "--dev-http-addr",
            &addr,
            "--config",
            config_file.to_str().unwrap(),
        ],
    );
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["exec"], Duration::from_secs(30));
    let nodes = agent.cli_json(&["node", "status", "--json"]);
    let node_id = nodes[0]["id"].as_str().unwrap().to_owned();
    let mut node = serde_json::Value::Null;
    drover_test_support::until_blocking(
        Duration::from_secs(60),
        Duration::from_millis(200),
        "the node showing the mock plugin healthy",
        || {
            node = agent.cli_json(&["node", "status", &node_id, "--json"]);
            node["csi_plugins"]["mock"]["healthy"] == true
        },
    );
    let f = &node["csi_plugins"]["mock"];
    assert_eq!(f["controller"]["publish_unpublish"], true, "{f:#}");
    assert_eq!(f["node"]["stage_unstage"], true, "{f:#}");

    let spec = root.path().join("mock.hcl");
    std::fs::write(
        &spec,
        "id = \"m\"\ntype = \"csi\"\nplugin_id = \"mock\"\n\
         capability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}\n",
    )
    .unwrap();
    cli_ok(&agent, &["volume", "create", spec.to_str().unwrap()]);

    let job = r#"
name = "uses-mock"
type = "service"

[[group]]
name = "g"

[group.volume.data]
type = "csi"
source = "m"

[[group.task]]
name = "t"
driver = "exec"
config = { command = "/bin/sh", args = ["-c", 'test -d /data && exec sleep 600'] }
resources = { cpu = 100, memory_mb = 64 }

[[group.task.volume_mount]]
volume = "data"
destination = "/data"
"#;
    let file = job_file(root.path(), "uses-mock", job);
    cli_ok(&agent, &["job", "run", "--detach", file.to_str().unwrap()]);
    wait_job(
        &agent,
        "uses-mock",
        "the job running on the mock's volume",
        |v| allocs_with(v, "running").len() == 1,
    );
    let vol = agent.cli_json(&["volume", "status", "m", "--json"]);
    assert_eq!(vol["CurrentWriters"], 1, "{vol:#}");
    assert!(
        agent
            .log_text()
            .contains("CSI volume published to this node by the controller"),
        "{}",
        common::cluster::tail(&agent.log_text())
    );

    cli_ok(&agent, &["job", "stop", "uses-mock"]);
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(200),
        "the volume without claims",
        || {
            let vol = agent.cli_json(&["volume", "status", "m", "--json"]);
            vol["Allocations"].as_array().is_some_and(Vec::is_empty)
        },
    );
    cli_ok(&agent, &["volume", "delete", "m"]);
    assert!(
        !agent.log_text().contains("ControllerUnpublishVolume:"),
        "an unpublish failed:\n{}",
        common::cluster::tail(&agent.log_text())
    );
}

/// Acceptance 5 for CSI volumes: `kill -9` of the agent (its embedded server and the
/// plugin, which dies with it) while an exec task writes through a published
/// single-node-writer volume. After the restart the task was not restarted and still
/// writes through the same mount, the volume keeps its one writer claim, and a second
/// writer is still refused.
#[test]
fn kill_9_of_the_agent_keeps_a_published_csi_volume_its_claim_and_its_task() {
    let Some(peers) = drover_test_support::csi::peers() else {
        return;
    };
    if !root_or_skip() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("hostpath-state");
    let (mut first, _, _) = hostpath_agent(root.path(), &peers.hostpath(), &state);
    first.end_tasks = false;
    let spec = root.path().join("kept.hcl");
    std::fs::write(
        &spec,
        "id = \"kept\"\ntype = \"csi\"\nplugin_id = \"hostpath\"\n\
         capability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}\n",
    )
    .unwrap();
    cli_ok(&first, &["volume", "create", spec.to_str().unwrap()]);
    let vol = first.cli_json(&["volume", "status", "kept", "--json"]);
    let data = state.join(vol["ExternalID"].as_str().unwrap());
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let job = |name: &str| {
        format!(
            r#"
name = "{name}"
type = "service"

[[group]]
name = "g"

[group.volume.data]
type = "csi"
source = "kept"
access_mode = "single-node-writer"
attachment_mode = "file-system"

[[group.task]]
name = "t"
driver = "exec"
config = {{ command = "/bin/sh", args = ["-c", 'n=0; while true; do n=$((n+1)); echo $n > /data/tick.tmp; mv /data/tick.tmp /data/tick; sleep 0.1; done'] }}
resources = {{ cpu = 100, memory_mb = 64 }}

[[group.task.volume_mount]]
volume = "data"
destination = "/data"
"#
        )
    };
    let file = job_file(root.path(), "ticker", &job("ticker"));
    cli_ok(&first, &["job", "run", "--detach", file.to_str().unwrap()]);
    let status = wait_job(&first, "ticker", "the ticker running", |v| {
        allocs_with(v, "running").len() == 1
    });
    let alloc = allocs_with(&status, "running")[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let tick = || -> u64 {
        std::fs::read_to_string(data.join("tick"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    };
    drover_test_support::until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(100),
        "the ticker writing through its volume",
        || tick() > 0,
    );
    let before = first.cli_json(&["alloc", "status", &alloc, "--json"])["task_states"]["t"].clone();
    let mount_dir = first.data_dir.join("csi/hostpath/mounts");
    let target = mount_dir
        .join(format!("per-alloc/{alloc}/default/kept"))
        .to_string_lossy()
        .into_owned();
    assert!(mounts_under(&mount_dir).contains(&target));

    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let at_kill = tick();
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(50),
        "the task writing while its agent is dead",
        || tick() > at_kill,
    );

    let (second, _, _) = hostpath_agent(root.path(), &peers.hostpath(), &state);
    let status = wait_job(
        &second,
        "ticker",
        "the ticker running after the restart",
        |v| allocs_with(v, "running").len() == 1,
    );
    assert_eq!(allocs_with(&status, "running")[0]["id"], alloc.as_str());
    let after = second.cli_json(&["alloc", "status", &alloc, "--json"])["task_states"]["t"].clone();
    for field in ["task_id", "started_at", "starts", "restarts"] {
        assert_eq!(
            after[field], before[field],
            "{field}: {before:#} then {after:#}"
        );
    }
    assert!(
        mounts_under(&mount_dir).contains(&target),
        "the published mount is still there"
    );
    let at_restart = tick();
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(50),
        "the recovered task still writing through its volume",
        || tick() > at_restart,
    );
    let vol = second.cli_json(&["volume", "status", "kept", "--json"]);
    assert_eq!(vol["CurrentWriters"], 1, "{vol:#}");
    let file = job_file(root.path(), "rival", &job("rival"));
    cli_ok(&second, &["job", "run", "--detach", file.to_str().unwrap()]);
    wait_job(
        &second,
        "rival",
        "a second writer refused with the reason",
        |v| {
            v["placement_failures"]["g"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("no free write claim"))
        },
    );
    // Stopped, the recovered allocation is unpublished like any other (the rival is
    // stopped first: it would take the volume).
    cli_ok(&second, &["job", "stop", "rival"]);
    cli_ok(&second, &["job", "stop", "ticker"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !mounts_under(&mount_dir).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the recovered allocation's volume unpublished after its stop: not within 30s \
             ({:?})\nagent log:\n{}",
            mounts_under(&mount_dir),
            common::cluster::tail(&second.log_text())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(second);
    drop(first);
}
