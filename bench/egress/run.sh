#!/usr/bin/env bash
# The egress proxy benchmark, one run, side by side:
#   direct      oha -> nginx (TLS, a small JSON answer)
#   hermes      oha -> hermes egress proxy (CONNECT, MITM, token swap) -> nginx
#   sigv4       oha -> a second hermes proxy, the upstream an AWS host: the
#               placeholder's SigV4 signature checked, the request signed
#               again with the real pair -> nginx (POST, a small JSON body)
#   mitmproxy   oha -> mitmproxy with an addon doing the same swap -> nginx
# Keep-alive HTTPS, 16 connections, everything on this machine (loopback
# only). Then the proxy's RSS with 1,000 idle tunnels open.
# The upstream is named `localhost` (found in /etc/hosts, so no client
# asks DNS); the bench maps the openai provider to it, so that hermes swaps
# the token exactly as for api.openai.com.
# Installs what it needs when missing: nginx (apt), oha (cargo install),
# mitmproxy 12 (PyPI, in a venv under target/bench; where the host's
# Python is older than 3.12, inside a Debian trixie root made there with
# debootstrap).
# Usage: bash bench/egress/run.sh [SECONDS]   (default 10 per run)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
SECS=${1:-10}
CONNS=16
WORK=$ROOT/target/bench/egress
UP_PORT=18443
HERMES_PORT=18090
MITM_PORT=18080
mkdir -p "$WORK"
say() { printf '==> %s\n' "$*" >&2; }

# --- tools -----------------------------------------------------------------
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    say "installing nginx"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends nginx-light openssl >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
if ! command -v oha >/dev/null; then
    say "installing oha (cargo install)"
    cargo install oha --locked >/dev/null
fi
# mitmproxy 12 (the baseline) needs Python 3.12 or newer. Where the host's
# Python is older (Debian bookworm has 3.11), it runs from a Debian trixie
# root made with debootstrap (Python 3.13), entered with chroot: it shares
# the host's network, so loopback is the same. pip there trusts the host's
# CA bundle, as the host's pip does.
MITM_ROOT=
if python3 -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
    if [ ! -x "$WORK/venv/bin/mitmdump" ]; then
        say "installing mitmproxy 12 (PyPI) in $WORK/venv"
        python3 -m venv "$WORK/venv"
        "$WORK/venv/bin/pip" install -q 'mitmproxy>=12,<13'
    fi
    MITMDUMP=("$WORK/venv/bin/mitmdump")
else
    MITM_ROOT=$WORK/trixie
    if [ ! -x "$MITM_ROOT/opt/mitm/bin/mitmdump" ]; then
        command -v debootstrap >/dev/null || {
            DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends debootstrap >/dev/null
        }
        say "making a Debian trixie root for mitmproxy 12 (Python $(python3 -c 'import sys; print(sys.version.split()[0])') here is too old) in $MITM_ROOT"
        rm -rf "$MITM_ROOT"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            trixie "$MITM_ROOT" http://deb.debian.org/debian >/dev/null
        cp /etc/resolv.conf "$MITM_ROOT/etc/resolv.conf"
        cp /etc/ssl/certs/ca-certificates.crt "$MITM_ROOT/etc/ssl/certs/ca-certificates.crt"
        say "installing mitmproxy 12 (PyPI) in $MITM_ROOT/opt/mitm"
        chroot "$MITM_ROOT" python3 -m venv /opt/mitm
        chroot "$MITM_ROOT" env -u PIP_FIND_LINKS PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
            /opt/mitm/bin/pip install -q 'mitmproxy>=12,<13'
    fi
    MITMDUMP=(chroot "$MITM_ROOT" /opt/mitm/bin/mitmdump)
fi
say "building hermes (release)"
cargo build -q --release -p hermes-controller --bin hermes
HERMES=$ROOT/target/release/hermes

# --- upstream: nginx with a CA of the bench's own --------------------------
cd "$WORK"
if [ ! -f upstream.crt ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
        -subj "/CN=bench upstream CA" -keyout ca.key -out ca.crt \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
        -keyout upstream.key -out upstream.csr 2>/dev/null
    printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' > ext.cnf
    openssl x509 -req -in upstream.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
        -extfile ext.cnf -out upstream.crt 2>/dev/null
    cat upstream.crt ca.crt > upstream-chain.crt
fi
cat > nginx.conf <<CONF
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$UP_PORT ssl http2;
        ssl_certificate $WORK/upstream-chain.crt;
        ssl_certificate_key $WORK/upstream.key;
        location / { default_type application/json; return 200 '{"id":"bench","object":"model"}'; }
    }
}
CONF
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
    [ -n "${HOME_DIR:-}" ] && "$HERMES" --home "$HOME_DIR" egress stop >/dev/null 2>&1 || true
    [ -n "${SIGV4_HOME:-}" ] && "$HERMES" --home "$SIGV4_HOME" egress stop >/dev/null 2>&1 || true
}
trap cleanup EXIT
"$NGINX" -c "$WORK/nginx.conf" -e "$WORK/nginx-error.log"

