"""The sandbox controller's commands in Hermes Agent's own CLI.

``hermes reconcile``, ``hermes sandbox``, ``hermes session``,
``hermes controller`` and ``hermes egress`` become subcommands of the
agent's ``hermes``, each run by the controller's binary ``hermesctl``
(``$HERMESCTL`` when set, else found on ``PATH``) with the same arguments.
The process is replaced by ``hermesctl``: stdin, stdout, stderr, signals
and the exit code are the controller's own. ``HERMES_HOME`` is the home
the agent resolved (from ``-p PROFILE`` among others), so both programs
act on one home.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

#: The controller's binary, and the variable that names another one.
BINARY = "hermesctl"
BINARY_ENV = "HERMESCTL"

#: The name the controller is run under, so that its usage and errors say
#: ``hermes reconcile`` as the user typed it.
ARGV0 = "hermes"

#: Each command with its help line in ``hermes COMMAND --help`` of the agent
#: (the controller's own help comes with ``hermes COMMAND --help``).
COMMANDS: dict[str, str] = {
    "reconcile": "Compare config.yaml with the host and converge the sandboxes (hermesctl)",
    "sandbox": "Inspect the sandboxes hermesctl manages",
    "session": "Session sandboxes, one per session id (hermesctl; `sessions` is the agent's history)",
    "controller": "Converge the sandboxes continuously, in the foreground (hermesctl)",
    "egress": "The egress credential proxy: set-up, daemon, status (hermesctl)",
}

#: Where to get the binary when it is missing.
INSTALL_HINT = (
    "install the hermes sandbox controller (`cargo install --path controller` "
    "in its repository puts hermesctl in ~/.cargo/bin) or set HERMESCTL to its path"
)


def register(ctx: Any) -> None:
    """Hermes Agent's plugin entry point: one CLI command per controller
    command, but none that the agent has built in (the agent's parser
    would refuse the second one, and its own comes first)."""
    taken = _builtin_commands()
    for name, help_text in COMMANDS.items():
        if name in taken:
            continue
        ctx.register_cli_command(
            name=name,
            help=help_text,
            setup_fn=_take_every_argument,
            handler_fn=functools.partial(_dispatch, name),
            description=f"Runs `{BINARY} {name} ARGS...` on the agent's HERMES_HOME.",
        )


def _builtin_commands() -> frozenset[str]:
    """The agent's own top-level commands, as its CLI lists them (empty
    when that list is not where version 0.19 keeps it)."""
    main = sys.modules.get("hermes_cli.main")
    names = getattr(main, "_BUILTIN_SUBCOMMANDS", frozenset())
    return frozenset(names) if isinstance(names, (set, frozenset)) else frozenset()


def _take_every_argument(parser: argparse.ArgumentParser) -> None:
    """Makes the agent's subparser hand every word after the command to
    hermesctl as it is, `--help` and `--dry-run` included: with no prefix
    characters no word is an option of the agent's, so all of them land in
    one positional list."""
    parser.prefix_chars = ""
    parser.add_argument("hermesctl_args", nargs=argparse.REMAINDER, metavar="ARGS")


def _dispatch(command: str, args: argparse.Namespace) -> NoReturn:
    """The agent's handler for ``hermes COMMAND``."""
    run(command, list(getattr(args, "hermesctl_args", None) or []))


def run(command: str, args: Sequence[str]) -> NoReturn:
    """Replaces this process with ``hermesctl COMMAND ARGS...`` on the
    agent's home; when there is no binary to run, says so on one line and
    exits 1."""
    binary = find_binary()
    if binary is None:
        _fail(_missing_message())
    env = dict(os.environ)
    home = agent_home()
    if home is not None:
        env["HERMES_HOME"] = str(home)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(binary, [ARGV0, command, *args], env)
    except OSError as e:
        _fail(f"cannot run {binary}: {e.strerror or e}")


def find_binary() -> str | None:
    """``$HERMESCTL`` (a path, or a name looked up on PATH) when set and
    not empty, else ``hermesctl`` on PATH; ``None`` when that is not an
    executable file."""
    named = os.environ.get(BINARY_ENV, "")
    return shutil.which(named or BINARY)


def agent_home() -> Path | None:
    """The home the agent resolved for this run: ``$HERMES_HOME`` as it set
    it from ``-p PROFILE``, the active profile or the environment, else its
    default ``~/.hermes``."""
    try:
        from hermes_constants import get_hermes_home
    except ImportError:
        return None
    return Path(get_hermes_home())


def _missing_message() -> str:
    named = os.environ.get(BINARY_ENV, "")
    if named:
        return f"HERMESCTL={named} is not an executable file; {INSTALL_HINT}"
    return f"{BINARY} is not on PATH; {INSTALL_HINT}"


def _fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)
