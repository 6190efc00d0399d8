fn main() {
    drover_plugin_sdk::serve(drover_driver_rawexec::RawExecDriver::new())
}
