//! Helpers of the in-process tests: driver libraries in `plugin_dir`, agents that load
//! them, and libraries built from C at test time.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{Agent, drover};

/// A shared library cargo built in this target directory (`lib<crate>.so`), or `None`
/// after a loud `SKIPPED` line; under `CI=true` a missing library fails the test.
///
/// rawexec is a dependency of the `drover` crate, the skeleton and the fixture library
/// are dev-dependencies of it: `cargo test -p drover` builds their `cdylib`s into
/// `target/<profile>/deps` before the tests run.
pub fn built_library(crate_name: &str) -> Option<PathBuf> {
    let file = format!("lib{}.so", crate_name.replace('-', "_"));
    let profile_dir = drover().parent().expect("target dir").to_owned();
    let found = [
        profile_dir.join("deps").join(&file),
        profile_dir.join(&file),
    ]
    .into_iter()
    .find(|p| p.is_file());
    if found.is_none() {
        let why = format!(
            "{file} is not in {}: build the workspace's libraries first \
             (`cargo test -p drover` builds it)",
            profile_dir.display()
        );
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("SKIPPED: {why}");
    }
    found
}

/// Compile `source` (C) into the shared library `dir/<name>` with `gcc -shared -fPIC`;
/// `None` after a loud `SKIPPED` line when there is no gcc (a failure under `CI=true`).
pub fn gcc_library(dir: &Path, name: &str, source: &str) -> Option<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    match Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
    {
        Ok(o) if o.status.success() => Some(out),
        Ok(o) => panic!(
            "gcc could not build {name}: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => {
            let why = format!("gcc cannot be run ({e}); it builds the C test libraries");
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

/// An agent's directories and config, for agents that load driver libraries; the
/// agent can be started again on the same directories (after a `kill -9`).
pub struct InProcessRig {
    pub root: tempfile::TempDir,
    pub plugins: PathBuf,
    config: PathBuf,
}

impl InProcessRig {
    /// Fresh directories, with `config` (TOML) as the agent config.
    pub fn new(config: &str) -> InProcessRig {
        let root = tempfile::tempdir().unwrap();
        let plugins = root.path().join("plugins");
        std::fs::create_dir(&plugins).unwrap();
        std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o700)).unwrap();
        let config_file = root.path().join("agent.toml");
        std::fs::write(&config_file, config).unwrap();
        InProcessRig {
            root,
            plugins,
            config: config_file,
        }
    }

    /// Put a copy of `library` into `plugin_dir` as `file_name`, mode `mode` (the
    /// mode of a library as `install` leaves it is 0644: no exec bit is needed).
    pub fn install(&self, library: &Path, file_name: &str, mode: u32) -> PathBuf {
        let to = self.plugins.join(file_name);
        std::fs::copy(library, &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).unwrap();
        to
    }

    /// Start an agent on these directories (again), which destroys its tasks when
    /// dropped unless a test turns that off.
    pub fn start(&self) -> Agent {
        // A killed agent leaves its socket file; the helper waits for the file to
        // appear, so it must not see the stale one.
        let _ = std::fs::remove_file(self.root.path().join("data").join("api.sock"));
        let config = self.config.to_str().unwrap();
        let mut agent = Agent::start(self.root.path(), &self.plugins, &["--config", config]);
        agent.end_tasks = true;
        agent
    }
}

/// A rig whose config allows `[plugin.NAME] in_process = true`, with the library the
/// crate `crate_name` builds in its `plugin_dir` as `file_name` (mode 0644); `None`
/// when that library was not built (see [`built_library`]).
pub fn rig_with(crate_name: &str, name: &str, file_name: &str) -> Option<(InProcessRig, PathBuf)> {
    let library = built_library(crate_name)?;
    let rig = InProcessRig::new(&format!("[plugin.{name}]\nin_process = true\n"));
    let installed = rig.install(&library, file_name, 0o644);
    Some((rig, installed))
}

/// `drover task run --driver DRIVER --config CONFIG --json`, as the CLI ends.
pub fn task_run(agent: &Agent, driver: &str, config: &str) -> std::process::Output {
    agent.cli(&[
        "task", "run", "--driver", driver, "--config", config, "--json",
    ])
}

/// [`task_run`] that must succeed: the task's JSON.
pub fn started(agent: &Agent, driver: &str, config: &str) -> serde_json::Value {
    agent.cli_json(&[
        "task", "run", "--driver", driver, "--config", config, "--json",
    ])
}

/// Wait until plugin loading has settled with `name` healthy, and return the rows.
pub fn healthy(agent: &Agent, name: &str) -> Vec<serde_json::Value> {
    agent.wait_plugins(Duration::from_secs(20), |rows| {
        rows.iter()
            .any(|r| r["name"] == name && r["state"] == "healthy")
    })
}

/// The `plugin status` row of the plugin whose `path` is `path`.
pub fn row_at<'a>(rows: &'a [serde_json::Value], path: &Path) -> &'a serde_json::Value {
    let shown = path.display().to_string();
    rows.iter()
        .find(|r| r["path"] == shown.as_str())
        .unwrap_or_else(|| panic!("no plugin row for {shown} in {rows:#?}"))
}
