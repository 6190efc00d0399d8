//! The qemu driver: the [`DriverPlugin`](drover_plugin_sdk::DriverPlugin) impl.
//!
//! FOUNDATION STUB: the driver helper builds this.

/// The driver's name.
pub const PLUGIN_NAME: &str = "qemu";
/// The plugin's version.
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Runs each task as a qemu VM owned by its own executor.
#[derive(Debug, Default)]
pub struct QemuDriver {}

impl QemuDriver {
    /// A driver with no tasks.
    pub fn new() -> Self {
        QemuDriver {}
    }
}
