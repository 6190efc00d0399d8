fn main() {
    drover_plugin_sdk::serve(drover_driver_java::JavaDriver::new())
}
