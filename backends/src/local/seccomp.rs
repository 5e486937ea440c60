//! The seccomp filter of a bubblewrap sandbox (`bwrap --seccomp FD`): the
//! system calls that make or enter namespaces, mount, reach other
//! processes' memory, load kernel code, or inject terminal input fail with
//! `EPERM`; everything else is allowed (bubblewrap's namespaces and the
//! read-only host do the rest).
//!
//! The sandboxed process holds no capability, so most of these would fail
//! anyway; the filter closes what an unprivileged process can still do:
//! a user namespace of its own (and with it every namespace and mount),
//! `ptrace` of its siblings, `TIOCSTI` on an inherited terminal, and the
//! kernel's larger attack surfaces (`bpf`, `userfaultfd`, `io_uring`,
//! `perf_event_open`, keyrings).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Why the filter could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the sandbox's seccomp filter: {0}")]
pub struct FilterError(String);

/// The namespace flags of `clone(2)`/`unshare(2)`.
const NAMESPACE_FLAGS: u64 = (libc_consts::CLONE_NEWNS
    | libc_consts::CLONE_NEWCGROUP
    | libc_consts::CLONE_NEWUTS
    | libc_consts::CLONE_NEWIPC
    | libc_consts::CLONE_NEWUSER
    | libc_consts::CLONE_NEWPID
    | libc_consts::CLONE_NEWNET
    | libc_consts::CLONE_NEWTIME) as u64;

/// The kernel's values (x86-64 and aarch64 share them).
mod libc_consts {
    pub const CLONE_NEWTIME: i64 = 0x80;
    pub const CLONE_NEWNS: i64 = 0x0002_0000;
    pub const CLONE_NEWCGROUP: i64 = 0x0200_0000;
    pub const CLONE_NEWUTS: i64 = 0x0400_0000;
    pub const CLONE_NEWIPC: i64 = 0x0800_0000;
    pub const CLONE_NEWUSER: i64 = 0x1000_0000;
    pub const CLONE_NEWPID: i64 = 0x2000_0000;
    pub const CLONE_NEWNET: i64 = 0x4000_0000;
    pub const TIOCSTI: u64 = 0x5412;
    pub const TIOCLINUX: u64 = 0x541C;
}

/// The calls refused whatever their arguments.
const DENIED: &[&str] = &[
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "open_by_handle_at",
    "name_to_handle_at",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "quotactl",
    "lookup_dcookie",
    "vhangup",
    "personality",
];

/// The filters, compiled for this machine's architecture, each as the
/// bytes `bwrap --add-seccomp-fd` reads (each instruction in native byte
/// order). The kernel runs them all and takes the strictest answer: the
/// first refuses with `EPERM`, the second answers `clone3` with `ENOSYS`
/// (its flags are in memory a filter cannot read; the C library then
/// falls back to `clone`, whose flags the first filter reads).
pub fn programs() -> Result<Vec<Vec<u8>>, FilterError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| FilterError(format!("architecture {}: {e:?}", std::env::consts::ARCH)))?;
    let rule = |conditions: Vec<SeccompCondition>| {
        SeccompRule::new(conditions).map_err(|e| FilterError(format!("{e:?}")))
    };
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
            .map_err(|e| FilterError(format!("{e:?}")))
    };
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for name in DENIED {
        if let Some(nr) = syscall_number(name) {
            denied.insert(nr, Vec::new());
        }
    }
    // `clone` with any namespace flag (one rule a flag: any that matches
    // refuses the call).
    if let Some(nr) = syscall_number("clone") {
        let mut flags = Vec::new();
        for bit in 0..64 {
            let flag = 1u64 << bit;
            if NAMESPACE_FLAGS & flag != 0 {
                flags.push(rule(vec![cond(0, SeccompCmpOp::MaskedEq(flag), flag)?])?);
            }
        }
        denied.insert(nr, flags);
    }
    if let Some(nr) = syscall_number("ioctl") {
        denied.insert(
            nr,
            vec![
                rule(vec![cond(1, SeccompCmpOp::Eq, libc_consts::TIOCSTI)?])?,
                rule(vec![cond(1, SeccompCmpOp::Eq, libc_consts::TIOCLINUX)?])?,
            ],
        );
    }
    let mut clone3 = BTreeMap::new();
    if let Some(nr) = syscall_number("clone3") {
        clone3.insert(nr, Vec::new());
    }
    Ok(vec![
        bytes(&filter(denied, arch, SeccompAction::Errno(1))?),
        bytes(&filter(clone3, arch, SeccompAction::Errno(38))?),
    ])
}

fn bytes(program: &BpfProgram) -> Vec<u8> {
    program
        .iter()
        .flat_map(|i| {
            let mut b = Vec::with_capacity(8);
            b.extend_from_slice(&i.code.to_ne_bytes());
            b.push(i.jt);
            b.push(i.jf);
            b.extend_from_slice(&i.k.to_ne_bytes());
            b
        })
        .collect()
}

/// A filter whose listed calls (and matching rules) get `action`, all
/// else allowed.
fn filter(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    arch: TargetArch,
    action: SeccompAction,
) -> Result<BpfProgram, FilterError> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, arch)
        .map_err(|e| FilterError(format!("{e:?}")))?;
    BpfProgram::try_from(filter).map_err(|e| FilterError(format!("{e:?}")))
}

/// The number of a system call on this architecture, by name.
fn syscall_number(name: &str) -> Option<i64> {
    #[cfg(target_arch = "x86_64")]
    const TABLE: &[(&str, i64)] = &[
        ("ioctl", 16),
        ("clone", 56),
        ("ptrace", 101),
        ("personality", 135),
        ("vhangup", 153),
        ("pivot_root", 155),
        ("adjtimex", 159),
        ("chroot", 161),
        ("acct", 163),
        ("settimeofday", 164),
        ("mount", 165),
        ("umount2", 166),
        ("swapon", 167),
        ("swapoff", 168),
        ("reboot", 169),
        ("init_module", 175),
        ("delete_module", 176),
        ("quotactl", 179),
        ("lookup_dcookie", 212),
        ("clock_settime", 227),
        ("add_key", 248),
        ("request_key", 249),
        ("keyctl", 250),
        ("unshare", 272),
        ("perf_event_open", 298),
        ("name_to_handle_at", 303),
        ("open_by_handle_at", 304),
        ("setns", 308),
        ("process_vm_readv", 310),
        ("process_vm_writev", 311),
        ("finit_module", 313),
        ("kexec_load", 246),
        ("kexec_file_load", 320),
        ("bpf", 321),
        ("userfaultfd", 323),
        ("io_uring_setup", 425),
        ("io_uring_enter", 426),
        ("io_uring_register", 427),
        ("open_tree", 428),
        ("move_mount", 429),
        ("fsopen", 430),
        ("fsconfig", 431),
        ("fsmount", 432),
        ("fspick", 433),
        ("clone3", 435),
        ("mount_setattr", 442),
    ];
    #[cfg(not(target_arch = "x86_64"))]
    const TABLE: &[(&str, i64)] = &[];
    TABLE.iter().find(|(n, _)| *n == name).map(|(_, nr)| *nr)
}
