//! Profiles as Hermes Agent has them: a profile is a home directory, not a
//! label. `hermes -p NAME` (the agent's, and ours) switches the home to
//! `<root>/profiles/NAME`; the profile a home is follows from its path.
//! Both programs on one host therefore agree on the `hermes-profile`
//! label of a sandbox and on the directory its data lives in.
//!
//! The rules, with every path already canonical (the caller resolves
//! symlinks; this module does no IO):
//!
//! - the **root** of a home is `~/.hermes` when the home is inside it; the
//!   grandparent when the home's parent is called `profiles` (a profile of
//!   a home elsewhere, `/opt/data/profiles/coder`); else the home itself;
//! - a home **is** profile `default` when it is its root, profile `NAME`
//!   when it is `<root>/profiles/NAME` with NAME a profile id of the
//!   agent's, and `custom` otherwise (`~/.hermes/elsewhere`);
//! - profile `NAME`'s home is the root for `default`, else
//!   `<root>/profiles/NAME`.

use std::path::{Path, PathBuf};

/// The profile of a home that is its own root.
pub const DEFAULT: &str = "default";
/// The profile of a home inside `~/.hermes` that is neither the root nor
/// one of its profiles.
pub const CUSTOM: &str = "custom";
/// The directory of the profiles under a root.
pub const PROFILES_DIR: &str = "profiles";
/// The file in a root that names the profile used when none is given
/// (the agent's `hermes profile use NAME`).
pub const ACTIVE_PROFILE_FILE: &str = "active_profile";

/// Whether `name` is a profile id as the agent accepts one:
/// `[a-z0-9][a-z0-9_-]{0,63}`.
pub fn is_profile_id(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    name.len() <= 64
        && (first.is_ascii_lowercase() || first.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The root of `home`, given `native`, the user's `~/.hermes`.
pub fn root_of(home: &Path, native: &Path) -> PathBuf {
    if home.starts_with(native) {
        return native.to_path_buf();
    }
    match home.parent() {
        Some(parent) if parent.file_name().is_some_and(|n| n == PROFILES_DIR) => parent
            .parent()
            .map_or_else(|| home.to_path_buf(), Path::to_path_buf),
        _ => home.to_path_buf(),
    }
}

/// The profile `home` is.
pub fn profile_of(home: &Path, native: &Path) -> String {
    let root = root_of(home, native);
    if home == root {
        return DEFAULT.to_string();
    }
    if let Ok(rel) = home.strip_prefix(root.join(PROFILES_DIR)) {
        let mut parts = rel.components();
        if let (Some(std::path::Component::Normal(name)), None) = (parts.next(), parts.next())
            && let Some(name) = name.to_str()
            && is_profile_id(name)
        {
            return name.to_string();
        }
    }
    CUSTOM.to_string()
}

/// The home of profile `name` under `root`.
pub fn profile_home(root: &Path, name: &str) -> PathBuf {
    if name == DEFAULT {
        root.to_path_buf()
    } else {
        root.join(PROFILES_DIR).join(name)
    }
}

/// Whether a home's path names a profile directly (its parent is
/// `profiles`): then the root's active profile does not apply to it.
pub fn names_a_profile(home: &Path) -> bool {
    home.parent()
        .and_then(Path::file_name)
        .is_some_and(|n| n == PROFILES_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NATIVE: &str = "/home/u/.hermes";

    fn profile(home: &str) -> String {
        profile_of(Path::new(home), Path::new(NATIVE))
    }

    #[test]
    fn a_home_is_the_profile_the_agent_says_it_is() {
        assert_eq!(profile("/home/u/.hermes"), "default");
        assert_eq!(profile("/home/u/.hermes/profiles/coder"), "coder");
        assert_eq!(profile("/home/u/.hermes/profiles/Coder"), "custom");
        assert_eq!(profile("/home/u/.hermes/profiles/a/b"), "custom");
        assert_eq!(profile("/home/u/.hermes/elsewhere"), "custom");
        // Outside ~/.hermes a home is its own root...
        assert_eq!(profile("/srv/agent"), "default");
        assert_eq!(profile("/tmp/xyz"), "default");
        // ...unless its parent is `profiles`.
        assert_eq!(profile("/opt/data/profiles/coder"), "coder");
        assert_eq!(profile("/opt/data/profiles/-x"), "custom");
    }

    #[test]
    fn a_profile_s_home_is_under_the_root_s_profiles() {
        let native = Path::new(NATIVE);
        for home in ["/home/u/.hermes", "/home/u/.hermes/profiles/coder"] {
            let root = root_of(Path::new(home), native);
            assert_eq!(root, native);
            assert_eq!(profile_home(&root, "default"), native);
            assert_eq!(
                profile_home(&root, "ops"),
                Path::new("/home/u/.hermes/profiles/ops")
            );
        }
        let root = root_of(Path::new("/opt/data/profiles/coder"), native);
        assert_eq!(root, Path::new("/opt/data"));
        assert_eq!(
            profile_home(&root, "ops"),
            Path::new("/opt/data/profiles/ops")
        );
        // A profile's home is that profile, both ways.
        for name in ["default", "ops", "a-1_b"] {
            assert_eq!(profile_of(&profile_home(&root, name), native), name);
        }
    }

    #[test]
    fn profile_ids_are_the_agent_s() {
        assert!(is_profile_id("coder"));
        assert!(is_profile_id("0a_b-c"));
        assert!(!is_profile_id(""));
        assert!(!is_profile_id("Coder"));
        assert!(!is_profile_id("_x"));
        assert!(!is_profile_id("a.b"));
        assert!(!is_profile_id(&"a".repeat(65)));
        assert!(is_profile_id(&"a".repeat(64)));
    }
}
