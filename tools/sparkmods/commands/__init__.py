"""Sub-commands of the `sparkmods` CLI: one module each (a module may add several), with a
`register(subparsers)` that adds its parsers.

COMMANDS lists them with their one-line help so that `sparkmods --help` and the start of any
sub-command import only the module that is run (see cli.py); each module takes its help text
from here, so the list and the parsers cannot disagree.
"""

from __future__ import annotations

from collections import namedtuple

TYPE_CHECKING = False  # typing costs start-up time; the hints below are strings anyway
if TYPE_CHECKING:
    from typing import Dict, List

# module: sparkmods.commands.<module>; help: the line `sparkmods --help` shows
Command = namedtuple("Command", ["module", "help"])

COMMANDS: Dict[str, Command] = {
    "adopt": Command("adopt", "turn a community mod (run.sh, no mod.toml) into a versioned mod of this collection"),
    "apply": Command("apply", "apply (or revert) a mod to a vLLM installed in a folder"),
    "check": Command("check", "check mods against vLLM releases, wheels, trees, commits or images"),
    "check-patch": Command("check", "check a loose patch file (no manifest) against vLLM targets"),
    "checkpoint": Command("checkpoint", "inspect and fix safetensors checkpoints (MTP index, hybrid INT4+FP8)"),
    "launch": Command("launch", "validate a recipe and write its launch script (launch-cluster.sh or standalone)"),
    "matrix": Command("matrix", "build the compatibility matrix (matrix/matrix.json, MATRIX.md, matrix.svg)"),
    "rebase-patch": Command("rebase", "carry a patch from the vLLM it was written for to another one"),
    "rebase": Command("rebase", "add a variant to a mod for a vLLM none of its variants works on"),
    "recipe": Command("recipe", "recipe tools (run-recipe.sh v1 YAML)"),
    "sync": Command("sync", "generate run.sh and the runtime copy inside each mod"),
    "tune": Command("tune", "time the int8-lm-head and turboquant kernels on this GPU and write the table they read"),
    "verify": Command("verify", "check a running vLLM server: did each mod take effect?"),
}


def help_for(name: str) -> str:
    """The one-line help of a top-level command."""
    return COMMANDS[name].help


def only_one(values: "List[str]", flag: str) -> str:
    """The value of an option registered with action="append" that the command takes once:
    argparse alone would keep the last one given and drop the others without a word."""
    if len(values) > 1:
        from sparkmods.errors import SparkmodsError

        raise SparkmodsError(f"{flag} given {len(values)} times ({', '.join(values)}); this command takes one: "
                             "run it once for each")
    return values[0]
