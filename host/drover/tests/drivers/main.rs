//! End-to-end tests of the docker, exec, java and qemu drivers through the real agent
//! and CLI, against a real dockerd and the VM rig. One test binary for the area, so that
//! CI links it once; each file is a module.

#[path = "../common/mod.rs"]
mod common;

mod docker_cli;
mod docker_env;
mod docker_health;
mod docker_recovery;
mod docker_task_dir;
mod exec_agent;
mod qemu;
