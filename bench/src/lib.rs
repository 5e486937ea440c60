//! The pieces hermes's benchmark binaries share: `bench-docker` (warm
//! exec, reattach, no-op reconcile), `bench-reap` (reaping exited orphans)
//! and `bench-controller` (the controller's latency and idle cost).
//!
//! - [`harness`]: what a run needs and checks first, its temporary home
//!   and unique profile, the cleanup, the targets and the exit code;
//! - [`fleet`]: labelled containers made through the engine as hermes
//!   makes them, and their removal;
//! - [`run`]: timing one run of a program;
//! - [`stats`]: percentiles and the lines that show them.

pub mod fleet;
pub mod harness;
pub mod run;
pub mod stats;
