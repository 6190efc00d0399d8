//! The default seccomp filter of isolated tasks, in the spirit of Docker's default
//! profile: the system calls an unprivileged container has no business making, and
//! that widen the kernel's attack surface, fail with `EPERM`.
//!
//! Docker's profile is an allowlist (everything else is refused); this one is a
//! denylist over the same ground, so that a task's ordinary system calls, including
//! ones newer than this list, keep working:
//!
//! - new namespaces: `unshare`, and `clone` with a `CLONE_NEW*` flag (the way to a
//!   fresh user namespace with every capability in it), `setns`; `clone3` fails with
//!   `ENOSYS`, as under Docker, because a filter cannot read its flags from memory and
//!   libc falls back to `clone` on `ENOSYS`;
//! - mounts: `mount`, `umount2`, `pivot_root`, the new mount API (`fsopen`, `fsmount`,
//!   `fsconfig`, `fspick`, `move_mount`, `open_tree`, `mount_setattr`);
//! - the kernel keyring, `bpf`, `perf_event_open`, `userfaultfd`, kernel modules,
//!   `kexec`, `reboot`, swap, clock setting, accounting, quotas, `syslog`;
//! - other processes' memory: `ptrace`, `process_vm_readv`/`writev`, `kcmp`,
//!   `pidfd_getfd`, `process_madvise`;
//! - `io_uring` (`io_uring_setup`, `_enter`, `_register`), as Docker since 2023: a
//!   large kernel surface, whose operations (e.g. `IORING_OP_SOCKET`) no filter sees;
//! - `open_by_handle_at` (the "shocker" escape), `lookup_dcookie`, NUMA page moves,
//!   `AF_VSOCK` sockets, and `personality` other than the values Docker allows;
//! - on x86-64, system calls of another ABI (32-bit x86) kill the task, and x32
//!   numbers fail with `ENOSYS`: they would otherwise bypass a list of x86-64 numbers.
//!
//! The plugin builds the program once ([`Policy::program`]); each task's executor
//! installs it after `no_new_privs`, right before `exec`. The kernel caches the
//! verdict of every system call whose verdict does not depend on its arguments, so
//! allowed calls cost next to nothing.

use std::collections::{BTreeMap, BTreeSet};

use drover_executor::BpfInstruction;
use drover_plugin_sdk::DriverError;
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

/// One denied system call: its name, and its number on this architecture.
type Entry = (&'static str, i64);

macro_rules! sys {
    ($($name:ident),* $(,)?) => {
        [$((stringify!($name), libc::$name as i64)),*]
    };
}

/// Denied whatever their arguments, on every architecture we build for.
const DENIED: [Entry; 53] = sys![
    SYS_setns,
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
    SYS_move_mount,
    SYS_open_tree,
    SYS_fsopen,
    SYS_fsconfig,
    SYS_fsmount,
    SYS_fspick,
    SYS_mount_setattr,
    SYS_keyctl,
    SYS_add_key,
    SYS_request_key,
    SYS_bpf,
    SYS_perf_event_open,
    SYS_userfaultfd,
    SYS_kexec_load,
    SYS_kexec_file_load,
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
    SYS_reboot,
    SYS_swapon,
    SYS_swapoff,
    SYS_settimeofday,
    SYS_clock_settime,
    SYS_clock_adjtime,
    SYS_adjtimex,
    SYS_acct,
    SYS_quotactl,
    SYS_quotactl_fd,
    SYS_syslog,
    SYS_sethostname,
    SYS_setdomainname,
    SYS_vhangup,
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_kcmp,
    SYS_pidfd_getfd,
    SYS_process_madvise,
    SYS_open_by_handle_at,
    SYS_lookup_dcookie,
    SYS_fanotify_init,
    SYS_mbind,
    SYS_set_mempolicy,
    SYS_set_mempolicy_home_node,
    SYS_migrate_pages,
    SYS_move_pages,
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
];

/// Denied on x86-64 only (the others have no such calls).
#[cfg(target_arch = "x86_64")]
const DENIED_ARCH: [Entry; 5] = sys![
    SYS_iopl,
    SYS_ioperm,
    SYS_uselib,
    SYS__sysctl,
    SYS_nfsservctl
];
#[cfg(not(target_arch = "x86_64"))]
const DENIED_ARCH: [Entry; 0] = [];

/// Denied only with some arguments (the rules are in [`conditional_rules`]).
const CONDITIONAL: [Entry; 4] = sys![SYS_clone, SYS_unshare, SYS_socket, SYS_personality];

/// `clone3` answers `ENOSYS` (its flags live in memory a filter cannot read).
const CLONE3: Entry = ("clone3", libc::SYS_clone3);

/// `CLONE_NEW*` flags refused in `clone`: Docker's mask, 0x7E020000.
const CLONE_NS_FLAGS: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];
/// `unshare` also takes `CLONE_NEWTIME` (in `clone` that bit is part of the exit signal).
const CLONE_NEWTIME: u64 = 0x80;
/// `personality` values Docker allows: PER_LINUX, PER_LINUX32, with UNAME26, and the
/// query. Anything else (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, …) is refused.
const PERSONALITY_OK: [u64; 5] = [0, 8, 0x20000, 0x20008, 0xffff_ffff];
/// `AF_VSOCK`: talks to the hypervisor, refused as by Docker.
const AF_VSOCK: u64 = 40;
/// Set in a syscall number of the x32 ABI (x86-64's `__X32_SYSCALL_BIT`).
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Every name the default filter denies (or, for `clone3`, answers `ENOSYS`), sorted:
/// the names `seccomp_allow` accepts.
///
/// ```
/// let names = drover_isolation::seccomp::denied_names();
/// assert!(names.contains(&"keyctl") && names.contains(&"unshare"));
/// assert!(!names.contains(&"read"));
/// ```
pub fn denied_names() -> Vec<&'static str> {
    let mut v: Vec<&str> = all_entries().map(|(n, _)| n).collect();
    v.sort_unstable();
    v
}

