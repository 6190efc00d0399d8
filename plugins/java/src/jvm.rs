//! Finding the JVM and asking it who it is (`java -version`).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long `java -version` may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// What `java -version` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jvm {
    /// `17.0.15`.
    pub version: String,
    /// `OpenJDK Runtime Environment`.
    pub vendor: String,
    /// `OpenJDK 64-Bit Server VM (build …)`.
    pub vm: Option<String>,
}

impl Jvm {
    /// Run `java -version` and parse it.
    pub async fn probe(java: &Path) -> Result<Jvm, String> {
        let run = tokio::process::Command::new(java)
            .arg("-version")
            .env_clear()
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(PROBE_TIMEOUT, run)
            .await
            .map_err(|_| {
                format!(
                    "{} -version did not answer within {PROBE_TIMEOUT:?}",
                    java.display()
                )
            })?
            .map_err(|e| format!("cannot run {} -version: {e}", java.display()))?;
        // The JVM prints its version on stderr.
        let text = String::from_utf8_lossy(&out.stderr);
        parse_version(&text).ok_or_else(|| {
            format!(
                "cannot read the version of {} from {:?}",
                java.display(),
                text.lines().next().unwrap_or_default()
            )
        })
    }
}

/// Parse `java -version` output.
///
/// ```
/// let out = "openjdk version \"17.0.15\" 2025-04-15\n\
///            OpenJDK Runtime Environment (build 17.0.15+6-Debian-1deb12u1)\n\
///            OpenJDK 64-Bit Server VM (build 17.0.15+6-Debian-1deb12u1, mixed mode, sharing)\n";
/// let jvm = drover_driver_java::parse_version(out).unwrap();
/// assert_eq!(jvm.version, "17.0.15");
/// assert_eq!(jvm.vendor, "OpenJDK Runtime Environment");
/// assert!(jvm.vm.unwrap().starts_with("OpenJDK 64-Bit Server VM"));
/// ```
pub fn parse_version(text: &str) -> Option<Jvm> {
    // JVMs may print notes first ("Picked up JAVA_TOOL_OPTIONS: …").
    let mut lines = text
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.contains(" version \""));
    let first = lines.next()?;
    let version = first.split('"').nth(1)?.to_owned();
    let runtime = lines.next().unwrap_or_default();
    let vendor = runtime
        .split(" (build")
        .next()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map_or_else(
            || {
                first
                    .split(" version")
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            },
            str::to_owned,
        );
    let vm = lines.next().filter(|l| !l.is_empty()).map(str::to_owned);
    Some(Jvm {
        version,
        vendor,
        vm,
    })
}

/// The JVM to use: `$JAVA_HOME/bin/java`, else `java` in `PATH`, with symlinks
/// resolved (`/usr/bin/java` → `/etc/alternatives/java` → the JVM's own path), so
/// that the task's root only needs the JVM's home.
pub fn find_java() -> Option<PathBuf> {
    let from_home = std::env::var_os("JAVA_HOME").map(|h| PathBuf::from(h).join("bin/java"));
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let from_path = path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join("java"));
    from_home
        .into_iter()
        .chain(from_path)
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

/// The home of the JVM whose binary is `java` (`…/bin/java` → `…`).
pub fn java_home(java: &Path) -> Option<PathBuf> {
    java.parent()?.parent().map(Path::to_owned)
}

/// `/etc/java*`: configuration the JVM's `conf/` links to on Debian and Ubuntu.
pub fn etc_java_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/etc")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("java"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_vendors_and_notes() {
        let out = "Picked up JAVA_TOOL_OPTIONS: -Xss1m\n\
                   openjdk version \"25\" 2025-09-16 LTS\n\
                   OpenJDK Runtime Environment Temurin-25+36 (build 25+36-LTS)\n\
                   OpenJDK 64-Bit Server VM Temurin-25+36 (build 25+36-LTS, mixed mode)\n";
        let jvm = parse_version(out).unwrap();
        assert_eq!(jvm.version, "25");
        assert_eq!(jvm.vendor, "OpenJDK Runtime Environment Temurin-25+36");
        let old = "java version \"1.8.0_402\"\n";
        let jvm = parse_version(old).unwrap();
        assert_eq!(
            (jvm.version.as_str(), jvm.vendor.as_str()),
            ("1.8.0_402", "java")
        );
        assert!(parse_version("bash: java: not found").is_none());
    }

    #[test]
    fn home_of_a_jvm() {
        assert_eq!(
            java_home(Path::new("/usr/lib/jvm/jdk-17/bin/java")).unwrap(),
            Path::new("/usr/lib/jvm/jdk-17")
        );
    }
}
