//! The `device_nodes` device plugin as a binary of its own (the `drover` binary also
//! serves it as a built-in).

fn main() {
    drover_plugin_sdk::server::serve_device(drover_device_nodes::DeviceNodes::default())
}
