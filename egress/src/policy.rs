//! What the proxy lets through, decided without IO: the host allowlist,
//! the deny ranges every dialled address is checked against, and the
//! parsing of hosts in every spelling a client may use (names, IPv4 in
//! decimal, octal, hex and short forms, bracketed IPv6, IPv4 embedded in
//! IPv6).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// A destination host, as parsed from a CONNECT target, a URL or a Host
/// header: a lowercase DNS name or an IP address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Why a host text is not a host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("empty host")]
    Empty,
    #[error("host longer than 253 characters")]
    TooLong,
    #[error("not a valid IPv6 address")]
    BadIpv6,
    #[error("looks numeric but is not a valid IPv4 address")]
    BadNumeric,
    #[error("not a valid host name")]
    BadName,
}

/// Parses a host the way resolvers do, so that no spelling slips past the
/// address checks: `127.1`, `0177.0.0.1`, `0x7f.1` and `2130706433` are all
/// 127.0.0.1; `[::ffff:127.0.0.1]` is an IPv6 address (its embedded IPv4
/// address is checked by [`DenyList::check`]). Names are lowercased and lose
/// one trailing dot. A name whose last label is numeric but which is no
/// valid address (`1.2.3.256`) is refused rather than handed to a resolver.
pub fn parse_host(text: &str) -> Result<Host, HostError> {
    if text.is_empty() {
        return Err(HostError::Empty);
    }
    if text.len() > 255 {
        return Err(HostError::TooLong);
    }
    if let Some(inner) = text.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(HostError::BadIpv6)?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .map_err(|_| HostError::BadIpv6);
    }
    if text.contains(':') {
        return text
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .map_err(|_| HostError::BadIpv6);
    }
    let lower = text.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() {
        return Err(HostError::Empty);
    }
    if let Some(ip) = parse_ipv4_loose(name) {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    let last = name.rsplit('.').next().unwrap_or(name);
    if last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x") {
        return Err(HostError::BadNumeric);
    }
    if name.len() > 253 {
        return Err(HostError::TooLong);
    }
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.split('.').all(valid_label) {
        Ok(Host::Name(name.to_string()))
    } else {
        Err(HostError::BadName)
    }
}

/// IPv4 in the forms `inet_aton` accepts: one to four parts, each decimal,
/// octal (leading `0`) or hex (`0x`); the last part fills the remaining
/// bytes (`127.1`, `10.65536`, `2130706433`).
pub fn parse_ipv4_loose(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(4);
    for part in &parts {
        values.push(parse_ipv4_part(part)?);
    }
    let (last, head) = values.split_last()?;
    let mut addr: u32 = 0;
    for (i, v) in head.iter().enumerate() {
        if *v > 0xff {
            return None;
        }
        addr |= v << (24 - 8 * i as u32);
    }
    let room_bits = 32 - 8 * head.len() as u32;
    if room_bits < 32 && u64::from(*last) >= 1u64 << room_bits {
        return None;
    }
    Some(Ipv4Addr::from(addr | last))
}

fn parse_ipv4_part(part: &str) -> Option<u32> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() {
        // `0x` alone is 0 for inet_aton.
        return (radix == 16).then_some(0);
    }
    if !digits.bytes().all(|b| (b as char).is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

/// The ranges refused when `proxy.upstream_deny_cidrs` is not set: the
/// reference's list and smokescreen's extras, declared once in the model
/// (where `config check` warns about a `proxy.resolve` entry inside them).
pub use hermes_model::config::DEFAULT_UPSTREAM_DENY as DEFAULT_DENY;

/// Why an address may not be dialled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The address (or the IPv4 address embedded in it) lies in a deny range.
    #[error("{addr} lies in the denied range {range}")]
    Range { addr: IpAddr, range: IpNet },
    /// Unspecified, multicast or broadcast: never a destination, whatever
    /// the configured list says.
    #[error("{addr} is not a unicast destination")]
    NotUnicast { addr: IpAddr },
    /// An address of one of this host's own interfaces (other than its
    /// loopback interfaces, which follow the list): never a destination,
    /// whatever the configured list says.
    #[error("{addr} is an address of this host")]
    HostAddress { addr: IpAddr },
}

/// The addresses of this host's own interfaces, except those of its
/// loopback interfaces (which the deny list governs, as it does 127/8):
/// replaced whole while the proxy runs, as interfaces come and go.
#[derive(Debug, Default)]
pub struct HostAddrs(std::sync::RwLock<Vec<IpAddr>>);

impl HostAddrs {
    pub fn set(&self, addrs: Vec<IpAddr>) {
        match self.0.write() {
            Ok(mut a) => *a = addrs,
            Err(poisoned) => *poisoned.into_inner() = addrs,
        }
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = addr.to_canonical();
        match self.0.read() {
            Ok(a) => a.contains(&addr),
            Err(poisoned) => poisoned.into_inner().contains(&addr),
        }
    }
}

/// The ranges no upstream address may lie in, and this host's own
/// addresses.
#[derive(Debug, Clone)]
pub struct DenyList {
    nets: Vec<IpNet>,
    host: std::sync::Arc<HostAddrs>,
}

impl PartialEq for DenyList {
    fn eq(&self, other: &Self) -> bool {
        self.nets == other.nets
    }
}

impl Eq for DenyList {}

impl Default for DenyList {
    fn default() -> Self {
        DenyList::new(
            DEFAULT_DENY
                .iter()
                .filter_map(|net| net.parse().ok())
                .collect(),
        )
    }
}

