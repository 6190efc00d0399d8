//! The web UI at `/ui` (issue 28, acceptance 4): headless Chromium (Debian's
//! `chromium` and `chromedriver`, driven by Selenium from Python) against a dev agent.
//! The browser script (`python/ui_browser.py`) does what a user does and checks what
//! they would see: a job submitted through the API after the page loaded appears on
//! it without a reload, its allocation's log shows a line the task printed after the
//! page opened, the page's security headers, no CSP violation; it saves screenshots
//! (1280x800 and a phone's 390x844) to `<target>/ui-screenshots/`, which are kept.
//!
//! Selenium and chromedriver rather than Playwright: chromedriver comes from the same
//! Debian source package as chromium, so the two always match (Playwright pins the
//! browser builds it speaks to, and its own cannot be downloaded here), and the
//! Python venv of scripts/test.sh is already there; no Node.js anywhere.

use crate::common;

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::{dev_agent_with_api, tail};

/// The whole browser script may take this long (it has its own, shorter deadlines
/// per step; this one catches a browser that hangs).
const SCRIPT_LIMIT: Duration = Duration::from_secs(240);

/// What the browser test needs: the interpreter with Selenium, chromium and
/// chromedriver. `None` after saying loudly what is missing (a failure under
/// `CI=true`; scripts/test.sh installs them).
fn browser_tools() -> Option<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("DROVER_TEST_PYTHON_UI")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/python-ui/bin/python"));
    let mut missing = Vec::new();
    match Command::new(&python)
        .args(["-c", "import selenium"])
        .output()
    {
        Ok(out) if out.status.success() => {}
        Ok(out) => missing.push(format!(
            "{} cannot import selenium: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => missing.push(format!(
            "no Python for the UI test at {}: {e}",
            python.display()
        )),
    }
    for (env, default) in [
        ("DROVER_TEST_CHROMIUM", "/usr/bin/chromium"),
        ("DROVER_TEST_CHROMEDRIVER", "/usr/bin/chromedriver"),
    ] {
        let path = std::env::var(env).unwrap_or_else(|_| default.to_owned());
        if !Path::new(&path).exists() {
            missing.push(format!(
                "{path} is missing (Debian: apt-get install chromium chromium-driver)"
            ));
        }
    }
    if missing.is_empty() {
        return Some(python);
    }
    let why = missing.join("; ");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "the web UI test cannot run (CI=true: a failure): {why}; scripts/test.sh installs them"
        );
    }
    eprintln!("########################################################################");
    eprintln!("# SKIPPED: the web UI browser test: {why} (scripts/test.sh installs them)");
    eprintln!("########################################################################");
    None
}

/// `<target dir>/ui-screenshots`: the test binary is `<target>/<profile>/deps/cluster-…`.
fn screenshots_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary lies in <target>/<profile>/deps");
    target.join("ui-screenshots")
}

/// Acceptance 4.
#[test]
fn web_ui_shows_a_job_submitted_after_it_loaded_and_its_log_lines_live() {
    let Some(python) = browser_tools() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let (agent, api) = dev_agent_with_api(root.path());
    let token_file = agent.data_dir.join("server/dev-token");
    let token = std::fs::read_to_string(&token_file).expect("the dev token");
    let shots = screenshots_dir();
    // Only this run's pictures: an old one must not pass for a new one.
    let _ = std::fs::remove_dir_all(&shots);
    let work = root.path().join("browser");
    std::fs::create_dir_all(&work).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/python/ui_browser.py");
    let (out_path, err_path) = (work.join("stdout"), work.join("stderr"));
    let mut child = Command::new(&python)
        .arg(&script)
        .arg(api.base())
        .arg(token.trim())
        .arg(&shots)
        .arg(&work)
        // Its own process group: on a timeout the browser and its driver go with it.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("run the browser script");
    let began = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the browser script") {
            break Some(status);
        }
        if began.elapsed() > SCRIPT_LIMIT {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    println!("{stdout}");
    assert!(
        status.is_some_and(|s| s.success()),
        "the browser script failed ({status:?}, after {:?}):\n{stdout}\n{stderr}\nscreenshots: {}\nagent log:\n{}",
        began.elapsed(),
        shots.display(),
        tail(&agent.log_text())
    );
    for name in [
        "jobs-1280x800.png",
        "job-1280x800.png",
        "allocation-1280x800.png",
        "nodes-1280x800.png",
        "terminal-1280x800.png",
        "jobs-phone-390x844.png",
        "allocation-phone-390x844.png",
    ] {
        let png = std::fs::read(shots.join(name)).unwrap_or_default();
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 5_000,
            "{name}: no screenshot in {}",
            shots.display()
        );
    }
    println!("UI screenshots kept in {}", shots.display());
}
