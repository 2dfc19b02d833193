"""The `sparkmods` command line: one sub-command per module in `sparkmods.commands`.

Each command module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int` as the handler. Keeping the commands in separate modules lets each
feature own its command without touching a shared file.

Exit codes are stable: 0 success, 1 a finding (a mod does not apply, a regression, ...),
2 usage or input error (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Sequence

from sparkmods import __version__, commands
from sparkmods.closedpipe import ClosedPipeGuard
from sparkmods.errors import SparkmodsError
from sparkmods.runtime.engine import UnsafePath
from sparkmods.runtime.locate import LocateError
from sparkmods.runtime.manifest import ManifestError
from sparkmods.runtime.udiff import PatchParseError

# Input problems raised by the stdlib runtime (it cannot depend on SparkmodsError).
_INPUT_ERRORS = (SparkmodsError, ManifestError, LocateError, UnsafePath, PatchParseError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkmods",
        description="Check, apply and rebase vLLM mods for NVIDIA DGX Spark.",
    )
    parser.add_argument("--version", action="version", version=f"sparkmods {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    stdout = sys.stdout
    sys.stdout = guard = ClosedPipeGuard(stdout)  # `sparkmods check | head -2`: no traceback
    try:
        return int(args.func(args))
    except _INPUT_ERRORS as exc:
        print(f"sparkmods: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sparkmods: interrupted", file=sys.stderr)
        return 130
    finally:
        guard.flush()  # inside the guard, so a reader gone before the last buffer is no error either
        sys.stdout = stdout
