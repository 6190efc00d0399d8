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
    crate::common::copy_exec(plugin, plugins.join("nomad-device-example-v1.0.18"));
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
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the task of {job} did not write its device ids within 30s\nagent log:\n{}",
            tail(&agent.log_text())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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

/// The running allocation of `job`: its id and its task `t`'s state.
fn running_task(agent: &Agent, job: &str) -> (String, serde_json::Value) {
    let v = wait_job(agent, job, &format!("{job} running"), |v| {
        v["allocations"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["client_status"] == "running"))
    });
    let id = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["client_status"] == "running")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let a = agent.cli_json(&["alloc", "status", &id, "--json"]);
    (id, a["task_states"]["t"].clone())
}

/// Acceptance 5: `kill -9` of the agent (its embedded server too) while a docker task
/// holds 2 device instances (the example plugin's reservation mounts are bound into
/// the container) and has a host volume mounted (staged by the docker plugin). After the restart the task
/// was not restarted (same task, same start, no restart counted: the device hook,
/// which reserves, runs only when a task starts), it still writes through its volume
/// mount, the allocation keeps its instances, and nothing is given twice: a job asking for 2 more waits ("1 of 2 instances free"), one asking for 1
/// gets the one instance the first does not hold.
#[test]
fn kill_9_of_the_agent_keeps_reserved_devices_and_mounted_volumes_and_restarts_nothing() {
    let Some(p) = peers() else { return };
    let Some(docker) = drover_test_support::docker::docker_env() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let devices = root.path().join("devices");
    std::fs::create_dir(&devices).unwrap();
    for f in ["dev-a", "dev-b", "dev-c"] {
        std::fs::write(devices.join(f), f).unwrap();
        std::fs::set_permissions(devices.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let keep = root.path().join("keep");
    std::fs::create_dir(&keep).unwrap();
    let _safe = common::NosuidNodev::mount(&keep);
    let plugins = root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    crate::common::copy_exec(
        p.device_example(),
        plugins.join("nomad-device-example-v1.0.18"),
    );
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[plugin.example-fs-device]\nconfig = {{ dir = {:?}, list_period = \"1s\" }}\n\
             [plugin.docker]\nconfig = {{ endpoint = {:?} }}\n\
             [host_volume.keep]\npath = {:?}\n",
            devices.display().to_string(),
            docker.host,
            keep.display().to_string()
        ),
    )
    .unwrap();
    let args = ["--dev", "--config", config.to_str().unwrap()];
    let mut first = Agent::start(root.path(), &plugins, &args);
    wait_dev_node_ready(&first, &["docker"], Duration::from_secs(30));
    wait_instances(&first, "3 healthy instances", |i| {
        i.len() == 3 && i.iter().all(|(_, h)| *h)
    });

    let holder = root.path().join("holder.nomad.hcl");
    std::fs::write(
        &holder,
        r#"
job "holder" {
  datacenters = ["dc1"]
  group "g" {
    volume "data" {
      type   = "host"
      source = "keep"
    }
    task "t" {
      driver = "docker"
      config {
        image   = "IMAGE"
        command = "/bin/sh"
        args    = ["-c", "cat /tmp/task-mounts/* > /data/mounted; echo \"$DROVER_DEVICE_NOMAD_FILE_MOCK\" > /data/ids.tmp && mv /data/ids.tmp /data/ids; n=0; while true; do n=$((n+1)); echo $n > /data/tick.tmp; mv /data/tick.tmp /data/tick; sleep 0.1; done"]
      }
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
      resources {
        cpu    = 50
        memory = 32
        device "nomad/file/mock" {
          count = 2
        }
      }
    }
  }
}
"#
        .replace("IMAGE", &docker.image),
    )
    .unwrap();
    run_job(&first, &holder);
    let held = ids_given(&first, "holder");
    assert_eq!(held.len(), 2, "{held:?}");
    drover_test_support::until_blocking(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the holder's task writing its ids into its volume",
        || keep.join("ids").exists(),
    );
    let mut seen: Vec<String> = std::fs::read_to_string(keep.join("ids"))
        .unwrap()
        .trim()
        .split(',')
        .map(str::to_owned)
        .collect();
    seen.sort();
    assert_eq!(seen, held);
    // The plugin's reservation mounts (its files, one per instance) are in the
    // container: their contents are the instances' names.
    let mounted = std::fs::read_to_string(keep.join("mounted")).unwrap_or_default();
    assert_eq!(mounted, held.concat(), "the reserved instances' mounts");
    let (alloc, before) = running_task(&first, "holder");

    // kill -9: no shutdown of any kind. The task keeps running and writing.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let tick = |what: &str| -> u64 {
        std::fs::read_to_string(keep.join("tick"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("{what}: no tick in the volume"))
    };
    let at_kill = tick("after the kill");
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(50),
        "the task ticking while its agent is dead",
        || tick("while the agent is dead") > at_kill,
    );

    let mut second = Agent::start(root.path(), &plugins, &args);
    second.end_tasks = true;
    wait_dev_node_ready(&second, &["docker"], Duration::from_secs(60));
    wait_instances(&second, "3 instances after the restart", |i| i.len() == 3);
    let (alloc_after, after) = running_task(&second, "holder");
    assert_eq!(alloc_after, alloc, "the same allocation runs");
    for field in ["task_id", "started_at", "starts", "restarts"] {
        assert_eq!(
            after[field], before[field],
            "{field}: {before:#} then {after:#}"
        );
    }
    assert_eq!(after["restarts"], 0, "{after:#}");
    assert_eq!(ids_given(&second, "holder"), held, "the holder's devices");
    let at_restart = tick("after the restart");
    drover_test_support::until_blocking(
        Duration::from_secs(10),
        Duration::from_millis(50),
        "the recovered task still writing through its volume mount",
        || tick("after the restart") > at_restart,
    );

    // Nothing given twice: one instance is free, and only that one.
    run_job(&second, &job(root.path(), "two-more", 2));
    wait_job(
        &second,
        "two-more",
        "two-more blocked with the reason",
        |v| {
            v["placement_failures"]["g"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("device nomad/file/mock: 1 of 2 instances free"))
        },
    );
    run_job(&second, &job(root.path(), "one-more", 1));
    let one = ids_given(&second, "one-more");
    assert_eq!(one.len(), 1, "{one:?}");
    assert!(
        !held.contains(&one[0]),
        "{one:?} is held by the holder {held:?}"
    );
    assert_eq!(ids_seen(&second, root.path(), "one-more"), one);
    drop(second);
    drop(first);
}
