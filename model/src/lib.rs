//! The pure data model of hermes: no IO, no async runtime, no clock.
//!
//! - [`action`]: the operations of the host plan.
//! - [`adoption`]: comparing a sandbox Hermes Agent made with the one hermes wants.
//! - [`yaml`]: a positioned YAML tree, read with limits against hostile input.
//! - [`value`]: plain config values, the merged view, YAML and JSON rendering.
//! - [`schema`]: every known key with its type and default.
//! - [`config`]: text → validated, typed [`config::Config`], errors with key path and line.
//! - [`keypath`]: dotted key paths, with quoted keys for names holding a dot.
//! - [`edit`]: `config set`/`unset` as text edits that keep comments and order.
//! - [`dotenv`]: reading and editing `.env` files.
//! - [`migration`]: moving a sandbox's data from hermes's earlier layout to the one it shares with Hermes Agent.
//! - [`names`]: the one rule for task, session and profile names (paths, labels).
//! - [`desired`]: what the host should look like, derived from the config.
//! - [`sandbox`]: the Docker sandbox wanted: names, labels, hardened spec, spec hash.
//! - [`observed`]: the labelled containers a pass saw.
//! - [`homes`]: which hermes home a container belongs to.
//! - [`profiles`]: Hermes Agent's profiles: which profile a home is, which home a profile is.
//! - [`singularity`]: the Apptainer instance wanted: image cache, overlay, egress wiring.
//! - [`ssh`]: the remote host of the SSH backend: target, workspace, what a pass found.
//! - [`cloud`]: the remote sandbox services: credentials, the sandbox wanted, snapshot records.
//! - [`plan`]: the operations a pass would carry out, each with its cause.

pub mod action;
pub mod adoption;
pub mod cloud;
pub mod config;
pub mod desired;
pub mod dotenv;
pub mod edit;
pub mod egress;
pub mod fingerprint;
pub mod homes;
pub mod keypath;
pub mod kubernetes;
pub mod migration;
pub mod names;
pub mod observed;
pub mod plan;
pub mod profiles;
pub mod providers;
pub mod redact;
pub mod sandbox;
pub mod schema;
pub mod settings;
pub mod singularity;
pub mod ssh;
pub mod value;
pub mod yaml;

/// Seconds since the Unix epoch of `t`; times before it read as 0. Pure:
/// the caller says when.
pub fn unix_seconds(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
