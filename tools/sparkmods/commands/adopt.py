"""`sparkmods adopt DIR --out mods/NAME`: a community mod becomes a versioned mod of ours."""

from __future__ import annotations

import argparse
from pathlib import Path

from sparkmods.commands import help_for
from sparkmods.sources.options import add_target_args


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("adopt", help=help_for("adopt"),
                       description="Judge a community mod (run.sh, no mod.toml) on vLLM targets and write a mod "
                                   "whose variants cover the versions where its steps apply.")
    p.add_argument("mod", metavar="DIR", help="the community mod folder")
    p.add_argument("--out", required=True, metavar="DIR/NAME",
                   help="the new mod folder (its name is the mod's), outside this repository: a community mod's "
                        "text is not committed here")
    p.add_argument("--sandbox-image", metavar="IMAGE",
                   help="where a mod whose run.sh cannot be read statically is run (default: sparkmods-sandbox:latest)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds a run may take (default 120)")
    add_target_args(p)
    p.set_defaults(func=run)


def _this_repository() -> "Path | None":
    """The sparkmods checkout this code runs from (None for an installed package)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / ".git").exists() and (root / "tools" / "sparkmods").is_dir() else None


def run(args: argparse.Namespace) -> int:
    from sparkmods.community.adopt import plan_adoption, write_adoption
    from sparkmods.community.runsh import is_community_mod, read_mod
    from sparkmods.errors import SparkmodsError
    from sparkmods.sources.options import open_sources
    from sparkmods.sync import sync

    folder, out = Path(args.mod), Path(args.out)
    if not is_community_mod(folder):
        raise SparkmodsError(f"{folder}: not a community mod (want a folder with run.sh and no mod.toml)")
    inside = _this_repository()
    if inside is not None and out.resolve().is_relative_to(inside):
        raise SparkmodsError(f"{out}: inside the sparkmods repository ({inside}); adopt writes a community mod "
                             "outside it (its text is not committed here): pick another --out")
    mod = read_mod(folder)
    if mod.checkable:
        adopted = plan_adoption(mod, out.name, open_sources(args))
    else:
        from sparkmods.community.adopt import plan_adoption_by_running
        from sparkmods.community.sandbox import check_image, sandbox_image

        image = sandbox_image(args.sandbox_image)
        check_image(image)
        adopted = plan_adoption_by_running(mod, out.name, open_sources(args), image, args.timeout)
    write_adoption(adopted, mod, out)
    sync(out)
    for v in adopted.variants:
        print(f"variant {v.label}: vllm {v.vllm}; verified on {', '.join(v.verified)}")
    for version, status, reason in adopted.not_carried:
        print(f"not carried to {version}: {status}: {reason}")
    if adopted.not_carried:
        print(f"carry it further with: sparkmods rebase {out} --onto VERSION")
    print(f"wrote {out}: {len(adopted.variants)} variant(s)")
    return 0
