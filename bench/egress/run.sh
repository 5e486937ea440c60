#!/usr/bin/env bash
# The egress proxy benchmark, one run, side by side, with the upstream
# offering HTTP/1.1 only and then HTTP/2 (and HTTP/1.1):
#   direct              oha -> nginx (TLS, a small JSON answer)
#   hermes CONNECT      oha -> hermes egress proxy (CONNECT, MITM, token swap) -> nginx
#   hermes transparent  oha -> hermes's tunnel port, TLS at once (no CONNECT:
#                       the SNI names the target, as on the proxy-only network) -> nginx
#   squid               oha -> squid (ssl_bump, generated host certificates,
#                       request_header_replace of Authorization) -> nginx
#   mitmproxy           oha -> mitmproxy with an addon doing the same swap -> nginx
#   sigv4               oha -> a second hermes proxy whose AWS host is the upstream:
#                       the placeholder's SigV4 signature checked, the request
#                       signed again with the real pair -> nginx (a POST), beside
#                       the header swap (hermes CONNECT) at keep-alive c=16
# Each with keep-alive HTTPS at 16 and at 1 connection, and with a new
# connection per request (4 at a time), with the CPU time per request of
# nginx's worker and of the hermes proxy (for direct and the hermes rows);
# then the proxy's RSS with 1,000 idle tunnels open (with each upstream
# kind, the proxy started afresh).
# Everything runs in a network namespace of the bench's own, on its
# loopback: the upstream listens on port 443 there (the transparent path
# goes to the SNI name's port 443) without touching the host's network.
# The upstream is named `localhost` (found in /etc/hosts, so no client
# asks DNS); the bench maps the openai provider to it, so that hermes swaps
# the token exactly as for api.openai.com.
# Installs what it needs when missing: nginx and squid-openssl (apt), oha
# (cargo install), mitmproxy 12 (PyPI, in a venv under target/bench; where
# the host's Python is older than 3.12, inside a Debian trixie root made
# there with debootstrap).
# Usage: bash bench/egress/run.sh [SECONDS]   (default 10 per run)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
SECS=${1:-10}
WORK=$ROOT/target/bench/egress
HERMES_PORT=18090
MITM_PORT=18080
SQUID_PORT=18128
mkdir -p "$WORK"
say() { printf '==> %s\n' "$*" >&2; }

