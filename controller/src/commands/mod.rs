//! One module per top-level subcommand.

pub mod config;
pub mod exec;
pub mod reconcile;
pub mod sandbox;
