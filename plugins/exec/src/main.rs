fn main() {
    // Each task's executor is this binary re-executed: become it before anything else.
    drover_executor::run_if_executor();
    drover_plugin_sdk::serve(drover_driver_exec::ExecDriver::new())
}
