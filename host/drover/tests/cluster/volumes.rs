//! Host volumes end to end (issue 27, acceptance 3) on a dev agent whose config offers
//! `[host_volume.NAME]`: the node registers them (`node status --json`, Nomad's
//! `/v1/node/:id`); an exec task writes into its volume and a later allocation on the
//! node reads it back; a read-only mount refuses writes; a job needing a volume no
//! node has is blocked with the reason; a link a task plants inside a volume does not
//! let another task's mount reach outside it, and a link planted where a nested volume
//! was is refused rather than followed. A config offering a link is refused at start.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Agent;
use common::cluster::{allocs_with, free_port, job_file, wait_dev_node_ready, wait_job};

/// A dev agent offering `volumes` (name, path, read_only), with Nomad's HTTP API on a
/// free port; the port.
fn volume_agent(root: &Path, volumes: &[(&str, &Path, bool)]) -> (Agent, u16) {
    volume_agent_with(root, volumes, "", &["exec"])
}

/// [`volume_agent`] with more config (`extra`), ready once `drivers` are healthy.
fn volume_agent_with(
    root: &Path,
    volumes: &[(&str, &Path, bool)],
    extra: &str,
    drivers: &[&str],
) -> (Agent, u16) {
    let mut config = extra.to_owned();
    for (name, path, ro) in volumes {
        config.push_str(&format!(
            "[host_volume.{name}]\npath = \"{}\"\nread_only = {ro}\n",
            path.display()
        ));
    }
    let config_file = root.join("volumes.toml");
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
    wait_dev_node_ready(&agent, drivers, Duration::from_secs(30));
    (agent, port)
}

