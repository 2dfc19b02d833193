"""Any vLLM build: dev, nightly and fork builds get their variant by content (runtime/modcheck.py).

The real trees are the files of real releases (PyPI wheels, `network`) whose metadata is
relabelled with a fork's version, `0.1.dev19043+g1a2b3c4`, which no variant range holds; the
real mods' run.sh must choose by content, say so in one line, and apply + revert byte for byte.
The rules (tie, upstream, no variant, override) are shown on small mods and trees without network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest

import realtree
from modfactory import ORIGINAL, PATCHED, TARGET, make_mod, make_site, unified
from sparkmods.runtime.manifest import Upstream, load_manifest
from sparkmods.runtime.modcheck import BASE_ENV, BaseMismatch, by_version, check_mod
from vllmenv import run_sh

FORK = "0.1.dev19043+g1a2b3c4"


def _relabel(site: Path, version: str) -> Path:
    for dist in site.glob("vllm-*.dist-info"):
        shutil.rmtree(dist)
    return realtree.write_site(site, version, {})


def _first_line(out: str) -> str:
    return out.splitlines()[0] if out else ""


# --- the rule on small mods ------------------------------------------------------------------------

@pytest.mark.parametrize("version, by", [
    ("0.19.1", True), ("0.20.0rc1", True), ("0.19.1.dev0+g2a69949bd", False), ("0.20.0+cu129", False),
    (FORK, False), ("not a version", False),
])
def test_what_the_version_settles(version: str, by: bool) -> None:
    assert by_version(version) is by


def _two_variant_mod(mods: Path, second_patch: str, upstream: str = "") -> Path:
    """Mod `two`: variant old (>=0.19,<0.20) and new (>=0.20) with the given patches."""
    mod = make_mod(mods, name="two", vllm=">=0.19.0,<0.20.0")
    (mod / "patches" / "v2").mkdir()
    (mod / "patches" / "v2" / "demo.patch").write_text(second_patch)
    with (mod / "mod.toml").open("a") as fh:
        fh.write(textwrap.dedent('''
            [[variant]]
            label = "v2"
            vllm = ">=0.20.0, <0.30.0"
            patches = ["patches/v2/demo.patch"]
            verified = ["0.20.0"]
            ''') + upstream)
    from sparkmods.sync import sync

    sync(mod)
    return mod


# v2's patch, for a file v1's does not fit: it conflicts on ORIGINAL.
_NEWER = ORIGINAL.replace("y = x * 2", "y = x * 4")
_NEWER_PATCH = unified(TARGET, _NEWER, _NEWER.replace("y = x * 4", "y = x * 5"))


def _check(mod: Path, site: Path, version: str, base: "str | None" = None):
    manifest = load_manifest(mod)
    return check_mod(manifest, mod, version, lambda rel: (site / rel).read_bytes() if (site / rel).is_file() else None,
                     base)


def test_ties_go_to_the_range_that_holds_the_version_else_the_newest(tmp_path: Path) -> None:
    mod = _two_variant_mod(tmp_path / "mods", unified(TARGET, ORIGINAL, PATCHED))  # both variants identical
    site = make_site(tmp_path / "site", FORK)
    newest = _check(mod, site, FORK)
    assert (newest.status, newest.variant) == ("ok", "v2")
    assert newest.how == f"by content: the v2 patches apply exactly (as do v1's; the newest variant wins); vLLM reports {FORK}"
    held = _check(mod, site, "0.19.5.dev3+gabcdef1")
    assert held.variant == "v1" and "its range holds 0.19.5.dev3" in held.how
    # A release is still decided by its version alone.
    assert _check(mod, site, "0.19.1").variant == "v1" and _check(mod, site, "0.19.1").how == ""


def test_the_variant_whose_hunks_sit_where_its_patch_says_wins(tmp_path: Path) -> None:
    moved = "# a line vLLM main added on top\n" * 3 + ORIGINAL
    second = unified(TARGET, moved, moved.replace("        y = x * 2\n", "        y = x * 2\n        y = y + 1  # demo mod\n"))
    mod = _two_variant_mod(tmp_path / "mods", second)
    site = make_site(tmp_path / "site", FORK, {TARGET: moved})
    result = _check(mod, site, FORK)
    assert (result.status, result.variant) == ("ok", "v2")  # v1 applies too, 3 lines off
    assert result.how == ("by content: the v2 patches apply exactly (so do v1's, further from the lines they state; "
                          f"the nearest wins); vLLM reports {FORK}")
    site2 = make_site(tmp_path / "site2", FORK)  # the old layout: v1 exact, v2 3 lines off
    assert _check(mod, site2, FORK).variant == "v1"


def test_upstream_is_recognised_by_content_and_nothing_fitting_says_how_to_name_the_base(tmp_path: Path) -> None:
    upstream = textwrap.dedent('''
        [upstream]
        since = "0.30.0"
        evidence = "vLLM does it"
        detect = [{ file = "vllm/model_executor/layers/demo.py", contains = "y = y + 1" }]
        ''')
    mod = _two_variant_mod(tmp_path / "mods", unified(TARGET, ORIGINAL, PATCHED), upstream)
    carried = make_site(tmp_path / "carried", FORK, {TARGET: PATCHED.replace("  # demo mod", "")})
    result = _check(mod, carried, FORK)
    assert (result.status, result.variant) == ("upstream", None)
    assert result.how == f"by content: every upstream detect matches (vLLM carries it since 0.30.0); vLLM reports {FORK}"
    other = make_site(tmp_path / "other", FORK, {TARGET: "something else entirely\n"})
    none = _check(mod, other, FORK)
    assert none.status == "no-variant" and "v1 conflict, v2 conflict" in none.reason
    assert BASE_ENV in none.how
    # A dev build of a release a variant covers: that variant's conflict is what is shown.
    dev = _check(mod, other, "0.20.1.dev4+gabcdef1")
    assert (dev.status, dev.variant) == ("conflict", "v2") and "selects by version" in dev.how
    assert isinstance(load_manifest(mod).upstream, Upstream)


def test_the_base_override_applies_or_is_refused_naming_both_versions(tmp_path: Path) -> None:
    mod = _two_variant_mod(tmp_path / "mods", _NEWER_PATCH)
    site = make_site(tmp_path / "site", FORK)
    chosen = _check(mod, site, FORK, base="0.19.1")
    assert (chosen.status, chosen.variant) == ("ok", "v1")
    assert chosen.how == f"by {BASE_ENV}=0.19.1: the v1 patches apply exactly; vLLM reports {FORK}"
    with pytest.raises(BaseMismatch, match=rf"{BASE_ENV}=0.20.0 selects variant v2, which does not apply to this vLLM "
                                           rf"\(it reports 0.1.dev19043\+g1a2b3c4\): conflict"):
        _check(mod, site, FORK, base="0.20.0")
    for bad in ("0.18.0", "0.20.0.dev1", "soon"):
        with pytest.raises(BaseMismatch, match=rf"{BASE_ENV}={bad}: .*vLLM reports 0.1.dev19043"):
            _check(mod, site, FORK, base=bad)


def test_run_sh_says_why_and_refuses_a_wrong_base_without_writing(tmp_path: Path, monkeypatch) -> None:
    mod = _two_variant_mod(tmp_path / "mods", _NEWER_PATCH)
    site = make_site(tmp_path / "site", FORK)
    before = realtree.snapshot(site)
    checked = run_sh(mod, site, tmp_path / "ws", "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert _first_line(checked.stdout) == f"[two] chose variant v1 by content: the v1 patches apply exactly; vLLM reports {FORK}"
    monkeypatch.setenv(BASE_ENV, "0.20.0")
    refused = run_sh(mod, site, tmp_path / "ws", "apply")
    assert refused.returncode == 2
    assert "ERROR: SPARKMODS_VLLM_BASE=0.20.0 selects variant v2" in refused.stdout and FORK in refused.stdout
    assert realtree.snapshot(site) == before
    monkeypatch.setenv(BASE_ENV, "0.19.1")
    applied = run_sh(mod, site, tmp_path / "ws", "apply")
    assert applied.returncode == 0 and f"[two] chose variant v1 by {BASE_ENV}=0.19.1" in applied.stdout
    monkeypatch.delenv(BASE_ENV)
    again = [run_sh(mod, site, tmp_path / "ws", "apply").stdout for _ in range(2)]  # the stamp's replay, then again
    monkeypatch.setenv("SPARKMODS_LOCK_TIMEOUT", "30")  # the full path
    full = run_sh(mod, site, tmp_path / "ws", "apply").stdout
    assert again[0] == again[1] == full
    assert _first_line(full) == f"[two] chose variant v1 by content: the v1 patches are already applied; vLLM reports {FORK}"
    assert run_sh(mod, site, tmp_path / "ws", "revert").returncode == 0
    assert realtree.snapshot(site) == before


def _host_check(mod: Path, site: Path, spec: str = "") -> dict:
    """`sparkmods check --json`'s row for the mod on the tree (or the target spec)."""
    out = subprocess.run([sys.executable, "-m", "sparkmods", "check", mod.name, "--mods-dir", str(mod.parent),
                          "--vllm", spec or f"dir:{site}", "--json", "--no-cache"], capture_output=True, text=True,
                         check=False)
    assert out.returncode in (0, 1), out.stderr
    [row] = json.loads(out.stdout)["results"]
    return row


