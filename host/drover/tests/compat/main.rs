//! Wire compatibility with HashiCorp go-plugin, against real go-plugin programs (Debian's
//! go-plugin package and go-plugin 1.6.3), in both directions; and with Nomad, against
//! the real Nomad 1.0.18 programs, in both directions: its task drivers in a Drover
//! agent (nomad_drivers.rs), Drover's drivers in a Nomad agent (nomad_agent.rs); and
//! Nomad's HTTP API and job files on Drover (nomad_api.rs with python-nomad,
//! nomad_jobs.rs). One
//! test binary for the area, so that CI links it once; each file is a module.

#[path = "../common/mod.rs"]
mod common;

mod goplugin16;
mod goplugin16_sdk;
mod goplugin_compat;
mod nomad_agent;
mod nomad_api;
mod nomad_drivers;
mod nomad_jobs;
