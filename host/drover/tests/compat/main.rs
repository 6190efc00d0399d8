//! Wire compatibility with HashiCorp go-plugin, against real go-plugin programs (Debian's
//! go-plugin package and go-plugin 1.6.3), in both directions; and with Nomad's driver
//! plugins, against the real Nomad 1.0.18 programs. One test binary for the
//! area, so that CI links it once; each file is a module.

#[path = "../common/mod.rs"]
mod common;

mod goplugin16;
mod goplugin16_sdk;
mod goplugin_compat;
mod nomad_drivers;
