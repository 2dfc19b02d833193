"""run.sh imports little: its apply (and its answer on an applied tree) loads none of the
heavier standard modules it once imported, and each lighter piece of code that stands in for
one of them (runtime/basics.py, the PEP 440, patch-header and name checks read without re,
the journal's JSON writer, the symlink check) says exactly what the standard code says; the
argument parser reads a command line as argparse did, or refuses it."""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Set

import pytest

from modfactory import ORIGINAL, TARGET, make_mod, make_site, make_template_mod
from sparkmods.community.judge import CommunityResult
from sparkmods.runtime import pep440
from sparkmods.runtime.applier import parse_args
from sparkmods.runtime.engine import FileResult, UnsafePath, safe_target
from sparkmods.runtime.journal import dump_json
from sparkmods.runtime.manifest import _LABEL, _NAME
from sparkmods.runtime.modcheck import ModResult
from sparkmods.runtime.pep440 import Version
from sparkmods.runtime.udiff import _hunk_header
from test_applier import run_sh

# What the runtime once imported on run.sh's apply, and what those imported in turn.
HEAVY = {"dataclasses", "inspect", "ast", "pathlib", "typing", "argparse", "contextlib", "signal", "enum",
         "hashlib", "_hashlib", "json", "re", "shutil", "threading", "collections", "functools", "glob", "fnmatch"}


def imported(stderr: str) -> Set[str]:
    """The modules a run imported, from Python's -X importtime lines on stderr."""
    names = {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    return names - {"imported package"}  # the header line


def test_apply_and_the_applied_tree_import_none_of_the_heavy_modules(tmp_path: Path) -> None:
    """As the launcher runs it (a mod with a workspace install and notes), on a warm cache: the
    apply, then the quick answer on the applied tree. (The first run on this cache compiles
    the runtime and decodes manifest.json, with json.)"""
    pristine = make_site(tmp_path / "pristine")
    mod = make_template_mod(tmp_path / "mods")
    env = {"SPARKMODS_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPROFILEIMPORTTIME": "1"}
    assert run_sh(mod, pristine, tmp_path, "check", env_extra=env).returncode == 0  # warms the cache
    site = tmp_path / "site"
    shutil.copytree(pristine, site)
    start = imported(subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True,
                                    text=True).stderr)  # what the interpreter loads before any code runs
    runs = (("applied variant v1", "_sparkmods.applier"), ("already applied (variant v1)", "_sparkmods.stamp"))
    for expect, module in runs:
        out = run_sh(mod, site, tmp_path, env_extra=env)
        assert out.returncode == 0 and expect in out.stdout, out.stdout + out.stderr
        loaded = imported(out.stderr) - start
        assert module in loaded and not loaded & HEAVY, sorted(loaded & HEAVY)


@pytest.mark.parametrize("tree,code,line", [
    ({}, 0, "[demo] applied variant v1 to vLLM 0.19.1"),
    ({TARGET: ORIGINAL.replace("y = x * 2", "y = x * 3")}, 1, "[demo]   nothing was changed; pin a vLLM"),
])
def test_the_exit_skips_the_teardown_but_no_output_or_exit_code(tmp_path: Path, tree, code: int, line: str) -> None:
    """run.sh's Python ends with os._exit once its streams are flushed: every line reaches a
    file (block-buffered, unlike a terminal) and the exit code is the run's."""
    site = make_site(tmp_path / "site", files=tree)
    mod = make_mod(tmp_path / "mods")
    env = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable,
           "SPARKMODS_CACHE_DIR": str(tmp_path / "cache")}
    with open(tmp_path / "out.txt", "w") as out:
        done = subprocess.run(["bash", str(mod / "run.sh")], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=60)
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert done.returncode == code and any(text.startswith(line) for text in lines), lines