# --- tools (outside the namespace: they may need the network) ---------------
if [ -z "${HERMES_BENCH_NS:-}" ]; then
    need=()
    command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
    command -v squid >/dev/null || [ -x /usr/sbin/squid ] || need+=(squid-openssl)
    command -v openssl >/dev/null || need+=(openssl)
    if [ ${#need[@]} -gt 0 ]; then
        say "installing ${need[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends "${need[@]}" >/dev/null
    fi
    if ! command -v oha >/dev/null; then
        say "installing oha (cargo install)"
        cargo install oha --locked >/dev/null
    fi
    # mitmproxy 12 (the baseline) needs Python 3.12 or newer. Where the
    # host's Python is older (Debian bookworm has 3.11), it runs from a
    # Debian trixie root made with debootstrap (Python 3.13), entered with
    # chroot: it shares the caller's network, so loopback is the same. pip
    # there trusts the host's CA bundle, as the host's pip does.
    if python3 -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
        if [ ! -x "$WORK/venv/bin/mitmdump" ]; then
            say "installing mitmproxy 12 (PyPI) in $WORK/venv"
            python3 -m venv "$WORK/venv"
            "$WORK/venv/bin/pip" install -q 'mitmproxy>=12,<13'
        fi
    else
        MITM_ROOT=$WORK/trixie
        if [ ! -x "$MITM_ROOT/opt/mitm/bin/mitmdump" ]; then
            command -v debootstrap >/dev/null || {
                DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends debootstrap >/dev/null
            }
            say "making a Debian trixie root for mitmproxy 12 (Python $(python3 -c 'import sys; print(sys.version.split()[0])') here is too old) in $MITM_ROOT"
            rm -rf "$MITM_ROOT"
            # The mirror this machine's apt uses ($HERMES_DEBIAN_MIRROR wins).
            mirror=$(bash "$ROOT/scripts/debian-mirror")
            debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
                trixie "$MITM_ROOT" "$mirror" >/dev/null
            cp /etc/resolv.conf "$MITM_ROOT/etc/resolv.conf"
            cp /etc/ssl/certs/ca-certificates.crt "$MITM_ROOT/etc/ssl/certs/ca-certificates.crt"
            say "installing mitmproxy 12 (PyPI) in $MITM_ROOT/opt/mitm"
            chroot "$MITM_ROOT" python3 -m venv /opt/mitm
            chroot "$MITM_ROOT" env -u PIP_FIND_LINKS PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
                /opt/mitm/bin/pip install -q 'mitmproxy>=12,<13'
        fi
    fi
    # botocore signs the SigV4 row's request once (with the placeholder).
    if ! python3 -c 'import botocore' 2>/dev/null && [ ! -d "$WORK/boto/botocore" ]; then
        say "installing botocore (PyPI) in $WORK/boto"
        python3 -m pip install -q --disable-pip-version-check --target "$WORK/boto" botocore
    fi
    say "building hermes (release)"
    cargo build -q --release -p hermes-controller --bin hermes
    # The rest in a network namespace of the bench's own (loopback only).
    NS=hermes-bench-$$
    ip netns add "$NS"
    trap 'ip netns del "$NS" 2>/dev/null || true' EXIT
    ip netns exec "$NS" ip link set lo up
    HERMES_BENCH_NS=$NS ip netns exec "$NS" bash "${BASH_SOURCE[0]}" "$@"
    exit
fi

HERMES=$ROOT/target/release/hermes
MITM_ROOT=
MITMDUMP=("$WORK/venv/bin/mitmdump")
if [ -x "$WORK/trixie/opt/mitm/bin/mitmdump" ] && ! [ -x "$WORK/venv/bin/mitmdump" ]; then
    MITM_ROOT=$WORK/trixie
    MITMDUMP=(chroot "$MITM_ROOT" /opt/mitm/bin/mitmdump)
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
SQUID=$(command -v squid || echo /usr/sbin/squid)

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
nginx_start() { # h1 | h2
    local http2=
    [ "$1" = h2 ] && http2=" http2"
    cat > nginx.conf <<CONF
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 8192; }
worker_rlimit_nofile 16384;
http {
    access_log off;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:443 ssl$http2;
        ssl_certificate $WORK/upstream-chain.crt;
        ssl_certificate_key $WORK/upstream.key;
        location / { default_type application/json; return 200 '{"id":"bench","object":"model"}'; }
    }
}
CONF
    "$NGINX" -c "$WORK/nginx.conf" -e "$WORK/nginx-error.log"
}
nginx_stop() {
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
    for _ in $(seq 50); do [ -f "$WORK/nginx.pid" ] || break; sleep 0.1; done
}
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    nginx_stop
    [ -f "$WORK/squid/squid.pid" ] && kill "$(cat "$WORK/squid/squid.pid")" 2>/dev/null || true
    [ -n "${HOME_DIR:-}" ] && "$HERMES" --home "$HOME_DIR" egress stop >/dev/null 2>&1 || true
    [ -n "${SIGV4_HOME:-}" ] && "$HERMES" --home "$SIGV4_HOME" egress stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

# --- hermes ----------------------------------------------------------------
HOME_DIR=$WORK/home
rm -rf "$HOME_DIR"; mkdir -p "$HOME_DIR"
cat > "$HOME_DIR/config.yaml" <<CONF
proxy:
  enabled: true
  tunnel_port: $HERMES_PORT
  listen: [127.0.0.1]
  upstream_deny_cidrs: [169.254.0.0/16]
  upstream_ca_file: $WORK/ca.crt
  extra_allowed_hosts: [localhost]
  resolve:
    localhost: 127.0.0.1
CONF
"$HERMES" --home "$HOME_DIR" egress setup >/dev/null
# The openai provider serves `localhost` too; all 1,000 idle tunnels come
# from one address (the default allows 256 per client).
python3 - "$HOME_DIR/proxy/mappings.json" "$HOME_DIR/proxy/config.json" <<'PY'
import json, sys
path = sys.argv[1]
m = json.load(open(path))
for entry in m["mappings"]:
    if entry["provider"] == "openai":
        entry["hosts"].append("localhost")
