//! Capabilities of a task: the plugin's allowlist, the task's `cap_add`/`cap_drop`,
//! and the masks the executor applies (through the `caps` crate's names and bits).

use caps::Capability;
use drover_executor::CapabilitySets;
use drover_plugin_sdk::DriverError;

/// What a task gets when the plugin config says nothing: Nomad's exec default, the
/// capabilities a traditional Unix service run as root expects, without the ones that
/// administer the machine (`sys_admin`, `net_admin`, `sys_module`, …).
pub const DEFAULT_CAPS: [&str; 13] = [
    "audit_write",
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "mknod",
    "net_bind_service",
    "setfcap",
    "setgid",
    "setpcap",
    "setuid",
    "sys_chroot",
];

/// A set of capabilities: bit `n` for capability number `n`, as the kernel counts.
pub type CapSet = u64;

/// `chown` for `CAP_CHOWN`.
pub fn short_name(c: Capability) -> String {
    c.to_string()
        .trim_start_matches("CAP_")
        .to_ascii_lowercase()
}

fn names(set: CapSet) -> String {
    mask_names(set).join(", ")
}

/// Parse capability names (`net_admin`, `CAP_NET_ADMIN`, any case) or `all`. `what`
/// names the list in errors (`cap_add`, `allow_caps`).
///
/// ```
/// let set = drover_isolation::caps::parse_list("cap_add", &["net_admin".into(), "CAP_CHOWN".into()]).unwrap();
/// assert_eq!(set.count_ones(), 2);
/// let err = drover_isolation::caps::parse_list("cap_add", &["net_admn".into()]).unwrap_err();
/// assert!(err.to_string().contains("net_admn"));
/// ```
pub fn parse_list(what: &str, list: &[String]) -> Result<CapSet, DriverError> {
    let mut set: CapSet = 0;
    for name in list {
        if name.eq_ignore_ascii_case("all") {
            set |= caps::all().iter().fold(0, |m, c| m | c.bitmask());
            continue;
        }
        let cap: Capability = caps::to_canonical(name).parse().map_err(|_| {
            DriverError::InvalidConfig(format!("{what}: unknown capability {name:?}"))
        })?;
        set |= cap.bitmask();
    }
    Ok(set)
}

/// The default set ([`DEFAULT_CAPS`]).
pub fn default_set() -> CapSet {
    DEFAULT_CAPS
        .iter()
        .filter_map(|n| caps::to_canonical(n).parse::<Capability>().ok())
        .fold(0, |m, c| m | c.bitmask())
}

/// The task's capabilities: the defaults the allowlist permits, plus `cap_add` (each
/// of which must be in `allow`, else the error names it), minus `cap_drop`.
/// `ambient` is `cap_add` minus `cap_drop`: what a task running as a non-root user
/// really holds (without `cap_add` such a task holds none).
///
/// ```
/// use drover_isolation::caps::{default_set, parse_list, task_caps};
/// let allow = default_set();
/// let sets = task_caps(allow, &[], &["chown".into()]).unwrap();
/// assert_eq!(sets.bounding & (1 << 0), 0); // CAP_CHOWN dropped
/// let err = task_caps(allow, &["sys_admin".into()], &[]).unwrap_err();
/// assert!(err.to_string().contains("sys_admin"));
/// ```
pub fn task_caps(
    allow: CapSet,
    cap_add: &[String],
    cap_drop: &[String],
) -> Result<CapabilitySets, DriverError> {
    let add = parse_list("cap_add", cap_add)?;
    let drop = parse_list("cap_drop", cap_drop)?;
    let refused = add & !allow;
    if refused != 0 {
        return Err(DriverError::InvalidConfig(format!(
            "cap_add asks for {} outside the plugin's allow_caps ({}); an operator must add \
             {} to allow_caps in the plugin config first",
            names(refused),
            names(allow),
            if refused.count_ones() == 1 {
                "it"
            } else {
                "them"
            }
        )));
    }
    let base = default_set() & allow;
    Ok(CapabilitySets {
        bounding: (base | add) & !drop,
        ambient: add & !drop,
    })
}

/// The names of the capabilities in `mask`.
pub fn mask_names(mask: u64) -> Vec<String> {
    let mut set: Vec<Capability> = caps::all()
        .into_iter()
        .filter(|c| mask & c.bitmask() != 0)
        .collect();
    set.sort_by_key(Capability::index);
    set.into_iter().map(short_name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn defaults_within_the_allowlist() {
        let allow = parse_list("allow_caps", &s(&["chown", "kill", "net_admin"])).unwrap();
        let sets = task_caps(allow, &[], &[]).unwrap();
        assert_eq!(mask_names(sets.bounding), ["chown", "kill"]);
        assert_eq!(sets.ambient, 0);
        let sets = task_caps(allow, &s(&["NET_ADMIN"]), &s(&["kill"])).unwrap();
        assert_eq!(mask_names(sets.bounding), ["chown", "net_admin"]);
        assert_eq!(mask_names(sets.ambient), ["net_admin"]);
    }

    #[test]
    fn refusal_names_every_capability_outside_the_allowlist() {
        let err = task_caps(
            default_set(),
            &s(&["sys_admin", "chown", "sys_ptrace"]),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("asks for sys_ptrace, sys_admin outside"),
            "only the refused ones are named as refused: {err}"
        );
    }

    #[test]
    fn all_and_unknown_names() {
        let all = parse_list("allow_caps", &s(&["all"])).unwrap();
        assert!(all.count_ones() > 30);
        let sets = task_caps(all, &s(&["sys_admin"]), &s(&["all"])).unwrap();
        assert_eq!((sets.bounding, sets.ambient), (0, 0));
        let err = parse_list("cap_drop", &s(&["cap_foo"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cap_drop") && err.contains("cap_foo"), "{err}");
    }
}
