//! Reaching an upstream without being turned against the host: resolve
//! (`proxy.resolve` first, then the system resolver), refuse when any
//! answer lies in a deny range, dial only the addresses that were checked,
//! and check the connected peer once more.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

use crate::policy::{Denied, DenyList, Host};
use crate::target::Target;

/// How long one TCP connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a lookup may take.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("{0}")]
    Denied(#[from] Denied),
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("{host} has no address")]
    NoAddress { host: String },
    #[error("cannot connect to {target}: {source}")]
    Connect {
        target: String,
        source: std::io::Error,
    },
}

impl DialError {
    /// The word in the refusal header and the access log.
    pub fn reason(&self) -> &'static str {
        match self {
            DialError::Denied(_) => "denied-address",
            DialError::Resolve { .. } | DialError::NoAddress { .. } => "resolve-failed",
            DialError::Connect { .. } => "connect-failed",
        }
    }
}

/// Resolves `target` and checks every answer: one denied answer refuses
/// the whole name (a name that sometimes points inside is not trusted).
pub async fn resolve(
    target: &Target,
    overrides: &BTreeMap<String, IpAddr>,
    deny: &DenyList,
) -> Result<Vec<SocketAddr>, DialError> {
    let addrs: Vec<SocketAddr> = match &target.host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
        Host::Name(name) => match overrides.get(name) {
            Some(ip) => vec![SocketAddr::new(*ip, target.port)],
            None => {
                let lookup = tokio::net::lookup_host((name.as_str(), target.port));
                match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
                    Ok(Ok(found)) => found.collect(),
                    Ok(Err(source)) => {
                        return Err(DialError::Resolve {
                            host: name.clone(),
                            source,
                        });
                    }
                    Err(_) => {
                        return Err(DialError::Resolve {
                            host: name.clone(),
                            source: std::io::ErrorKind::TimedOut.into(),
                        });
                    }
                }
            }
        },
    };
    if addrs.is_empty() {
        return Err(DialError::NoAddress {
            host: target.host.to_string(),
        });
    }
    for addr in &addrs {
        deny.check(addr.ip())?;
    }
    Ok(addrs)
}

/// Connects to the first of `addrs` that answers, checking each address
/// before dialling it and the connected peer after; the stream and the
/// peer's address.
pub async fn connect(
    addrs: &[SocketAddr],
    deny: &DenyList,
) -> Result<(TcpStream, SocketAddr), DialError> {
    let mut last = None;
    for addr in addrs {
        deny.check(addr.ip())?;
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let peer = stream.peer_addr().map_err(|source| DialError::Connect {
                    target: addr.to_string(),
                    source,
                })?;
                deny.check(peer.ip())?;
                // Small request heads and SSE events go out at once.
                let _ = stream.set_nodelay(true);
                return Ok((stream, peer));
            }
            Ok(Err(e)) => last = Some((addr, e)),
            Err(_) => last = Some((addr, std::io::ErrorKind::TimedOut.into())),
        }
    }
    let (addr, source) = match last {
        Some((addr, e)) => (addr.to_string(), e),
        None => (String::new(), std::io::ErrorKind::AddrNotAvailable.into()),
    };
    Err(DialError::Connect {
        target: addr,
        source,
    })
}

/// How often the host's own addresses are read again.
pub const HOST_ADDRS_EVERY: Duration = Duration::from_secs(2);

/// The addresses of this host's interfaces, except its loopback
/// interfaces (`IFF_LOOPBACK`), whose addresses the deny list governs.
pub fn host_addrs() -> Vec<IpAddr> {
    let Ok(all) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out: Vec<IpAddr> = all
        .filter(|ifa| {
            !ifa.flags
                .contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)
        })
        .filter_map(|ifa| {
            let addr = ifa.address?;
            addr.as_sockaddr_in()
                .map(|a| IpAddr::V4(a.ip()))
                .or_else(|| addr.as_sockaddr_in6().map(|a| IpAddr::V6(a.ip())))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Keeps `host` on this host's current addresses: read now, then every
/// [`HOST_ADDRS_EVERY`] (interfaces come and go: Docker networks, VPNs).
pub async fn watch_host_addrs(host: std::sync::Arc<crate::policy::HostAddrs>) {
    loop {
        host.set(host_addrs());
        tokio::time::sleep(HOST_ADDRS_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::target::parse_connect;

    #[tokio::test]
    async fn names_resolving_into_denied_ranges_are_refused() {
        let deny = DenyList::default();
        let overrides: BTreeMap<String, IpAddr> = [
            (
                "metadata.test".to_string(),
                "169.254.169.254".parse().unwrap(),
            ),
            (
                "mapped.test".to_string(),
                "::ffff:10.0.0.1".parse().unwrap(),
            ),
            ("public.test".to_string(), "8.8.8.8".parse().unwrap()),
        ]
        .into();
        for name in [
            "metadata.test:443",
            "mapped.test:443",
            "localhost:443",
            "127.1:443",
        ] {
            let err = resolve(&parse_connect(name).unwrap(), &overrides, &deny)
                .await
                .unwrap_err();
            assert_eq!(err.reason(), "denied-address", "{name}: {err}");
        }
        let ok = resolve(
            &parse_connect("public.test:443").unwrap(),
            &overrides,
            &deny,
        )
        .await
        .unwrap();
        assert_eq!(ok, vec!["8.8.8.8:443".parse().unwrap()]);
    }

    #[tokio::test]
    async fn a_denied_address_is_never_dialled() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let err = connect(&[addr], &DenyList::default()).await.unwrap_err();
        assert_eq!(err.reason(), "denied-address");
        // The same address under a list without 127/8 connects; and that
        // is the first connection the listener has (it accepts in order):
        // nothing reached it before.
        let open = DenyList::new(vec!["169.254.0.0/16".parse().unwrap()]);
        let (stream, _) = connect(&[addr], &open).await.unwrap();
        let (_, first) = listener.accept().await.unwrap();
        assert_eq!(first, stream.local_addr().unwrap());
    }
}

#[cfg(test)]
mod host_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::policy::HostAddrs;

    #[test]
    fn the_hosts_own_addresses_are_refused_whatever_the_list() {
        let host = std::sync::Arc::new(HostAddrs::default());
        host.set(vec!["198.51.100.7".parse().unwrap()]);
        let deny = DenyList::new(vec!["192.0.2.0/24".parse().unwrap()]).with_host_addrs(host);
        for addr in ["198.51.100.7", "::ffff:198.51.100.7"] {
            let err = deny.check(addr.parse().unwrap()).unwrap_err();
            assert!(
                matches!(err, crate::policy::Denied::HostAddress { .. }),
                "{err}"
            );
        }
        assert!(deny.check("198.51.100.8".parse().unwrap()).is_ok());
        // Loopback interfaces are left to the list.
        assert!(!host_addrs().iter().any(IpAddr::is_loopback));
    }
}
