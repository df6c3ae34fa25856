"""``dispatch completion bash|zsh|fish``: print the shell's completion hook (argcomplete).

Install once, for example::

    dispatch completion bash > ~/.local/share/bash-completion/completions/dispatch
    dispatch completion zsh > ~/.zfunc/_dispatch      # with fpath+=(~/.zfunc) before compinit
    dispatch completion fish > ~/.config/fish/completions/dispatch.fish

It completes command names, options, and live ids from the state dir (sessions, cards, cron
jobs); see :mod:`dispatcher.cli.completion`.
"""

from __future__ import annotations

import argparse

from dispatcher.cli.completion import SHELLS, print_text, shell_code
from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the ``completion`` command."""
    parser = add_group(
        subparsers,
        "completion",
        common,
        description="Print the completion hook for SHELL on stdout. Install it with e.g. "
        "'dispatch completion bash > ~/.local/share/bash-completion/completions/dispatch', "
        "'dispatch completion zsh > ~/.zfunc/_dispatch' or "
        "'dispatch completion fish > ~/.config/fish/completions/dispatch.fish'. It completes "
        "commands, options and live ids (sessions, cards, cron jobs) from the state dir.",
    )
    parser.add_argument("shell", choices=SHELLS, help="the shell: " + ", ".join(SHELLS))
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Print the hook."""
    print_text(shell_code(args.shell))
    return 0