def test_host_check_makes_the_same_choice_as_run_sh(tmp_path: Path) -> None:
    mod = _two_variant_mod(tmp_path / "mods", unified(TARGET, ORIGINAL, PATCHED))
    site = make_site(tmp_path / "site", FORK)
    row = _host_check(mod, site)
    assert (row["variant"], row["chosen_by"]) == ("v2", _check(mod, site, FORK).how)


# --- the real mods on real release files labelled as a fork build ---------------------------------

@pytest.fixture(scope="module")
def fork_trees(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("fork-trees")
    return {v: realtree.release_site(root / v, realtree.repo_mods(), v, FORK) for v in ("0.26.0", "0.33.0")}


def _expected(mod: Path, release: str) -> str:
    """What the release itself selects by version: the variant content must find again."""
    chosen = load_manifest(mod).select(release)
    return "upstream" if isinstance(chosen, Upstream) else chosen.label


@pytest.mark.network
@pytest.mark.parametrize("release", ["0.33.0", "0.26.0"])
@pytest.mark.parametrize("mod", realtree.repo_mods(), ids=lambda p: p.name)
def test_every_mod_on_a_fork_labelled_release_chooses_by_content_and_reverts_byte_for_byte(
        fork_trees, release: str, mod: Path, tmp_path: Path) -> None:
    site = realtree.copy_tree(fork_trees[release], tmp_path / "site")
    before = realtree.snapshot(site)
    checked = run_sh(mod, site, tmp_path / "ws", "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    line = _first_line(checked.stdout)
    expected = _expected(mod, release)
    if expected == "upstream":
        assert line == f"[{mod.name}] by content: every upstream detect matches " \
                       f"(vLLM carries it since 0.27.0); vLLM reports {FORK}"
    else:
        assert line.startswith(f"[{mod.name}] chose variant {expected} by content: ") and line.endswith(
            f"; vLLM reports {FORK}"), line
    applied = run_sh(mod, site, tmp_path / "ws", "apply")
    assert applied.returncode == 0, applied.stdout
    assert _first_line(applied.stdout) == line
    reverted = run_sh(mod, site, tmp_path / "ws", "revert")
    assert reverted.returncode == 0, reverted.stdout
    assert realtree.snapshot(site) == before


@pytest.mark.network
def test_the_base_override_on_a_real_fork_tree(fork_trees, tmp_path: Path, monkeypatch) -> None:
    mod = realtree.REPO_MODS / "mtp-weights"
    site = realtree.copy_tree(fork_trees["0.33.0"], tmp_path / "site")
    before = realtree.snapshot(site)
    monkeypatch.setenv(BASE_ENV, "0.33.0")
    right = run_sh(mod, site, tmp_path / "ws", "check")
    assert right.returncode == 0
    assert _first_line(right.stdout) == f"[mtp-weights] chose variant v0.33.0 by {BASE_ENV}=0.33.0: the v0.33.0 " \
                                        f"patches apply exactly; vLLM reports {FORK}"
    monkeypatch.setenv(BASE_ENV, "0.26.0")
    wrong = run_sh(mod, site, tmp_path / "ws", "apply")
    assert wrong.returncode == 2
    assert f"ERROR: {BASE_ENV}=0.26.0 selects variant v0.26.0, which does not apply to this vLLM (it reports {FORK})" \
        in wrong.stdout
    assert realtree.snapshot(site) == before


def test_a_content_choice_that_drifts_names_the_override_of_one_that_does_not(tmp_path: Path) -> None:
    drifting = PATCHED.replace("        y = y + 1  # demo mod\n",
                               "        from vllm.model_executor.layers.nothing import helper\n        y = helper(y)\n")
    mod = _two_variant_mod(tmp_path / "mods", unified(TARGET, ORIGINAL, drifting))  # v2, the newest, drifts
    site = make_site(tmp_path / "site", FORK)
    row = _host_check(mod, site)
    assert (row["variant"], row["status"]) == ("v2", "drift")
    assert row["reason"].endswith(f"; variant v1 applies without drift: set {BASE_ENV}=0.19.1 for run.sh to choose it")


def test_a_fork_clone_without_tags_is_checked_by_content(tmp_path: Path) -> None:
    """git: a repository with no release tag reports setuptools_scm's 0.1.dev<commits>+g<hash>."""
    mod = _two_variant_mod(tmp_path / "mods", _NEWER_PATCH)
    repo = tmp_path / "fork"
    (repo / TARGET).parent.mkdir(parents=True)
    (repo / TARGET).write_text(ORIGINAL)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    row = _host_check(mod, repo, f"git:{repo}@HEAD")
    assert row["vllm"].startswith("0.1.dev1+g") and (row["variant"], row["status"]) == ("v1", "ok")
    assert row["chosen_by"] == f"by content: the v1 patches apply exactly; vLLM reports {row['vllm']}"
