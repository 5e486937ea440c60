//! The pure planners: given what the config wants ([`Desired`]), what
//! exists ([`Observed`]) and the time, decide what one pass does. No IO, no
//! async runtime, no clock of their own: the same inputs always give the
//! same [`Plan`], which is what makes `--dry-run` trustworthy and the rules
//! testable in milliseconds.

use std::time::SystemTime;

use hermes_model::config::Backend;
use hermes_model::desired::Desired;
use hermes_model::plan::{Describe, Kind, Op, Plan, Target};

/// Everything a pass saw on the host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {}

/// What one operation of the host's plan does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The configured backend cannot be driven by this build.
    Unsupported,
}

impl Describe for Action {
    fn kind(&self) -> Kind {
        match self {
            Action::Unsupported => Kind::Blocked,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            Action::Unsupported => "blocked",
        }
    }
}

/// Plans one pass over every part of the host.
pub fn plan_all(desired: &Desired, _observed: &Observed, _now: SystemTime) -> Plan<Action> {
    let mut ops = Vec::new();
    match desired.backend() {
        // Commands run on the host itself: there is nothing to converge.
        Backend::Local => {}
        other => ops.push(Op {
            target: Target::Sandbox {
                profile: desired.profile.clone(),
                task: "default".to_string(),
                session: None,
            },
            action: Action::Unsupported,
            cause: format!("the {other} backend is not available in this build"),
        }),
    }
    Plan::new(ops)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use hermes_model::config::Config;

    #[test]
    fn the_local_backend_has_nothing_to_converge() {
        let desired = Desired::new(Config::default(), "default").unwrap();
        let plan = plan_all(&desired, &Observed::default(), SystemTime::UNIX_EPOCH);
        assert!(!plan.is_pending());
        assert_eq!(plan.to_string(), "No changes. The host is converged.");
    }
}
