fn main() {
    // Each task's executor is this binary re-executed: become it before anything else,
    // with the sandbox that isolates the task.
    drover_executor::run_if_executor(Some(&drover_isolation::LinuxSandbox));
    drover_plugin_sdk::serve(drover_driver_java::JavaDriver::new())
}
