"""Every command example in README.md and launch/README.md runs as written and prints what is shown.

A `console` block is a transcript: a line starting with `$ ` is a command, the lines after it
(up to the next command) are what it prints, stdout and stderr together as a terminal shows
them. The HTML comment right before a block says how it runs:

  <!-- docs-test: TIER [venv=X.Y.Z] [replay=FOLDER] [demo-image] [clone] -->
      TIER: fast (no network), network, docker, vllm_runtime (pytest marks; several allowed);
      venv=  a vLLM release the tests install first (tests/vllmenv.py), for `dir:` examples;
      replay= a recorded verify scenario served on loopback while the block runs;
      demo-image: the stand-in community image the README checks is built first;
      clone: the block runs in a fresh copy of the repository (what a clone of this working tree
             holds), with the interpreter the tests run under as `python3` and none of this
             machine's pip configuration but how it reaches an index (CA bundle, proxy): the
             Quick start's set-up as a new user types it.
  <!-- docs-test: skip (REASON) -->
      not run: set-up commands, the test suite itself, GPU or second-node commands.

Each block runs in a scratch folder that links the repository's mods/, launch/, examples/ and
tests/, its commands one after another in one bash (so files and $? carry over). A reader runs
the README in order, so a block that may read the package index (any tier but fast) starts
with the sparkmods cache that README's first block, the Quick start, left; a fast block starts
with an empty one. The comparison is exact except for three things, and only these: trailing
spaces, the replay server's URL, which prints as the documented http://127.0.0.1:8000, and a
shown line `...`, which stands for one or more lines the docs leave out.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "launch" / "README.md"]
LINKED = ("mods", "launch", "examples", "tests")
DOC_URL = "http://127.0.0.1:8000"
DOC_LAUNCHER = "~/spark-vllm-docker/launch-cluster.sh"  # where the docs say eugr's launcher is
TIERS = ("fast", "network", "docker", "vllm_runtime")
DEMO_IMAGE = "sparkmods-demo/vllm-node:0.19.1-dev"
DEMO_VERSION = "0.19.1.dev0+g2a69949bd.d20260404"  # a community-style source build of 0.19.1
# How this machine reaches an index (its CA bundle, its proxy): passed to the `clone` block's pip,
# whose own configuration is left out.
REACHING_THE_INDEX = ("PIP_CERT", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
                      "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")
ANNOTATION = re.compile(r"<!-- docs-test: (.*) -->")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block and the annotation before it."""

    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    lines: Tuple[str, ...]
    annotation: Optional[str]

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    def option(self, key: str) -> Optional[str]:
        found = re.search(rf"\b{key}=(\S+)", self.annotation or "")
        return found.group(1) if found else None

    def tiers(self) -> List[str]:
        return [w for w in (self.annotation or "").split() if w in TIERS]

    def transcript(self) -> List[Tuple[str, str]]:
        """(command, expected output) pairs."""
        pairs: List[Tuple[str, List[str]]] = []
        for text in self.lines:
            if text.startswith("$ "):
                pairs.append((text[2:], []))
            else:
                pairs[-1][1].append(text.rstrip())
        return [(cmd, "".join(f"{line}\n" for line in out)) for cmd, out in pairs]


def blocks(doc: Path) -> Iterator[Block]:
    """Every fenced block of a Markdown file, with the `docs-test` comment just before it."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        note = ANNOTATION.fullmatch(before.strip())
        yield Block(doc, i + 1, opening.group(1), tuple(lines[i + 1:end]), note.group(1) if note else None)
        i = end + 1


ALL = [b for doc in DOCS for b in blocks(doc)]
TRANSCRIPTS = [b for b in ALL if b.lines and b.lines[0].startswith("$ ")]
RUN = [b for b in TRANSCRIPTS if not (b.annotation or "").startswith("skip")]
QUICK_START = RUN[0]  # README's first command: every later block runs after it


def _params() -> List[pytest.param]:
    marks = {"network": pytest.mark.network, "docker": pytest.mark.docker, "vllm_runtime": pytest.mark.vllm_runtime}
    return [pytest.param(b, id=b.name, marks=[marks[t] for t in b.tiers() if t in marks]) for b in RUN]


def test_every_command_block_is_a_transcript_or_says_why_not() -> None:
    """A shown command either has its real output under it (a transcript) or a stated reason."""
    for block in ALL:
        commands = block.lang in ("bash", "sh", "console") or any(line.startswith("$ ") for line in block.lines)
        if not commands:
            continue
        if block in TRANSCRIPTS:
            assert block.lang == "console", f"{block.name}: a transcript is a ```console block"
            assert block.annotation and (block.tiers() or block.annotation.startswith("skip")), \
                f"{block.name}: say its tier before it: <!-- docs-test: fast|network|docker|vllm_runtime -->"
        else:
            assert re.fullmatch(r"skip \(.+\)", block.annotation or ""), \
                f"{block.name}: commands without their output: show the output ($ lines) or say <!-- docs-test: skip (why) -->"


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run runs exactly the two set-up and test lines the README gives, in that order."""
    readme = DOCS[0].read_text(encoding="utf-8")
    command = "bash ci/setup-tests.sh && SPARKMODS_REQUIRE_DOCKER=1 .venv/bin/pytest -m '' -n 2"
    assert f"\nbash ci/setup-docker.sh\n{command}\n" in readme
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert command in ci and "bash ci/setup-docker.sh" in ci[:ci.index(command)]


