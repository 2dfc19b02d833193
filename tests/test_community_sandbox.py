"""Community mods judged by running them (sparkmods.community.sandbox) in a real Docker engine:
each status from a small run.sh of our own, the sandbox's walls, the static reading agreeing with
the run on diff mods, loose files on the command line, adopt of a Python patcher, and the
incremental community matrix. No mod text of another project is used or kept here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest

from communitytree import FIXTURES, sites
from realtree import write_site
from sparkmods.cli import main
from sparkmods.community.sandbox import (
    APPLIED,
    FAILED,
    NO_CHANGE,
    OUTSIDE,
    SITE_DIR,
    TIMED_OUT,
    agrees,
    release_tree,
    run_mod,
)
from sparkmods.sources import open_targets

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[1]
MODEL = "vllm/model_executor/models/toy.py"
TOY = "import os\n\n\nclass Toy:\n    def forward(self, x):\n        return x\n"

PY_PATCHER = f"""\
#!/bin/bash
set -e
python3 - <<'PY'
import sys
from pathlib import Path
path = Path("{SITE_DIR}") / "{MODEL}"
text = path.read_text()
if "return x\\n" not in text:
    print("anchor missing, skipping")
    sys.exit(0)
path.write_text(text.replace("return x\\n", "return x * 2\\n"))
print("patched")
PY
"""


def mod(root: Path, name: str, run_sh: str, **files: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "run.sh").write_text(textwrap.dedent(run_sh))
    for fname, text in files.items():
        (folder / fname).write_text(text)
    return folder


def site(root: Path, version: str, files: Dict[str, str]) -> Path:
    return write_site(root, version, {k: v.encode() for k, v in files.items()})


@pytest.fixture(scope="module")
def image(sandbox_image: str) -> str:
    return sandbox_image


def test_each_status_from_a_run(tmp_path: Path, image: str):
    tree = site(tmp_path / "site", "0.19.1", {MODEL: TOY})
    mods = tmp_path / "mods"
    ran = run_mod(mod(mods, "py-patcher", PY_PATCHER), tree, image)
    assert (ran.status, ran.exit_code, ran.changed) == (APPLIED, 0, [("modified", MODEL)])
    assert (tree / MODEL).read_text() == TOY  # the run worked on a copy

    moved = site(tmp_path / "moved", "0.20.0", {MODEL: TOY.replace("return x", "return x + 0")})
    ran = run_mod(mods / "py-patcher", moved, image)
    assert (ran.status, ran.exit_code, ran.last_line) == (NO_CHANGE, 0, "anchor missing, skipping")

    ran = run_mod(mod(mods, "sed-missing", f"""\
        set -e
        sed -i 's/return x/return -x/' {SITE_DIR}/vllm/not_there.py
        """), tree, image)
    assert ran.status == FAILED and ran.exit_code == 2 and "not_there.py" in ran.last_line
    assert ran.reason().startswith("exit 2: sed: ")

    ran = run_mod(mod(mods, "template", "cp run.sh $WORKSPACE_DIR/template.jinja\n"), tree, image)
    assert (ran.status, ran.outside) == (OUTSIDE, ["/workspace/vllm/template.jinja"])
    ran = run_mod(mod(mods, "pth", f"set -e\necho x > {SITE_DIR}/extra.pth\n"), tree, image)
    assert (ran.status, ran.outside) == (OUTSIDE, [f"{SITE_DIR}/extra.pth"])
    ran = run_mod(mod(mods, "etc", "set -e\necho x > /etc/motd\nmkdir -p /root/.cache/x\n"), tree, image)
    assert (ran.status, ran.exit_code, ran.outside) == (OUTSIDE, 0, ["/etc/motd", "/root/.cache/x"])
    ran = run_mod(mod(mods, "same-bytes", f"set -e\nf={SITE_DIR}/{MODEL}\ncp $f /tmp/x && cat /tmp/x > $f\n"
                      "python3 -c 'import vllm'\n"), tree, image)
    assert (ran.status, ran.changed, ran.outside) == (NO_CHANGE, [], [])  # rewritten unchanged; bytecode ignored

    ran = run_mod(mod(mods, "slow", "sleep 30\n"), tree, image, timeout=2)
    assert ran.status == TIMED_OUT and ran.seconds < 20 and "still running after 2 s" in ran.reason(2)


def test_the_sandbox_has_no_network_and_runs_as_the_launcher_does(tmp_path: Path, image: str):
    tree = site(tmp_path / "site", "0.19.1", {MODEL: TOY})
    probe = mod(tmp_path, "probe", f"""\
        set -e
        test "$PWD" = /workspace/mods/probe
        test "$WORKSPACE_DIR" = /workspace/vllm
        test "$(id -u)" = 0
        test -x run.sh
        python3 -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("vllm.model_executor.models.toy") else 1)'
        python3 -c 'import importlib.metadata as m; assert m.version("vllm") == "0.19.1"'
        if curl -fsS --max-time 5 https://pypi.org/simple/ -o /dev/null; then exit 9; fi
        echo "$(($(cat {SITE_DIR}/{MODEL} | wc -l)))" > /tmp/lines
        echo probed
        """)
    ran = run_mod(probe, tree, image)
    assert (ran.status, ran.last_line) == (NO_CHANGE, "probed"), ran


def _importer(root: Path) -> Path:
    return mod(root, "imports-vllm", "set -e\npython3 -c 'import vllm'\n")


@pytest.mark.network
def test_import_vllm_is_a_finding_not_faked(tmp_path: Path, image: str):
    [source] = open_targets("pypi:0.19.1")
    tree = release_tree(source)
    assert (tree / "vllm" / "__init__.py").is_file() and not list(tree.rglob("*.so"))
    assert release_tree(source) == tree  # cached on disk, by the wheel's sha256
    ran = run_mod(_importer(tmp_path), tree, image)
    assert ran.status == FAILED and ran.exit_code == 1 and "No module named" in ran.last_line


def test_static_reading_and_run_agree_on_diff_mods(tmp_path: Path, image: str, capsys):
    good, bad = sites(tmp_path)
    for name in ("patch-d-site", "patch-root-skipping", "reverse-upstream", "dry-run-guard", "stacked-loop"):
        for tree in (good, bad):
            assert main(["check", "--community", str(FIXTURES), name, "--vllm", f"dir:{tree}", "--json"]) in (0, 1)
            [row] = json.loads(capsys.readouterr().out)["results"]
            assert row["static"] is not None and agrees(row["static"], row["status"]), row
    assert main(["check", "--community", str(FIXTURES), "patch-root-skipping", "--vllm", f"dir:{good}"]) == 0
    out = capsys.readouterr().out
    assert "applied" in out and "0 disagree with the static reading" in out


def test_python_and_sed_patchers_get_a_real_status(tmp_path: Path, image: str, capsys):
    good, _ = sites(tmp_path)
    assert main(["check", "--community", str(FIXTURES), "python-edit", "sed-edit", "--vllm", f"dir:{good}",
                 "--json"]) in (0, 1)
    rows = {r["mod"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert set(rows) == {"python-edit", "sed-edit"}
    assert all(r["status"] in (APPLIED, NO_CHANGE, FAILED) and r["static"] is None for r in rows.values())


def test_loose_script_and_diff_on_the_command_line(tmp_path: Path, image: str, capsys):
    tree = site(tmp_path / "site", "0.19.1", {MODEL: TOY})
    script = tmp_path / "double.sh"
    script.write_text(PY_PATCHER)
    assert main(["check", str(script), "--vllm", f"dir:{tree}", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["results"]
    assert (row["mod"], row["status"], row["run"]["changed"]) == ("double", APPLIED,
                                                                 [{"path": MODEL, "change": "modified"}])
    diff = tmp_path / "triple.diff"
    diff.write_text(f"--- a/{MODEL}\n+++ b/{MODEL}\n@@ -6 +6 @@\n-        return x\n+        return x * 3\n")
    assert main(["check", "--community", str(diff), "--vllm", f"dir:{tree}", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["results"]
    assert (row["status"], row["static"]) == (APPLIED, "ok")
    assert main(["check", "--community", str(diff), "--vllm", f"dir:{tree}", "--sandbox-image",
                 "sparkmods-no-such-image:0"]) == 2
    err = capsys.readouterr().err
    assert "no sandbox image 'sparkmods-no-such-image:0'" in err and err.count("\n") == 1


def test_adopt_a_python_patcher_outside_the_repository(tmp_path: Path, image: str, capsys):
    one = site(tmp_path / "a", "0.19.1", {MODEL: TOY})
    two = site(tmp_path / "b", "0.20.0", {MODEL: "# moved\n" * 10 + TOY})  # only line numbers differ
    three = site(tmp_path / "c", "0.21.0", {MODEL: TOY.replace("return x", "return x + 0")})
    folder = mod(tmp_path / "community", "double", PY_PATCHER)
    out = tmp_path / "adopted" / "double"
    assert main(["adopt", str(folder), "--out", str(out), *(f"--vllm=dir:{t}" for t in (one, two, three))]) == 0
    printed = capsys.readouterr().out
    assert "variant v0.19.1: vllm >=0.19.1, <0.21.0; verified on 0.19.1, 0.20.0" in printed
    assert "not carried to 0.21.0: no-change" in printed
    patch = (out / "patches" / "v0.19.1" / "double.patch").read_text()
    assert "-        return x\n+        return x * 2\n" in patch and "python3" not in patch
    assert main(["check", "double", "--mods-dir", str(out.parent), "--vllm", f"dir:{two}"]) == 0
    capsys.readouterr()
    inside = REPO / "mods" / "double-adopted"
    assert main(["adopt", str(folder), "--out", str(inside), "--vllm", f"dir:{one}"]) == 2
    assert "inside the sparkmods repository" in capsys.readouterr().err and not inside.exists()


def _mirror(root: Path, mods: Dict[str, str]) -> Path:
    work = root / "work"
    for name, run_sh in mods.items():
        (work / "mods" / name).mkdir(parents=True, exist_ok=True)
        (work / "mods" / name / "run.sh").write_text(run_sh)
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    if not (work / ".git").exists():
        subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "snapshot"], check=True)
    return work / ".git"


@pytest.mark.network
def test_community_matrix_is_incremental(tmp_path: Path, image: str):
    """Cells re-run only for a changed mod; the results hold statuses and counts, no mod text."""
    bench = [sys.executable, str(REPO / "ci" / "bench" / "bench_community.py"), "--out", str(tmp_path / "out"),
             "--vllm", "pypi:0.19.1", "--vllm", "pypi:0.20.0"]
    marker = "echo sparkmods-own-words-1 && exit 3\n"
    mirror = _mirror(tmp_path, {"alpha": marker, "beta": "echo quiet\n"})
    for expect_run, expect_reused in ((4, 0), (0, 4)):
        subprocess.run(bench + ["--mirror", str(mirror)], check=True, capture_output=True)
        doc = json.loads((tmp_path / "out" / "community-any-cpu.json").read_text())
        assert (doc["timing"]["cells_run"], doc["timing"]["cells_reused"]) == (expect_run, expect_reused)
    assert {(c["mod"], c["vllm"], c["status"]) for c in doc["cells"]} == {
        ("alpha", "0.19.1", FAILED), ("alpha", "0.20.0", FAILED), ("beta", "0.19.1", NO_CHANGE),
        ("beta", "0.20.0", NO_CHANGE)}
    mirror = _mirror(tmp_path, {"beta": "echo louder\n"})
    subprocess.run(bench + ["--mirror", str(mirror)], check=True, capture_output=True)
    doc = json.loads((tmp_path / "out" / "community-any-cpu.json").read_text())
    assert (doc["timing"]["cells_run"], doc["timing"]["cells_reused"]) == (2, 2)
    for name in ("community-any-cpu.json", "community-any-cpu.md"):
        text = (tmp_path / "out" / name).read_text()
        assert "sparkmods-own-words" not in text and "echo" not in text


MIRROR = Path(os.environ.get("SPARKMODS_COMMUNITY_MIRROR", "/work/.mirror/spark-arena+eugr-recipes/repo"))


@pytest.mark.network
@pytest.mark.skipif(not MIRROR.is_dir(), reason=f"no spark-arena/eugr-recipes mirror at {MIRROR} "
                                                 "(set SPARKMODS_COMMUNITY_MIRROR to a git directory of one)")
def test_adopt_a_community_python_patcher_keeps_its_text_out_of_the_repository(tmp_path: Path, image: str, capsys):
    name = "kv-cache-prealloc-cleanup"  # a Python patcher of the collection: a heredoc run by python3
    folder = tmp_path / "community" / name
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "--git-dir", str(MIRROR), "archive", f"HEAD:mods/{name}"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    before = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    out = tmp_path / "adopted" / name
    assert main(["adopt", str(folder), "--out", str(out), "--vllm", "pypi:0.18.0", "--vllm", "pypi:0.18.1"]) == 0
    assert "variant v0.18.0: vllm >=0.18.0" in capsys.readouterr().out
    patch = (out / "patches" / "v0.18.0" / f"{name}.patch").read_text()
    assert patch.startswith("--- a/vllm/") and (out / "mod.toml").is_file() and (out / "run.sh").is_file()
    after = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=all"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert not [line for line in set(after) - set(before) if name in line or "kv-cache" in line]
