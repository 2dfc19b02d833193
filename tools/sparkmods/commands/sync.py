"""`sparkmods sync [MOD ...] [--check]`: (re)generate each mod's run.sh, _sparkmods.py and manifest.json."""

from __future__ import annotations

import argparse

from sparkmods.commands import help_for


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("sync", help=help_for("sync"),
                       description="Regenerate each mod's run.sh, _sparkmods.py and manifest.json from tools/sparkmods/runtime.")
    p.add_argument("mods", nargs="*", metavar="MOD")
    p.add_argument("--mods-dir", help="folder holding the mods (default: ./mods or the repository's)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if any generated file is stale")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """One line per file written or stale, then one summary line, so success is visible too."""
    from sparkmods.modsdir import resolve_mods
    from sparkmods.sync import stale_files, sync

    mod_dirs = resolve_mods(args.mods, args.mods_dir)
    changed = 0
    for mod_dir in mod_dirs:
        if args.check:
            for problem in stale_files(mod_dir):
                print(f"{mod_dir.name}: {problem} (run: sparkmods sync {mod_dir.name})")
                changed += 1
        else:
            for rel in sync(mod_dir):
                print(f"{mod_dir.name}: wrote {rel}")
                changed += 1
    if args.check:
        print(f"{len(mod_dirs)} mods checked: " + (f"{changed} generated files stale" if changed
                                                   else "run.sh, _sparkmods.py and manifest.json up to date"))
        return 1 if changed else 0
    print(f"{len(mod_dirs)} mods synced: {changed} files written" + ("" if changed else " (all up to date)"))
    return 0