# --- hermes ----------------------------------------------------------------
HOME_DIR=$WORK/home
rm -rf "$HOME_DIR"; mkdir -p "$HOME_DIR"
cat > "$HOME_DIR/config.yaml" <<CONF
proxy:
  tunnel_port: $HERMES_PORT
  listen: [127.0.0.1]
  upstream_deny_cidrs: [169.254.0.0/16]
  upstream_ca_file: $WORK/ca.crt
  extra_allowed_hosts: [localhost]
  resolve:
    localhost: 127.0.0.1
CONF
"$HERMES" --home "$HOME_DIR" egress setup >/dev/null
python3 - "$HOME_DIR/proxy/mappings.json" <<'PY'
import json, sys
path = sys.argv[1]
m = json.load(open(path))
for entry in m["mappings"]:
    if entry["provider"] == "openai":
        entry["hosts"].append("localhost")
json.dump(m, open(path, "w"), indent=2)
PY
OPENAI_API_KEY=sk-bench-real "$HERMES" --home "$HOME_DIR" egress start >/dev/null
TOKEN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens"]["openai"])' "$HOME_DIR/proxy/tokens.json")
HERMES_PID=$(cat "$HOME_DIR/proxy/proxy.pid")

# --- hermes, SigV4 ---------------------------------------------------------
# A second proxy whose AWS host is the upstream; one request signed once
# with the placeholder pair (botocore, from PyPI under $WORK/boto when the
# host has none), sent again and again: the proxy checks and re-signs each.
SIGV4_PORT=$((HERMES_PORT + 10))
SIGV4_HOME=$WORK/home-sigv4
rm -rf "$SIGV4_HOME"; mkdir -p "$SIGV4_HOME"
cat > "$SIGV4_HOME/config.yaml" <<CONF
proxy:
  tunnel_port: $SIGV4_PORT
  listen: [127.0.0.1]
  upstream_deny_cidrs: [169.254.0.0/16]
  upstream_ca_file: $WORK/ca.crt
  aws_hosts: [localhost]
  resolve:
    localhost: 127.0.0.1
CONF
"$HERMES" --home "$SIGV4_HOME" egress setup >/dev/null
AWS_ACCESS_KEY_ID=AKIABENCHREAL0000001 AWS_SECRET_ACCESS_KEY=bench/real/secret \
    "$HERMES" --home "$SIGV4_HOME" egress start >/dev/null
if ! python3 -c 'import botocore' 2>/dev/null && [ ! -d "$WORK/boto/botocore" ]; then
    say "installing botocore (PyPI) in $WORK/boto"
    python3 -m pip install -q --disable-pip-version-check --target "$WORK/boto" botocore
fi
SIGV4_BODY='{"prompt":"hi","max_tokens":16}'
SIGV4_HEADERS=()
while IFS= read -r line; do SIGV4_HEADERS+=(-H "$line"); done < <(
    PYTHONPATH="$WORK/boto" python3 - "$SIGV4_HOME/proxy/tokens.json" "https://localhost:$UP_PORT/model/m/invoke" "$SIGV4_BODY" <<'PY'
import json, sys
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
tokens = json.load(open(sys.argv[1]))["tokens"]
req = AWSRequest(method="POST", url=sys.argv[2], data=sys.argv[3].encode(),
                 headers={"content-type": "application/json"})
SigV4Auth(Credentials(tokens["aws"], tokens["aws-secret"]), "bedrock", "us-east-1").add_auth(req)
for name in ("content-type", "X-Amz-Date", "Authorization"):
    print(f"{name}: {req.headers[name]}")
PY
)

