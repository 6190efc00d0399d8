//! Device plugins (issue 27, acceptance 1): Nomad's example device plugin (1.0.18,
//! unmodified: it models the files of a directory as devices `nomad/file/mock`, a
//! file whose permission bits are `unhealthy_perm` being unhealthy) in a dev agent's
//! plugin_dir. Its instances reach the node's registration; a job asking for
//! `count = 2` is placed and its task sees the ids it got; a second one waits, with
//! the reason, until the first stops; an unhealthy instance is never given.

use crate::common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use common::Agent;
use common::cluster::{tail, wait_dev_node_ready, wait_job};
use drover_test_support::nomad::peers;

/// A dev agent with the example device plugin in its plugin_dir, pointed at `devices`.
fn agent_with_devices(root: &Path, plugin: &Path, devices: &Path) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(plugin, plugins.join("nomad-device-example-v1.0.18")).unwrap();
    let config = root.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[plugin.example-fs-device]\nconfig = {{ dir = {:?}, list_period = \"1s\" }}\n",
            devices.display().to_string()
        ),
    )
    .unwrap();
    let mut agent = Agent::start(
        root,
        &plugins,
        &["--dev", "--config", config.to_str().unwrap()],
    );
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, &["raw_exec"], Duration::from_secs(30));
    agent
}

/// The node's `nomad/file/mock` instances as (id, healthy), once `done` holds.
fn wait_instances(
    agent: &Agent,
    what: &str,
    done: impl Fn(&[(String, bool)]) -> bool,
) -> Vec<(String, bool)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        // `node status NODE --json`: the node as the server keeps it.
        let list = agent.cli_json(&["node", "status", "--json"]);
        let id = list[0]["id"].as_str().unwrap_or_default().to_owned();
        let node = agent.cli_json(&["node", "status", &id, "--json"]);
        let got: Vec<(String, bool)> = node["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| g["vendor"] == "nomad" && g["type"] == "file" && g["name"] == "mock")
            .flat_map(|g| g["instances"].as_array().cloned().unwrap_or_default())
            .map(|i| {
                (
                    i["id"].as_str().unwrap_or_default().to_owned(),
                    i["healthy"] == true,
                )
            })
            .collect();
        if done(&got) {
            return got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 30s; last node status:\n{node:#}\nagent log:\n{}",
            tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A job of one raw_exec task asking for `count` instances of `nomad/file/mock`; the
/// task writes the ids it was told into `out/<job>` and stays up.
fn job(root: &Path, name: &str, count: u32) -> std::path::PathBuf {
    let out = root.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let path = root.join(format!("{name}.nomad.hcl"));
    std::fs::write(
        &path,
        format!(
            r#"
job "{name}" {{
  datacenters = ["dc1"]
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "echo \"$DROVER_DEVICE_NOMAD_FILE_MOCK\" > {out}/{name}.tmp && mv {out}/{name}.tmp {out}/{name}; exec sleep 600"]
      }}
      resources {{
        cpu    = 50
        memory = 32
        device "nomad/file/mock" {{
          count = {count}
        }}
      }}
    }}
  }}
}}
"#,
            out = out.display()
        ),
    )
    .unwrap();
    path
}

