//! The Docker daemon the tests run against: a private dockerd that `scripts/test.sh`
//! starts (`--bridge none`, its own socket and data root) with a busybox image it
//! imports, announced in `DROVER_TEST_DOCKER_HOST` and `DROVER_TEST_DOCKER_IMAGE`.

use std::process::Output;

/// The Docker daemon and image the tests use.
#[derive(Debug, Clone)]
pub struct DockerEnv {
    /// `unix:///…/docker.sock`.
    pub host: String,
    /// An image with busybox in it, present on that daemon.
    pub image: String,
}

/// The test daemon, or `None` (after saying so loudly) when there is none. Under
/// `CI=true` a missing daemon fails the test instead.
pub fn docker_env() -> Option<DockerEnv> {
    match std::env::var("DROVER_TEST_DOCKER_HOST") {
        Ok(host) if !host.is_empty() => Some(DockerEnv {
            host,
            image: std::env::var("DROVER_TEST_DOCKER_IMAGE")
                .unwrap_or_else(|_| "drover-test/busybox:latest".into()),
        }),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "DROVER_TEST_DOCKER_HOST is not set: run the tests through scripts/test.sh, \
                 which starts a private dockerd"
            );
            eprintln!(
                "SKIPPED: DROVER_TEST_DOCKER_HOST is not set (scripts/test.sh starts a private \
                 dockerd and sets it)"
            );
            None
        }
    }
}

impl DockerEnv {
    /// Run the docker CLI against the test daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        docker(&self.host, args)
    }

    /// Run the docker CLI and return its trimmed stdout; panics on failure.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "docker {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `docker inspect` of one object as JSON, `None` if it does not exist.
    pub fn inspect(&self, what: &str) -> Option<serde_json::Value> {
        inspect(&self.host, what)
    }

    /// Remove every container with label `key` = `value` (a test's leftovers).
    pub fn remove_labelled(&self, key: &str, value: &str) {
        let ids = self.cli_ok(&["ps", "-aq", "--filter", &format!("label={key}={value}")]);
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids);
            let _ = self.cli(&args);
        }
    }
}

/// `docker inspect` of one object on the daemon at `host` as JSON, `None` if it does
/// not exist.
pub fn inspect(host: &str, what: &str) -> Option<serde_json::Value> {
    let out = docker(host, &["inspect", what]);
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v.as_array()?.first().cloned()
}

/// Run the docker CLI against `host`.
pub fn docker(host: &str, args: &[&str]) -> Output {
    std::process::Command::new("docker")
        .arg("-H")
        .arg(host)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the docker CLI: {e}"))
}
