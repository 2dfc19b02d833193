"""`sparkmods sync [MOD ...] [--check]`: (re)generate each mod's run.sh and _sparkmods/."""

from __future__ import annotations

import argparse

from sparkmods.modsdir import resolve_mods
from sparkmods.sync import drift, sync


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("sync", help="generate run.sh and the runtime copy inside each mod",
                       description="Regenerate each mod's run.sh and _sparkmods/ from tools/sparkmods/runtime.")
    p.add_argument("mods", nargs="*", metavar="MOD")
    p.add_argument("--mods-dir", help="folder holding the mods (default: ./mods or the repository's)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if any generated file drifted")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    status = 0
    for mod_dir in resolve_mods(args.mods, args.mods_dir):
        if args.check:
            for problem in drift(mod_dir):
                print(f"{mod_dir.name}: {problem} (run: sparkmods sync {mod_dir.name})")
                status = 1
        else:
            for rel in sync(mod_dir):
                print(f"{mod_dir.name}: wrote {rel}")
    return status