fn run_job(agent: &Agent, path: &Path) {
    let out = agent.cli(&["job", "run", "--detach", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "job run {}: {}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The ids the task of `job` wrote, once it has.
fn ids_seen(agent: &Agent, root: &Path, job: &str) -> Vec<String> {
    let file = root.join("out").join(job);
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        &format!("the task of {job} writing its device ids"),
        || file.exists(),
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let mut ids: Vec<String> = text
        .trim()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    ids.sort();
    assert!(
        !ids.is_empty(),
        "the task of {job} saw no device ids ({text:?})\nagent log:\n{}",
        tail(&agent.log_text())
    );
    ids
}

/// The device ids the API says `job`'s running allocation was given.
fn ids_given(agent: &Agent, job: &str) -> Vec<String> {
    let v = wait_job(agent, job, &format!("{job} running"), |v| {
        v["allocations"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["client_status"] == "running"))
    });
    let alloc = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["client_status"] == "running")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let a = agent.cli_json(&["alloc", "status", &alloc, "--json"]);
    let mut ids: Vec<String> = a["task_devices"]["t"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["device_ids"].as_array().cloned().unwrap_or_default())
        .filter_map(|i| i.as_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

#[test]
fn nomads_example_device_plugin_fingerprints_places_reserves_and_blocks() {
    let Some(p) = peers() else { return };
    let root = tempfile::tempdir().unwrap();
    let devices = root.path().join("devices");
    std::fs::create_dir(&devices).unwrap();
    for f in ["dev-a", "dev-b", "dev-c"] {
        std::fs::write(devices.join(f), f).unwrap();
        std::fs::set_permissions(devices.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let agent = agent_with_devices(root.path(), &p.device_example(), &devices);

    // The plugin is listed as a device plugin, and its 3 instances reach the node.
    let rows = agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == "example-fs-device" && r["state"] == "healthy")
    });
    let row = rows
        .iter()
        .find(|r| r["name"] == "example-fs-device")
        .unwrap();
    assert_eq!(row["type"], "device", "{row:#}");
    assert_eq!(row["protocol"], "nomad", "{row:#}");
    let all = wait_instances(&agent, "3 healthy instances", |i| {
        i.len() == 3 && i.iter().all(|(_, h)| *h)
    });
    let mut names: Vec<&str> = all.iter().map(|(id, _)| id.as_str()).collect();
    names.sort();
    assert_eq!(names, ["dev-a", "dev-b", "dev-c"]);
    let list = agent.cli_json(&["node", "status", "--json"]);
    let node_id = list[0]["id"].as_str().unwrap().to_owned();
    let out = agent.cli(&["node", "status", &node_id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("nomad/file/mock  3/3 healthy  dev-a, dev-b, dev-c"),
        "{text}"
    );

    // count = 2: placed, and the task sees the 2 ids it was given.
    run_job(&agent, &job(root.path(), "first", 2));
    let given = ids_given(&agent, "first");
    assert_eq!(given.len(), 2, "{given:?}");
    assert_eq!(ids_seen(&agent, root.path(), "first"), given);

    // A second job asking for 2: blocked, with the reason, while the first runs.
    run_job(&agent, &job(root.path(), "second", 2));
    wait_job(&agent, "second", "second blocked with the reason", |v| {
        v["placement_failures"]["g"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("device nomad/file/mock: 1 of 2 instances free"))
    });
    // ... and placed once the first stops, on instances it may now have.
    let out = agent.cli(&["job", "stop", "first"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = ids_given(&agent, "second");
    assert_eq!(second.len(), 2, "{second:?}");
    assert_eq!(ids_seen(&agent, root.path(), "second"), second);

    // An instance made unhealthy (the plugin's unhealthy_perm, -rwxrwxrwx by
    // default) shows so, and is not given: with one of the two free instances gone, a
    // job asking for 2 more is blocked, and one asking for 1 gets the healthy free one.
    let free: Vec<String> = names
        .iter()
        .map(|s| (*s).to_owned())
        .filter(|n| !second.contains(n))
        .collect();
    assert_eq!(free.len(), 1, "{free:?} {second:?}");
    let sick = &second[0];
    std::fs::set_permissions(devices.join(sick), std::fs::Permissions::from_mode(0o777)).unwrap();
    wait_instances(&agent, "the chmod-ed instance unhealthy", |i| {
        i.iter().any(|(id, h)| id == sick && !*h) && i.iter().filter(|(_, h)| *h).count() == 2
    });
    let out = agent.cli(&["node", "status", &node_id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("{sick} (unhealthy: Device has bad permissions")),
        "{text}"
    );
    let out = agent.cli(&["job", "stop", "second"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    run_job(&agent, &job(root.path(), "third", 3));
    wait_job(
        &agent,
        "third",
        "third blocked: only 2 healthy instances",
        |v| {
            v["placement_failures"]["g"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("device nomad/file/mock: 2 of 3 instances free"))
        },
    );
    run_job(&agent, &job(root.path(), "fourth", 2));
    let fourth = ids_given(&agent, "fourth");
    assert!(
        !fourth.contains(sick),
        "{fourth:?} has the unhealthy {sick}"
    );
    assert_eq!(ids_seen(&agent, root.path(), "fourth"), fourth);
}
