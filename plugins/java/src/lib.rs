//! # drover-driver-java
//!
//! The `java` task driver: runs a JVM service (`jar_path`, or `class` with
//! `class_path`) with `jvm_options` and `args`, contained exactly like an exec task:
//! it is [`drover_isolation::IsolatedDriver`] with a [`Java`] flavor, so
//! namespaces, chroot, cgroups, capabilities, user, recovery and stats are the exec
//! driver's own code. The task's root also holds the JVM (its home and `/etc/java*`).
//!
//! ```no_run
//! drover_plugin_sdk::serve(drover_driver_java::JavaDriver::new())
//! ```
#![warn(missing_docs)]

mod config;
mod jvm;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use drover_isolation::{CommandLine, Flavor, IsolatedDriver, IsolationConfig, TaskContext};
use drover_plugin_sdk::taskdir::FileKind;
use drover_plugin_sdk::{DriverError, Fingerprint, Health};

pub use config::TaskConfig;
pub use jvm::{Jvm, find_java, parse_version};

/// The driver's name.
pub const PLUGIN_NAME: &str = "java";
/// The plugin's version.
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What makes java java: a JVM command line from a jar or a main class.
#[derive(Debug, Default)]
pub struct Java {
    /// The JVM to run; `None`: found in `PATH` (or `JAVA_HOME`) when needed.
    pub java: Option<PathBuf>,
    /// The last `java -version` answer, for the JVM binary at that path and mtime:
    /// the fingerprint runs every few seconds, a JVM start costs tens of milliseconds
    /// of CPU and tens of MiB.
    probed: Mutex<Option<(PathBuf, Option<SystemTime>, Jvm)>>,
}

impl Java {
    /// A flavor running the JVM at `java`.
    pub fn with_java(java: impl Into<PathBuf>) -> Self {
        Java {
            java: Some(java.into()),
            probed: Mutex::new(None),
        }
    }

    /// `java -version` of `java`, from the cache while the binary is unchanged.
    async fn probe(&self, java: &Path) -> Result<Jvm, String> {
        let mtime = std::fs::metadata(java).and_then(|m| m.modified()).ok();
        if let Some((path, at, jvm)) = &*self.probed.lock().unwrap_or_else(PoisonError::into_inner)
            && path == java
            && *at == mtime
        {
            return Ok(jvm.clone());
        }
        let jvm = Jvm::probe(java).await?;
        *self.probed.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((java.to_owned(), mtime, jvm.clone()));
        Ok(jvm)
    }

    fn java(&self) -> Result<PathBuf, DriverError> {
        match &self.java {
            Some(j) => Ok(j.clone()),
            None => find_java().ok_or_else(|| {
                DriverError::FailedPrecondition(
                    "no JVM found: install one (e.g. default-jdk-headless) or put java in the \
                     plugin's PATH or JAVA_HOME"
                        .into(),
                )
            }),
        }
    }
}

/// A path of the task config: relative ones are relative to the task directory,
/// which is `/` inside the task's root.
fn inside(path: &str) -> PathBuf {
    Path::new("/").join(path)
}

