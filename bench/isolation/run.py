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
   `terminal.local_sandbox: bwrap`.

Needs the engine with the test image and a runsc runtime, and bwrap
(`bash scripts/test` provisions all of them). Works in temporary homes of
its own and removes every container it made, also on Ctrl-C.

    python3 bench/isolation/run.py [--hermes target/release/hermes] [--runs 30] [--sessions 8]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hermes", default=None)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=8)
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
    finally:
        for h in homes:
            h.close()


if __name__ == "__main__":
    main()
