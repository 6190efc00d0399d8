fn main() {
    // FOUNDATION STUB: becomes
    //   drover_executor::run_if_executor(None);
    //   drover_plugin_sdk::serve(drover_driver_qemu::QemuDriver::new())
    // once QemuDriver implements DriverPlugin.
    drover_executor::run_if_executor(None);
    let _ = drover_driver_qemu::QemuDriver::new();
    eprintln!("drover-driver-qemu: not built yet");
    std::process::exit(1);
}
