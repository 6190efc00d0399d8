//! The bound on the driver libraries one agent keeps: a library cannot be unloaded, so
//! each distinct one loaded (each upgrade of an in-process driver too) stays mapped
//! until the agent exits; past the bound, a new one is refused with a reason. Its own
//! test binary: the loader keeps its libraries for the life of the process.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::sync::Arc;
use std::time::Duration;

use common::inproc::gcc_library;
use drover_host::plugins::library::MAX_RETAINED_LIBRARIES;
use drover_host::plugins::trust::{self, Binary, Policy};
use drover_host::plugins::{candidate, loader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_retained_libraries_bound_a_new_library_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut reasons = Vec::new();
    for n in 0..=MAX_RETAINED_LIBRARIES {
        let name = format!("kept{n}.so");
        // Distinct bytes each; no entry symbol: refused once mapped, and still kept.
        let source = format!("int drover_kept_{n}(void) {{ return {n}; }}\n");
        let Some(library) = gcc_library(&plugins, &name, &source) else {
            return;
        };
        std::fs::set_permissions(&library, std::fs::Permissions::from_mode(0o644)).unwrap();
        let c = candidate::Candidate::external(library);
        let (fd, _) = trust::open_checked(&c).unwrap_or_else(|e| panic!("{e}"));
        let binary = Binary {
            sha256: trust::sha256_fd(&fd).unwrap(),
            fd: Arc::new(fd),
        };
        let policy = Policy {
            in_process: [c.label.clone()].into(),
            ..Policy::default()
        };
        policy.before_exec(&c, &binary.sha256).unwrap();
        let refused = loader::fingerprint(
            &c,
            &binary,
            Duration::from_secs(10),
            root.path(),
            &drover_plugin_sdk::version::supported_api_range(),
            &loader::LaunchSettings::default(),
        )
        .await
        .map(|fp| fp.info.name)
        .unwrap_err();
        reasons.push(refused);
    }
    let (last, kept) = reasons.split_last().unwrap();
    for r in kept {
        assert!(r.contains("exports no `drover_plugin_entry_v1`"), "{r}");
    }
    assert!(
        last.contains(&format!(
            "kept{MAX_RETAINED_LIBRARIES}.so is not loaded: this agent already keeps \
             {MAX_RETAINED_LIBRARIES} driver libraries"
        )) && last.contains("restart the agent to load more libraries"),
        "{last}"
    );
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        !maps.contains(&format!("/memfd:kept{MAX_RETAINED_LIBRARIES} ")),
        "the refused library was mapped"
    );
}
