//! `drover-executor`: the per-task executor of Drover's executor-backed drivers
//! (rawexec, exec, java, qemu), one process per running task.
//!
//! It links only the executor and the task sandbox, never the agent's runtime, gRPC or
//! TLS: its private memory is what every running task costs. Drivers find it beside
//! their own program and check its build before they run it
//! (`drover_executor::EXECUTOR_BINARY`).

fn main() {
    drover_executor::executor_main(Some(&drover_isolation::LinuxSandbox))
}