def test_the_quick_start_runs_the_main_job_first() -> None:
    """The README's first command is the main job on its default (every mod, every release from
    PyPI: no Docker, no GPU) from a fresh clone, run as written, with all of it green."""
    readme = DOCS[0].read_text(encoding="utf-8").splitlines()
    start = readme.index("## Quick start")
    first = next(b for b in ALL if b.doc == DOCS[0] and b.line > start)
    assert first == QUICK_START and "clone" in QUICK_START.annotation.split(), QUICK_START.name
    (command, shown), *_ = QUICK_START.transcript()
    assert command.startswith("python3 -m venv .venv && ") and command.endswith(" && .venv/bin/sparkmods check")
    assert re.fullmatch(r"(\d+) checked, \1 green, 0 not", shown.splitlines()[-1]), shown


def test_set_up_lines_need_no_sudo() -> None:
    """A root-only machine has no sudo: the commands are shown as typed there."""
    for block in ALL:
        for text in block.lines:
            assert not re.search(r"(^|[;&|(]\s*|\$ )sudo\b", text), f"{block.name}: {text}"


def test_numpy_and_safetensors_are_named_before_the_block_that_needs_them() -> None:
    """examples/make_demo_checkpoints.py needs numpy and safetensors, which sparkmods itself does
    not install: the text just before its block says how to get them."""
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        for block in ALL:
            if block.doc == doc and any("examples/make_demo_checkpoints.py" in line for line in block.lines):
                previous = max((b.line + len(b.lines) for b in ALL if b.doc == doc and b.line < block.line), default=0)
                assert "pip install numpy safetensors" in "\n".join(lines[previous:block.line]), block.name


def test_the_launch_synopsis_lists_every_option_launch_has() -> None:
    """launch/README.md's synopsis names every option of `sparkmods launch`, and none it lacks."""
    from sparkmods.cli import build_parser

    parser = build_parser(["launch"])
    [launch] = [a.choices["launch"] for a in parser._actions if getattr(a, "choices", None) and "launch" in a.choices]
    options = {o for a in launch._actions for o in a.option_strings if o not in ("-h", "--help", "--output")}
    [synopsis] = [b for b in ALL if b.doc == DOCS[1] and b.lines and b.lines[0].startswith("sparkmods launch ")]
    shown = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", "\n".join(synopsis.lines)))
    assert shown == options, f"{synopsis.name}: missing {sorted(options - shown)}, unknown {sorted(shown - options)}"


ENV_NAME = re.compile(r"\bSPARKMODS_[A-Z0-9_]*[A-Z0-9]\b")


def _read_variables() -> set:
    """SPARKMODS_* names in what ships: the tools, the mods' files, patches' added lines and run.sh."""
    found = set()
    for path in [*(REPO / "tools" / "sparkmods").rglob("*.py"), *(REPO / "mods").rglob("*")]:
        if path.is_file() and path.suffix in (".py", ".sh", ".patch"):
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".patch":
                text = "\n".join(line for line in text.splitlines() if line.startswith("+"))
            found |= set(ENV_NAME.findall(text))
    return found


