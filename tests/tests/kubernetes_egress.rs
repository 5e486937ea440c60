//! The egress proxy on the kubernetes backend, against the real
//! kube-apiserver of `tests/kube-harness/` (each Pod a container of the
//! test engine; NetworkPolicy egress isolation as the harness approximates
//! a CNI's, see its README). Through the real `hermes` binary: the dry run
//! plans the proxy's setup, then its objects, then the sandbox once the
//! proxy Pod is Ready, and the pass does exactly that; the sandbox Pod
//! reaches an allowlisted name (resolved by `proxy.resolve` to a TLS
//! upstream of the test's own) with a token the proxy Pod swaps for the
//! real key, while the sandbox's Pod spec, its environment, its files and
//! the CA's ConfigMap hold no key, and the sandbox reaches nothing but
//! the proxy. While the proxy Pod is not Ready no sandbox Pod is made (a
//! pass and `hermes exec` both say why); with the proxy disabled its
//! objects go.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use hermes_tests::cli::TestHome;
use hermes_tests::kube_harness::{Harness, proxy_image};
use hermes_tests::upstream::Upstream;

const OPENROUTER_KEY: &str = "sk-or-v1-kube-REAL-openrouter-0001";
const NAMES: &[&str] = &["openrouter.ai"];

/// A home on the harness with the proxy enabled, in the cluster from
/// `image`, `openrouter.ai` resolving to `upstream`.
fn home_with_proxy(h: &Harness, upstream: &Upstream, image: &str) -> TestHome {
    let home = TestHome::new();
    let ca = home.path().join("upstream-ca.pem");
    std::fs::write(&ca, &upstream.ca_pem).unwrap();
    home.write_config(proxy_config(h, upstream, image, true, &ca));
    std::fs::write(
        home.path().join(".env"),
        format!("OPENROUTER_API_KEY={OPENROUTER_KEY}\n"),
    )
    .unwrap();
    home
}

fn proxy_config(
    h: &Harness,
    upstream: &Upstream,
    image: &str,
    enabled: bool,
    ca: &std::path::Path,
) -> String {
    format!(
        "{}security:\n  redact_secrets: false\nproxy:\n  enabled: {enabled}\n  tunnel_port: 3128\n  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n    openrouter.ai: {}\n",
        h.config(&format!("  kubernetes_proxy_image: {image}\n")),
        ca.display(),
        upstream.addr.ip()
    )
}

fn list(h: &Harness, resource: &str) -> Vec<serde_json::Value> {
    let path = match resource {
        "networkpolicies" => format!(
            "/apis/networking.k8s.io/v1/namespaces/{}/networkpolicies",
            h.namespace
        ),
        other => format!("/api/v1/namespaces/{}/{other}", h.namespace),
    };
    h.admin_get(&path)["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn sandbox_pods(h: &Harness) -> Vec<serde_json::Value> {
    list(h, "pods")
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["hermes-agent"] == "1")
        .collect()
}

