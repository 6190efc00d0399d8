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
            let jar_inside = inside(jar);
            let host = task.root.host_path(&jar_inside).ok_or_else(|| {
                DriverError::InvalidConfig(format!(
                    "jar_path {jar:?} is not inside the task's root: put the jar in the task's \
                     local/ directory (jar_path = \"local/app.jar\")"
                ))
            })?;
            match std::fs::metadata(&host) {
                Ok(m) if m.is_file() => {}
                Ok(_) => {
                    return Err(DriverError::InvalidConfig(format!(
                        "jar_path {jar:?} ({}) is not a file",
                        host.display()
                    )));
                }
                Err(e) => {
                    return Err(DriverError::InvalidConfig(format!(
                        "jar_path {jar:?} ({}): {e}",
                        host.display()
                    )));
                }
            }
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
