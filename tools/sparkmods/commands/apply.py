"""`sparkmods apply MOD --vllm dir:PATH [--dry-run] [--revert]`: run.sh's code, on the host.

Exit codes are run.sh's: 0 done, 1 cannot apply or revert here, 2 bad input, 130/143 interrupted.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sparkmods.commands import help_for, only_one
from sparkmods.errors import SparkmodsError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sparkmods.runtime.pep440 import Version


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("apply", help=help_for("apply"),
                       description="Apply a mod to an installed vLLM with the same code run.sh uses.")
    p.add_argument("mod", metavar="MOD")
    p.add_argument("--vllm", required=True, action="append", metavar="dir:PATH",
                   help="site-packages (or a prefix) holding vllm/, e.g. dir:.venv/lib/python3.12/site-packages")
    p.add_argument("--mods-dir", help="folder holding the mods")
    p.add_argument("--workspace", help="where installed files go (default: $WORKSPACE_DIR, then the cwd)")
    p.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    p.add_argument("--revert", action="store_true", help="restore the pristine files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparkmods.modsdir import resolve_mods
    from sparkmods.runtime import fsops
    from sparkmods.runtime.applier import Printer, run as run_action
    from sparkmods.runtime.locate import LocateError, find_vllm

    target = only_one(args.vllm, "--vllm")
    if not target.startswith("dir:"):
        raise SparkmodsError(f"--vllm {target!r}: apply writes files, so it needs dir:PATH")
    (mod_dir,) = resolve_mods([args.mod], args.mods_dir)
    path, _, version = target[4:].partition("#")  # dir:PATH#VERSION, as `check` takes it
    try:
        found = find_vllm(path)
    except LocateError as exc:  # its "not installed" text speaks of PYTHON_ROOT, which run.sh users set
        detail = f"no vllm/ in {path}" if str(exc).startswith("vllm is not installed") else str(exc)
        raise SparkmodsError(f"--vllm {target}: {detail}; name the site-packages folder (or a prefix "
                             "holding one) where vllm/ is installed") from None
    if version and _public(version, target) != _public(found.version, target):
        raise SparkmodsError(f"--vllm {target}: {found.site} holds vLLM {found.version}, not {version}")
    site = found.site
    workspace = Path(args.workspace or os.environ.get("WORKSPACE_DIR") or os.getcwd())
    fsops.arm_from_env()
    # run.sh's own entry point: same lock, journal recovery, signal handling, messages and exit codes
    return run_action("revert" if args.revert else "apply", mod_dir, site, workspace, args.dry_run,
                      Printer(mod_dir.name))


def _public(version: str, spec: str) -> "Version":
    from sparkmods.runtime.pep440 import InvalidVersion, Version

    try:
        return Version(version).public
    except InvalidVersion:
        raise SparkmodsError(f"--vllm {spec}: {version!r} is not a vLLM version (dir:PATH#0.19.1)") from None