#[test]
fn a_sandbox_pod_reaches_providers_only_through_the_proxy_pod_and_never_holds_a_key() {
    let h = Harness::start();
    let upstream = Upstream::start(SocketAddr::new(h.pod_gateway(), 0), NAMES);
    let home = home_with_proxy(&h, &upstream, &proxy_image());

    // Set up here, then the proxy's objects, then the sandbox: three
    // stages, each said.
    let dry = home.run(["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    for expected in [
        "+ proxy",
        "setup",
        &format!("no Secret {}/hermes-proxy-", h.namespace),
        &format!("no NetworkPolicy {}/hermes-sandboxes-", h.namespace),
        &format!("no Pod {}/hermes-proxy-", h.namespace),
        "is Ready",
    ] {
        assert!(dry.stdout.contains(expected), "{expected}:\n{}", dry.stdout);
    }
    assert!(list(&h, "pods").is_empty(), "a dry run made nothing");

    let apply = home.run(["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert!(
        apply.stdout.ends_with("The host is converged.\n"),
        "{}",
        apply.stdout
    );
    let again = home.run(["reconcile", "--dry-run"]);
    assert_eq!(again.code, 0, "nothing left to do: {again:?}");

    // The objects: the key in the Secret only, mounted by the proxy Pod
    // only; the CA's ConfigMap holds the certificate alone.
    let secrets = list(&h, "secrets");
    let secret = secrets
        .iter()
        .find(|s| s["metadata"]["labels"]["hermes-proxy"].is_string())
        .expect("the proxy's Secret");
    let secret_name = secret["metadata"]["name"].as_str().unwrap().to_string();
    let maps = list(&h, "configmaps");
    let ca_map = maps
        .iter()
        .find(|m| m["metadata"]["labels"]["hermes-proxy"].is_string())
        .expect("the CA's ConfigMap");
    let ca_text = ca_map["data"].to_string();
    assert!(ca_text.contains("BEGIN CERTIFICATE"), "{ca_text}");
    assert!(!ca_text.contains("PRIVATE KEY"), "{ca_text}");
    let pods = list(&h, "pods");
    for pod in &pods {
        let spec = pod["spec"].to_string();
        assert!(
            !spec.contains(OPENROUTER_KEY),
            "a key in a Pod's spec: {spec}"
        );
        let mounts_secret = pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == secret_name.as_str());
        let is_proxy = pod["metadata"]["labels"]["hermes-proxy"].is_string();
        assert_eq!(
            mounts_secret, is_proxy,
            "only the proxy mounts the Secret: {spec}"
        );
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false, "{spec}");
        if is_proxy {
            let sc = &pod["spec"]["containers"][0]["securityContext"];
            assert_eq!(sc["runAsNonRoot"], true, "{spec}");
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{spec}");
            assert_eq!(sc["capabilities"]["drop"][0], "ALL", "{spec}");
        }
    }
    let policies = list(&h, "networkpolicies");
    assert_eq!(policies.len(), 2, "{policies:?}");
    let sandbox = sandbox_pods(&h);
    assert_eq!(sandbox.len(), 1, "{sandbox:?}");

    let port = upstream.addr.port();
    let gateway = upstream.addr.ip();
    let script = format!(
        r#"echo "== env"
printenv | grep -E '_API_KEY=|_PROXY=' | sort
echo "== curl"
curl -sS --max-time 20 "https://openrouter.ai:{port}/echo" -H "Authorization: Bearer $OPENROUTER_API_KEY"
echo
echo "== python"
python3 - <<'PY'
import os, urllib.request
req = urllib.request.Request("https://openrouter.ai:{port}/echo",
    headers={{"authorization": "Bearer " + os.environ["OPENROUTER_API_KEY"]}})
print(urllib.request.urlopen(req, timeout=20).read().decode())
PY
echo "== direct"
curl -sS --noproxy '*' --connect-timeout 3 --max-time 5 -k "https://{gateway}:{port}/echo" >/dev/null 2>&1 && echo reached || echo refused
echo "== token"
ls /var/run/secrets/kubernetes.io 2>&1 || true
echo "== grep"
grep -rs -- '{OPENROUTER_KEY}' /proc/1/environ /etc /root /workspace /tmp >/dev/null && echo found || echo none
"#
    );
    let run = home.run(["exec", "--", "sh", "-c", &script]);
    assert_eq!(run.code, 0, "{run:?}");
    let section = |name: &str| hermes_tests::egress::section(&run.stdout, name);
    let env = section("env");
    assert!(
        env.contains("HTTPS_PROXY=http://hermes-proxy-"),
        "the proxy by its Service's name: {env}"
    );
    assert!(!env.contains(OPENROUTER_KEY), "{env}");
    let curl: serde_json::Value = serde_json::from_str(section("curl").trim())
        .unwrap_or_else(|e| panic!("curl's answer ({e}): {run:?}"));
    assert_eq!(
        curl["headers"]["authorization"],
        format!("Bearer {OPENROUTER_KEY}"),
        "the proxy Pod swapped the token for the key"
    );
    let python: serde_json::Value = serde_json::from_str(section("python").trim()).unwrap();
    assert_eq!(
        python["headers"]["authorization"],
        format!("Bearer {OPENROUTER_KEY}")
    );
    assert_eq!(section("direct").trim(), "refused", "{run:?}");
    assert!(
        section("token").contains("No such file"),
        "no service account token: {run:?}"
    );
    assert_eq!(section("grep").trim(), "none", "{run:?}");
    // `hermes status` speaks of the cluster's proxy.
    let status = home.run(["status"]);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(
        status
            .stdout
            .contains("Proxy:       healthy; listening on hermes-proxy-"),
        "{}",
        status.stdout
    );
    // Down: the sandbox and the proxy Pod go; the Secret (the proxy's
    // files) stays, as the daemon's files do.
    let down = home.run(["down", "--yes"]);
    assert_eq!(down.code, 0, "{down:?}");
    assert!(list(&h, "pods").is_empty(), "{:?}", list(&h, "pods"));
    assert_eq!(
        list(&h, "secrets")
            .iter()
            .filter(|s| s["metadata"]["name"] == secret_name.as_str())
            .count(),
        1
    );
    // Nothing hermes printed holds the key either.
    for out in [
        &dry.stdout,
        &dry.stderr,
        &apply.stdout,
        &apply.stderr,
        &run.stderr,
        &status.stdout,
        &down.stdout,
    ] {
        assert!(!out.contains(OPENROUTER_KEY), "{out}");
    }
}