def test_an_edited_manifest_is_decoded_again_not_taken_from_the_cache(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_template_mod(tmp_path / "mods")
    env = {"SPARKMODS_CACHE_DIR": str(tmp_path / "cache"), "WORKSPACE_DIR": str(tmp_path)}
    assert "--chat-template t.jinja" in run_sh(mod, site, tmp_path, "check", env_extra=env).stdout
    assert list((tmp_path / "cache" / "runtime-code").glob("manifest.json-*.code"))
    data = json.loads((mod / "manifest.json").read_text())
    data["variant"][0]["notes"] = "edited notes"
    (mod / "manifest.json").write_text(json.dumps(data))
    out = run_sh(mod, site, tmp_path, "check", env_extra=env)
    assert out.returncode == 0 and "edited notes" in out.stdout, out.stdout + out.stderr


def random_json(rng: random.Random, depth: int = 0):
    chars = [chr(c) for c in [*range(0x80), 0xe9, 0x7ff, 0x2028, 0xd800, 0xdfff, 0xfffe, 0x1f600, 0x10ffff]]
    kind = rng.randrange(4 if depth > 3 else 7)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randrange(-10 ** 20, 10 ** 20)
    if kind == 2:
        return "".join(rng.choice(chars) for _ in range(rng.randrange(8)))
    if kind == 3:
        return rng.randrange(0o7777)
    if kind in (4, 5):
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {"".join(rng.choice(chars) for _ in range(rng.randrange(5))): random_json(rng, depth + 1)
            for _ in range(rng.randrange(4))}


def test_the_journal_writer_writes_what_json_dumps_writes() -> None:
    rng = random.Random(440)
    for _ in range(5000):
        value = random_json(rng)
        assert dump_json(value) == json.dumps(value, indent=1, sort_keys=True).encode(), value
    with pytest.raises(TypeError):
        dump_json({"x": 1.5})


def _by_pattern(text: str) -> Version:
    """text read by the PEP 440 pattern, as every version but a plain release is."""
    version = object.__new__(Version)
    version._parse(text)
    return version


FIELDS = ("epoch", "release", "pre", "post", "dev", "local")


@pytest.mark.parametrize("text", ["0", "0.19.1", "1.2.3.4.5", "007.010", " 0.19.1\n", "2024.10.0"])
def test_a_plain_release_reads_as_the_pattern_reads_it(text: str) -> None:
    assert [getattr(Version(text), f) for f in FIELDS] == [getattr(_by_pattern(text), f) for f in FIELDS]


@pytest.mark.parametrize("text", ["0.19.1.dev0+g2a69949bd.d20260404", "v1.0", "1!2.0", "0.19.1rc1", "1.0.post2",
                                  "0.19.1.", ".1", "1..2", "1.\u0661", "1.\u00b2", ""])
def test_anything_else_is_read_by_the_pattern(text: str) -> None:
    try:
        want = [getattr(_by_pattern(text), f) for f in FIELDS]
    except pep440.InvalidVersion:
        with pytest.raises(pep440.InvalidVersion):
            Version(text)
        return
    assert [getattr(Version(text), f) for f in FIELDS] == want


def test_commit_of_a_local_label() -> None:
    assert Version("0.19.1.dev0+g2a69949bd.d20260404").commit == "2a69949bd"
    assert Version("0.19.1+g12345").commit is None and Version("0.19.1+gxyz1234567").commit is None


def random_text(rng: random.Random, alphabet: str, longest: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(longest)))


def test_range_clauses_read_as_their_pattern_reads_them() -> None:
    pattern = re.compile(r"^\s*(>=|<=|==|~=|>|<)\s*([^\s,]+)\s*$")
    rng = random.Random(7)
    for _ in range(20000):
        text = random_text(rng, " \t\u00a0<>=~!01.,a", 9)
        match = pattern.match(text)
        assert pep440._clause(text) == (match.groups() if match else None), repr(text)


def test_hunk_headers_read_as_their_pattern_reads_them() -> None:
    pattern = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
    rng = random.Random(8)
    samples = ["@@ -1,5 +1,6 @@ def f():", "@@ -0,0 +1 @@", "@@ -1 +1 @@", "@@ -\u0661,2 +3 @@x", "@@ -1, +2 @@"]
    samples += ["@@ " + random_text(rng, "-+,@ 019\u0661x", 14) for _ in range(30000)]
    for text in samples:
        match = pattern.match(text)
        want = None
        if match:
            a, b, c, d, section = match.groups()
            want = (int(a), int(b) if b is not None else 1, int(c), int(d) if d is not None else 1, section.strip())
        assert _hunk_header(text) == want, repr(text)


