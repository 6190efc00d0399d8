//! The docker driver as the host sees it: the real plugin binary, driven through the
//! SDK client, against a real dockerd. Every wait is on a real condition with a bound.

mod common;

use std::time::{Duration, Instant};

use common::*;
use drover_plugin_sdk::{DriverError, Health, Signal, TaskHandle, TaskState};
use serde_json::json;
use tokio_stream::StreamExt as _;

fn sh(env: &DockerEnv, script: &str) -> serde_json::Value {
    json!({ "image": env.image, "command": "sh", "args": ["-c", script] })
}

fn container_id(h: &TaskHandle) -> String {
    let v: serde_json::Value = serde_json::from_slice(&h.driver_state).unwrap();
    v["container_id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn container_output_goes_to_the_logs_and_its_exit_code_to_wait() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    let c = &p.client;

    let spec = s.spec("echo", sh(&env, "echo out; echo err >&2; exit 3"));
    let handle = within(PROMPT, "start", c.start_task(spec)).await.unwrap();
    let cid = container_id(&handle);
    let labels = &env.inspect(&cid).unwrap()["Config"]["Labels"];
    assert_eq!(labels["drover.task_id"], "echo");
    assert_eq!(labels["drover.task_name"], "test-echo");

    let result = within(PROMPT, "wait", c.wait_task("echo")).await.unwrap();
    assert_eq!(result.exit_code, 3, "{result:?}");
    assert!(!result.oom_killed);
    // Reported dead means the output is in the files.
    assert_eq!(s.log("echo", "stdout"), "out\n");
    assert_eq!(s.log("echo", "stderr"), "err\n");
    let status = c.inspect_task("echo").await.unwrap();
    assert_eq!(status.state, TaskState::Exited);
    assert_eq!(status.attributes["container_id"], cid);
    assert_eq!(status.exit_result.unwrap().exit_code, 3);

    // The same id cannot be started twice while the task exists.
    let again = c
        .start_task(s.spec("echo", sh(&env, "exit 0")))
        .await
        .unwrap_err();
    assert!(matches!(again, DriverError::AlreadyExists(_)), "{again:?}");

    c.destroy_task("echo", false).await.unwrap();
    assert!(env.inspect(&cid).is_none(), "container still exists");
    assert!(matches!(
        c.inspect_task("echo").await,
        Err(DriverError::NotFound(_))
    ));
}

#[tokio::test]
async fn signals_reach_the_container_and_stop_escalates_to_kill() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    let c = &p.client;

    // A shell as PID 1 gets only the signals it traps.
    let trapping = "trap 'echo got HUP' HUP; trap 'echo bye; exit 0' TERM; \
                    echo ready; while :; do sleep 0.1; done";
    c.start_task(s.spec("trap", sh(&env, trapping)))
        .await
        .unwrap();
    until(PROMPT, "ready", || {
        s.log("trap", "stdout").contains("ready")
    })
    .await;
    c.signal_task("trap", Signal::HUP).await.unwrap();
    until(PROMPT, "HUP handled", || {
        s.log("trap", "stdout").contains("got HUP")
    })
    .await;
    let t = Instant::now();
    c.stop_task("trap", Duration::from_secs(20), Signal::TERM)
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    let r = c.wait_task("trap").await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    assert!(s.log("trap", "stdout").ends_with("bye\n"));
    assert!(matches!(
        c.signal_task("trap", Signal::HUP).await,
        Err(DriverError::FailedPrecondition(_))
    ));

    // One that ignores SIGTERM (PID 1 without a handler) is killed after the timeout.
    c.start_task(s.spec("stubborn", sh(&env, "while :; do sleep 0.1; done")))
        .await
        .unwrap();
    let t = Instant::now();
    c.stop_task("stubborn", Duration::from_secs(1), Signal::default())
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "stop took {took:?}"
    );
    assert_eq!(c.wait_task("stubborn").await.unwrap().exit_code, 137);
    // A running task is not destroyed without force; with force it is.
    c.start_task(s.spec("forced", sh(&env, "sleep 1000")))
        .await
        .unwrap();
    assert!(matches!(
        c.destroy_task("forced", false).await,
        Err(DriverError::FailedPrecondition(_))
    ));
    c.destroy_task("forced", true).await.unwrap();
    assert!(matches!(
        c.wait_task("forced").await,
        Err(DriverError::NotFound(_))
    ));
}