impl DenyList {
    /// A list that replaces the default one.
    pub fn new(nets: Vec<IpNet>) -> DenyList {
        DenyList {
            nets,
            host: std::sync::Arc::default(),
        }
    }

    /// The same list, also refusing the addresses in `host`.
    pub fn with_host_addrs(mut self, host: std::sync::Arc<HostAddrs>) -> DenyList {
        self.host = host;
        self
    }

    /// `Some(list)` replaces the default list; `None` keeps it.
    pub fn from_config(nets: Option<&[IpNet]>) -> DenyList {
        nets.map_or_else(DenyList::default, |n| DenyList::new(n.to_vec()))
    }

    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    /// Checks one address: the address itself and every IPv4 address an
    /// IPv6 form can carry (IPv4-mapped, IPv4-compatible, NAT64, 6to4,
    /// Teredo), so that `::ffff:169.254.169.254` is refused like
    /// `169.254.169.254` even under a list that only names IPv4 ranges.
    pub fn check(&self, addr: IpAddr) -> Result<(), Denied> {
        let mut candidates = vec![addr];
        if let IpAddr::V6(v6) = addr {
            candidates.extend(embedded_ipv4(v6).into_iter().map(IpAddr::V4));
        }
        for candidate in candidates {
            if !is_unicast(candidate) {
                return Err(Denied::NotUnicast { addr });
            }
            if self.host.contains(candidate) {
                return Err(Denied::HostAddress { addr });
            }
            if let Some(range) = self.nets.iter().find(|net| net.contains(&candidate)) {
                return Err(Denied::Range {
                    addr,
                    range: *range,
                });
            }
        }
        Ok(())
    }
}

fn is_unicast(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()),
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast()),
    }
}

/// The IPv4 addresses an IPv6 address carries in the well-known embeddings.
fn embedded_ipv4(v6: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = v6.segments();
    let o = v6.octets();
    let low32 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    let mut out = Vec::new();
    // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible, deprecated).
    if s[..5] == [0; 5] && (s[5] == 0xffff || (s[5] == 0 && u32::from(low32) > 1)) {
        out.push(low32);
    }
    // 64:ff9b::/96 and 64:ff9b:1::/48 (NAT64).
    if s[0] == 0x64 && s[1] == 0xff9b {
        out.push(low32);
    }
    // 2002:AABB:CCDD::/48 (6to4).
    if s[0] == 0x2002 {
        out.push(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    // 2001:0::/32 (Teredo): the server, and the client with its bits flipped.
    if s[0] == 0x2001 && s[1] == 0 {
        out.push(Ipv4Addr::new(o[4], o[5], o[6], o[7]));
        out.push(Ipv4Addr::from(!u32::from(low32)));
    }
    out
}

/// The hosts a sandbox may reach: exact names, and `*.domain` patterns
/// that match any name below `domain` (not `domain` itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    exact: Vec<String>,
    /// `.domain` for each `*.domain`.
    suffixes: Vec<String>,
}

/// The hosts allowed without any `proxy.extra_allowed_hosts`.
pub const DEFAULT_ALLOWED: &[&str] = &[
    "openrouter.ai",
    "*.openrouter.ai",
    "api.openai.com",
    "api.anthropic.com",
    "generativelanguage.googleapis.com",
    "api.x.ai",
    "api.mistral.ai",
    "api.groq.com",
    "api.together.xyz",
    "api.deepseek.com",
    "inference.nousresearch.com",
];

impl Allowlist {
    /// The default hosts plus `extra` (exact names or `*.domain`).
    pub fn with_defaults<S: AsRef<str>>(extra: &[S]) -> Allowlist {
        let mut list = Allowlist::default();
        for pattern in DEFAULT_ALLOWED
            .iter()
            .copied()
            .chain(extra.iter().map(AsRef::as_ref))
        {
            list.add(pattern);
        }
        list
    }

    /// Exactly `patterns`, without the defaults.
    pub fn exactly<S: AsRef<str>>(patterns: &[S]) -> Allowlist {
        let mut list = Allowlist::default();
        for pattern in patterns {
            list.add(pattern.as_ref());
        }
        list
    }

    fn add(&mut self, pattern: &str) {
        let pattern = pattern.trim().to_ascii_lowercase();
        let pattern = pattern.strip_suffix('.').unwrap_or(&pattern);
        match pattern.strip_prefix("*.") {
            Some(domain) if !domain.is_empty() => self.suffixes.push(format!(".{domain}")),
            Some(_) => {}
            // `*-rest.domain`: a first label ending in `-rest`.
            None if pattern.len() > 2 && pattern.starts_with("*-") => {
                self.suffixes.push(pattern[1..].to_string());
            }
            None => match parse_host(pattern) {
                Ok(host) => self.exact.push(host.to_string()),
                Err(_) => self.exact.push(pattern.to_string()),
            },
        }
    }

    /// Every pattern, as configured (`*.domain` for wildcards).
    pub fn patterns(&self) -> Vec<String> {
        self.exact
            .iter()
            .cloned()
            .chain(self.suffixes.iter().map(|s| format!("*{s}")))
            .collect()
    }

    pub fn allows(&self, host: &Host) -> bool {
        let text = host.to_string();
        if self.exact.contains(&text) {
            return true;
        }
        match host {
            Host::Name(name) => self.suffixes.iter().any(|suffix| {
                name.strip_suffix(suffix.as_str()).is_some_and(|head| {
                    // `*-rest` covers one label's head; `*.domain` any.
                    !head.is_empty() && (suffix.starts_with('.') || !head.contains('.'))
                })
            }),
            Host::Ip(_) => false,
        }
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
