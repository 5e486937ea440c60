//! The proxy-only network of `proxy.enforce_network`.
//!
//! Sandboxes join an internal Docker network (no route out): the only
//! address they can reach outside themselves is the network's gateway,
//! the host end of its bridge. The proxy listens there, and a firewall
//! chain on the host admits only the proxy's two ports from that bridge,
//! so that no other host service (sshd, a database on 0.0.0.0) is reachable
//! either. A sandbox that ignores `HTTPS_PROXY` reaches nothing.
//!
//! Every name derives from the hermes home, so that two homes on one host
//! (two users, or tests) have networks and chains of their own:
//! network `hermes-egress-<h>`, bridge `hermes-<h>` (an interface name has
//! at most 15 bytes), chain `HERMES-<h>`, with `<h>` 8 hex digits.
//!
//! Sandboxes on the network do not reach each other: the network is made
//! with `enable_icc=false` (Docker then drops bridge-to-same-bridge
//! traffic itself), and the firewall holds a rule of hermes's own that
//! rejects it too ([`ProxyNetwork::forward_rule`]), in `DOCKER-USER` (which
//! Docker evaluates before its own forwarding rules and never flushes), or
//! at the head of `FORWARD` where there is no such chain.
//!
//! The chain is written with `iptables-restore --noflush` (one atomic
//! commit that replaces the chain's rules and inserts the forward rule
//! when it is missing) and checked with `iptables-save` (one process, no
//! rule ever half-written).
//!
//! The transparent path (issue: programs that ignore `HTTPS_PROXY`): the
//! chain's twin in the `nat` table redirects the gateway's ports 443, 80
//! and 53/udp to the proxy's own ports ([`ProxyNetwork::nat_rules`]), and
//! the sandboxes' name server is the gateway, where the proxy's DNS
//! responder answers allowlisted names with the gateway's address.
//!
//! Also here: the addresses the proxy listens on when config names none
//! ([`default_listen`]), and the network's part of `hermes egress setup`
//! ([`setup`]).

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};

use anyhow::Context;
use hermes_backends::docker::Engine;
use sha2::{Digest, Sha256};

use hermes_model::config::Config;

use crate::home::Home;

/// The addresses listened on when config names none: the Docker bridge
/// gateway when there is one, and 127.0.0.1.
pub(crate) fn default_listen() -> Vec<IpAddr> {
    let mut listen = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for ifa in addrs {
            if ifa.interface_name == "docker0"
                && let Some(v4) = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in())
            {
                listen.push(IpAddr::V4(v4.ip()));
            }
        }
    }
    listen.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    listen
}

/// The most copies of one rule [`ProxyNetwork::remove_firewall`] deletes.
const MAX_COPIES: usize = 16;

/// What [`setup`] did to the proxy-only network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkSetup {
    /// `enforce_network` is off and there is no network.
    None,
    /// In place, with its firewall.
    Enforced {
        name: String,
        gateway: IpAddr,
        tunnel_port: u16,
        /// Made anew: the old one let its sandboxes reach each other.
        replaced: bool,
        /// Whether the proxy must listen anew (a new network or gateway).
        changed: bool,
    },
}

impl NetworkSetup {
    /// Whether the running proxy must listen anew.
    pub fn changed(&self) -> bool {
        matches!(self, NetworkSetup::Enforced { changed: true, .. })
    }
}

impl std::fmt::Display for NetworkSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetworkSetup::None => Ok(()),
            NetworkSetup::Enforced {
                name,
                gateway,
                tunnel_port,
                replaced,
                ..
            } => {
                if *replaced {
                    writeln!(
                        f,
                        "Network:  {name} made anew: its sandboxes could reach each other (made before enable_icc=false)"
                    )?;
                }
                write!(
                    f,
                    "Network:  {name} (internal; gateway {gateway}; only ports {tunnel_port} and {} of the host reachable)",
                    tunnel_port.saturating_add(1)
                )
            }
        }
    }
}