/// Check that the jar at `host` (`jar_path` as given) is a regular file. A jar in the
/// task directory is looked at beneath it without following links: the plugin runs as
/// root, and a link planted by an earlier run of the task (`local/app.jar ->
/// /root/x`) would otherwise tell the task whether a root-only host path exists. A jar
/// elsewhere in the root is looked at by `in_root` ([`TaskRoot::metadata`]: in the
/// allocation's directory or a host volume, which tasks control too, no link is
/// followed from the host).
///
/// [`TaskRoot::metadata`]: drover_isolation::rootfs::TaskRoot::metadata
fn check_jar(
    jar: &str,
    host: &Path,
    task_dir: &Path,
    in_root: impl FnOnce() -> std::io::Result<Option<std::fs::Metadata>>,
) -> Result<(), DriverError> {
    let invalid = |m: String| Err(DriverError::InvalidConfig(m));
    let kind = match host.strip_prefix(task_dir) {
        Ok(rel) => drover_plugin_sdk::taskdir::Dir::open(task_dir)
            .and_then(|dir| dir.metadata(rel))
            .map(|m| m.kind),
        Err(_) => match in_root() {
            // Through a link in the allocation's directory or a volume: not followed
            // from the host; the JVM, inside the task's root, says if it is no jar.
            Ok(None) => return Ok(()),
            Ok(Some(m)) if m.is_file() => Ok(FileKind::File),
            Ok(Some(_)) => Ok(FileKind::Unknown),
            Err(e) => Err(e),
        },
    };
    match kind {
        Ok(FileKind::File) => Ok(()),
        Ok(FileKind::Symlink) => invalid(format!(
            "jar_path {jar:?} ({}) is a symbolic link, and links in the task directory are \
             not followed: put the jar itself there",
            host.display()
        )),
        Ok(_) => invalid(format!(
            "jar_path {jar:?} ({}) is not a file",
            host.display()
        )),
        Err(e) => invalid(format!("jar_path {jar:?} ({}): {e}", host.display())),
    }
}

impl Flavor for Java {
    type TaskConfig = TaskConfig;
    const NAME: &'static str = PLUGIN_NAME;
    const VERSION: &'static str = PLUGIN_VERSION;

    fn isolation(&self, config: &TaskConfig) -> IsolationConfig {
        config.isolation()
    }

    fn command(
        &self,
        task: &TaskContext<'_>,
        config: &TaskConfig,
    ) -> Result<CommandLine, DriverError> {
        config.validate()?;
        let java = self.java()?;
        let program = task
            .root
            .find_command(&java.display().to_string(), task.cwd, task.path)
            .map_err(|e| {
                DriverError::FailedPrecondition(format!(
                    "the JVM {} is not visible in the task's root: {e}",
                    java.display()
                ))
            })?;
        let mut args = config.jvm_options.clone();
        if let Some(jar) = &config.jar_path {
            if Path::new(jar)
                .components()
                .any(|c| c == std::path::Component::ParentDir)
            {
                return Err(DriverError::InvalidConfig(format!(
                    "jar_path {jar:?} contains `..`: give the jar's path without it"
                )));
            }
            let jar_inside = inside(jar);
            let host = task.root.host_path(&jar_inside).ok_or_else(|| {
                DriverError::InvalidConfig(format!(
                    "jar_path {jar:?} is not inside the task's root: put the jar in the task's \
                     local/ directory (jar_path = \"local/app.jar\")"
                ))
            })?;
            check_jar(jar, &host, &task.spec.task_dir, || {
                task.root.metadata(&jar_inside)
            })?;
            args.push("-jar".into());
            args.push(jar_inside.display().to_string());
        } else if let Some(class) = &config.class {
            if let Some(cp) = &config.class_path {
                let cp: Vec<String> = cp
                    .split(':')
                    .map(|e| inside(e).display().to_string())
                    .collect();
                args.push("-cp".into());
                args.push(cp.join(":"));
            }
            args.push(class.clone());
        }
        args.extend(config.args.iter().cloned());
        Ok(CommandLine {
            program: program.display().to_string(),
            args,
        })
    }

    fn chroot_extra(&self) -> Vec<PathBuf> {
        let mut extra = jvm::etc_java_dirs();
        if let Ok(java) = self.java()
            && let Some(home) = jvm::java_home(&java)
        {
            extra.push(home);
        }
        extra
    }