fn all_entries() -> impl Iterator<Item = Entry> {
    DENIED
        .into_iter()
        .chain(DENIED_ARCH)
        .chain(CONDITIONAL)
        .chain([CLONE3])
        .map(|(n, nr)| (n.strip_prefix("SYS_").unwrap_or(n), nr))
}

/// `seccomp` in the plugin config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The default filter, less `seccomp_allow`.
    #[default]
    Default,
    /// No filter at all.
    Unconfined,
}

/// What a plugin's tasks may not call: the default filter less the allowed names, or
/// nothing.
///
/// ```
/// use drover_isolation::seccomp::{Mode, Policy};
/// let p = Policy::new(Mode::Default, &["ptrace".to_string()]).unwrap();
/// assert!(p.program().is_some());
/// let err = Policy::new(Mode::Default, &["keyctll".to_string()]).unwrap_err();
/// assert!(err.to_string().contains("keyctll"));
/// assert!(Policy::new(Mode::Unconfined, &[]).unwrap().program().is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    program: Option<Vec<BpfInstruction>>,
}

impl Default for Policy {
    /// The default filter.
    fn default() -> Self {
        // Built from constants only; `the_default_program_fits_and_is_deterministic`
        // proves it builds.
        #[allow(clippy::expect_used)]
        Policy::new(Mode::Default, &[]).expect("the default seccomp filter builds")
    }
}

impl Policy {
    /// The policy of `mode`, with the system calls named in `allow` let through.
    /// A name the default filter does not deny is an error naming it.
    pub fn new(mode: Mode, allow: &[String]) -> Result<Policy, DriverError> {
        let known = denied_names();
        let mut allowed = BTreeSet::new();
        for name in allow {
            let n = name.trim();
            if !known.contains(&n) {
                return Err(DriverError::InvalidConfig(format!(
                    "seccomp_allow: {name:?} is not a system call the default filter denies; \
                     it denies: {}",
                    known.join(", ")
                )));
            }
            allowed.insert(n);
        }
        if allowed.contains(CLONE3.0) && !(allowed.contains("clone") && allowed.contains("unshare"))
        {
            return Err(DriverError::InvalidConfig(
                "seccomp_allow: \"clone3\" needs \"clone\" and \"unshare\" allowed too: \
                 a filter cannot see clone3's flags, so allowing it alone would let \
                 clone3(CLONE_NEWUSER) through while clone and unshare still refuse new \
                 namespaces"
                    .into(),
            ));
        }
        if mode == Mode::Unconfined {
            if !allow.is_empty() {
                return Err(DriverError::InvalidConfig(
                    "seccomp_allow has no effect with seccomp = \"unconfined\" (no filter at \
                     all); remove one of them"
                        .into(),
                ));
            }
            return Ok(Policy { program: None });
        }
        let program = build(&allowed)
            .map_err(|e| DriverError::Internal(format!("cannot build the seccomp filter: {e}")))?;
        Ok(Policy {
            program: Some(program),
        })
    }

    /// The filter to install in each task, or `None` for no filter.
    pub fn program(&self) -> Option<&Vec<BpfInstruction>> {
        self.program.as_ref()
    }
}