#[tokio::test]
async fn refusals_are_clear_and_quick() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({ "pull_timeout": "20s" })).await;
    let c = &p.client;

    let mut cfg = sh(&env, "true");
    cfg["privileged"] = json!(true);
    let e = c.start_task(s.spec("priv", cfg)).await.unwrap_err();
    assert!(
        matches!(&e, DriverError::InvalidConfig(m) if m.contains("privileged") && m.contains("allow_privileged")),
        "{e:?}"
    );
    let mut cfg = sh(&env, "true");
    cfg["volumes"] = json!(["/etc:/host-etc"]);
    let e = c.start_task(s.spec("vol", cfg)).await.unwrap_err();
    assert!(
        matches!(&e, DriverError::InvalidConfig(m) if m.contains("volumes.enabled")),
        "{e:?}"
    );
    // Host-level modes without their opt-in in the plugin config.
    for (field, value, setting) in [
        ("network_mode", "host", "allow_host_namespaces"),
        ("pid_mode", "host", "allow_host_namespaces"),
        ("ipc_mode", "container:any", "allow_container_namespaces"),
    ] {
        let mut cfg = sh(&env, "true");
        cfg[field] = json!(value);
        let e = c.start_task(s.spec("hostmode", cfg)).await.unwrap_err();
        assert!(
            matches!(&e, DriverError::InvalidConfig(m) if m.contains(field) && m.contains(setting)),
            "{e:?}"
        );
    }
    // An image that is not there, from a registry that cannot be reached.
    let t = Instant::now();
    let e = c
        .start_task(s.spec(
            "missing",
            json!({ "image": "127.0.0.1:9/drover/nosuch:1", "command": "true" }),
        ))
        .await
        .unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("127.0.0.1:9/drover/nosuch:1") && m.contains("pulling it failed"),
        "{m}"
    );
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    // A command that does not exist in the image: nothing is left behind.
    let e = c
        .start_task(s.spec(
            "nocmd",
            json!({ "image": env.image, "command": "/no/such/binary" }),
        ))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("/no/such/binary"), "{e}");
    for id in ["priv", "vol", "hostmode", "missing", "nocmd"] {
        assert!(matches!(
            c.inspect_task(id).await,
            Err(DriverError::NotFound(_))
        ));
    }
    let left = env.cli_ok(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=drover.alloc_dir={}", s.alloc_dir().display()),
    ]);
    assert!(left.is_empty(), "containers left behind: {left}");
}

#[tokio::test]
async fn a_container_over_its_memory_limit_is_reported_oom_killed() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    let mut spec = s.spec("oom", sh(&env, "x=aaaaaaaa; while :; do x=$x$x; done"));
    spec.resources.memory_mb = 16;
    p.client.start_task(spec).await.unwrap();
    let r = within(Duration::from_secs(60), "wait", p.client.wait_task("oom"))
        .await
        .unwrap();
    assert!(r.oom_killed, "{r:?}");
    assert_eq!(r.exit_code, 137, "{r:?}");
}

/// The plugin's own OOM evidence (the container's memory cgroup) does not turn every
/// SIGKILL into an OOM kill: a memory-limited container killed by a signal, with
/// memory to spare, is reported killed, not OOM killed.
#[tokio::test]
async fn a_container_killed_under_its_memory_limit_is_not_reported_oom_killed() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    let mut spec = s.spec("killed", sh(&env, "echo up; while :; do sleep 0.1; done"));
    spec.resources.memory_mb = 64;
    p.client.start_task(spec).await.unwrap();
    until(PROMPT, "running", || {
        s.log("killed", "stdout").contains("up")
    })
    .await;
    p.client.signal_task("killed", Signal::KILL).await.unwrap();
    let r = within(PROMPT, "wait", p.client.wait_task("killed"))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 137, "{r:?}");
    assert!(!r.oom_killed, "{r:?}");
}

