//! Whose the files are that the agent writes for a task: its workload identity token
//! (`secrets/nomad_token`) and its rendered templates. The exec and java drivers run a
//! task as a user of its own (`nobody` unless its config names another), and a
//! `secrets/` file is 0600: left the agent's (root's), the task could not read its own
//! token or secrets. So such files go to the user the task will run as, resolved as
//! the driver resolves it; a task that runs as root, or as the plugin's own user
//! (raw_exec, qemu, a Nomad driver) or inside a container (docker), keeps the agent's
//! files as they are.
//!
//! Ownership is given through the descriptor the agent opened (beneath the task
//! directory, without following links): never `chown` by path, which a link the task
//! planted would redirect to a file of the host.

use std::os::fd::AsFd;

use drover_isolation::user;

/// The drivers that run a task as its config's `user`, or as
/// [`user::DEFAULT_USER`] when it names none (the isolation engine's rule).
const OWN_USER_DRIVERS: &[&str] = &["exec", "java"];

/// The user and group a task's files are given to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// Give the open file or directory `fd` to this owner.
    pub(crate) fn give(self, fd: impl AsFd) -> std::io::Result<()> {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(self.uid)),
            Some(rustix::fs::Gid::from_raw(self.gid)),
        )
        .map_err(Into::into)
    }
}

/// Who the task of `driver` with `config` (its final driver config) runs as, when
/// that is a user other than root the agent can give files to; `None` otherwise. A
/// user the host does not know is left to the driver, which fails the start naming it.
pub(crate) fn task_owner(driver: &str, config: &serde_json::Value) -> Option<Owner> {
    if !OWN_USER_DRIVERS.contains(&driver) || !rustix::process::geteuid().is_root() {
        // Not a driver that changes user, or an agent that cannot give files away
        // (its tasks then run as its own user anyway).
        return None;
    }
    let name = match config.get("user") {
        Some(serde_json::Value::String(name)) => name.as_str(),
        _ => user::DEFAULT_USER,
    };
    let creds = user::resolve(name).ok()?;
    (creds.uid != 0).then_some(Owner {
        uid: creds.uid,
        gid: creds.gid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_and_java_tasks_run_as_their_user_or_nobody_and_others_as_the_plugin() {
        let root = rustix::process::geteuid().is_root();
        let nobody = user::resolve(user::DEFAULT_USER).ok();
        let expect_nobody = nobody.filter(|_| root).map(|c| Owner {
            uid: c.uid,
            gid: c.gid,
        });
        assert_eq!(task_owner("exec", &serde_json::json!({})), expect_nobody);
        assert_eq!(
            task_owner("java", &serde_json::json!({"user": "nobody"})),
            expect_nobody
        );
        assert_eq!(
            task_owner("exec", &serde_json::json!({"user": "1234:5678"})),
            root.then_some(Owner {
                uid: 1234,
                gid: 5678
            })
        );
        // Root's task: nothing changes.
        assert_eq!(
            task_owner("exec", &serde_json::json!({"user": "root"})),
            None
        );
        assert_eq!(
            task_owner("exec", &serde_json::json!({"user": "0:0"})),
            None
        );
        // The plugin's own user, or a container's.
        for driver in ["raw_exec", "docker", "qemu"] {
            assert_eq!(
                task_owner(driver, &serde_json::json!({"user": "nobody"})),
                None
            );
        }
        // A user the host does not have: the driver says so at the start.
        assert_eq!(
            task_owner("exec", &serde_json::json!({"user": "no-such-user-here"})),
            None
        );
    }
}