fn masked_set(arg: u8, flag: u64) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(vec![SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(flag),
        flag,
    )?])
}

/// The rules under which [`CONDITIONAL`] calls are denied (any rule matching denies).
fn conditional_rules(name: &str) -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    match name {
        "clone" => CLONE_NS_FLAGS.iter().map(|&f| masked_set(0, f)).collect(),
        "unshare" => CLONE_NS_FLAGS
            .iter()
            .chain([&CLONE_NEWTIME])
            .map(|&f| masked_set(0, f))
            .collect(),
        "socket" => Ok(vec![SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            AF_VSOCK,
        )?])?]),
        "personality" => Ok(vec![SeccompRule::new(
            PERSONALITY_OK
                .iter()
                .map(|&v| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, v))
                .collect::<Result<_, _>>()?,
        )?]),
        _ => Ok(Vec::new()),
    }
}

fn target_arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())
}

/// A small prelude (the `ENOSYS` answers) followed by seccompiler's program for the
/// `EPERM` denials. The prelude only returns or falls through to the next
/// instruction, so the program after it runs exactly as compiled.
fn build(allowed: &BTreeSet<&str>) -> Result<Vec<BpfInstruction>, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (name, nr) in all_entries() {
        if allowed.contains(name) || name == CLONE3.0 {
            continue;
        }
        rules.insert(nr, conditional_rules(name).map_err(|e| e.to_string())?);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        target_arch()?,
    )
    .map_err(|e| e.to_string())?;
    let main: seccompiler::BpfProgram = filter.try_into().map_err(|e| format!("{e}"))?;

    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    #[cfg(target_arch = "x86_64")]
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const NR_OFFSET: u32 = 0; // seccomp_data.nr
    let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    let ins = |code, jt, jf, k| BpfInstruction { code, jt, jf, k };
    let mut prelude = vec![ins(LD_W_ABS, 0, 0, NR_OFFSET)];
    if !allowed.contains(CLONE3.0) {
        // nr == clone3 → ENOSYS, else skip the return.
        prelude.push(ins(JEQ_K, 0, 1, CLONE3.1 as u32));
        prelude.push(ins(RET_K, 0, 0, enosys));
    }
    #[cfg(target_arch = "x86_64")]
    {
        // The architecture is checked first thing by the main program (another one
        // kills the task); on x86-64 itself, x32 numbers carry this bit.
        prelude.push(ins(JGE_K, 0, 1, X32_SYSCALL_BIT));
        prelude.push(ins(RET_K, 0, 0, enosys));
    }
    prelude.extend(main.into_iter().map(|i| BpfInstruction {
        code: i.code,
        jt: i.jt,
        jf: i.jf,
        k: i.k,
    }));
    Ok(prelude)
}

/// The program as the kernel takes it.
pub(crate) fn to_sock_filters(program: &[BpfInstruction]) -> Vec<seccompiler::sock_filter> {
    program
        .iter()
        .map(|i| seccompiler::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_denied_name_is_distinct_and_allowable() {
        let names = denied_names();
        let set: BTreeSet<_> = names.iter().collect();
        assert_eq!(set.len(), names.len(), "a name twice: {names:?}");
        let all: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let p = Policy::new(Mode::Default, &all).unwrap();
        // Nothing left to deny but the prelude's x32 check and the arch check.
        assert!(p.program().unwrap().len() < 12, "{:?}", p.program());
    }

    #[test]
    fn bad_names_are_named() {
        for bad in ["read", "keyctl2", ""] {
            let err = Policy::new(Mode::Default, &[bad.to_string()]).unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        for alone in [
            &["clone3"][..],
            &["clone3", "clone"][..],
            &["clone3", "unshare"][..],
        ] {
            let names: Vec<String> = alone.iter().map(|s| s.to_string()).collect();
            let err = Policy::new(Mode::Default, &names).unwrap_err();
            assert!(
                err.to_string().contains("CLONE_NEWUSER"),
                "{alone:?}: {err}"
            );
        }
        let names = ["clone3", "clone", "unshare"].map(String::from);
        Policy::new(Mode::Default, &names).unwrap();
        let err = Policy::new(Mode::Unconfined, &["bpf".into()]).unwrap_err();
        assert!(err.to_string().contains("unconfined"), "{err}");
    }

    #[test]
    fn the_default_program_fits_and_is_deterministic() {
        let a = Policy::default();
        let b = Policy::new(Mode::Default, &[]).unwrap();
        assert_eq!(a, b);
        let n = a.program().unwrap().len();
        assert!(n > 100 && n < 4096, "{n} instructions");
    }
}