/// Kill -9 the plugin while a container writes numbered lines; the container keeps
/// running, the new plugin recovers it by its handle, the logs continue with every
/// line exactly once, and the exit code arrives. A second container exits while no
/// plugin runs; its exit code is still reported.
#[tokio::test]
async fn plugin_kill9_recovers_containers_with_logs_and_exit_codes() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    let counter = "i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo line $i; \
                   [ -e /local/go ] || sleep 0.05; done; exit 7";
    let h1 = p
        .client
        .start_task(s.spec("counter", sh(&env, counter)))
        .await
        .unwrap();
    let h2 = p
        .client
        .start_task(s.spec("short", sh(&env, "echo early; sleep 1; echo late; exit 5")))
        .await
        .unwrap();
    until(PROMPT, "first lines", || {
        s.log("counter", "stdout").contains("line 3\n")
    })
    .await;
    drop(p); // SIGKILL
    // Meanwhile the containers run on, and `short` ends.
    until(PROMPT, "short exits", || {
        env.inspect(&container_id(&h2))
            .is_some_and(|v| v["State"]["Running"] == false)
    })
    .await;
    let p = Plugin::launch(&s, json!({})).await;
    for h in [&h1, &h2] {
        p.client.recover_task(h.clone()).await.unwrap();
        // Idempotent.
        p.client.recover_task(h.clone()).await.unwrap();
    }
    let st = p.client.inspect_task("counter").await.unwrap();
    assert_eq!(st.attributes["container_id"], container_id(&h1));
    std::fs::write(s.dir.path().join("counter/local/go"), "").unwrap();
    let r = within(PROMPT, "wait counter", p.client.wait_task("counter"))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 7);
    let expected: String = (1..=60).map(|i| format!("line {i}\n")).collect();
    assert_eq!(s.log("counter", "stdout"), expected);
    let r = within(PROMPT, "wait short", p.client.wait_task("short"))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 5);
    assert_eq!(s.log("short", "stdout"), "early\nlate\n");
}

/// Without a handle (the agent died before it stored one), RecoverTask finds the
/// container by its task-id label; a task that only got as far as `create` counts as
/// never started.
#[tokio::test]
async fn recover_without_a_handle_finds_the_container_by_label() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    let spec = s.spec("probe", sh(&env, "echo hi; sleep 1000"));
    let h = p.client.start_task(spec.clone()).await.unwrap();
    drop(p);
    let p = Plugin::launch(&s, json!({})).await;
    let probe = TaskHandle::for_spec(spec.clone());
    p.client.recover_task(probe).await.unwrap();
    let st = p.client.inspect_task("probe").await.unwrap();
    assert_eq!(st.state, TaskState::Running);
    assert_eq!(st.attributes["container_id"], container_id(&h));

    let nobody = TaskHandle::for_spec(s.spec("nobody", sh(&env, "true")));
    assert!(matches!(
        p.client.recover_task(nobody).await,
        Err(DriverError::NotFound(_))
    ));

    // Created, never started: removed, NotFound, and a start then works.
    let created = s.spec("created", sh(&env, "echo started; exit 0"));
    let cid = env.cli_ok(&[
        "create",
        "--name",
        "test-created-created",
        "--label",
        "drover.task_id=created",
        "--label",
        &format!("drover.alloc_dir={}", s.alloc_dir().display()),
        &env.image,
        "true",
    ]);
    let probe = TaskHandle::for_spec(created.clone());
    assert!(matches!(
        p.client.recover_task(probe).await,
        Err(DriverError::NotFound(_))
    ));
    assert!(env.inspect(&cid).is_none(), "created container not removed");
    p.client.start_task(created).await.unwrap();
    assert_eq!(p.client.wait_task("created").await.unwrap().exit_code, 0);
    assert_eq!(s.log("created", "stdout"), "started\n");

    // The container of a handle that no longer exists is NotFound.
    env.cli_ok(&["rm", "-f", &container_id(&h)]);
    let p2 = Plugin::launch(&s, json!({})).await;
    assert!(matches!(
        p2.client.recover_task(h).await,
        Err(DriverError::NotFound(_))
    ));
}

