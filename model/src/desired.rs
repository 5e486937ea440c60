//! What the host should look like: derived from the config and the active
//! profile by a pure function. Observed state is compared against this.

use crate::config::{Backend, Config};

/// The desired state of one host for one profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub profile: String,
    pub config: Config,
}

/// Why a profile name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("profile `{0}` must be 1 to 63 characters of letters, digits, `_`, `.` and `-`")]
pub struct BadProfile(pub String);

impl Desired {
    pub fn new(config: Config, profile: &str) -> Result<Desired, BadProfile> {
        let ok = !profile.is_empty()
            && profile.len() <= 63
            && profile
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !ok {
            return Err(BadProfile(profile.to_string()));
        }
        Ok(Desired {
            profile: profile.to_string(),
            config,
        })
    }

    pub fn backend(&self) -> Backend {
        self.config.terminal.backend
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_label_safe_names() {
        assert!(Desired::new(Config::default(), "default").is_ok());
        assert!(Desired::new(Config::default(), "work-2.a_b").is_ok());
        assert!(Desired::new(Config::default(), "").is_err());
        assert!(Desired::new(Config::default(), "a/b").is_err());
        assert!(Desired::new(Config::default(), &"x".repeat(64)).is_err());
    }
}
