//! The java driver through its real binary: a jar built here with `javac` and `jar`
//! runs in an isolated task with `jvm_options` and `args`; its stdout is in the task's
//! logs and its exit code is reported; a bad `jar_path` is refused before anything
//! starts; the fingerprint names the JVM.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use drover_plugin_sdk::client::{LaunchOptions, PluginClient, PluginProcess};
use drover_plugin_sdk::logs::log_files;
use drover_plugin_sdk::{AgentInfo, DriverError, Health, TaskSpec};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_drover-driver-java");
const PROMPT: Duration = Duration::from_secs(30);

const HELLO: &str = r#"
public class Hello {
    public static void main(String[] args) throws Exception {
        System.out.println("hello " + String.join(",", args) + " greeting=" + System.getProperty("greeting"));
        System.out.println("user=" + System.getProperty("user.name") + " pid=" + ProcessHandle.current().pid());
        System.out.flush();
        System.exit(Integer.parseInt(args[0]));
    }
}
"#;

/// Root, `javac` and `jar`: without them the test skips loudly, except under
/// `CI=true`, where it fails.
fn prerequisites() -> bool {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let mut missing = Vec::new();
    if !rustix::process::geteuid().is_root() {
        missing.push("root");
    }
    for tool in ["javac", "jar", "java"] {
        if Command::new(tool).arg("-version").output().is_err() {
            missing.push(tool);
        }
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        !ci,
        "the java tests need {missing:?}, and CI=true forbids skipping"
    );
    eprintln!("SKIPPED: the java tests need {missing:?}");
    false
}

/// `Hello.class` in `<dir>/classes` and `<dir>/app.jar`.
fn build_jar(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("Hello.java"), HELLO).unwrap();
    let classes = dir.join("classes");
    let javac = Command::new("javac")
        .arg("-d")
        .arg(&classes)
        .arg(dir.join("Hello.java"))
        .output()
        .unwrap();
    assert!(
        javac.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&javac.stderr)
    );
    let jar = dir.join("app.jar");
    let out = Command::new("jar")
        .args(["--create", "--file"])
        .arg(&jar)
        .args(["--main-class", "Hello", "-C"])
        .arg(&classes)
        .arg(".")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "jar: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    jar
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

struct Java {
    process: PluginProcess,
    client: PluginClient,
    dir: PathBuf,
    parent: String,
}

impl Java {
    async fn launch(dir: &Path) -> Java {
        let process = tokio::time::timeout(
            PROMPT,
            PluginProcess::launch(LaunchOptions::new("java", BIN)),
        )
        .await
        .unwrap()
        .unwrap();
        let client = process.client();
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let parent = format!("drover-java-test-{}-{n}", std::process::id());
        let agent = AgentInfo::new(drover_plugin_sdk::version::PLUGIN_API_VERSION)
            .with_alloc_dir(dir)
            .with_plugin_state_dir(dir.join("plugin-state"));
        client
            .set_config(
                json!({ "cgroup_parent": format!("/{parent}") }).to_string(),
                &agent,
            )
            .await
            .unwrap();
        Java {
            process,
            client,
            dir: dir.to_owned(),
            parent,
        }
    }

    fn spec(&self, id: &str, config: Value) -> TaskSpec {
        let task_dir = self.dir.join(id);
        for sub in ["local", "secrets", "tmp", "logs"] {
            std::fs::create_dir_all(task_dir.join(sub)).unwrap();
        }
        TaskSpec::new(id)
            .with_stdout_path(task_dir.join("logs/stdout"))
            .with_stderr_path(task_dir.join("logs/stderr"))
            .with_driver_config_json(config.to_string())
            .with_task_dir(task_dir.clone())
    }

    fn log(&self, id: &str, stream: &str) -> String {
        log_files(&self.dir.join(id).join("logs").join(stream))
            .unwrap_or_default()
            .into_iter()
            .map(|(_, p)| std::fs::read_to_string(p).unwrap_or_default())
            .collect()
    }
}

impl Drop for Java {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.process.pid() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        // Whatever a failed test left in its cgroups.
        for c in ["memory", "cpu", "cpuacct", "pids", "freezer"] {
            let root = Path::new("/sys/fs/cgroup").join(c).join(&self.parent);
            if let Ok(rd) = std::fs::read_dir(&root) {
                for d in rd
                    .filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                {
                    for pid in std::fs::read_to_string(d.join("cgroup.procs"))
                        .unwrap_or_default()
                        .lines()
                    {
                        if let Ok(pid) = pid.parse::<i32>() {
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(pid),
                                nix::sys::signal::Signal::SIGKILL,
                            );
                        }
                    }
                    let _ = std::fs::remove_dir(&d);
                }
            }
            let _ = std::fs::remove_dir(&root);
        }
    }
}