#[test]
fn no_sandbox_pod_is_made_while_the_proxy_pod_is_not_ready_and_a_disabled_proxy_goes() {
    let h = Harness::start();
    let upstream = Upstream::start(SocketAddr::new(h.pod_gateway(), 0), NAMES);
    let home = home_with_proxy(&h, &upstream, "hermes-test-proxy:not-there");

    // The proxy's image is missing: its Pod never gets Ready, the pass
    // says so and makes no sandbox.
    let apply = home.run(["reconcile"]);
    assert_ne!(apply.code, 0, "{apply:?}");
    assert!(
        apply.stdout.contains("ImagePull") && apply.stderr.contains("cannot start"),
        "{apply:?}"
    );
    assert!(sandbox_pods(&h).is_empty(), "no sandbox without the proxy");
    let dry = home.run(["reconcile", "--dry-run"]);
    assert!(
        dry.stdout.contains(&format!(
            "the egress proxy Pod {}/hermes-proxy-",
            h.namespace
        )) && dry.stdout.contains("is not Ready"),
        "{dry:?}"
    );
    let exec = home.run(["exec", "--", "true"]);
    assert_eq!(exec.code, 3, "refused, failing closed: {exec:?}");
    assert!(exec.stderr.contains("not Ready"), "{exec:?}");
    assert!(sandbox_pods(&h).is_empty(), "exec made no sandbox either");

    // Without an image at all: blocked, with the key to set.
    let ca = home.path().join("upstream-ca.pem");
    home.write_config(
        proxy_config(&h, &upstream, "x", true, &ca).replace("  kubernetes_proxy_image: x\n", ""),
    );
    let dry = home.run(["reconcile", "--dry-run"]);
    assert!(
        dry.stdout
            .contains("terminal.kubernetes_proxy_image is not set"),
        "{dry:?}"
    );

    // With the image: the proxy Pod is replaced, then the sandbox made.
    home.write_config(proxy_config(&h, &upstream, &proxy_image(), true, &ca));
    let apply = home.run(["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert_eq!(sandbox_pods(&h).len(), 1);
    let wired = sandbox_pods(&h)[0]["metadata"]["labels"]["hermes-egress"].clone();
    assert_ne!(wired, "off");

    // The proxy broken under a running sandbox (its Pod gone, its image
    // missing): no command runs there, even in the Pod that runs.
    home.write_config(proxy_config(
        &h,
        &upstream,
        "hermes-test-proxy:not-there",
        true,
        &ca,
    ));
    let proxy_pods: Vec<String> = list(&h, "pods")
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["hermes-proxy"].is_string())
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    for name in &proxy_pods {
        h.admin(
            "DELETE",
            &format!(
                "/api/v1/namespaces/{}/pods/{name}?gracePeriodSeconds=0",
                h.namespace
            ),
            None,
        );
    }
    let exec = home.run(["exec", "--", "echo", "RAN"]);
    assert_eq!(exec.code, 3, "refused, failing closed: {exec:?}");
    assert!(!exec.stdout.contains("RAN"), "{exec:?}");
    assert_eq!(sandbox_pods(&h).len(), 1, "the sandbox itself is kept");
    home.write_config(proxy_config(&h, &upstream, &proxy_image(), true, &ca));
    let apply = home.run(["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let exec = home.run(["exec", "--", "echo", "RAN"]);
    assert_eq!(exec.code, 0, "{exec:?}");

    // Disabled: its objects go, and the sandbox is made again unwired.
    home.write_config(proxy_config(&h, &upstream, &proxy_image(), false, &ca));
    let apply = home.run(["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let left: Vec<String> = [
        "secrets",
        "configmaps",
        "services",
        "pods",
        "networkpolicies",
    ]
    .iter()
    .flat_map(|r| list(&h, r))
    .filter(|o| o["metadata"]["labels"]["hermes-proxy"].is_string())
    .map(|o| o["metadata"]["name"].to_string())
    .collect();
    assert!(left.is_empty(), "the proxy's objects are gone: {left:?}");
    let pods = sandbox_pods(&h);
    assert_eq!(pods.len(), 1, "{pods:?}");
    assert_eq!(pods[0]["metadata"]["labels"]["hermes-egress"], "off");
}
