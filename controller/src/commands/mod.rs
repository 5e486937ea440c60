//! One module per top-level subcommand.

pub mod config;
pub mod reconcile;
