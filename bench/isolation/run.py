#!/usr/bin/env python3
"""The price of isolation, side by side in one run (docs/benchmarks.md).

For each pair, the same command through hermes, interleaved round by round
after a warm-up, p50 and p90 and the ratio of the p50s:

1. warm `hermes exec -- true`: a Docker sandbox under runc against one
   under gVisor's runsc (`terminal.docker_runtime`);
2. create to first command: a new session's first `hermes exec --session
   S -- true` (its sandbox made, started, then the command), runc against
   runsc;
3. warm `hermes exec -- true` on the local backend, unsandboxed against
   `terminal.local_sandbox: bwrap`;
4. the egress proxy's keep-alive throughput from inside the sandbox: one
   HTTPS connection through the proxy (CONNECT, the token swapped for the
   key) to a TLS upstream on this host's loopback (`proxy.resolve` maps
   api.openai.com to it), requests per second, for each of the four.

Needs the engine with the test image and a runsc runtime, and bwrap
(`bash scripts/test` provisions all of them). Works in temporary homes of
its own and removes every container it made, also on Ctrl-C.

    python3 bench/isolation/run.py [--hermes target/release/hermes] [--runs 30] [--sessions 8] [--requests 500]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def p(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def timed(cmd, env, cwd):
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited with {r.returncode}: {r.stderr.decode()[-500:]}")
    return took


class Home:
    """A temporary HERMES_HOME with one profile of its own (container
    names are per profile: each home's must differ)."""

    def __init__(self, hermes, config, tag):
        self.dir = tempfile.mkdtemp(prefix="hermes-isobench-", dir="/var/tmp")
        os.chmod(self.dir, 0o700)
        self.profile = f"isob{os.getpid()}{tag}"
        pdir = os.path.join(self.dir, "profiles", self.profile)
        os.makedirs(pdir, mode=0o700)
        with open(os.path.join(pdir, "config.yaml"), "w") as f:
            f.write(config)
        self.hermes = hermes
        self.env = dict(os.environ, HERMES_HOME=self.dir)
        self.cwd = tempfile.mkdtemp(prefix="hermes-isobench-ws-", dir="/var/tmp")

    def run(self, *args):
        return [self.hermes, "--profile", self.profile, *args]

    def close(self):
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=hermes-profile={self.profile}"],
                             capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.cwd, ignore_errors=True)


def pair(title, a, b, runs, warmup):
    """a, b: (label, Home, args); interleaved rounds."""
    samples = {a[0]: [], b[0]: []}
    for i in range(warmup + runs):
        order = (a, b) if i % 2 == 0 else (b, a)
        for label, home, args in order:
            t = timed(home.run(*args), home.env, home.cwd)
            if i >= warmup:
                samples[label].append(t)
    print(f"\n{title}")
    print(f"  {'':44} {'p50':>9} {'p90':>9}")
    for label in samples:
        s = samples[label]
        print(f"  {label:44} {p(s, .5) * 1e3:7.1f}ms {p(s, .9) * 1e3:7.1f}ms")
    ratio = p(samples[b[0]], .5) / p(samples[a[0]], .5)
    print(f"  ratio of the p50s ({b[0]} / {a[0]}): {ratio:.2f}")
    return ratio


UPSTREAM = r"""
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        body = b'{"object":"list","data":[]}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""

CLIENT = r"""
import http.client, os, ssl, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
ph, pp = os.environ["HTTPS_PROXY"].split("://", 1)[1].rsplit(":", 1)
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
c = http.client.HTTPSConnection(ph, int(pp), context=ctx, timeout=30)
c.set_tunnel("api.openai.com", port)
auth = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
def one():
    c.request("GET", "/v1/models", headers=auth)
    r = c.getresponse(); r.read()
    if r.status != 200:
        sys.exit(f"status {r.status}")
for _ in range(50):
    one()
t = time.perf_counter()
for _ in range(n):
    one()
