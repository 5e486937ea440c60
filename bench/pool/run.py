#!/usr/bin/env python3
"""A new session's first command, and a stopped sandbox's, side by side in
one run (docs/benchmarks.md).

1. new session -> first command done: `hermes exec --session S -- true`
   for a session never seen before, with a warm pool of 2
   (`terminal.warm_pool`: the session claims a ready member), against no
   pool (its sandbox made, started, then the command), against `docker run
   --rm IMAGE true`; rounds interleaved, the pool refilled between rounds
   (untimed), each session's container removed after its round;
2. the refill: `hermes reconcile` making the one member a claim took;
3. a stopped sandbox's first command (`terminal.idle_action: stop`: the
   container stopped as the plan's stop does, then `hermes exec -- true`
   starts it again) against a running one's.

p50 and p90 of each, and the ratios of the p50s. Needs the engine with the
test image (`bash scripts/test` provisions it). Works in temporary homes of
its own and removes every container it made, also on Ctrl-C.

    python3 bench/pool/run.py [--hermes target/release/hermes] [--runs 30]
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time


def p(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def run(cmd, env=None, cwd=None):
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited with {r.returncode}: {r.stderr[-500:]}")
    return r


def timed(cmd, env=None, cwd=None):
    t = time.perf_counter()
    r = run(cmd, env, cwd)
    return time.perf_counter() - t, r


class Home:
    """A temporary HERMES_HOME with one profile of its own."""

    def __init__(self, hermes, config, tag):
        self.dir = tempfile.mkdtemp(prefix="hermes-poolbench-", dir="/var/tmp")
        os.chmod(self.dir, 0o700)
        self.profile = f"poolb{os.getpid()}{tag}"
        pdir = os.path.join(self.dir, "profiles", self.profile)
        os.makedirs(pdir, mode=0o700)
        with open(os.path.join(pdir, "config.yaml"), "w") as f:
            f.write(config)
        self.hermes = hermes
        self.env = dict(os.environ, HERMES_HOME=self.dir)

    def cmd(self, *args):
        return [self.hermes, "--profile", self.profile, *args]

    def run(self, *args):
        return run(self.cmd(*args), self.env)

    def timed(self, *args):
        return timed(self.cmd(*args), self.env)

    def remove(self, name):
        subprocess.run(["docker", "rm", "-f", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self):
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=hermes-profile={self.profile}"],
                             capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


def show(title, samples, base=None):
    print(f"\n{title}")
    print(f"  {'':44} {'p50':>9} {'p90':>9}")
    for label, s in samples.items():
        print(f"  {label:44} {p(s, .5) * 1e3:7.1f}ms {p(s, .9) * 1e3:7.1f}ms")
    if base:
        b = p(samples[base], .5)
        for label, s in samples.items():
            if label != base:
                print(f"  ratio of the p50s ({label} / {base}): {p(s, .5) / b:.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hermes", default=None)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--image", default=os.environ.get("HERMES_TEST_IMAGE", "hermes-test-base:bookworm-1"))
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    hermes = args.hermes or next(
        (p for p in (f"{root}/target/release/hermes", f"{root}/target/debug/hermes") if os.path.exists(p)), None)
    if not hermes:
        sys.exit("no hermes binary: cargo build --release --bin hermes")
    print(f"hermes: {hermes}; image: {args.image}; load average {os.getloadavg()[0]:.1f}; "
          f"{args.runs} runs of each side")
    sessions = f"terminal:\n  backend: docker\n  docker_image: {args.image}\n  container_persistent: false\n"
    homes = []
    try:
        pooled = Home(hermes, sessions + "  warm_pool: 2\n", "p")
        cold = Home(hermes, sessions, "c")
        stopped = Home(hermes, f"terminal:\n  backend: docker\n  docker_image: {args.image}\n"
                       "  idle_action: stop\n", "s")
        homes += [pooled, cold, stopped]
        pooled.run("reconcile")
        first = {"pool of 2 (a member claimed)": [], "no pool (made, started)": [],
                 "docker run --rm IMAGE true": []}
        refill = {"hermes reconcile (1 member made)": []}
        claimed = 0
        for i in range(args.warmup + args.runs):
            keep = i >= args.warmup
            session = f"b{i}"
            order = [0, 1, 2] if i % 2 == 0 else [2, 1, 0]
            for which in order:
                if which == 0:
                    took, r = pooled.timed("exec", "--session", session, "--", "true")
                    claimed += "   claim  " in r.stderr
                    if keep:
                        first["pool of 2 (a member claimed)"].append(took)
                elif which == 1:
                    took, _ = cold.timed("exec", "--session", session, "--", "true")
                    if keep:
                        first["no pool (made, started)"].append(took)
                else:
                    took, _ = timed(["docker", "run", "--rm", args.image, "true"])
                    if keep:
                        first["docker run --rm IMAGE true"].append(took)
            pooled.remove(f"hermes-{pooled.profile}-default-{session}")
            cold.remove(f"hermes-{cold.profile}-default-{session}")
            took, _ = pooled.timed("reconcile")
            if keep:
                refill["hermes reconcile (1 member made)"].append(took)
        if claimed < args.runs:
            sys.exit(f"only {claimed} of {args.warmup + args.runs} first commands claimed a member")
        show("1. new session -> first command done", first, base="docker run --rm IMAGE true")
        b = p(first["no pool (made, started)"], .5)
        print(f"  ratio of the p50s (pool of 2 / no pool): {p(first['pool of 2 (a member claimed)'], .5) / b:.2f}")
        show("2. the refill after a claim", refill)

        stopped.run("reconcile")
        name = f"hermes-{stopped.profile}-default"
        resume = {"running sandbox": [], "stopped sandbox (started again)": []}
        for i in range(args.warmup + args.runs):
            keep = i >= args.warmup
            took, _ = stopped.timed("exec", "--", "true")
            if keep:
                resume["running sandbox"].append(took)
            run(["docker", "stop", "-t", "0", name])
            took, r = stopped.timed("exec", "--", "true")
            if keep:
                resume["stopped sandbox (started again)"].append(took)
        show("3. a stopped sandbox's first command (terminal.idle_action: stop)", resume,
             base="running sandbox")
    finally:
        for h in homes:
            h.close()


if __name__ == "__main__":
    main()
