//! End-to-end tests of Drover as a system service: the Debian package (its contents,
//! its systemd units, the packaged binary and configs run from the unpacked tree) and
//! the `sd_notify` protocol of `drover agent` and `drover server` (readiness, watchdog,
//! SIGHUP reloads). One test binary for the area, so that CI links it once.

#[path = "../common/mod.rs"]
mod common;

mod notify;
mod package;