/// With `proxy.enforce_network`: makes the proxy-only network and its
/// firewall chain; without, nothing (a pass plans their removal). For the
/// command line: the engine is asked on a
/// current-thread runtime of its own.
pub(crate) fn setup(home: &Home, config: &Config) -> anyhow::Result<NetworkSetup> {
    let network = ProxyNetwork::for_home(home);
    let before = network.gateway();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if config.proxy.enforce_network {
        let (gateway, replaced) = runtime.block_on(async {
            let engine = Engine::connect().await?;
            network.ensure_network(&engine).await
        })?;
        network.install_firewall(config.proxy.tunnel_port)?;
        return Ok(NetworkSetup::Enforced {
            changed: replaced || before.map(IpAddr::V4) != Some(gateway),
            name: network.name,
            gateway,
            tunnel_port: config.proxy.tunnel_port,
            replaced,
        });
    }
    // Off: the network and its chain, when still there, are the pass's to
    // remove (`remove-network` in the plan, after its sandboxes left it).
    Ok(NetworkSetup::None)
}

/// The names of one home's proxy-only network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyNetwork {
    /// The Docker network.
    pub name: String,
    /// Its bridge interface on the host.
    pub bridge: String,
    /// The host firewall chain that admits only the proxy's ports.
    pub chain: String,
    /// The home's identity, the network's `hermes-home` label.
    pub home_id: String,
}

impl ProxyNetwork {
    pub fn for_home(home: &Home) -> ProxyNetwork {
        let root = std::fs::canonicalize(home.root()).unwrap_or_else(|_| home.root().to_path_buf());
        let digest = Sha256::digest(root.as_os_str().as_encoded_bytes());
        let h: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        ProxyNetwork {
            name: format!("hermes-egress-{h}"),
            bridge: format!("hermes-{h}"),
            chain: format!("HERMES-{h}"),
            home_id: home.scope().id,
        }
    }

    /// The bridge's IPv4 address on the host, when the network exists.
    pub fn gateway(&self) -> Option<Ipv4Addr> {
        nix::ifaddrs::getifaddrs().ok()?.find_map(|ifa| {
            if ifa.interface_name != self.bridge {
                return None;
            }
            ifa.address
                .as_ref()
                .and_then(|a| a.as_sockaddr_in())
                .map(|v4| v4.ip())
        })
    }

    /// The rules, in `iptables-save`'s own spelling: the jump from INPUT
    /// for traffic that comes in on the bridge, then the chain admitting
    /// the CONNECT port and the plain HTTP port (TCP) and the DNS
    /// responder (UDP on the CONNECT port), and rejecting the rest at
    /// once: a TCP reset, an ICMP error for anything else, never silence.
    pub fn firewall_rules(&self, tunnel_port: u16) -> Vec<String> {
        let (chain, bridge) = (&self.chain, &self.bridge);
        let http = tunnel_port.saturating_add(1);
        vec![
            format!("-A INPUT -i {bridge} -j {chain}"),
            format!("-A {chain} -p tcp -m tcp --dport {tunnel_port} -j ACCEPT"),
            format!("-A {chain} -p tcp -m tcp --dport {http} -j ACCEPT"),
            format!("-A {chain} -p udp -m udp --dport {tunnel_port} -j ACCEPT"),
            format!("-A {chain} -p tcp -j REJECT --reject-with tcp-reset"),
            format!("-A {chain} -j REJECT --reject-with icmp-port-unreachable"),
        ]
    }

    /// The transparent path, in the `nat` table (`iptables-save`'s
    /// spelling): the jump from PREROUTING for traffic that comes in on
    /// the bridge, then redirects of the gateway's port 443 to the CONNECT
    /// port (where TLS without a CONNECT takes its target from the SNI),
    /// port 80 to the plain port (origin-form requests, the target from
    /// `Host`) and port 53/udp to the DNS responder. Redirects, not
    /// listeners on 443, 80 and 53: the proxy needs no privileged port,
    /// and a host service already listening there on every address
    /// (a web server, a local resolver) neither blocks it nor is reached.
    pub fn nat_rules(&self, tunnel_port: u16, gateway: Ipv4Addr) -> Vec<String> {
        let (chain, bridge) = (&self.chain, &self.bridge);
        let http = tunnel_port.saturating_add(1);
        let to = |proto: &str, port: u16, to: u16| {
            format!(
                "-A {chain} -d {gateway}/32 -p {proto} -m {proto} --dport {port} -j REDIRECT --to-ports {to}"
            )
        };
        vec![
            format!("-A PREROUTING -i {bridge} -j {chain}"),
            to("tcp", 443, tunnel_port),
            to("tcp", 80, http),
            to("udp", 53, tunnel_port),
        ]
    }

