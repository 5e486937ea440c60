"""Prints model/src/config/agent_lists.rs: lists hermes takes from the installed
Hermes Agent (its sections, its terminal defaults and environment map, its
provider blocklist).

Run with the agent's Python and a scratch home:
  HERMES_HOME=$(mktemp -d) /tmp/agent-venv/bin/python scripts/agent-lists.py \
      > model/src/config/agent_lists.rs
"""
import importlib.metadata, sys
from hermes_cli.config import DEFAULT_CONFIG as D, TERMINAL_CONFIG_ENV_MAP as M
from tools.environments.local import _HERMES_PROVIDER_ENV_BLOCKLIST as B

HERMES_SECTIONS = {"terminal", "proxy", "reconcile", "security"}
version = importlib.metadata.version("hermes-agent")

def strs(name, doc, items):
    out = [f"/// {line}" if line else "///" for line in doc.split("\n")]
    out.append(f"pub const {name}: &[&str] = &[")
    out += [f'    "{i}",' for i in items]
    out.append("];")
    return "\n".join(out)

parts = [
    "//! Lists taken from Hermes Agent " + version + ", generated, not written by hand:",
    "//! `HERMES_HOME=$(mktemp -d) /tmp/agent-venv/bin/python scripts/agent-lists.py > model/src/config/agent_lists.rs`",
    "//! with the agent installed in that virtual environment.",
    "",
    strs("AGENT_SECTIONS",
         "The top-level keys of the agent's `DEFAULT_CONFIG` that are not\nhermes's sections: the agent's own, left alone without a word.",
         [k for k in D if k not in HERMES_SECTIONS]),
    "",
    strs("AGENT_SECURITY_KEYS",
         "The keys of the agent's `security` section that hermes does not\nread (`redact_secrets` it shares).",
         [k for k in D["security"] if k != "redact_secrets"]),
    "",
    strs("AGENT_TERMINAL_DEFAULTS",
         "The keys of the agent's `DEFAULT_CONFIG[\"terminal\"]`: with a\n`terminal:` mapping in the file, the file (with these defaults) wins\nover a `TERMINAL_*` variable for each of them.",
         list(D["terminal"])),
    "",
    "/// The agent's `TERMINAL_CONFIG_ENV_MAP`: (key of `terminal`, variable).",
    "pub const TERMINAL_ENV_MAP: &[(&str, &str)] = &[",
    *[f'    ("{k}", "{v}"),' for k, v in M.items()],
    "];",
    "",
    strs("PROVIDER_ENV_BLOCKLIST",
         "The agent's `_HERMES_PROVIDER_ENV_BLOCKLIST`: names it never passes\nthrough to a sandbox from `terminal.env_passthrough` (its provider,\ntool and messaging credentials), sorted.",
         sorted(B)),
    "",
]
sys.stdout.write("\n".join(parts))
