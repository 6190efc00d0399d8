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
    build_jar_of(dir, "Hello", HELLO)
}

/// Class `class` from `source`, in `<dir>/classes` and `<dir>/app.jar`.
fn build_jar_of(dir: &Path, class: &str, source: &str) -> PathBuf {
    let file = dir.join(format!("{class}.java"));
    std::fs::write(&file, source).unwrap();
    let classes = dir.join("classes");
    let javac = Command::new("javac")
        .arg("-d")
        .arg(&classes)
        .arg(&file)
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
        .args(["--main-class", class, "-C"])
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
        Self::launch_with(dir, json!({})).await
    }

    /// With plugin config `config` (a `cgroup_parent` is added).
    async fn launch_with(dir: &Path, mut config: Value) -> Java {
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
        config["cgroup_parent"] = json!(format!("/{parent}"));
        client.set_config(config.to_string(), &agent).await.unwrap();
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
        drover_test_support::remove_plugin_socket_dir(&self.process.handshake().addr);
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

/// The task-escape suite from inside a JVM: the Java program reads its own seccomp
/// mode, tries `unshare -U`, `unshare -Urn` and `mount` as a task's program would, and
/// runs the exec tests' probe (`escape.c`: every denied system call class, made
/// directly), all of it under the filter the JVM inherited; and it starts a thread,
/// which needs `clone3`'s `ENOSYS` to fall back to `clone`.
const ESCAPE_JAVA: &str = r#"
import java.nio.file.*;

public class Escape {
    static String run(String... cmd) throws Exception {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        p.getInputStream().readAllBytes();
        return p.waitFor() == 0 ? "ok" : "refused";
    }

    public static void main(String[] args) throws Exception {
        for (String l : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (l.startsWith("Seccomp:")) System.out.println(l);
        }
        System.out.println("unshare-U=" + run("unshare", "-U", "true"));
        System.out.println("unshare-Urn=" + run("unshare", "-Urn", "true"));
        System.out.println("mount=" + run("mount", "-t", "tmpfs", "none", "/tmp"));
        Thread t = new Thread(() -> System.out.println("thread=ok"));
        t.start();
        t.join();
        Process p = new ProcessBuilder("/local/escape").redirectErrorStream(true).start();
        System.out.print(new String(p.getInputStream().readAllBytes()));
        System.out.println("probe-exit=" + p.waitFor());
    }
}
"#;

/// Scenario 4 and the task-escape suite in a java task (see [`ESCAPE_JAVA`]); root
/// refused by default and allowed with `user_denylist = []`; default memory and pids
/// limits for a task that gives no resources.
#[tokio::test]
async fn a_java_task_cannot_escape_and_gets_default_limits() {
    if !prerequisites() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let build = dir.path().join("build");
    std::fs::create_dir(&build).unwrap();
    let jar = build_jar_of(&build, "Escape", ESCAPE_JAVA);
    let j = Java::launch(dir.path()).await;
    let spec = j.spec("escape", json!({ "jar_path": "local/app.jar" }));
    std::fs::copy(&jar, spec.task_dir.join("local/app.jar")).unwrap();
    let src = build.join("escape.c");
    std::fs::write(&src, include_str!("../../exec/tests/escape.c")).unwrap();
    let cc = Command::new("cc")
        .args(["-O", "-static", "-o"])
        .arg(spec.task_dir.join("local/escape"))
        .arg(&src)
        .output()
        .expect("the task-escape suite needs a C compiler (cc)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    tokio::time::timeout(PROMPT, j.client.start_task(spec))
        .await
        .unwrap()
        .unwrap();
    // A task without resources: the defaults, in its cgroup, while it runs.
    let cg = |c: &str, f: &str| {
        std::fs::read_to_string(
            Path::new("/sys/fs/cgroup")
                .join(c)
                .join(&j.parent)
                .join("escape")
                .join(f),
        )
        .map(|s| s.trim().to_owned())
    };
    let memory = cg("memory", "memory.limit_in_bytes");
    let pids = cg("pids", "pids.max");
    let exit = tokio::time::timeout(PROMPT, j.client.wait_task("escape"))
        .await
        .unwrap()
        .unwrap();
    let out = j.log("escape", "stdout");
    assert!(
        exit.successful(),
        "{exit:?}\nstdout:\n{out}\nstderr:\n{}",
        j.log("escape", "stderr")
    );
    assert_eq!(memory.ok(), Some((300u64 << 20).to_string()));
    assert_eq!(pids.ok().as_deref(), Some("1024"));
    let lines: Vec<&str> = out.lines().collect();
    for want in [
        "Seccomp:\t2",
        "unshare-U=refused",
        "unshare-Urn=refused",
        "mount=refused",
        "thread=ok",
        "done",
        "probe-exit=0",
    ] {
        assert!(lines.contains(&want), "{want} not in:\n{out}");
    }
    let mut wrong = Vec::new();
    let mut probes = 0;
    for (probe, outcome) in lines.iter().filter_map(|l| l.split_once(' ')) {
        probes += 1;
        let want = if probe.starts_with("allowed-") {
            "ok"
        } else if probe == "clone3" {
            "ENOSYS"
        } else {
            "EPERM"
        };
        if outcome != want {
            wrong.push(format!("{probe}: {outcome}, expected {want}"));
        }
    }
    assert!(probes > 40, "too few probes:\n{out}");
    assert!(wrong.is_empty(), "{}\n{out}", wrong.join("\n"));

    // Root: refused by default, naming the option.
    let spec = j.spec(
        "rooted",
        json!({ "jar_path": "local/app.jar", "user": "root" }),
    );
    let err = j.client.start_task(spec).await.unwrap_err();
    assert!(matches!(err, DriverError::InvalidConfig(_)), "{err:?}");
    assert!(err.to_string().contains("user_denylist"), "{err}");
    drop(j);

    // Allowed with the opt-in, and still under the filter.
    let dir = tempfile::tempdir().unwrap();
    let j = Java::launch_with(dir.path(), json!({ "user_denylist": [] })).await;
    let spec = j.spec(
        "rooted",
        json!({ "class": "Hello", "class_path": "local/classes", "args": ["0"], "user": "root" }),
    );
    build_jar(&build);
    copy_dir(&build.join("classes"), &spec.task_dir.join("local/classes"));
    tokio::time::timeout(PROMPT, j.client.start_task(spec))
        .await
        .unwrap()
        .unwrap();
    let exit = tokio::time::timeout(PROMPT, j.client.wait_task("rooted"))
        .await
        .unwrap()
        .unwrap();
    let out = j.log("rooted", "stdout");
    assert!(
        exit.successful(),
        "{exit:?}\n{out}\n{}",
        j.log("rooted", "stderr")
    );
    assert!(out.contains("user=root"), "{out}");
}
