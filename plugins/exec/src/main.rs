fn main() {
    drover_plugin_sdk::serve(drover_driver_exec::ExecDriver::new())
}