json.dump(m, open(path, "w"), indent=2)
c = json.load(open(sys.argv[2]))
c.setdefault("limits", {})["max_connections_per_client"] = 4096
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
hermes_start() {
    "$HERMES" --home "$HOME_DIR" egress stop >/dev/null 2>&1 || true
    OPENAI_API_KEY=sk-bench-real "$HERMES" --home "$HOME_DIR" egress start >/dev/null
    HERMES_PID=$(cat "$HOME_DIR/proxy/proxy.pid")
}
hermes_start
TOKEN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens"]["openai"])' "$HOME_DIR/proxy/tokens.json")

# --- hermes, SigV4 ---------------------------------------------------------
# A second proxy whose AWS host is the upstream; one request signed once
# with the placeholder pair (botocore), sent again and again: the proxy
# checks and re-signs each.
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
SIGV4_URL=https://localhost/model/m/invoke
SIGV4_BODY='{"prompt":"hi","max_tokens":16}'
SIGV4_HEADERS=()
while IFS= read -r line; do SIGV4_HEADERS+=(-H "$line"); done < <(
    PYTHONPATH="$WORK/boto" python3 - "$SIGV4_HOME/proxy/tokens.json" "$SIGV4_URL" "$SIGV4_BODY" <<'PY'
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

# --- squid -----------------------------------------------------------------
# ssl_bump with host certificates minted by its helper from a CA of its
# own, the token's header replaced by the key (request_header_replace
# needs the header denied first), no cache, no access log.
SQ=$WORK/squid
rm -rf "$SQ"; mkdir -p "$SQ"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=bench squid CA" -keyout "$SQ/ca.key" -out "$SQ/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" 2>/dev/null
/usr/lib/squid/security_file_certgen -c -s "$SQ/ssl_db" -M 16MB >/dev/null
cp "$WORK/ca.crt" "$SQ/upstream-ca.crt"
cat > "$SQ/squid.conf" <<CONF
workers 1
http_port 127.0.0.1:$SQUID_PORT ssl-bump tls-cert=$SQ/ca.crt tls-key=$SQ/ca.key generate-host-certificates=on dynamic_cert_mem_cache_size=16MB
sslcrtd_program /usr/lib/squid/security_file_certgen -s $SQ/ssl_db -M 16MB
sslcrtd_children 4 startup=1 idle=1
ssl_bump bump all
tls_outgoing_options cafile=$SQ/upstream-ca.crt
acl bench src 127.0.0.1/32
http_access allow bench
http_access deny all
request_header_access Authorization deny all
request_header_replace Authorization Bearer sk-bench-real
cache deny all
access_log none
cache_log $SQ/cache.log
pid_filename $SQ/squid.pid
coredump_dir $SQ
cache_effective_user proxy
dns_nameservers 127.0.0.1
max_filedescriptors 16384
shutdown_lifetime 0 seconds
CONF
chown -R proxy:proxy "$SQ"
"$SQUID" -f "$SQ/squid.conf" -N >"$SQ/stdout.log" 2>&1 &
pids+=($!)

# --- mitmproxy -------------------------------------------------------------
# Its files, as it sees them (inside its root when it has one).
MITM_FILES=$WORK/mitm-files
[ -n "$MITM_ROOT" ] && MITM_FILES=$MITM_ROOT/bench
rm -rf "$MITM_FILES"; mkdir -p "$MITM_FILES"
cp "$WORK/ca.crt" "$ROOT/bench/egress/inject.py" "$MITM_FILES/"
SEEN=$MITM_FILES
[ -n "$MITM_ROOT" ] && SEEN=/bench
BENCH_TOKEN=$TOKEN BENCH_KEY=sk-bench-real BENCH_UPSTREAM_PORT=443 \
    "${MITMDUMP[@]}" -q --listen-host 127.0.0.1 --listen-port $MITM_PORT \
    --set confdir="$SEEN/mitm" --set ssl_verify_upstream_trusted_ca="$SEEN/ca.crt" \
    -s "$SEEN/inject.py" >"$WORK/mitm.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -f "$MITM_FILES/mitm/mitmproxy-ca-cert.pem" ] && break; sleep 0.1; done
MITM_VERSION=$("${MITMDUMP[@]}" --version 2>/dev/null | awk '/^Mitmproxy:/ {print $2} /^Python:/ {print "on Python " $2}' | paste -sd' ')
say "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
say "mitmproxy ${MITM_VERSION:-unknown}, $("$SQUID" -v | head -1), $(oha --version), nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///')"
sleep 1

# --- runs ------------------------------------------------------------------
URL=https://localhost/v1/models
run() { # upstream kind, row, mode, oha args...
    local kind=$1 row=$2 mode=$3; shift 3
    local conns
    case $mode in
        ka16) conns=(-c 16) ;;
        ka1) conns=(-c 1) ;;
        new) conns=(-c 4 --disable-keepalive) ;;
    esac
    say "$kind $row $mode: ${SECS}s"
    local before_n before_h
    before_n=$(ticks "$NGINX_WORKER"); before_h=$(ticks "$HERMES_PID")
    oha --no-tui --output-format json -z "${SECS}s" "${conns[@]}" --insecure "$@" \
        >"$WORK/$kind-$row-$mode.json"
    echo "$(($(ticks "$NGINX_WORKER") - before_n)) $(($(ticks "$HERMES_PID") - before_h)) $(getconf CLK_TCK)" \
        >"$WORK/$kind-$row-$mode.cpu"
}
# CPU time (user + system, in clock ticks) a process has used so far.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
mgmt_get() {
    curl -s -H "Authorization: Bearer $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mgmt_token"])' "$HOME_DIR/proxy/config.json")" \
        "http://$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mgmt"])' "$HOME_DIR/proxy/state.json")$1"
}
for kind in h1 h2; do
    nginx_stop
    nginx_start "$kind"
    sleep 0.5
    NGINX_WORKER=$(pgrep -P "$(cat "$WORK/nginx.pid")" | head -1)
    for mode in ka16 ka1 new; do
        run "$kind" direct "$mode" -H "Authorization: Bearer sk-bench-real" "$URL"
        run "$kind" connect "$mode" -x "http://127.0.0.1:$HERMES_PORT" -H "Authorization: Bearer $TOKEN" "$URL"
        run "$kind" transparent "$mode" --connect-to "localhost:443:127.0.0.1:$HERMES_PORT" \
            -H "Authorization: Bearer $TOKEN" "$URL"
        run "$kind" squid "$mode" -x "http://127.0.0.1:$SQUID_PORT" -H "Authorization: Bearer $TOKEN" "$URL"
        run "$kind" mitmproxy "$mode" -x "http://127.0.0.1:$MITM_PORT" -H "Authorization: Bearer $TOKEN" "$URL"
    done
    run "$kind" sigv4 ka16 -x "http://127.0.0.1:$SIGV4_PORT" -m POST -d "$SIGV4_BODY" \
        "${SIGV4_HEADERS[@]}" "$SIGV4_URL"
    # 1,000 idle tunnels, the proxy started afresh.
    hermes_start
    sleep 1
    before=$(rss "$HERMES_PID")
    coproc IDLE { python3 "$ROOT/bench/egress/idle_tunnels.py" --proxy-port $HERMES_PORT --host localhost --port 443 \
        --ca "$HOME_DIR/proxy/ca.crt" --token "$TOKEN" -n 1000 --hold-seconds 120; }
    ready=
    read -r -t 120 ready <&"${IDLE[0]}" || true
    sleep 1
    idle=$(rss "$HERMES_PID")
    open=$(mgmt_get /health | python3 -c 'import json,sys; print(json.load(sys.stdin)["counters"]["open_tunnels"])')
    idle_pid=$IDLE_PID
    [ -n "${IDLE[1]:-}" ] && eval "exec ${IDLE[1]}>&-"
    wait "$idle_pid" 2>/dev/null || true
    ready=${ready:-ready none}
    echo "$before ${idle:-0} ${ready##* } ${open:-none}" >"$WORK/$kind-rss.txt"
    hermes_start
