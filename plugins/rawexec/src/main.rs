fn main() {
    // Each task's executor is this binary re-executed: become it before anything else.
    // rawexec never isolates a task, so its executors need no sandbox.
    drover_executor::run_if_executor(None);
    drover_plugin_sdk::serve(drover_driver_rawexec::RawExecDriver::new())
}