print(f"{n / (time.perf_counter() - t):.1f}")
"""


def free_port():
    import socket
    for _ in range(100):
        a = socket.socket(); a.bind(("127.0.0.1", 0)); port = a.getsockname()[1]
        b = socket.socket()
        try:
            b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        finally:
            a.close(); b.close()
        return port
    sys.exit("no free port pair")


def throughput(homes, upstream_port, requests, rounds):
    """Requests per second over one keep-alive connection through the
    proxy, from inside each home's sandbox; the best of `rounds`."""
    print(f"\n4. the egress proxy's keep-alive throughput from inside ({requests} requests, best of {rounds})")
    results = {}
    for label, h in homes:
        best = 0.0
        for _ in range(rounds):
            r = subprocess.run(h.run("exec", "--", "python3", "-c", CLIENT, str(upstream_port), str(requests)),
                               env=h.env, cwd=h.cwd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{label}: the client failed: {r.stdout[-300:]} {r.stderr[-500:]}")
            best = max(best, float(r.stdout.strip().splitlines()[-1]))
        results[label] = best
        print(f"  {label:44} {best:8.1f} req/s")
    base = results[homes[0][0]]
    for label, _ in homes[1:]:
        print(f"  ratio {label} / {homes[0][0]}: {results[label] / base:.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hermes", default=None)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--image", default=os.environ.get("HERMES_TEST_IMAGE", "hermes-test-base:bookworm-1"))
    ap.add_argument("--runsc", default=os.environ.get("HERMES_TEST_RUNSC", "runsc"))
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    hermes = args.hermes or next(
        (p for p in (f"{root}/target/release/hermes", f"{root}/target/debug/hermes") if os.path.exists(p)), None)
    if not hermes:
        sys.exit("no hermes binary: cargo build --release --bin hermes")
    print(f"hermes: {hermes}; image: {args.image}; runtime: {args.runsc}; "
          f"load average {os.getloadavg()[0]:.1f}; {args.runs} runs of each side")
    docker = lambda runtime, extra="": (
        f"terminal:\n  backend: docker\n  docker_image: {args.image}\n  docker_runtime: {runtime}\n{extra}")
    homes = []
    tls = tempfile.mkdtemp(prefix="hermes-isobench-tls-")
    # A CA of the bench's own, and the upstream's certificate from it (a
    # self-signed one would be a CA used as an end entity: refused).
    ca, ca_key = os.path.join(tls, "ca.pem"), os.path.join(tls, "ca.key")
    cert, key, csr = (os.path.join(tls, n) for n in ("cert.pem", "key.pem", "req.csr"))
    ext = os.path.join(tls, "ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:api.openai.com\nbasicConstraints=CA:FALSE\n")
    for step in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=hermes isolation bench CA",
         "-keyout", ca_key, "-out", ca],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=api.openai.com", "-keyout", key, "-out", csr],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
         "-extfile", ext, "-out", cert],
    ):
        subprocess.run(["openssl", *step], check=True, capture_output=True)
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, cert, key], stdout=subprocess.PIPE, text=True)
    upstream_port = int(upstream.stdout.readline())
    def proxied(extra=""):
        return (f"{extra}security:\n  redact_secrets: false\nproxy:\n  enabled: true\n  tunnel_port: {free_port()}\n"
                f"  upstream_deny_cidrs: [169.254.0.0/16]\n  upstream_ca_file: {ca}\n"
                f"  resolve:\n    api.openai.com: 127.0.0.1\n")
    try:
        runc = Home(hermes, docker("runc"), "runc"); homes.append(runc)
        runsc = Home(hermes, docker(args.runsc), "runsc"); homes.append(runsc)
        for h in (runc, runsc):
            timed(h.run("reconcile"), h.env, h.cwd)
        pair("1. warm exec of `true` (docker)", ("runc", runc, ["exec", "--", "true"]),
             (args.runsc, runsc, ["exec", "--", "true"]), args.runs, args.warmup)

        counter = iter(range(10**6))
        def session(h):
            return ["exec", "--session", f"s{next(counter)}", "--", "true"]
        samples = {"runc": [], args.runsc: []}
        for i in range(args.sessions):
            for label, h in (("runc", runc), (args.runsc, runsc)) if i % 2 == 0 else ((args.runsc, runsc), ("runc", runc)):
                samples[label].append(timed(h.run(*session(h)), h.env, h.cwd))
        print("\n2. create to first command: a new session's first `exec -- true`")
        print(f"  {'':44} {'p50':>9} {'p90':>9}")
        for label, s in samples.items():
            print(f"  {label:44} {p(s, .5) * 1e3:7.1f}ms {p(s, .9) * 1e3:7.1f}ms")
        print(f"  ratio of the p50s ({args.runsc} / runc): {p(samples[args.runsc], .5) / p(samples['runc'], .5):.2f}")

        plain = Home(hermes, "terminal:\n  backend: local\n", "local"); homes.append(plain)
        bwrap = Home(hermes, "terminal:\n  backend: local\n  local_sandbox: bwrap\n", "bwrap"); homes.append(bwrap)
        pair("3. warm exec of `true` (local)", ("local", plain, ["exec", "--", "true"]),
             ("local under bwrap", bwrap, ["exec", "--", "true"]), args.runs, args.warmup)

        # 4: the same four, each with the proxy on (a home of its own).
        four = [
            ("docker, runc", docker("runc"), "prunc"),
            (f"docker, {args.runsc}", docker(args.runsc), "prunsc"),
            ("local under bwrap", "terminal:\n  backend: local\n  local_sandbox: bwrap\n", "pbwrap"),
        ]
        proxied_homes = []
        for label, config, tag in four:
            h = Home(hermes, config + proxied(), tag); homes.append(h)
            with open(os.path.join(h.dir, "profiles", h.profile, ".env"), "w") as f:
                f.write("OPENAI_API_KEY=sk-isobench-REAL-0001\n")
            timed(h.run("reconcile"), h.env, h.cwd)
            proxied_homes.append((label, h))
        throughput(proxied_homes, upstream_port, args.requests, 3)
    finally:
        for h in homes:
            subprocess.run(h.run("egress", "stop"), env=h.env, cwd=h.cwd,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            h.close()
        upstream.kill()
        shutil.rmtree(tls, ignore_errors=True)


if __name__ == "__main__":
    main()
