//! The SDK's conformance harness against the real rawexec binary.

use std::time::Duration;

use drover_plugin_sdk::testing::Conformance;

#[tokio::test]
async fn rawexec_conforms() {
    check(Conformance::new(env!(
        "CARGO_BIN_EXE_drover-driver-rawexec"
    )))
    .await;
}

/// The same checks against rawexec built as a library (`libdrover_driver_rawexec.so`,
/// next to this test's executable in target/*/deps), loaded into this process as an
/// agent with `in_process = true` loads it. Its executors are the rawexec binary (in a
/// test the host is this test binary, which is no executor).
#[tokio::test]
async fn rawexec_conforms_in_process() {
    let Some(library) = drover_plugin_sdk::testing::built_library(LIBRARY) else {
        return;
    };
    check(
        Conformance::shared_library(library).executor(env!("CARGO_BIN_EXE_drover-driver-rawexec")),
    )
    .await;
}

/// The same checks against rawexec linked static-pie by `scripts/build-plugins.sh`, the
/// form that launches fastest: `scripts/test.sh` builds it and names it in
/// `DROVER_TEST_STATIC_RAWEXEC`. Without it the test skips, loudly; under `CI=true` it
/// fails.
#[tokio::test]
async fn rawexec_linked_static_pie_conforms() {
    let Some(binary) = std::env::var_os("DROVER_TEST_STATIC_RAWEXEC") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but DROVER_TEST_STATIC_RAWEXEC is not set (scripts/test.sh builds it)"
        );
        eprintln!("SKIPPED: DROVER_TEST_STATIC_RAWEXEC is not set (scripts/test.sh sets it)");
        return;
    };
    let data = std::fs::read(&binary).unwrap_or_else(|e| panic!("{binary:?}: {e}"));
    let segments = program_header_types(&data);
    assert!(
        !segments.contains(&object::elf::PT_INTERP),
        "{binary:?} asks for a dynamic loader: it is not linked statically"
    );
    // Alone in its directory, with no `drover-executor` beside it: its executors are
    // the static binary itself, the most static form. Installed beside the dedicated
    // executor, the plugin runs that one, as every other form here does.
    check(Conformance::new(binary)).await;
}

/// The `p_type` of each program header of the 64-bit ELF file `data`.
fn program_header_types(data: &[u8]) -> Vec<object::elf::ProgramType> {
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data).expect("ELF");
    let endian = header.endian().expect("byte order");
    assert_eq!(
        header.e_type(endian),
        object::elf::ET_DYN,
        "not position independent"
    );
    header
        .program_headers(endian, data)
        .expect("program headers")
        .iter()
        .map(|p| p.p_type(endian))
        .collect()
}

/// rawexec as a library, as cargo names it.
const LIBRARY: &str = "libdrover_driver_rawexec.so";

/// Run the harness with rawexec's sample and long tasks, in either form.
async fn check(form: Conformance) {
    let report = form
        .plugin_config(serde_json::json!({ "enabled": true }))
        .sample_task(serde_json::json!({ "command": "/bin/sh", "args": ["-c", "exit 0"] }))
        .long_task(serde_json::json!({ "command": "/bin/sleep", "args": ["1000"] }))
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
}

/// In process, the library logs through its own `tracing` into the pipe the host gave
/// it, and the host replays each line in its own `tracing` under the plugin's name, as
/// it does a plugin process's stderr.
#[tokio::test]
async fn in_process_logs_reach_the_host() {
    use drover_plugin_sdk::client::{InProcessOptions, InProcessPlugin, sealed_copy};
    use tracing_subscriber::prelude::*;

    let Some(library) = drover_plugin_sdk::testing::built_library(LIBRARY) else {
        return;
    };
    let seen = Captured::default();
    // Global, not scoped to this thread: tracing caches each callsite's interest
    // process-wide, and another test's thread hitting the replay's callsite first
    // (while no scoped subscriber exists) can leave it disabled for this one. The
    // other tests' lines land here too; the plugin name tells this one's apart.
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(seen.clone())
                .with_ansi(false),
        )
        .try_init()
        .expect("no other test of this binary installs a subscriber");
    let file = std::fs::File::open(&library).expect("the library opens");
    let sealed = sealed_copy(&file.into(), "rawexec").expect("a sealed copy");
    let mut opts = InProcessOptions::new("rawexec-logs", sealed, &library);
    opts.executor = Some(env!("CARGO_BIN_EXE_drover-driver-rawexec").into());
    let plugin = InProcessPlugin::load(opts).await.expect("loads");
    drover_test_support::until(
        Duration::from_secs(5),
        "the library's first log line replayed in the host",
        || {
            seen.text().lines().any(|l| {
                l.contains("serving in process")
                    && l.contains(r#"plugin="rawexec-logs""#)
                    && l.contains(env!("CARGO_BIN_EXE_drover-driver-rawexec"))
            })
        },
    )
    .await;
    assert!(plugin.shutdown().await.is_success());
    assert!(plugin.has_exited());
}

/// What the host's `tracing` wrote.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}