/// A directory `name` in `root` anyone may write to: exec tasks run as `nobody`, and
/// who may write into a volume is the operator's choice (its mode).
fn dir(root: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let d = root.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

fn run_ok(agent: &Agent, root: &Path, name: &str, text: &str) {
    let file = job_file(root, name, text);
    let out = agent.cli(&["job", "run", "--detach", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "job run {name}: {}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        common::cluster::tail(&agent.log_text())
    );
}

/// A batch job of one exec task running `script` with `volumes` (TOML of the group's
/// volume tables) and `mounts` (TOML of the task's volume_mount tables).
fn batch_job(name: &str, volumes: &str, mounts: &str, script: &str) -> String {
    format!(
        r#"
name = "{name}"
type = "batch"

[[group]]
name = "g"
{volumes}

[[group.task]]
name = "t"
driver = "exec"
config = {{ command = "/bin/sh", args = ["-c", '{script}'] }}
resources = {{ cpu = 100, memory_mb = 64 }}
{mounts}
"#
    )
}

/// Wait until job `name`'s one allocation is complete (or failed, when `fail`).
fn wait_done(agent: &Agent, name: &str, status: &str) -> serde_json::Value {
    wait_job(agent, name, &format!("job {name} {status}"), |v| {
        allocs_with(v, status).len() == 1
    })
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("<{}: {e}>", path.display()))
}

/// Acceptance 3: written data outlives the allocation; a read-only mount refuses
/// writes; the node shows its volumes; a missing volume blocks with the reason.
#[test]
fn host_volume_data_outlives_its_allocation_and_read_only_mounts_refuse_writes() {
    let root = tempfile::tempdir().unwrap();
    let shared = dir(root.path(), "shared");
    let results = dir(root.path(), "results");
    let (agent, port) = volume_agent(
        root.path(),
        &[("shared", &shared, false), ("results", &results, false)],
    );

    // The node registered its volumes: the CLI and Nomad's API show them.
    let nodes = agent.cli_json(&["node", "status", "--json"]);
    let node_id = nodes[0]["id"].as_str().unwrap().to_owned();
    let node = agent.cli_json(&["node", "status", &node_id, "--json"]);
    assert_eq!(
        node["host_volumes"]["shared"],
        serde_json::json!({"path": shared.display().to_string(), "read_only": false}),
        "{node:#}"
    );
    let token = std::fs::read_to_string(agent.data_dir.join("server/dev-token")).unwrap();
    let api = common::nomad_http::NomadApi::new(port).with_token(token.trim());
    let node = api.get_ok(&format!("/v1/node/{node_id}"));
    assert_eq!(
        node["HostVolumes"]["shared"],
        serde_json::json!({"Path": shared.display().to_string(), "ReadOnly": false}),
        "{node:#}"
    );

    // A service job writes into the volume, then is stopped.
    let writer = r#"
name = "writer"
type = "service"

[[group]]
name = "g"

[group.volume.data]
type = "host"
source = "shared"

[[group.task]]
name = "t"
driver = "exec"
config = { command = "/bin/sh", args = ["-c", 'echo "kept by $NOMAD_ALLOC_ID" > /data/note; exec sleep 600'] }
resources = { cpu = 100, memory_mb = 64 }

[[group.task.volume_mount]]
volume = "data"
destination = "/data"
"#;
    run_ok(&agent, root.path(), "writer", writer);
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
        "the writer's note in the volume on the host",
        || read(&shared.join("note")).contains("kept by"),
    );
    assert_eq!(
        read(&shared.join("note")).trim(),
        format!("kept by {writer_alloc}")
    );
    let out = agent.cli(&["job", "stop", "writer"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_job(&agent, "writer", "the writer stopped", |v| {
        v["allocations"]
            .as_array()
            .is_some_and(|a| a.iter().all(|a| a["client_status"] != "running"))
    });

    // A new allocation on the node reads it back, through a mount that is read-only
    // (the mount says so; the group's request is writable): its write fails.
    let reader = batch_job(
        "reader",
        "[group.volume.data]\ntype = \"host\"\nsource = \"shared\"\n\
         [group.volume.out]\ntype = \"host\"\nsource = \"results\"\n",
        "[[group.task.volume_mount]]\nvolume = \"data\"\ndestination = \"/srv/data\"\nread_only = true\n\
         [[group.task.volume_mount]]\nvolume = \"out\"\ndestination = \"/out\"\n",
        "cat /srv/data/note > /out/read; if echo x 2> /out/write-error > /srv/data/new; \
         then echo wrote > /out/write; else echo refused > /out/write; fi",
    );
    run_ok(&agent, root.path(), "reader", &reader);
    wait_done(&agent, "reader", "complete");
    assert_eq!(
        read(&results.join("read")).trim(),
        format!("kept by {writer_alloc}")
    );
    assert_eq!(read(&results.join("write")).trim(), "refused");
    assert!(
        read(&results.join("write-error")).contains("Read-only file system"),
        "{}",
        read(&results.join("write-error"))
    );
    assert!(!shared.join("new").exists());

    // The group's request read-only: the same.
    let ro_group = batch_job(
        "ro-group",
        "[group.volume.data]\ntype = \"host\"\nsource = \"shared\"\nread_only = true\n\
         [group.volume.out]\ntype = \"host\"\nsource = \"results\"\n",
        "[[group.task.volume_mount]]\nvolume = \"data\"\ndestination = \"/data\"\n\
         [[group.task.volume_mount]]\nvolume = \"out\"\ndestination = \"/out\"\n",
        "if echo x > /data/new2; then echo wrote > /out/write2; else echo refused > /out/write2; fi",
    );
    run_ok(&agent, root.path(), "ro-group", &ro_group);
    wait_done(&agent, "ro-group", "complete");
    assert_eq!(read(&results.join("write2")).trim(), "refused");
    assert!(!shared.join("new2").exists());

    // A volume no node has: accepted, blocked with the reason.
    let nowhere = batch_job(
        "nowhere",
        "[group.volume.data]\ntype = \"host\"\nsource = \"nowhere\"\n",
        "[[group.task.volume_mount]]\nvolume = \"data\"\ndestination = \"/data\"\n",
        "true",
    );
    run_ok(&agent, root.path(), "nowhere", &nowhere);
    let v = wait_job(&agent, "nowhere", "the job blocked on its volume", |v| {
        v["placement_failures"]["g"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("missing host volume \"nowhere\""))
    });
    assert!(v["allocations"].as_array().unwrap().is_empty(), "{v:#}");

    // A mount of a volume the group lacks: refused when submitted, naming it.
    let typo = batch_job(
        "typo",
        "[group.volume.data]\ntype = \"host\"\nsource = \"shared\"\n",
        "[[group.task.volume_mount]]\nvolume = \"dta\"\ndestination = \"/data\"\n",
        "true",
    );
    let file = job_file(root.path(), "typo", &typo);
    let out = agent.cli(&["job", "run", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("\"dta\""), "{err}");
}

/// Acceptance 3: a link planted inside a volume by one task does not let another
/// task's mount reach outside it; a link put where a nested volume was is refused.
#[test]
fn a_link_planted_in_a_volume_does_not_reach_outside_it() {
    let root = tempfile::tempdir().unwrap();
    let shared = dir(root.path(), "shared");
    let inner = dir(&shared, "inner");
    let results = dir(root.path(), "results");
    let secret = root.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("marker"), "top-secret\n").unwrap();
    let (agent, _) = volume_agent(
        root.path(),
        &[
            ("shared", &shared, false),
            ("inner", &inner, false),
            ("results", &results, false),
        ],
    );
    let planter = batch_job(
        "planter",
        "[group.volume.data]\ntype = \"host\"\nsource = \"shared\"\n",
        "[[group.task.volume_mount]]\nvolume = \"data\"\ndestination = \"/data\"\n",
        &format!(
            "ln -s {s} /data/escape && ln -s / /data/root && rm -rf /data/inner && \
             ln -s {s} /data/inner",
            s = secret.display()
        ),
    );
    run_ok(&agent, root.path(), "planter", &planter);
    wait_done(&agent, "planter", "complete");
    assert!(
        std::fs::symlink_metadata(shared.join("escape"))
            .unwrap()
            .is_symlink()
    );
    assert!(
        std::fs::symlink_metadata(shared.join("inner"))
            .unwrap()
            .is_symlink()
    );

    // Another task mounting the volume follows the links inside its own root only.
    let prober = batch_job(
        "prober",
        "[group.volume.data]\ntype = \"host\"\nsource = \"shared\"\n\
         [group.volume.out]\ntype = \"host\"\nsource = \"results\"\n",
        "[[group.task.volume_mount]]\nvolume = \"data\"\ndestination = \"/data\"\n\
         [[group.task.volume_mount]]\nvolume = \"out\"\ndestination = \"/out\"\n",
        "cat /data/escape/marker > /out/escape 2>&1; cat /data/root/etc/shadow > /out/shadow 2>&1; \
         ls /data/root/ > /out/root-ls 2>&1; echo pwned > /data/escape/pwned 2> /out/pwn-error; \
         echo done > /out/done",
    );
    run_ok(&agent, root.path(), "prober", &prober);
    wait_done(&agent, "prober", "complete");
    assert_eq!(read(&results.join("done")).trim(), "done");
    assert!(
        !read(&results.join("escape")).contains("top-secret"),
        "{}",
        read(&results.join("escape"))
    );
    assert!(
        read(&results.join("shadow")).contains("No such file"),
        "{}",
        read(&results.join("shadow"))
    );
    // `/` through the link is the task's own root: its mount points, not the host's.
    let root_ls = read(&results.join("root-ls"));
    assert!(
        root_ls.contains("local") && !root_ls.contains("root\n"),
        "{root_ls}"
    );
    assert!(!secret.join("pwned").exists());

    // A task mounting the nested volume whose directory a task replaced with a link:
    // refused (the link is not followed), the secret not mounted.
    let nested = batch_job(
        "nested",
        "[group.volume.data]\ntype = \"host\"\nsource = \"inner\"\n\
         [group.volume.out]\ntype = \"host\"\nsource = \"results\"\n",
        "[[group.task.volume_mount]]\nvolume = \"data\"\ndestination = \"/data\"\n\
         [[group.task.volume_mount]]\nvolume = \"out\"\ndestination = \"/out\"\n",
        "cat /data/marker > /out/nested 2>&1",
    );
    run_ok(&agent, root.path(), "nested", &nested);
    let status = wait_done(&agent, "nested", "failed");
    let text = status.to_string();
    assert!(text.contains("without following links"), "{status:#}");
    assert!(
        !results.join("nested").exists() || !read(&results.join("nested")).contains("top-secret")
    );
}

/// A mount point a sibling task replaced with a link (in the shared `alloc/`) is not
/// followed: the task fails to start, saying why. raw_exec, which has no filesystem
/// isolation, refuses volume mounts.
#[test]
fn a_linked_mount_point_is_refused_and_raw_exec_refuses_volumes() {
    let root = tempfile::tempdir().unwrap();
    let shared = dir(root.path(), "shared");
    let (agent, _) = volume_agent_with(
        root.path(),
        &[("shared", &shared, false)],
        "",
        &["exec", "raw_exec"],
    );
    let job = r#"
name = "sibling"
type = "batch"

[[group]]
name = "g"

[group.volume.data]
type = "host"
source = "shared"

[[group.task]]
name = "plant"
driver = "exec"
lifecycle = { hook = "prestart", sidecar = false }
config = { command = "/bin/sh", args = ["-c", "ln -s /etc /alloc/data/vol"] }
resources = { cpu = 100, memory_mb = 64 }

[[group.task]]
name = "main"
driver = "exec"
config = { command = "/bin/sh", args = ["-c", "echo x > /alloc/data/vol/planted"] }
resources = { cpu = 100, memory_mb = 64 }

[[group.task.volume_mount]]
volume = "data"
destination = "/alloc/data/vol"
"#;
    run_ok(&agent, root.path(), "sibling", job);
    let status = wait_done(&agent, "sibling", "failed");
    assert!(
        status.to_string().contains("without following links"),
        "{status:#}"
    );
    assert!(!shared.join("planted").exists());

    let raw = batch_job(
        "raw",
        "[group.volume.data]\ntype = \"host\"\nsource = \"shared\"\n",
        "[[group.task.volume_mount]]\nvolume = \"data\"\ndestination = \"/data\"\n",
        "true",
    )
    .replace("driver = \"exec\"", "driver = \"raw_exec\"");
    run_ok(&agent, root.path(), "raw", &raw);
    let status = wait_done(&agent, "raw", "failed");
    assert!(
        status
            .to_string()
            .contains("has no filesystem isolation, so it cannot mount volumes"),
        "{status:#}"
    );
}

/// Acceptance 3 with docker: the task sees the volume at its destination, writes to
/// it, a read-only mount of it refuses writes, and a link inside it resolves in the
/// container, not on the host.
#[test]
fn a_docker_task_mounts_a_host_volume() {
    let Some(env) = drover_test_support::docker::docker_env() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let shared = dir(root.path(), "shared");
    let results = dir(root.path(), "results");
    let secret = root.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("marker"), "top-secret\n").unwrap();
    std::fs::write(shared.join("note"), "from the host\n").unwrap();
    std::os::unix::fs::symlink(&secret, shared.join("escape")).unwrap();
    // Writable volumes of docker tasks must be nosuid,nodev where the host sees them.
    let _safe = [
        common::NosuidNodev::mount(&shared),
        common::NosuidNodev::mount(&results),
    ];
    let (agent, _) = volume_agent_with(
        root.path(),
        &[("shared", &shared, false), ("results", &results, false)],
        &format!(
            "[plugin.docker]\nconfig = {{ endpoint = \"{}\" }}\n",
            env.host
        ),
        &["docker"],
    );
    let job = format!(
        r#"
name = "boxed"
type = "batch"

[[group]]
name = "g"

[group.volume.data]
type = "host"
source = "shared"

[group.volume.out]
type = "host"
source = "results"

[[group.task]]
name = "t"
driver = "docker"
config = {{ image = "{image}", command = "/bin/sh", args = ["-c", 'cat /data/note > /out/read; echo from-docker > /data/docker-note; if echo x 2> /out/ro-error > /ro/x; then echo wrote > /out/ro; else echo refused > /out/ro; fi; cat /data/escape/marker > /out/escape 2>&1; grep " /data " /proc/mounts > /out/mounts; echo done > /out/done'] }}
resources = {{ cpu = 100, memory_mb = 64 }}

[[group.task.volume_mount]]
volume = "data"
destination = "/data"

[[group.task.volume_mount]]
volume = "data"
destination = "/ro"
read_only = true

[[group.task.volume_mount]]
volume = "out"
destination = "/out"
"#,
        image = env.image
    );
    run_ok(&agent, root.path(), "boxed", &job);
    wait_done(&agent, "boxed", "complete");
    assert_eq!(read(&results.join("done")).trim(), "done");
    assert_eq!(read(&results.join("read")).trim(), "from the host");
    assert_eq!(read(&shared.join("docker-note")).trim(), "from-docker");
    assert_eq!(read(&results.join("ro")).trim(), "refused");
    assert!(
        read(&results.join("ro-error")).contains("Read-only file system"),
        "{}",
        read(&results.join("ro-error"))
    );
    assert!(!shared.join("x").exists());
    assert!(
        !read(&results.join("escape")).contains("top-secret"),
        "{}",
        read(&results.join("escape"))
    );
    // Bound from the plugin's nosuid,nodev staging mount: a root container cannot
    // leave a setuid file or a device node there for the host's users.
    let mounts = read(&results.join("mounts"));
    let opts = mounts.split(' ').nth(3).unwrap_or_default();
    assert!(
        opts.split(',').any(|o| o == "nosuid") && opts.split(',').any(|o| o == "nodev"),
        "{mounts}"
    );
}

/// A config offering a link, or a path that is no directory, stops the agent at
/// start with an error naming the volume.
#[test]
fn an_agent_refuses_a_host_volume_that_is_a_link() {
    let root = tempfile::tempdir().unwrap();
    let real = dir(root.path(), "real");
    std::fs::create_dir_all(root.path().join("plugins")).unwrap();
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    for (path, why) in [
        (link.clone(), "symbolic link"),
        (root.path().join("missing"), "must exist"),
    ] {
        let config = root.path().join("bad.toml");
        std::fs::write(
            &config,
            format!("[host_volume.data]\npath = \"{}\"\n", path.display()),
        )
        .unwrap();
        let out = std::process::Command::new(common::drover())
            .args([
                "agent",
                "--dev",
                "--dev-http-addr",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(root.path().join("data"))
            .arg("--plugin-dir")
            .arg(root.path().join("plugins"))
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("[host_volume.data]") && err.contains(why),
            "{err}"
        );
    }
}
