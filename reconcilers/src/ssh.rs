//! The SSH backend's planner: the host must be reachable over a trusted
//! key and the default task's workspace must exist on it. Planned from
//! what the holder reported this pass; no report, no operation. With the
//! egress proxy enforced on SSH (`proxy.enforce_on_ssh`) and not ready,
//! the host is blocked: its commands would be refused (fail closed).

use hermes_model::action::{Action, SshAction};
use hermes_model::desired::{DEFAULT_TASK, Desired};
use hermes_model::observed::Observed;
use hermes_model::plan::{Op, Target};
use hermes_model::ssh::{SshObserved, remote_workspace};

/// The backend's planner ([`crate::Planner`]): [`plan`]'s operations.
pub fn planner(desired: &Desired, observed: &Observed, _now: i64) -> crate::BackendOps {
    crate::BackendOps {
        own: plan(desired, observed),
        ..crate::BackendOps::default()
    }
}

/// The operations on the SSH backend's host.
pub fn plan(desired: &Desired, observed: &Observed) -> Vec<Op<Action>> {
    let Some(target) = &desired.ssh else {
        return Vec::new();
    };
    let target = match target {
        Ok(target) => target,
        Err(missing) => {
            return vec![Op {
                changes: Vec::new(),
                target: Target::Ssh {
                    dest: "(no host)".to_string(),
                },
                action: Action::Blocked,
                cause: missing.clone(),
            }];
        }
    };
    let on = Target::Ssh {
        dest: target.to_string(),
    };
    let blocked = |cause: String| {
        vec![Op {
            changes: Vec::new(),
            target: on.clone(),
            action: Action::Blocked,
            cause,
        }]
    };
    let path = match remote_workspace(&desired.profile, DEFAULT_TASK) {
        Ok(path) => path,
        Err(e) => return blocked(e.to_string()),
    };
    let prepare = |cause: String| {
        vec![Op {
            changes: Vec::new(),
            target: on.clone(),
            action: Action::Ssh(SshAction::PrepareWorkspace { path: path.clone() }),
            cause,
        }]
    };
    if let Some(reason) = crate::proxy::fail_closed_reason(desired, &observed.proxy) {
        return blocked(reason);
    }
    match &observed.ssh {
        None | Some(SshObserved::Ready { workspace: true }) => Vec::new(),
        Some(SshObserved::Ready { workspace: false }) => {
            prepare(format!("workspace ~/{path} does not exist"))
        }
        Some(SshObserved::NewHost { fingerprint }) => prepare(format!(
            "workspace ~/{path}; new host, its key {fingerprint} is trusted on first use"
        )),
        Some(SshObserved::HostKeyChanged { detail }) => {
            blocked(format!("host key changed: {detail}"))
        }
        Some(SshObserved::Unreachable { reason }) => blocked(format!("unreachable: {reason}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;
    use std::time::SystemTime;

    use hermes_model::config::load;
    use hermes_model::desired::{Egress, HostEnv};

    use super::*;
    use crate::plan_all;

    fn desired(config: &str) -> Desired {
        let mut env = HostEnv::default();
        env.process.insert("USER".into(), "me".into());
        Desired::build(
            load(config).unwrap().config,
            "default",
            Path::new("/h"),
            &env,
        )
        .unwrap()
    }

    fn plan_text(config: &str, ssh: Option<SshObserved>) -> String {
        plan_of(&desired(config), ssh)
    }

    fn plan_of(desired: &Desired, ssh: Option<SshObserved>) -> String {
        let observed = Observed {
            ssh,
            ..Observed::default()
        };
        plan_all(desired, &observed, SystemTime::UNIX_EPOCH).to_string()
    }

    const SSH: &str = "terminal:\n  backend: ssh\n  ssh_host: box\n  ssh_port: 2222\n";

    #[test]
    fn a_ready_host_with_its_workspace_is_converged() {
        assert_eq!(
            plan_text(SSH, Some(SshObserved::Ready { workspace: true })),
            "No changes. The host is converged."
        );
    }

    #[test]
    fn a_missing_workspace_is_prepared() {
        assert_eq!(
            plan_text(SSH, Some(SshObserved::Ready { workspace: false })),
            "+ ssh me@box:2222   prepare     workspace ~/.hermes-sandbox/default/default/workspace does not exist\n\
             Plan: 1 to create, 0 to change, 0 to remove."
        );
    }

    #[test]
    fn a_new_host_shows_the_key_it_will_trust() {
        let text = plan_text(
            SSH,
            Some(SshObserved::NewHost {
                fingerprint: "SHA256:abc".into(),
            }),
        );
        assert!(
            text.starts_with("+ ssh me@box:2222   prepare     workspace ~/.hermes-sandbox/default/default/workspace; new host, its key SHA256:abc is trusted on first use\n"),
            "{text}"
        );
    }

    #[test]
    fn a_changed_key_and_an_unreachable_host_are_blocked() {
        let text = plan_text(
            SSH,
            Some(SshObserved::HostKeyChanged {
                detail: "SHA256:old -> SHA256:new".into(),
            }),
        );
        assert_eq!(
            text,
            "! ssh me@box:2222   blocked     host key changed: SHA256:old -> SHA256:new\n\
             Plan: 0 to create, 0 to change, 0 to remove, 1 blocked."
        );
        let text = plan_text(
            SSH,
            Some(SshObserved::Unreachable {
                reason: "connection refused".into(),
            }),
        );
        assert!(
            text.starts_with("! ssh me@box:2222   blocked     unreachable: connection refused\n"),
            "{text}"
        );
    }

    #[test]
    fn an_enforced_proxy_that_is_not_ready_blocks_the_host() {
        let not_set_up = Egress::NotSetUp {
            missing: "ca.crt".into(),
        };
        let mut enforced = desired(&format!("{SSH}proxy:\n  enabled: true\n"));
        enforced.set_egress(not_set_up.clone());
        let text = plan_of(&enforced, Some(SshObserved::Ready { workspace: true }));
        assert!(
            text.contains(
                "! ssh me@box:2222   blocked     egress proxy not set up (ca.crt) (fail closed)\n"
            ),
            "{text}"
        );
        let mut not_enforced = desired(&format!(
            "{SSH}proxy:\n  enabled: true\n  enforce_on_ssh: false\n"
        ));
        not_enforced.set_egress(not_set_up);
        let text = plan_of(&not_enforced, Some(SshObserved::Ready { workspace: true }));
        assert!(!text.contains("ssh me@box:2222"), "{text}");
    }

    #[test]
    fn no_host_is_blocked_and_other_backends_have_no_ssh_operations() {
        let text = plan_text("terminal:\n  backend: ssh\n", None);
        assert!(
            text.starts_with("! ssh (no host)   blocked     terminal.ssh_host is not set\n"),
            "{text}"
        );
        assert_eq!(
            plan_text(
                "terminal:\n  ssh_host: box\n",
                Some(SshObserved::Ready { workspace: false })
            ),
            "No changes. The host is converged."
        );
    }
}
