//! Where commands run, and how hermes sees the sandboxes that exist.
//!
//! One execution trait for every backend of `terminal.backend` (local,
//! docker through bollard, ssh through russh, singularity, modal, daytona,
//! vercel_sandbox), and the observers that read the Docker world by label
//! into the `Observed` value the planners take. This crate does IO; the
//! decisions stay in `reconcilers`.
//!
//! - [`exec`]: what every backend's exec shares: the request and outcome,
//!   the [`exec::Executor`] trait (this host, a Docker container, an SSH
//!   host, a singularity instance; the cloud drivers have the same call),
//!   and the terminal contract every backend runs its commands under
//!   ([`exec::terminal_argv`]).
//! - [`local`]: this host (`terminal.backend: local`), a process group per
//!   command.
//! - [`docker`]: the Docker engine through bollard: observing labelled
//!   containers, idempotent create/start/remove, image pulls, and exec with
//!   live output and timeouts that kill the whole process tree.
//! - [`pty`]: a command on a pseudo-terminal of this host (`exec -t` on
//!   the local and singularity backends).
//! - [`host_dir`]: the directories made on the host for a sandbox, never
//!   through a symbolic link.
//! - [`ssh`]: a remote host through russh: trust on first use into an
//!   OpenSSH `known_hosts`, exec with live output and remote tree kill, a
//!   remote port forward, and the holder that keeps one connection open for
//!   every hermes process.
//! - [`singularity`]: Apptainer (or SingularityCE) as a program on this
//!   host: the image cached as a SIF, instances on an overlay, exec with
//!   values in the environment and timeouts that kill the tree inside.
//! - [`background`]: the background processes of `--background` on every
//!   backend: their state in the sandbox and the scripts that read and stop
//!   them.
//! - [`cloud`]: the life cycle the remote sandbox services share (create,
//!   resume, suspend to a snapshot, destroy, exec, files) and their retry
//!   rule.
//! - [`daytona`] (feature `daytona`): Daytona's REST API and sandbox
//!   toolbox, behind [`cloud::CloudDriver`].
//! - [`vercel`] (feature `vercel`): the Vercel Sandbox REST API, behind
//!   [`cloud::CloudDriver`].
//! - [`modal`] (feature `modal`): Modal's sandboxes through
//!   its gRPC API, a [`cloud::CloudDriver`].
//!
//! The three cloud drivers' features are on by default.

pub mod background;
pub mod cloud;
#[cfg(any(feature = "daytona", feature = "vercel"))]
pub mod cloud_http;
#[cfg(feature = "daytona")]
pub mod daytona;
pub mod docker;
pub mod env_header;
pub mod exec;
pub mod host_dir;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub mod local;
#[cfg(feature = "modal")]
pub mod modal;
pub mod pty;
pub mod singularity;
pub mod ssh;
#[cfg(feature = "vercel")]
pub mod vercel;

/// The model crate this crate's API speaks ([`model::sandbox::SandboxSpec`],
/// [`model::observed::ObservedContainer`], …), re-exported so users of the
/// backends need no second dependency to name those types.
pub use hermes_model as model;