    async fn fingerprint(&self, isolation: Fingerprint) -> Fingerprint {
        let Ok(java) = self.java() else {
            return Fingerprint::not_ready(
                Health::Undetected,
                "no JVM found in PATH or JAVA_HOME (install default-jdk-headless)",
            );
        };
        match self.probe(&java).await {
            Ok(jvm) => {
                let mut fp = isolation
                    .attribute("driver.java.version", &jvm.version)
                    .attribute("driver.java.vendor", &jvm.vendor)
                    .attribute("driver.java.path", java.display().to_string());
                if let Some(vm) = &jvm.vm {
                    fp = fp.attribute("driver.java.vm", vm);
                }
                fp
            }
            Err(e) => Fingerprint::not_ready(Health::Undetected, e),
        }
    }
}

/// The java driver. `JavaDriver::new()` uses the JVM found in `PATH` or
/// `JAVA_HOME`; `JavaDriver::with_flavor(Java::with_java(path))` a given one.
pub type JavaDriver = IsolatedDriver<Java>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The command line of a task whose config is `config`, in `task_dir`.
    fn command_in(task_dir: &Path, config: &str) -> Result<CommandLine, DriverError> {
        use drover_isolation::rootfs::{ChrootEnv, TaskRoot};
        let spec = drover_plugin_sdk::TaskSpec::new("t1").with_task_dir(task_dir);
        let root = TaskRoot::build(&ChrootEnv::default_list(), task_dir).unwrap();
        let task = TaskContext {
            spec: &spec,
            root: &root,
            cwd: Path::new("/"),
            path: "/usr/bin:/bin",
        };
        let config: TaskConfig = serde_json::from_str(config).unwrap();
        // Only looked for in the root: any program there stands in for the JVM.
        Java::with_java("/bin/sh").command(&task, &config)
    }

    fn invalid(r: Result<CommandLine, DriverError>) -> String {
        match r {
            Err(DriverError::InvalidConfig(m)) => m,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    /// A link planted in the task dir (by an earlier run of the task) is not followed
    /// as root to tell whether its target exists: it is refused, named.
    #[test]
    fn a_jar_path_through_a_link_in_the_task_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let task_dir = tmp.path().join("task");
        std::fs::create_dir_all(task_dir.join("local/real")).unwrap();
        let secret = tmp.path().join("root-only");
        std::fs::write(&secret, "x").unwrap();
        std::fs::write(task_dir.join("local/real/app.jar"), "PK").unwrap();
        std::os::unix::fs::symlink(&secret, task_dir.join("local/app.jar")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), task_dir.join("local/up")).unwrap();

        let ok = command_in(&task_dir, r#"{"jar_path":"local/real/app.jar"}"#).unwrap();
        assert_eq!(ok.args, ["-jar", "/local/real/app.jar"]);

        let m = invalid(command_in(&task_dir, r#"{"jar_path":"local/app.jar"}"#));
        assert!(
            m.contains(&task_dir.join("local/app.jar").display().to_string())
                && m.contains("is a symbolic link"),
            "{m}"
        );
        // A link on the way: named too, its target never looked at.
        let m = invalid(command_in(
            &task_dir,
            r#"{"jar_path":"local/up/root-only"}"#,
        ));
        assert!(
            m.contains(&format!(
                "{} is a symbolic link",
                task_dir.join("local/up").display()
            )),
            "{m}"
        );
        let m = invalid(command_in(
            &task_dir,
            r#"{"jar_path":"local/../../root-only"}"#,
        ));
        assert!(m.contains("contains `..`"), "{m}");
        let m = invalid(command_in(&task_dir, r#"{"jar_path":"local/missing.jar"}"#));
        assert!(m.contains("local/missing.jar"), "{m}");
    }

    #[tokio::test]
    async fn without_a_jvm_the_driver_is_undetected() {
        let java = Java::with_java("/nonexistent/jdk/bin/java");
        let fp = java.fingerprint(Fingerprint::healthy("isolation ok")).await;
        assert_eq!(fp.health, Health::Undetected, "{fp:?}");
        assert!(
            fp.description.contains("/nonexistent/jdk/bin/java"),
            "{fp:?}"
        );
    }
}