    /// The rule that rejects traffic from one container of the network to
    /// another, in `parent` (`DOCKER-USER` or `FORWARD`), in
    /// `iptables-save`'s spelling (without the `-A parent`).
    pub fn forward_rule(&self) -> String {
        let bridge = &self.bridge;
        format!("-i {bridge} -o {bridge} -j REJECT --reject-with icmp-port-unreachable")
    }

    /// Every rule of this network in `DOCKER-USER` (or `FORWARD`): the one
    /// between its containers, then the ones that refuse whatever else a
    /// sandbox sends to be forwarded (a raw IP address, any port) at once,
    /// a TCP reset or an ICMP error: Docker's own rules for an internal
    /// network drop it silently, and a client then waits for its timeout.
    pub fn forward_rules(&self) -> Vec<String> {
        let bridge = &self.bridge;
        vec![
            self.forward_rule(),
            format!("-i {bridge} -p tcp -j REJECT --reject-with tcp-reset"),
            format!("-i {bridge} -j REJECT --reject-with icmp-port-unreachable"),
        ]
    }

    /// Whether the host firewall holds exactly this network's rules.
    pub fn firewall_in_place(&self, tunnel_port: u16) -> anyhow::Result<bool> {
        let saved = iptables_save()?;
        let Some(gateway) = self.gateway() else {
            return Ok(false);
        };
        Ok(
            chain_matches(&saved, &self.chain, &self.firewall_rules(tunnel_port))
                && self
                    .forward_rules()
                    .iter()
                    .all(|rule| forward_rule_in(&saved, rule).is_some())
                && chain_matches(
                    &iptables_save_table("nat")?,
                    &self.chain,
                    &self.nat_rules(tunnel_port, gateway),
                ),
        )
    }

    /// Writes the chain (replacing whatever it held), the rule between the
    /// network's containers, and the jump to the chain.
    pub fn install_firewall(&self, tunnel_port: u16) -> anyhow::Result<()> {
        let rules = self.firewall_rules(tunnel_port);
        let (jump, chain_rules) = rules.split_first().context("no rules")?;
        let before = iptables_save()?;
        let mut script = format!("*filter\n:{} - [0:0]\n", self.chain);
        for rule in chain_rules {
            script.push_str(rule);
            script.push('\n');
        }
        let parent = if before.lines().any(|l| l.starts_with(":DOCKER-USER ")) {
            "DOCKER-USER"
        } else {
            "FORWARD"
        };
        // Inserted last first, so that they stand in their order at the head.
        for rule in self.forward_rules().iter().rev() {
            if forward_rule_in(&before, rule).is_none() {
                script.push_str(&format!("-I {parent} 1 {rule}\n"));
            }
        }
        script.push_str("COMMIT\n");
        let gateway = self
            .gateway()
            .with_context(|| format!("the bridge {} has no IPv4 address", self.bridge))?;
        let nat = self.nat_rules(tunnel_port, gateway);
        let (nat_jump, nat_rules) = nat.split_first().context("no rules")?;
        script.push_str(&format!("*nat\n:{} - [0:0]\n", self.chain));
        for rule in nat_rules {
            script.push_str(rule);
            script.push('\n');
        }
        script.push_str("COMMIT\n");
        iptables_restore(&script)?;
        for (table, jump, parent) in [("filter", jump, "INPUT"), ("nat", nat_jump, "PREROUTING")] {
            if iptables_save_table(table)?.lines().any(|l| l == jump) {
                continue;
            }
            let args: Vec<&str> = jump
                .trim_start_matches(&format!("-A {parent} "))
                .split_whitespace()
                .collect();
            let mut cmd = Command::new("iptables");
            cmd.args(["-w", "-t", table, "-I", parent, "1"]).args(&args);
            run(cmd, "iptables -I (the jump to hermes's chain)")?;
        }
        Ok(())
    }