@pytest.mark.parametrize("form", [_NAME, _LABEL], ids=["name", "label"])
def test_name_forms_match_as_their_patterns(form) -> None:
    pattern = re.compile(form.pattern)
    rng = random.Random(9)
    for _ in range(20000):
        text = random_text(rng, "aZ09._- /\u00e9", 70 if rng.random() < 0.1 else 5)
        assert form.matches(text) == bool(pattern.match(text)), repr(text)
    assert not form.matches("a\n")  # which the pattern's `$` would let through


def test_safe_target_resolves_as_realpath_does(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm" / "a").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (site / "vllm" / "a" / "x.py").write_text("")
    os.symlink("a", site / "vllm" / "inside")
    os.symlink(tmp_path / "out", site / "vllm" / "outside")
    os.symlink(site / "vllm" / "outside" / "..", site / "vllm" / "up")
    for rel in ["vllm/a/x.py", "vllm/a/new.py", "vllm/inside/x.py", "vllm/inside/deep/new.py", "vllm/x.py/y",
                "vllm/outside/x.py", "vllm/up/site/vllm/a/x.py", "vllm/up/elsewhere.py"]:
        real = os.path.realpath(site / rel)
        inside = real.startswith(str(site.resolve()) + os.sep)
        if inside:
            assert safe_target(site, rel) == real, rel
        else:
            with pytest.raises(UnsafePath):
                safe_target(site, rel)


def test_records_compare_and_show_every_field_base_classes_first() -> None:
    files = [FileResult("vllm/m.py", "ok")]
    assert ModResult("m", "0.1", "ok", "v1", "", files) == ModResult("m", "0.1", "ok", "v1", "", list(files))
    assert ModResult("m", "0.1", "ok") != ModResult("m", "0.2", "ok")
    assert CommunityResult("m", "0.1", "ok", steps=[{"a": 1}]) != CommunityResult("m", "0.1", "ok", steps=[])
    assert CommunityResult("m", "0.1", "ok") != ModResult("m", "0.1", "ok")
    assert repr(CommunityResult("m", "0.1", "ok")) == ("CommunityResult(mod='m', version='0.1', status='ok', "
                                                        "variant=None, reason='', files=[], how='', steps=[])")
    with pytest.raises(TypeError):
        hash(ModResult("m", "0.1", "ok"))


# The parser run.sh had before parse_args.
ARGPARSE = argparse.ArgumentParser(prog="run.sh", description="Apply this mod to the installed vLLM.")
ARGPARSE.add_argument("action", nargs="?", default="apply", choices=["apply", "check", "revert"])
ARGPARSE.add_argument("--dry-run", action="store_true")
ARGPARSE.add_argument("--site")
ARGPARSE.add_argument("--workspace")


def _argparse_reading(argv: List[str]) -> tuple:
    args = ARGPARSE.parse_args(argv)
    return args.action, args.dry_run, args.site, args.workspace


def _outcome(parse, argv: List[str]):
    """What parse makes of argv: its reading, or the exit code (0 help, 2 refused)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return parse(argv)
        except SystemExit as exc:
            return exc.code


def test_run_sh_arguments_read_as_argparse_read_them_or_are_refused() -> None:
    """Every command line of up to 3 of these words reads as argparse read it (the help, a
    refusal, or the same action and values), or is refused where parse_args says so: an
    abbreviated option, `--`, a value beginning with `-`, a -h after a refused word (argparse
    showed the help). Never read otherwise: `--workspace --dry-run` is no apply."""
    words = ["apply", "check", "revert", "x", "--dry-run", "--site", "--site=s", "--site=", "--workspace",
             "--workspace=w", "-h", "--help", "--", "--dry", "--si", "-x", "-", "-1", ""]
    for n in range(4):
        for argv in map(list, itertools.product(words, repeat=n)):
            theirs, ours = _outcome(_argparse_reading, argv), _outcome(parse_args, argv)
            if ours != theirs:
                assert ours == 2, (argv, theirs, ours)
                assert theirs == 0 or any(w in ("--", "--dry", "--si") for w in argv) or any(
                    w in ("--site", "--workspace") and value.startswith("-") for w, value in itertools.pairwise(argv)
                ), (argv, theirs)
