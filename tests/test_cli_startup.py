"""Start-up imports only what the command run needs, and the command list that `--help` shows
without importing the commands is the one the command modules register."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from sparkmods.cli import build_parser
from sparkmods.commands import COMMANDS

HEAVY = ("rich", "yaml", "packaging", "ssl", "http.client", "sparkmods.checking", "sparkmods.pyindex",
         "sparkmods.rebase", "sparkmods.sources.index", "sparkmods.sources.http", "sparkmods.launch",
         "sparkmods.checkpoint", "sparkmods.runtime.engine")

_PROBE = """
import json, sys
from sparkmods.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = %r
print(json.dumps(sorted(m for m in sys.modules if m in heavy or m.startswith(tuple(h + "." for h in heavy)))))
"""


def imported_by(*argv: str, heavy: tuple = HEAVY) -> list:
    """The heavy modules loaded by parsing argv (--help exits after printing)."""
    out = subprocess.run([sys.executable, "-c", _PROBE % (heavy,), *argv], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return json.loads(out.splitlines()[-1])


def _subcommands(parser: argparse.ArgumentParser) -> dict:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {choice.dest: choice.help for choice in action._choices_actions}


def test_the_listed_commands_are_the_registered_ones() -> None:
    assert _subcommands(build_parser()) == {name: c.help for name, c in COMMANDS.items()}
    assert list(_subcommands(build_parser(["check"]))) == list(COMMANDS)  # same order either way


def test_help_imports_none_of_the_commands() -> None:
    assert imported_by("--help", heavy=HEAVY + ("typing",)) == []


@pytest.mark.parametrize("command", ["check", "check-patch", "matrix", "launch", "apply", "sync"])
def test_a_command_s_help_imports_only_what_parsing_needs(command: str) -> None:
    assert imported_by(command, "--help") == []
