//! Attacks from inside a sandbox, end to end: each test plays what a
//! hostile sandbox (or a hostile name passed to `hermes exec`) can do, on
//! the real engine and through the real proxy, and checks that hermes
//! holds. One module per front:
//!
//! - [`names`]: task, session and profile names that would walk a path,
//!   and bind sources planted as symlinks;
//! - [`disk`]: a sandbox filling the host's disk;
//! - [`runner`]: the runner's directory forged from inside, a fork bomb
//!   against the timeout, what the sandbox sees of the host;
//! - [`proxy`]: the proxy flooded with connections, a doubled `Host`
//!   header, the host's own addresses, the access log grown without bound;
//! - [`isolation`]: sandboxes reaching each other, two homes sharing a
//!   profile name, config that defeats isolation;
//! - [`network`]: the proxy-only network outliving `enforce_network`;
//! - [`gvisor`]: all of the above that a runtime could change, under
//!   gVisor's runsc: a fork bomb, the kernel and syscalls seen, escapes,
//!   the proxy-only network on gVisor's own network stack;
//! - [`bwrap`]: the `local` backend under bubblewrap: secrets, other
//!   tasks, the host's processes and loopback, escapes, the proxy;
//! - [`controls`]: the exec environment, the metrics listener, the files
//!   and logs hermes writes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bwrap;
mod controls;
mod disk;
mod gvisor;
mod isolation;
mod names;
mod network;
mod proxy;
mod runner;
