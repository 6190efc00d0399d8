//! `drover-executor`: the per-task executor of Drover's executor-backed drivers
//! (rawexec, exec, java, qemu), one process per running task.
//!
//! It links only the executor and the task sandbox, never the agent's runtime, gRPC or
//! TLS: its private memory is what every running task costs. Drivers find it beside
//! their own program and check its build before they run it
//! (`drover_executor::EXECUTOR_BINARY`).
//!
//! Entered from the C runtime directly (`no_main`), not through Rust's `lang_start`:
//! that one reads `/proc/self/maps` to find the main thread's stack guard, maps an
//! alternate signal stack and polls descriptors 0-2, on every task start, for a
//! program that needs none of it. The executor catches SIGPIPE itself (a client
//! hanging up is an error, never a signal that ends it), is given its three
//! descriptors by the driver, and a stack overflow in it is a crash either way.
// Under `cargo test` the test harness brings its own `main`.
#![cfg_attr(not(test), no_main)]

/// The C `main`. Arguments are read through `std::env` (glibc hands them to Rust's
/// runtime before `main`). A panic ends the executor with status 101, as from a Rust
/// `main`, rather than unwinding into C (an abort).
#[cfg(not(test))]
// SAFETY (no_mangle): this binary links no other `main`; the C runtime calls this one.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    std::panic::catch_unwind(|| {
        drover_executor::executor_main(Some(&drover_isolation::LinuxSandbox))
    })
    .unwrap_or(101)
}
