//! The plugin side of in-process plugins: the C ABI a driver library exports
//! ([`crate::export_driver!`]) and what the host tells it when it starts.
//!
//! CONTRACT (foundation commit; the implementation fills it in).

/// The versioned entry symbol every driver library exports. A host looks it up with
/// `dlsym`; a library without it is not a Drover driver library.
pub const ENTRY_SYMBOL: &str = "drover_plugin_entry_v1";

/// The version of the in-process ABI the entry returns in its table. A host refuses a
/// library whose table carries another version.
pub const ABI_VERSION: u32 = 1;

/// The program a driver's executors run. A plugin process re-executes itself
/// (`/proc/self/exe`); a driver loaded into a host cannot (a `.so` is not a program),
/// so the host names the program at start, by default its own binary
/// (`/proc/self/exe` again, seen from the host).
pub fn executor_program() -> std::path::PathBuf {
    std::path::PathBuf::from("/proc/self/exe")
}