#[tokio::test]
async fn stats_exec_env_ports_and_task_dirs() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    let c = &p.client;
    let mut spec = s.spec(
        "web",
        json!({
            "image": env.image,
            "command": "sh",
            "args": ["-c", "cat /local/motd; echo $GREETING $DROVER_TASK_ID; sleep 1000"],
            "env": { "GREETING": "hello" },
            "ports": { "80": 18080, "53/udp": "127.0.0.1:15353" },
            "labels": { "team": "web" },
            "init": true,
        }),
    );
    spec.env.insert("DROVER_TASK_ID".into(), "web".into());
    std::fs::write(spec.task_dir.join("local/motd"), "from the task dir\n").unwrap();
    let h = c.start_task(spec).await.unwrap();
    until(PROMPT, "output", || {
        s.log("web", "stdout") == "from the task dir\nhello web\n"
    })
    .await;
    let info = env.inspect(&container_id(&h)).unwrap();
    let ports = &info["HostConfig"]["PortBindings"];
    assert_eq!(ports["80/tcp"][0]["HostPort"], "18080", "{ports}");
    assert_eq!(ports["53/udp"][0]["HostIp"], "127.0.0.1", "{ports}");
    assert_eq!(ports["53/udp"][0]["HostPort"], "15353", "{ports}");
    assert_eq!(info["Config"]["Labels"]["team"], "web");
    assert_eq!(info["HostConfig"]["Init"], true);

    let out = c
        .exec_task(
            "web",
            vec![
                "sh".into(),
                "-c".into(),
                "echo $GREETING; echo oops >&2; exit 4".into(),
            ],
            PROMPT,
        )
        .await
        .unwrap();
    assert_eq!(out.stdout, b"hello\n");
    assert_eq!(out.stderr, b"oops\n");
    assert_eq!(out.result.exit_code, 4);

    let mut stats = Box::pin(
        c.task_stats("web", Duration::from_millis(200))
            .await
            .unwrap(),
    );
    let first = within(PROMPT, "stats", stats.next())
        .await
        .unwrap()
        .unwrap();
    assert!(first.memory_rss_bytes > 0, "{first:?}");
    let second = within(PROMPT, "stats", stats.next())
        .await
        .unwrap()
        .unwrap();
    assert!(second.cpu_user + second.cpu_system >= first.cpu_user + first.cpu_system);

    // init forwards SIGTERM to sleep: the stop is prompt.
    let t = Instant::now();
    c.stop_task("web", Duration::from_secs(20), Signal::TERM)
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_loaded_tarball_provides_the_image() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let tag = format!("drover-test/loaded:{}", unique("t"));
    env.cli_ok(&["tag", &env.image, &tag]);
    let spec = s.spec(
        "loaded",
        json!({ "image": tag, "command": "echo", "args": ["loaded"], "load": "local/image.tar" }),
    );
    let tar = spec.task_dir.join("local/image.tar");
    env.cli_ok(&["save", "-o", tar.to_str().unwrap(), &tag]);
    env.cli_ok(&["rmi", &tag]);
    let p = Plugin::launch(&s, json!({})).await;
    p.client.start_task(spec).await.unwrap();
    assert_eq!(p.client.wait_task("loaded").await.unwrap().exit_code, 0);
    assert_eq!(s.log("loaded", "stdout"), "loaded\n");
    assert!(env.inspect(&tag).is_some());
    let _ = env.cli(&["rmi", &tag]);

    // A tarball that does not provide the image says so.
    let spec = s.spec(
        "wrong",
        json!({ "image": "drover-test/not-in-it:1", "load": "local/image.tar" }),
    );
    std::fs::copy(&tar, spec.task_dir.join("local/image.tar")).unwrap();
    let e = p.client.start_task(spec).await.unwrap_err();
    assert!(e.to_string().contains("did not provide image"), "{e}");
    let _ = env.cli(&["rmi", &tag]);
}

#[tokio::test]
async fn image_gc_removes_the_image_once_no_task_uses_it() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    // Another tag of the test image: removing it only untags.
    let tag = format!("drover-test/gc:{}", unique("t"));
    env.cli_ok(&["tag", &env.image, &tag]);
    let p = Plugin::launch(&s, json!({ "gc": { "image": true, "image_delay": "0s" } })).await;
    let cfg = json!({ "image": tag, "command": "sleep", "args": ["1000"] });
    p.client
        .start_task(s.spec("gc1", cfg.clone()))
        .await
        .unwrap();
    p.client.start_task(s.spec("gc2", cfg)).await.unwrap();
    p.client.destroy_task("gc1", true).await.unwrap();
    // Still used by gc2: kept. The GC runs in the background, so look a few times.
    for _ in 0..10 {
        assert!(
            env.inspect(&tag).is_some(),
            "image removed while gc2 uses it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.client.destroy_task("gc2", true).await.unwrap();
    until(PROMPT, "image removed", || env.inspect(&tag).is_none()).await;
    assert!(env.inspect(&env.image).is_some(), "the other tag is kept");
}

#[tokio::test]
async fn dangling_containers_are_reported_and_removed() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(
        &s,
        json!({ "gc": { "dangling_containers": {
            "remove": true, "period": "200ms", "creation_grace": "1s" } } }),
    )
    .await;
    let mut events = Box::pin(p.client.task_events().await.unwrap());
    p.client
        .start_task(s.spec("owned", sh(&env, "sleep 1000")))
        .await
        .unwrap();
    let ghost = env.cli_ok(&[
        "run",
        "-d",
        "--label",
        "drover.task_id=ghost",
        "--label",
        &format!("drover.alloc_dir={}", s.alloc_dir().display()),
        &env.image,
        "sleep",
        "1000",
    ]);
    // Another agent's container is none of this plugin's business.
    let other = env.cli_ok(&[
        "run",
        "-d",
        "--label",
        &format!("{TEST_LABEL}={}", s.alloc_dir().display()),
        "--label",
        "drover.task_id=elsewhere",
        "--label",
        "drover.alloc_dir=/some/other/agent",
        &env.image,
        "sleep",
        "1000",
    ]);
    until(PROMPT, "ghost removed", || env.inspect(&ghost).is_none()).await;
    let event = within(PROMPT, "event", async {
        loop {
            let e = events.next().await.unwrap().unwrap();
            if e.message.contains("dangling") {
                return e;
            }
        }
    })
    .await;
    assert_eq!(event.task_id, "ghost");
    assert_eq!(event.annotations["container_id"], ghost);
    assert_eq!(
        p.client.inspect_task("owned").await.unwrap().state,
        TaskState::Running
    );
    assert!(
        env.inspect(&other).is_some(),
        "another agent's container removed"
    );
    env.cli_ok(&["rm", "-f", &other]);
}

