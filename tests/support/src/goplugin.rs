//! Real HashiCorp go-plugin programs: the go-plugin 1.6.3 test program
//! (`tests/goplugin16`, a host and a plugin that `scripts/go-plugin-16.sh` builds from
//! the go-plugin 1.6.3 source), and reading what such a Go host reports.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The environment variable `scripts/test.sh` sets to the built program.
pub const ENV_PROGRAM: &str = "DROVER_TEST_GOPLUGIN16";

/// The built go-plugin 1.6.3 program, or `None` after a loud `SKIPPED` line when it
/// cannot be built here (no go-plugin tarball, no Go): a panic under `CI=true`.
///
/// `scripts/test.sh` builds it and names it in `DROVER_TEST_GOPLUGIN16`; without that
/// variable (a plain `cargo test`) the build script is run here, once per test binary
/// (it does nothing when the program is up to date).
///
/// ```no_run
/// if let Some(program) = drover_test_support::goplugin::program_16() {
///     assert!(program.exists());
/// }
/// ```
pub fn program_16() -> Option<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BUILT.get_or_init(locate) {
        Ok(p) => Some(p.clone()),
        Err(why) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("the go-plugin 1.6.3 program is missing (CI=true: a failure): {why}");
            }
            eprintln!("SKIPPED: the go-plugin 1.6.3 interoperability test: {why}");
            None
        }
    }
}

fn locate() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(ENV_PROGRAM) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{ENV_PROGRAM}={} is not a file", p.display()))
        };
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/go-plugin-16.sh");
    let out = Command::new(&script)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("{} failed: {stderr}", script.display()));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{ENV_PROGRAM}="))
                .map(PathBuf::from)
        })
        .ok_or_else(|| format!("{} built nothing: {stderr}", script.display()))
}

/// Run a Go host program; the JSON report it prints on stdout. Panics, with its stderr,
/// when it fails.
///
/// ```no_run
/// let mut cmd = std::process::Command::new("goplugin16");
/// cmd.args(["host", "/usr/lib/drover/plugins/skeleton"]);
/// let report = drover_test_support::goplugin::report(&mut cmd);
/// assert_eq!(report["ping"], "ok");
/// ```
pub fn report(cmd: &mut Command) -> serde_json::Value {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{cmd:?} printed no JSON report: {e}"))
}

/// The bytes of a report's hex field (a raw protobuf answer).
///
/// ```
/// assert_eq!(drover_test_support::goplugin::hex_decode("08ff"), vec![8, 255]);
/// ```
pub fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex in a Go report"))
        .collect()
}
