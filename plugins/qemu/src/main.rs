fn main() {
    // Each task's executor is this binary re-executed: become it before anything else.
    // qemu runs as a plain task (it confines itself: seccomp, dropping root), so its
    // executors need no sandbox.
    drover_executor::run_if_executor(None);
    drover_plugin_sdk::serve(drover_driver_qemu::QemuDriver::new())
}