# --- mitmproxy -------------------------------------------------------------
# Its files, as it sees them (inside its root when it has one).
MITM_FILES=$WORK/mitm-files
[ -n "$MITM_ROOT" ] && MITM_FILES=$MITM_ROOT/bench
rm -rf "$MITM_FILES"; mkdir -p "$MITM_FILES"
cp "$WORK/ca.crt" "$ROOT/bench/egress/inject.py" "$MITM_FILES/"
SEEN=$MITM_FILES
[ -n "$MITM_ROOT" ] && SEEN=/bench
BENCH_TOKEN=$TOKEN BENCH_KEY=sk-bench-real BENCH_UPSTREAM_PORT=$UP_PORT \
    "${MITMDUMP[@]}" -q --listen-host 127.0.0.1 --listen-port $MITM_PORT \
    --set confdir="$SEEN/mitm" --set ssl_verify_upstream_trusted_ca="$SEEN/ca.crt" \
    -s "$SEEN/inject.py" >"$WORK/mitm.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -f "$MITM_FILES/mitm/mitmproxy-ca-cert.pem" ] && break; sleep 0.1; done
MITM_VERSION=$("${MITMDUMP[@]}" --version 2>/dev/null | awk '/^Mitmproxy:/ {print $2} /^Python:/ {print "on Python " $2}' | paste -sd' ')
say "mitmproxy ${MITM_VERSION:-unknown}"
sleep 1

# --- runs ------------------------------------------------------------------
run() { # name, extra oha args...
    local name=$1; shift
    say "$name: ${SECS}s, $CONNS connections"
    oha --no-tui --output-format json -z "${SECS}s" -c $CONNS --insecure "$@" >"$WORK/$name.json"
}
URL=https://localhost:$UP_PORT/v1/models
run direct -H "Authorization: Bearer sk-bench-real" "$URL"
run hermes -x "http://127.0.0.1:$HERMES_PORT" -H "Authorization: Bearer $TOKEN" "$URL"
run mitmproxy -x "http://127.0.0.1:$MITM_PORT" -H "Authorization: Bearer $TOKEN" "$URL"
run sigv4 -x "http://127.0.0.1:$SIGV4_PORT" -m POST -d "$SIGV4_BODY" "${SIGV4_HEADERS[@]}" \
    "https://localhost:$UP_PORT/model/m/invoke"

# --- 1,000 idle tunnels ----------------------------------------------------
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
RSS_BEFORE=$(rss "$HERMES_PID")
coproc IDLE { python3 "$ROOT/bench/egress/idle_tunnels.py" --proxy-port $HERMES_PORT --host localhost --port $UP_PORT \
    --ca "$HOME_DIR/proxy/ca.crt" --token "$TOKEN" -n 1000 --hold-seconds 120; }
read -r -t 120 ready <&"${IDLE[0]}" || true
sleep 1
RSS_IDLE=$(rss "$HERMES_PID")
OPEN=$(curl -s -H "Authorization: Bearer $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mgmt_token"])' "$HOME_DIR/proxy/config.json")" \
    "http://$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mgmt"])' "$HOME_DIR/proxy/state.json")/health" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["counters"]["open_tunnels"])')
exec {IDLE[1]}>&-

python3 - "$WORK" "$RSS_BEFORE" "$RSS_IDLE" "${ready:-none}" "$OPEN" <<'PY'
import json, sys
work, before, idle, ready, open_conns = sys.argv[1:]
def load(name):
    j = json.load(open(f"{work}/{name}.json"))
    s = j["summary"]
    ok = j.get("statusCodeDistribution", {})
    return s["requestsPerSec"], j["latencyPercentiles"]["p50"] * 1000, ok
d, h, m, a = load("direct"), load("hermes"), load("mitmproxy"), load("sigv4")
print(f"{'run':<10} {'req/s':>10} {'p50 ms':>8}  status codes")
for name, r in (("direct", d), ("hermes", h), ("sigv4", a), ("mitmproxy", m)):
    print(f"{name:<10} {r[0]:>10.0f} {r[1]:>8.2f}  {r[2]}")
print()
print(f"hermes / direct     throughput {h[0] / d[0]:.2f}   (target >= 0.4)   added p50 {h[1] - d[1]:.2f} ms (target < 1)")
print(f"hermes / mitmproxy  throughput {h[0] / m[0]:.1f}x  (target >= 40x)")
print(f"sigv4 / header swap throughput {a[0] / h[0]:.2f}   added p50 {a[1] - h[1]:.2f} ms (re-signing must not dominate)")
print(f"hermes RSS          {int(before) / 1024:.1f} MiB at rest, {int(idle) / 1024:.1f} MiB with {ready.split()[-1]} idle tunnels open ({open_conns} tunnels open by the proxy's count; target < 64 MiB)")
PY