#[tokio::test]
async fn a_jar_runs_isolated_with_options_and_args_and_reports_its_exit_code() {
    if !prerequisites() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let build = dir.path().join("build");
    std::fs::create_dir(&build).unwrap();
    let jar = build_jar(&build);
    let j = Java::launch(dir.path()).await;

    let spec = j.spec(
        "jar",
        json!({
            "jar_path": "local/app.jar",
            "jvm_options": ["-Dgreeting=hi", "-Xmx64m"],
            "args": ["3", "x"],
        }),
    );
    std::fs::copy(&jar, spec.task_dir.join("local/app.jar")).unwrap();
    tokio::time::timeout(PROMPT, j.client.start_task(spec))
        .await
        .unwrap()
        .unwrap();
    let exit = tokio::time::timeout(PROMPT, j.client.wait_task("jar"))
        .await
        .unwrap()
        .unwrap();
    let out = j.log("jar", "stdout");
    assert_eq!(
        exit.exit_code,
        3,
        "{exit:?}\nstdout:\n{out}\nstderr:\n{}",
        j.log("jar", "stderr")
    );
    assert!(out.contains("hello 3,x greeting=hi"), "{out}");
    // Contained like an exec task: the default user, a small pid.
    assert!(out.contains("user=nobody pid=2"), "{out}");

    // A main class from a class path, exit code 0.
    let spec = j.spec(
        "class",
        json!({ "class": "Hello", "class_path": "local/classes", "args": ["0", "y"] }),
    );
    copy_dir(&build.join("classes"), &spec.task_dir.join("local/classes"));
    tokio::time::timeout(PROMPT, j.client.start_task(spec))
        .await
        .unwrap()
        .unwrap();
    let exit = tokio::time::timeout(PROMPT, j.client.wait_task("class"))
        .await
        .unwrap()
        .unwrap();
    assert!(exit.successful(), "{exit:?}: {}", j.log("class", "stderr"));
    assert!(j.log("class", "stdout").contains("hello 0,y greeting=null"));
    for id in ["jar", "class"] {
        j.client.destroy_task(id, false).await.unwrap();
    }
}

#[tokio::test]
async fn a_bad_jar_path_is_refused_before_anything_starts() {
    if !prerequisites() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let j = Java::launch(dir.path()).await;
    for (jar, says) in [
        ("local/missing.jar", "local/missing.jar"),
        ("/opt/elsewhere.jar", "not inside the task's root"),
        ("local", "not a file"),
    ] {
        let spec = j.spec("bad", json!({ "jar_path": jar }));
        let err = j.client.start_task(spec).await.unwrap_err();
        assert!(
            matches!(err, DriverError::InvalidConfig(_)),
            "{jar}: {err:?}"
        );
        assert!(err.to_string().contains(says), "{jar}: {err}");
    }
    for c in ["memory", "pids"] {
        let cg = Path::new("/sys/fs/cgroup")
            .join(c)
            .join(&j.parent)
            .join("bad");
        assert!(!cg.exists(), "{} was created", cg.display());
    }
    assert!(
        !dir.path().join("bad/logs/stdout.0").exists(),
        "something ran"
    );
}

#[tokio::test]
async fn the_fingerprint_names_the_jvm() {
    if !prerequisites() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let j = Java::launch(dir.path()).await;
    let mut stream = j.client.fingerprint().await.unwrap();
    let fp = tokio::time::timeout(PROMPT, tokio_stream::StreamExt::next(&mut stream))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(fp.health, Health::Healthy, "{fp:?}");
    let java = drover_driver_java::find_java().unwrap();
    let out = Command::new(&java).arg("-version").output().unwrap();
    let expected =
        drover_driver_java::parse_version(&String::from_utf8_lossy(&out.stderr)).unwrap();
    assert_eq!(fp.attributes["driver.java.version"], expected.version);
    assert_eq!(fp.attributes["driver.java.vendor"], expected.vendor);
    assert!(
        fp.attributes.contains_key("driver.java.cgroup_version"),
        "{fp:?}"
    );
}
