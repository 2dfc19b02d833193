"""The community-mod fixtures (tests/fixtures/community) and the vLLM trees they are judged on: the
GLM file their fix patches, in memory or written as a site."""

from __future__ import annotations

from pathlib import Path
from typing import Dict

from realtree import _old_side, write_site
from sparkmods.runtime.udiff import parse_patch

FIXTURES = Path(__file__).parent / "fixtures" / "community"
GLM = "vllm/model_executor/models/glm4_moe.py"


class Tree:
    """A vLLM tree in memory: what judge() reads."""

    def __init__(self, version: str, files: Dict[str, bytes]) -> None:
        self.version, self.files = version, files

    def read(self, path: str):
        return self.files.get(path)


def glm_tree(version: str = "0.19.1", broken: bool = False, outer: bool = False) -> Tree:
    """The fix's file; broken: a context line next to the change differs (no tool applies it);
    outer: only the hunk's first context line differs (GNU patch applies it with fuzz 1)."""
    (fp,) = parse_patch((FIXTURES / "patch-d-site" / "fix.patch").read_text())
    text = _old_side(fp)
    if broken:
        text = text.replace(b"param = params_dict[name]", b"param = params_dict.get(name)")
    if outer:
        text = text.replace(b"is_pp_missing_parameter(name, self)", b"is_pp_missing_parameter(name, model)")
    return Tree(version, {GLM: text})


def sites(tmp: Path) -> "tuple[Path, Path]":
    good = write_site(tmp / "a", "0.19.1", glm_tree().files)
    bad = write_site(tmp / "b", "0.20.0", glm_tree(broken=True).files)
    return good, bad
