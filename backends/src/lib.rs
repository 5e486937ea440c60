//! Where commands run, and how hermes sees the sandboxes that exist.
//!
//! One execution trait for every backend of `terminal.backend` (local,
//! docker through bollard, ssh through russh, singularity, modal, daytona,
//! vercel_sandbox), and the observers that read the Docker world by label
//! into the `Observed` value the planners take. This crate does IO; the
//! decisions stay in `reconcilers`.
//!
//! - [`exec`]: what every backend's exec shares: the request and outcome,
//!   and the [`exec::Executor`] trait (a Docker container and an SSH host
//!   both are one).
//! - [`docker`]: the Docker engine through bollard: observing labelled
//!   containers, idempotent create/start/remove, image pulls, and exec with
//!   live output and timeouts that kill the whole process tree.
//! - [`ssh`]: a remote host through russh: trust on first use into an
//!   OpenSSH `known_hosts`, exec with live output and remote tree kill, a
//!   remote port forward, and the holder that keeps one connection open for
//!   every hermes process.
//! - [`singularity`]: Apptainer (or SingularityCE) as a program on this
//!   host: the image cached as a SIF, instances on an overlay, exec with
//!   values in the environment and timeouts that kill the tree inside.
//! - [`cloud`]: the life cycle the remote sandbox services share (create,
//!   resume, suspend to a snapshot, destroy, exec, files) and their retry
//!   rule.

pub mod cloud;
pub mod docker;
pub mod exec;
pub mod singularity;
pub mod ssh;

/// The model crate this crate's API speaks ([`model::sandbox::SandboxSpec`],
/// [`model::observed::ObservedContainer`], …), re-exported so users of the
/// backends need no second dependency to name those types.
pub use hermes_model as model;