    /// Removes the jump, the forward rule and the chain; what is not there
    /// is skipped.
    pub fn remove_firewall(&self) -> anyhow::Result<()> {
        let saved = iptables_save()?;
        for forward in self.forward_rules() {
            // A rule may stand more than once (in either parent chain).
            for _ in 0..MAX_COPIES {
                let Some(parent) = forward_rule_in(&iptables_save()?, &forward) else {
                    break;
                };
                let mut cmd = Command::new("iptables");
                cmd.args(["-w", "-D", parent])
                    .args(forward.split_whitespace());
                run(cmd, "iptables -D (a rule of the network's in DOCKER-USER)")?;
            }
        }
        let jump = format!("-A INPUT -i {} -j {}", self.bridge, self.chain);
        for _ in saved.lines().filter(|l| *l == jump) {
            let mut cmd = Command::new("iptables");
            cmd.args(["-w", "-D", "INPUT", "-i", &self.bridge, "-j", &self.chain]);
            run(cmd, "iptables -D INPUT")?;
        }
        let nat = iptables_save_table("nat")?;
        let nat_jump = format!("-A PREROUTING -i {} -j {}", self.bridge, self.chain);
        for _ in nat.lines().filter(|l| *l == nat_jump) {
            let mut cmd = Command::new("iptables");
            cmd.args([
                "-w",
                "-t",
                "nat",
                "-D",
                "PREROUTING",
                "-i",
                &self.bridge,
                "-j",
                &self.chain,
            ]);
            run(cmd, "iptables -t nat -D PREROUTING")?;
        }
        if nat.lines().any(|l| l == format!(":{} - [0:0]", self.chain)) {
            for flag in ["-F", "-X"] {
                let mut cmd = Command::new("iptables");
                cmd.args(["-w", "-t", "nat", flag, &self.chain]);
                run(cmd, "iptables -t nat (hermes's chain)")?;
            }
        }
        if saved
            .lines()
            .any(|l| l == format!(":{} - [0:0]", self.chain))
        {
            let mut flush = Command::new("iptables");
            flush.args(["-w", "-F", &self.chain]);
            run(flush, "iptables -F")?;
            let mut delete = Command::new("iptables");
            delete.args(["-w", "-X", &self.chain]);
            run(delete, "iptables -X")?;
        }
        Ok(())
    }

    /// Makes sure the network exists, with no traffic between its
    /// containers (one made before is replaced, its containers connected
    /// again); returns its gateway, and whether it was replaced.
    pub async fn ensure_network(&self, engine: &Engine) -> anyhow::Result<(IpAddr, bool)> {
        let labels = HashMap::from([
            (
                hermes_model::sandbox::LABEL_AGENT.to_string(),
                "1".to_string(),
            ),
            ("hermes-egress-network".to_string(), "1".to_string()),
            (
                hermes_model::homes::LABEL_HOME.to_string(),
                self.home_id.clone(),
            ),
        ]);
        let net = engine
            .ensure_internal_network(&self.name, &self.bridge, &labels)
            .await?;
        let gateway = net
            .gateway
            .or_else(|| self.gateway().map(IpAddr::V4))
            .with_context(|| format!("the network {} has no gateway address", self.name))?;
        Ok((gateway, net.replaced))
    }
}

/// The chain (`DOCKER-USER` or `FORWARD`) of `saved` (iptables-save's
/// output) that holds `rule`, if any.
fn forward_rule_in(saved: &str, rule: &str) -> Option<&'static str> {
    ["DOCKER-USER", "FORWARD"]
        .into_iter()
        .find(|parent| saved.lines().any(|l| l == format!("-A {parent} {rule}")))
}

/// Whether `saved` (iptables-save's output) holds the jump and exactly the
/// chain's rules, in order.
fn chain_matches(saved: &str, chain: &str, rules: &[String]) -> bool {
    let Some((jump, chain_rules)) = rules.split_first() else {
        return false;
    };
    let prefix = format!("-A {chain} ");
    let found: Vec<&str> = saved.lines().filter(|l| l.starts_with(&prefix)).collect();
    saved.lines().any(|l| l == jump)
        && found.len() == chain_rules.len()
        && found.iter().zip(chain_rules).all(|(a, b)| a == b)
}

fn iptables_save() -> anyhow::Result<String> {
    iptables_save_table("filter")
}