done

python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
ROWS = [("direct", "direct"), ("connect", "hermes CONNECT"), ("transparent", "hermes transparent"),
        ("squid", "squid"), ("mitmproxy", "mitmproxy")]
MODES = [("ka16", "keep-alive c=16"), ("ka1", "keep-alive c=1"), ("new", "new conn/request c=4")]
def load(kind, row, mode):
    j = json.load(open(f"{work}/{kind}-{row}-{mode}.json"))
    codes = j.get("statusCodeDistribution", {})
    ok = sum(v for k, v in codes.items() if k == "200")
    errors = {k: v for k, v in j.get("errorDistribution", {}).items() if "deadline" not in k}
    bad = sum(v for k, v in codes.items() if k != "200") + sum(errors.values())
    return j["summary"]["requestsPerSec"] * (ok / max(ok + bad, 1)), bad
fails = []
for kind, title in (("h1", "upstream HTTP/1.1"), ("h2", "upstream HTTP/2")):
    r = {(row, mode): load(kind, row, mode) for row, _ in ROWS for mode, _ in MODES}
    print(f"== {title}")
    print(f"{'':<20}" + "".join(f"{name:>32}" for _, name in MODES))
    print(f"{'':<20}" + "".join(f"{'req/s  /direct  /squid':>32}" for _ in MODES))
    for row, name in ROWS:
        cells = []
        for mode, _ in MODES:
            v, bad = r[(row, mode)]
            d, s = r[("direct", mode)][0], r[("squid", mode)][0]
            cell = f"{v:9.0f} {v / d:8.2f} {v / s:7.2f}" + ("!" if bad else " ")
            cells.append(f"{cell:>32}")
        print(f"{name:<20}" + "".join(cells))
    # Where the CPU goes, per request: nginx's worker (the upstream) and
    # the hermes proxy, from their own CPU time over the run.
    print(f"{'CPU per request, us':<20}" + "".join(f"{'nginx   hermes':>32}" for _ in MODES))
    for row, name in ROWS[:3]:
        cells = []
        for mode, _ in MODES:
            n, h, tck = (int(x) for x in open(f"{work}/{kind}-{row}-{mode}.cpu").read().split())
            reqs = sum(json.load(open(f"{work}/{kind}-{row}-{mode}.json")).get("statusCodeDistribution", {}).values())
            per = lambda t: t / tck * 1e6 / max(reqs, 1)
            cells.append(f"{per(n):>24.1f} {per(h):7.1f}" if row != "direct" else f"{per(n):>24.1f} {'-':>7}")
        print(f"{name:<20}" + "".join(cells))
    before, idle, ready, open_t = open(f"{work}/{kind}-rss.txt").read().split()
    idle_mib = int(idle) / 1024
    print(f"hermes RSS: {int(before) / 1024:.1f} MiB at rest, {idle_mib:.1f} MiB with {ready} idle tunnels open ({open_t} by the proxy's count)")
    def check(ok, text):
        print(f"  [{'ok' if ok else 'MISSED'}] {text}")
        if not ok:
            fails.append(f"{kind}: {text}")
    for mode, mname in MODES:
        c, t = r[("connect", mode)][0], r[("transparent", mode)][0]
        check(t >= 0.95 * c, f"transparent within 5 % of CONNECT (or faster), {mname}: {t / c:.3f}")
    for row in ("connect", "transparent"):
        v = r[(row, "new")][0] / r[("direct", "new")][0]
        check(v >= 0.9, f"{row}: new connection per request >= 0.9 of direct: {v:.2f}")
        v = r[(row, "ka16")][0] / r[("direct", "ka16")][0]
        check(v >= 0.45, f"{row}: keep-alive c=16 >= 0.45 of direct: {v:.2f}")
        for mode, mname in MODES:
            v = r[(row, mode)][0] / r[("squid", mode)][0]
            check(v >= 1.5, f"{row}: >= 1.5x squid, {mname}: {v:.2f}x")
    check(idle_mib < 64 and ready == "1000", f"1,000 idle tunnels < 64 MiB: {idle_mib:.1f} MiB")
    a, bad = load(kind, "sigv4", "ka16")
    h = r[("connect", "ka16")][0]
    print(f"  sigv4 (re-signed) keep-alive c=16: {a:.0f} req/s{'!' if bad else ''}, {a / h:.2f} of the header swap's {h:.0f}")
    print()
print("(! marks a run with non-200 answers or errors; its req/s counts only the 200s)")
print(f"{len(fails)} target(s) missed")
PY
