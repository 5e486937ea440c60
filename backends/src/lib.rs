//! Where commands run, and how hermes sees the sandboxes that exist.
//!
//! One execution trait for every backend of `terminal.backend` (local,
//! docker through bollard, ssh through russh, singularity, modal, daytona,
//! vercel_sandbox), and the observers that read the Docker world by label
//! into the `Observed` value the planners take. This crate does IO; the
//! decisions stay in `reconcilers`.
