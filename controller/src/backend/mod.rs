//! The backends, and [`of`]: the one place the configured backend is
//! picked. Each backend is one implementation of [`crate::seam::Backend`]
//! in a module of its own here (its IO and glue), with its pure planner in
//! `hermes_reconcilers`. Adding one is its module, its planner, and its
//! line in [`of`].

pub mod cloud;
pub mod docker;
pub mod kubernetes;
pub mod local;
pub mod singularity;
pub mod ssh;

use hermes_model::config::Backend as Configured;
use hermes_model::desired::Desired;

use crate::seam::Backend;

/// The backend `desired` runs on.
pub fn of(desired: &Desired) -> &'static dyn Backend {
    match desired.backend() {
        Configured::Local => &local::Local,
        Configured::Docker => &docker::Docker,
        Configured::Ssh => &ssh::Ssh,
        Configured::Singularity => &singularity::Singularity,
        Configured::Kubernetes => &kubernetes::Kubernetes,
        Configured::Modal => &cloud::Cloud(Configured::Modal),
        Configured::Daytona => &cloud::Cloud(Configured::Daytona),
        Configured::VercelSandbox => &cloud::Cloud(Configured::VercelSandbox),
    }
}

/// Whether a pass of `desired` needs a Docker engine, and fails without
/// one: the Docker backend, or the proxy's proxy-only network
/// (`proxy.enforce_network`), which lives in Docker. Any other pass looks
/// at an engine only when one answers
/// ([`crate::observe::optional_engine`]).
pub fn needs_docker(desired: &Desired) -> bool {
    let proxy = &desired.config.proxy;
    of(desired).needs_docker() || (proxy.enabled && proxy.enforce_network)
}
