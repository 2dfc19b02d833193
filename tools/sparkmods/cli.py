"""The `sparkmods` command line: one sub-command per module in `sparkmods.commands`.

Each command module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int` as the handler. Keeping the commands in separate modules lets each
feature own its command without touching a shared file.

Start-up imports only what the command run needs: the sub-command named on the command line
is registered from its module, every other one is listed from `commands.COMMANDS` (name and
help) without importing it, and each module imports its heavy parts when it runs.

Exit codes are stable: 0 success, 1 a finding (a mod does not apply, a regression, ...),
2 usage or input error (one line on stderr, never a traceback), 3 an internal error (a bug:
one line saying so; the traceback with SPARKMODS_DEBUG=1).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from sparkmods import __version__
from sparkmods.closedpipe import ClosedPipeGuard
from sparkmods.commands import COMMANDS

TYPE_CHECKING = False  # typing costs start-up time; the hints below are strings anyway
if TYPE_CHECKING:
    from typing import Optional, Sequence, Tuple, Type

EXIT_INTERNAL = 3
DEBUG_ENV = "SPARKMODS_DEBUG"


def _input_errors() -> Tuple[Type[BaseException], ...]:
    """Input problems (exit 2, one line): ours, and those the stdlib runtime raises (it cannot
    depend on SparkmodsError). Imported only once something went wrong."""
    from sparkmods.errors import SparkmodsError
    from sparkmods.runtime.engine import UnsafePath
    from sparkmods.runtime.locate import LocateError
    from sparkmods.runtime.manifest import ManifestError
    from sparkmods.runtime.udiff import PatchParseError

    return SparkmodsError, ManifestError, LocateError, UnsafePath, PatchParseError


def _chosen(argv: Sequence[str]) -> Optional[str]:
    """The sub-command named: the first argument that is not an option (the top level takes
    only --help and --version, which have no values)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The parser, with the full parser of the command argv names (all of them when None)."""
    parser = argparse.ArgumentParser(
        prog="sparkmods",
        description="Check, apply and rebase vLLM mods for NVIDIA DGX Spark.",
    )
    parser.add_argument("--version", action="version", version=f"sparkmods {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    chosen = _chosen(argv) if argv is not None else None
    wanted = {c.module for name, c in COMMANDS.items() if argv is None or name == chosen}
    registered = set()
    for name, command in COMMANDS.items():
        if command.module in wanted:
            if command.module not in registered:
                importlib.import_module(f"{__package__}.commands.{command.module}").register(sub)
                registered.add(command.module)
        else:
            sub.add_parser(name, help=command.help, add_help=False)  # listed, never parsed
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_in)
    args = parser.parse_args(args_in)
    stdout = sys.stdout
    sys.stdout = guard = ClosedPipeGuard(stdout)  # `sparkmods check | head -2`: no traceback
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("sparkmods: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001  every other exception is a bug: one line, exit 3
        if not isinstance(exc, _input_errors()):
            return _internal_error(exc)
        print(f"sparkmods: error: {exc}", file=sys.stderr)
        return 2
    finally:
        guard.flush()  # inside the guard, so a reader gone before the last buffer is no error either
        sys.stdout = stdout


def _internal_error(exc: Exception) -> int:
    """An exception nothing expected: a bug. One line saying so (the traceback with
    SPARKMODS_DEBUG=1), exit 3, never the code of a finding."""
    if os.environ.get(DEBUG_ENV):
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__)
    print(f"sparkmods: internal error (a bug in sparkmods): {type(exc).__name__}: {exc}; please report it to the "
          f"spark-vllm-mods maintainers with the output of the same command run with {DEBUG_ENV}=1, which shows "
          "the traceback", file=sys.stderr)
    return EXIT_INTERNAL


def entry() -> None:
    """The `sparkmods` program (console script and `python -m sparkmods`): main(), then an exit
    that skips tearing the interpreter down.

    A check or a matrix leaves hundreds of thousands of parsed vLLM nodes in its caches, and a
    normal exit frees them one by one and, with the collector paused during the check
    (gcpause.py), collects them all once more: seconds spent after main has returned.
    What an exit must still do is done: the exit handlers run (weakref finalizers among them:
    an image source's helper container is removed there) and the standard streams are flushed.
    While a thread other than this one still runs, the normal exit waits for it instead.
    """
    code = main()
    fetching = sys.modules.get("sparkmods.sources.http")
    if fetching is not None:
        fetching.shutdown()  # its idle fetch threads: all a finished command leaves behind
    threading = sys.modules.get("threading")  # not imported: no other thread can exist
    if threading is not None and threading.active_count() > 1:
        raise SystemExit(code)
    import atexit
    import os

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a reader that went away (main's guard already said nothing of it) or a closed stream
    os._exit(code)
