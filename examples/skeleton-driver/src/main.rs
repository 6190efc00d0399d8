//! The whole binary: serve the driver. The SDK checks the magic cookie, binds the
//! socket, prints the handshake line and logs JSON on stderr.
fn main() {
    drover_plugin_sdk::serve(drover_skeleton_driver::SkeletonDriver::default())
}