#[tokio::test]
async fn fingerprint_names_the_engine_or_the_missing_daemon() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    let mut fp = Box::pin(p.client.fingerprint().await.unwrap());
    let first = within(PROMPT, "fingerprint", fp.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.health, Health::Healthy, "{first:?}");
    let server = env.cli_ok(&["version", "--format", "{{.Server.Version}}"]);
    assert_eq!(first.attributes["driver.docker.version"], server);
    assert_eq!(
        first.attributes["driver.docker.privileged.enabled"],
        "false"
    );

    let nowhere = s.dir.path().join("nowhere.sock");
    let p2 = Plugin::launch(
        &s,
        json!({ "endpoint": format!("unix://{}", nowhere.display()) }),
    )
    .await;
    let mut fp = Box::pin(p2.client.fingerprint().await.unwrap());
    let first = within(PROMPT, "fingerprint", fp.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.health, Health::Undetected, "{first:?}");
    assert!(first.description.contains("nowhere.sock"), "{first:?}");
    let e = p2
        .client
        .start_task(s.spec("x", sh(&env, "true")))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("nowhere.sock"), "{e}");
}

/// A container on the host network (allowed by the plugin config) serves on 127.0.0.1
/// (tests send traffic nowhere else); the file it serves comes from the task's
/// `local/` directory.
#[tokio::test]
async fn a_host_network_container_serves_on_localhost() {
    use std::io::{Read as _, Write as _};
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({ "allow_host_namespaces": ["network"] })).await;
    let port = drover_test_support::net::free_local_addr().port();
    let spec = s.spec(
        "httpd",
        json!({
            "image": env.image,
            "command": "httpd",
            "args": ["-f", "-p", format!("127.0.0.1:{port}"), "-h", "/local"],
            "network_mode": "host",
        }),
    );
    std::fs::write(
        spec.task_dir.join("local/index.html"),
        "served from the task dir\n",
    )
    .unwrap();
    p.client.start_task(spec).await.unwrap();
    let mut body = String::new();
    until(PROMPT, "httpd answers", || {
        let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = conn.write_all(b"GET /index.html HTTP/1.0\r\n\r\n");
        body.clear();
        conn.read_to_string(&mut body).is_ok() && body.contains("200")
    })
    .await;
    assert!(body.ends_with("served from the task dir\n"), "{body}");
    p.client
        .stop_task("httpd", Duration::from_secs(5), Signal::TERM)
        .await
        .unwrap();
}

/// A container that writes faster than the follower reads, across Docker's own log
/// file rotation (more than 10 MB of json-file): every line reaches the task's logs,
/// in order, by the time it is reported dead.
#[tokio::test]
async fn a_fast_writer_loses_no_lines() {
    let Some(env) = docker_env() else { return };
    let s = Scratch::new(&env);
    let p = Plugin::launch(&s, json!({})).await;
    const N: usize = 200_000;
    p.client
        .start_task(s.spec(
            "seq",
            json!({ "image": env.image, "command": "seq", "args": ["1", N.to_string()] }),
        ))
        .await
        .unwrap();
    let r = within(Duration::from_secs(120), "wait", p.client.wait_task("seq"))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0);
    let text = s.log("seq", "stdout");
    let mut count = 0;
    for (i, line) in text.lines().enumerate() {
        assert_eq!(
            line,
            (i + 1).to_string(),
            "line {} is out of sequence",
            i + 1
        );
        count += 1;
    }
    assert_eq!(count, N);
}