fn iptables_save_table(table: &str) -> anyhow::Result<String> {
    let out = Command::new("iptables-save")
        .args(["-t", table])
        .stderr(Stdio::piped())
        .output()
        .context("cannot run iptables-save (proxy.enforce_network needs iptables)")?;
    if !out.status.success() {
        anyhow::bail!(
            "iptables-save failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn iptables_restore(script: &str) -> anyhow::Result<()> {
    let mut child = Command::new("iptables-restore")
        .args(["-w", "--noflush"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run iptables-restore (proxy.enforce_network needs iptables)")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        anyhow::bail!(
            "iptables-restore failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn run(mut cmd: Command, what: &str) -> anyhow::Result<()> {
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        anyhow::bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn home(path: &str) -> Home {
        Home::resolve(Some(path.into())).unwrap()
    }

    fn net() -> ProxyNetwork {
        ProxyNetwork {
            name: "hermes-egress-0a1b2c3d".to_string(),
            bridge: "hermes-0a1b2c3d".to_string(),
            chain: "HERMES-0a1b2c3d".to_string(),
            home_id: "0a1b2c3d4e5f6071".to_string(),
        }
    }

    #[test]
    fn names_fit_their_limits_and_differ_between_homes() {
        let a = ProxyNetwork::for_home(&home("/tmp/one"));
        let b = ProxyNetwork::for_home(&home("/tmp/two"));
        assert_ne!(a, b);
        assert!(a.bridge.len() <= 15, "{}", a.bridge);
        assert!(a.chain.len() <= 28, "{}", a.chain);
        assert_eq!(a, ProxyNetwork::for_home(&home("/tmp/one")));
    }

    #[test]
    fn the_chain_admits_only_the_proxy_ports() {
        assert_eq!(
            net().firewall_rules(9090),
            [
                "-A INPUT -i hermes-0a1b2c3d -j HERMES-0a1b2c3d",
                "-A HERMES-0a1b2c3d -p tcp -m tcp --dport 9090 -j ACCEPT",
                "-A HERMES-0a1b2c3d -p tcp -m tcp --dport 9091 -j ACCEPT",
                "-A HERMES-0a1b2c3d -p udp -m udp --dport 9090 -j ACCEPT",
                "-A HERMES-0a1b2c3d -p tcp -j REJECT --reject-with tcp-reset",
                "-A HERMES-0a1b2c3d -j REJECT --reject-with icmp-port-unreachable",
            ]
        );
        assert_eq!(
            net().nat_rules(9090, Ipv4Addr::new(172, 30, 0, 1)),
            [
                "-A PREROUTING -i hermes-0a1b2c3d -j HERMES-0a1b2c3d",
                "-A HERMES-0a1b2c3d -d 172.30.0.1/32 -p tcp -m tcp --dport 443 -j REDIRECT --to-ports 9090",
                "-A HERMES-0a1b2c3d -d 172.30.0.1/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 9091",
                "-A HERMES-0a1b2c3d -d 172.30.0.1/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 9090",
            ]
        );
    }

    #[test]
    fn the_forward_rule_is_found_in_either_parent_chain() {
        let rule = net().forward_rule();
        assert_eq!(
            rule,
            "-i hermes-0a1b2c3d -o hermes-0a1b2c3d -j REJECT --reject-with icmp-port-unreachable"
        );
        let saved = |line: String| format!("*filter\n{line}\n-A DOCKER-USER -j RETURN\nCOMMIT\n");
        assert_eq!(
            forward_rule_in(&saved(format!("-A DOCKER-USER {rule}")), &rule),
            Some("DOCKER-USER")
        );
        assert_eq!(
            forward_rule_in(&saved(format!("-A FORWARD {rule}")), &rule),
            Some("FORWARD")
        );
        let other = rule.replace("0a1b2c3d", "ffffffff");
        assert_eq!(
            forward_rule_in(&saved(format!("-A FORWARD {other}")), &rule),
            None
        );
    }

    #[test]
    fn a_chain_with_a_rule_more_less_or_other_does_not_match() {
        let rules = net().firewall_rules(9090);
        let saved = |lines: &[&str]| {
            format!(
                "*filter\n:INPUT ACCEPT [0:0]\n{}\nCOMMIT\n",
                lines.join("\n")
            )
        };
        let all: Vec<&str> = rules.iter().map(String::as_str).collect();
        assert!(chain_matches(&saved(&all), &net().chain, &rules));
        assert!(
            !chain_matches(&saved(&all[1..]), &net().chain, &rules),
            "no jump"
        );
        assert!(
            !chain_matches(&saved(&all[..3]), &net().chain, &rules),
            "no reject"
        );
        let mut more = all.clone();
        more.push("-A HERMES-0a1b2c3d -p tcp -m tcp --dport 22 -j ACCEPT");
        assert!(
            !chain_matches(&saved(&more), &net().chain, &rules),
            "a rule more"
        );
        let old = net().firewall_rules(8080);
        let old: Vec<&str> = old.iter().map(String::as_str).collect();
        assert!(
            !chain_matches(&saved(&old), &net().chain, &rules),
            "other ports"
        );
    }
}