def test_the_environment_table_names_every_variable_and_no_other() -> None:
    """README's table of SPARKMODS_* variables: one row (or a shared row) for each the code reads."""
    text = DOCS[0].read_text(encoding="utf-8")
    section = text.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `SPARKMODS_")]
    listed = {name for row in rows for name in ENV_NAME.findall(row.split(" | ")[0])}
    read = _read_variables()
    assert len(read) > 20 and "SPARKMODS_VLLM_BASE" in read
    assert listed == read, f"README's table lacks {sorted(read - listed)}; lists {sorted(listed - read)}, which nothing reads"


def test_transcripts_are_found() -> None:
    tiers = {t for b in RUN for t in b.tiers()}
    assert {"fast", "network", "docker"} <= tiers, tiers
    assert any(b.doc == DOCS[1] for b in RUN), "launch/README.md shows no command with its output"


# --- running a block ---------------------------------------------------------------------------

def _replay(folder: Path):
    """A loopback server answering as the recorded scenario's server did (tests/verifyreplay.py)."""
    from sparkmods.verify.capture import load_scenario
    from verifyreplay import Replay
    return Replay(load_scenario(folder))


def _demo_image() -> None:
    """The stand-in community image: every Python file of vLLM 0.19.1 under a dev-build label."""
    from dockerimg import build_vllm_image, default_build_metadata
    from sparkmods.sources import open_targets
    [source] = open_targets("pypi:0.19.1")
    names = [n for n in source.list_files() if n.startswith("vllm/") and n.endswith(".py")]
    source.prefetch(names)
    build_vllm_image(DEMO_IMAGE, {n: source.read(n) for n in names}, DEMO_VERSION, default_build_metadata(DEMO_VERSION))


def _clone(work: Path) -> None:
    """What a clone of this working tree holds: the tracked files as they are now, and the new
    files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source, target = REPO / rel, work / rel
        if source.is_file() or source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)


def _matches(expected: str, actual: str) -> bool:
    """Equal, where a shown line `...` stands for one or more lines."""
    shown = expected.splitlines(keepends=True)
    pattern = "".join(r"(?:.*\n)+" if line == "...\n" else re.escape(line) for line in shown)
    return re.fullmatch(pattern, actual) is not None


def run_block(block: Block, scratch: Path, url: Optional[str]) -> List[Tuple[str, str, str]]:
    """Run the block's commands in one bash; (command, expected, actual) for each."""
    work, outs = scratch / "work", scratch / "out"
    work.mkdir()
    outs.mkdir()
    clone = "clone" in (block.annotation or "").split()
    if clone:
        _clone(work)
    for name in () if clone else LINKED:
        (work / name).symlink_to(REPO / name)
    pairs = block.transcript()
    script = "".join(f'{{ {cmd}\n}} >"{outs}/{i}" 2>&1 </dev/null\n' for i, (cmd, _) in enumerate(pairs))
    if url is not None:
        script = script.replace(DOC_URL, url)
    script = script.replace(DOC_LAUNCHER, str(REPO / "tests" / "fixtures" / "launch-cluster.sh"))  # eugr's, stood in
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOME": os.environ["HOME"],
           "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "SPARKMODS_CACHE_DIR": str(scratch / "cache")}
    env.update({k: v for k, v in os.environ.items() if k in ("SPARKMODS_VENV_DIR", "DOCKER_HOST", "SPARKMODS_INDEX_URL")})
    if clone:  # python3 is the tests' interpreter outside their venv (the reader's has its minor version)
        base = Path(getattr(sys, "_base_executable", sys.executable)).parent
        env.update(PATH=f"{base}:{os.environ['PATH']}", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
        env.update({k: v for k, v in os.environ.items() if k in REACHING_THE_INDEX})
    subprocess.run(["bash", "-c", script], cwd=work, env=env, timeout=600, check=False)
    results = []
    for i, (cmd, expected) in enumerate(pairs):
        actual = (outs / str(i)).read_text(encoding="utf-8", errors="replace") if (outs / str(i)).exists() else ""
        if url is not None:
            actual = actual.replace(url, DOC_URL)
        actual = "".join(f"{line.rstrip()}\n" for line in actual.splitlines())
        results.append((cmd, expected, actual))
    return results


@pytest.fixture(scope="session")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, List[Tuple[str, str, str]]]:
    """README's first block run once: the sparkmods cache it leaves, and what it printed."""
    scratch = tmp_path_factory.mktemp("quick-start")
    return scratch / "cache", run_block(QUICK_START, scratch, None)


@pytest.mark.parametrize("block", _params())
def test_block_prints_what_the_docs_show(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if "demo-image" in (block.annotation or ""):
        request.getfixturevalue("docker_engine")  # skips (or fails under SPARKMODS_REQUIRE_DOCKER=1)
        _demo_image()
    version = block.option("venv")
    if version is not None:
        from vllmenv import vllm_env
        vllm_env(version)
    if block != QUICK_START and set(block.tiers()) - {"fast"}:
        shutil.copytree(request.getfixturevalue("quick_start")[0], tmp_path / "cache")
    replay = block.option("replay")
    server = _replay(REPO / replay) if replay else None
    if block == QUICK_START:
        results = request.getfixturevalue("quick_start")[1]
    elif server is not None:
        with server:
            results = run_block(block, tmp_path, server.url)
    else:
        results = run_block(block, tmp_path, None)
    wrong = [f"$ {cmd}\n--- shown:\n{expected}--- printed:\n{actual}" for cmd, expected, actual in results
             if not _matches(expected, actual)]
    assert not wrong, f"{block.name}: the output differs from the docs:\n" + "\n".join(wrong)


STANDING_CELL = re.compile(r"(\*\*)?(?:\[([0-9.]+)\]\((ci/bench/results/[^)]+/served\.md)\)|([0-9.]+))(\*\*)?")


def _steady(served_md: str) -> Dict[Tuple[str, int, int], Dict[str, Any]]:
    """The steady rows of the served.json beside a linked served.md, by (config, context, batch)."""
    served = json.loads((REPO / served_md).with_name("served.json").read_text())
    return {(r["config"], r["context"], r["batch"]): r for r in served if r.get("phase") == "steady"}


def test_the_standing_table_is_what_the_linked_rows_say() -> None:
    """Every ratio in the README's full-size standing table is recomputed from the served.json it
    comes from (steady cells, config over stock, same run): the row's link, or the cell's own where
    a later run measured that cell; the windows column is every count the row's cells used."""
    text = (REPO / "README.md").read_text()
    head = "| model | config | 1k x 1 | 1k x 8 | 1k x 32 | 32k x 1 | 32k x 8 | 128k x 1 | windows | rows |"
    rows = list(itertools.takewhile(bool, text[text.index(head):].splitlines()[2:]))
    assert len(rows) == 8
    cells = [(1024, 1), (1024, 8), (1024, 32), (32768, 1), (32768, 8), (131072, 1)]
    for row in rows:
        fields = [f.strip() for f in row.strip("|").split("|")]
        config, link = fields[1], re.search(r"\((ci/bench/results/[^)]+/served\.md)\)", fields[-1])
        assert link, row
        windows = set()
        for shown, (context, batch) in zip(fields[2:8], cells):
            cell = STANDING_CELL.fullmatch(shown)
            assert cell and bool(cell.group(1)) == bool(cell.group(5)), (row, shown)
            steady = _steady(cell.group(3) or link.group(1))
            ratio = steady[(config, context, batch)]["tok_s"] / steady[("stock", context, batch)]["tok_s"]
            bar = 0.98 if config in ("hybrid-int4-fp8", "int8-lm-head") else 0.95 if context < 32768 else 1.0
            assert (cell.group(2) or cell.group(4)) == f"{ratio:.3f}", (row, context, batch)
            assert bool(cell.group(1)) == (round(ratio, 3) < bar), (row, context, batch)  # bold: below the bar
            windows.add(len(steady[(config, context, batch)].get("tok_s_runs") or [0]))
        assert fields[8] == " / ".join(str(n) for n in sorted(windows)), row


def test_the_first_request_range_is_what_the_linked_runs_say() -> None:
    """The README's range of first request over steady rate, the mods' and stock's, is recomputed
    from every run the standing table links (stock-again is stock)."""
    text = (REPO / "README.md").read_text()
    start = text.index("| model | config | 1k x 1 |")
    table = text[start:text.index("\n\n", start)]
    ratios: Dict[bool, List[float]] = {True: [], False: []}
    for link in sorted(set(re.findall(r"\((ci/bench/results/[^)]+/served\.md)\)", table))):
        steady = _steady(link)
        for row in json.loads((REPO / link).with_name("served.json").read_text()):
            if row.get("phase") == "first" and row["tok_s"]:
                steady_rate = steady[(row["config"], row["context"], row["batch"])]["tok_s"]
                ratios[row["config"] in ("stock", "stock-again")].append(row["tok_s"] / steady_rate)
    said = re.search(r"ran at\s+([0-9.]+)-([0-9.]+) of the same cell's steady rate.*?as stock's did\s+\(([0-9.]+)-([0-9.]+)\)",
                     text, re.S)
    assert said, "the README's first-request sentence is gone"
    shown = [said.group(n) for n in range(1, 5)]
    assert shown == [f"{min(ratios[False]):.3f}", f"{max(ratios[False]):.3f}",
                     f"{min(ratios[True]):.3f}", f"{max(ratios[True]):.3f}"]
