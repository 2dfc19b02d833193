"""run.sh's answers are the truth (issue #30, the runtime's part): links and odd files inside
vllm/, trees upgraded under an applied mod, output that fails after a completed change, state
another user could have written, hand edits, and what a revert removes.

Each case runs the mod's real run.sh (bash, a fresh Python) on a real folder tree, except the
few that call the journal's transact directly.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

import realtree
from modfactory import ORIGINAL, PATCHED, TARGET, make_mod, make_site, make_template_mod, unified
from realtree import snapshot, strays
from sparkmods.runtime.journal import JOURNAL_NAME, STATE_DIR, Entry, Journal, JournalError, dump_json, transact
from sparkmods.sync import sync

NEW = "vllm/sparkmods_new.py"
NEW_BODY = "x = 1\n"
CREATES = unified(TARGET, ORIGINAL, PATCHED) + f"--- /dev/null\n+++ b/{NEW}\n@@ -0,0 +1 @@\n+x = 1\n"
REPO_MOD = {m.name: m for m in realtree.repo_mods()}


def run_sh(mod: Path, site: Path, cwd: Path, *args: str, env: Optional[Dict[str, str]] = None,
           shell: str = "") -> subprocess.CompletedProcess:
    """run.sh as a user runs it; `shell` wraps it (`{run} | head -1`), its exit code last on stderr."""
    full = {"PATH": os.environ["PATH"], "PYTHON_ROOT": str(site), "SPARKMODS_PYTHON": sys.executable,
            "WORKSPACE_DIR": str(cwd)}
    full.update(env or {})
    command = " ".join(["bash", str(mod / "run.sh"), *args])
    argv = ["bash", "-c", shell.format(run=command) + '; echo "rc=${PIPESTATUS[0]}" >&2'] if shell else command.split()
    return subprocess.run(argv, cwd=cwd, env=full, text=True, capture_output=True, timeout=120)


def one_error(out: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The run printed exactly one line, an ERROR holding every word, and exited `code`."""
    text = out.stdout + out.stderr
    assert out.returncode == code, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "ERROR" in lines[0] and "Traceback" not in text, text
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def tree(site: Path) -> Dict[str, str]:
    """Everything under site but the state folder: files by sha256, links by where they point,
    folders and FIFOs by kind (realtree.snapshot reads through links)."""
    out = {}
    for path in sorted(site.rglob("*")):
        rel = path.relative_to(site).as_posix()
        if rel.split("/")[0] == STATE_DIR:
            continue
        mode = path.lstat().st_mode
        out[rel] = ("-> " + os.readlink(path) if stat.S_ISLNK(mode) else "folder" if stat.S_ISDIR(mode)
                    else "fifo" if stat.S_ISFIFO(mode) else hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def clean(site: Path, mods: List[str]) -> None:
    assert strays(site, mods) == []


# 1. Symbolic links inside vllm/: refused in one line before anything is written.

def _link_to_other(site: Path) -> None:
    (site / "vllm/other.py").write_text(ORIGINAL)
    (site / TARGET).unlink()
    (site / TARGET).symlink_to("../../other.py")


def _dangling_target(site: Path) -> None:
    (site / TARGET).unlink()
    (site / TARGET).symlink_to("gone.py")


def _dangling_new(site: Path) -> None:
    (site / NEW).symlink_to("nowhere.py")


def _new_links_to_existing(site: Path) -> None:
    (site / "vllm/keep.py").write_text("keep = 1\n")
    (site / NEW).symlink_to("keep.py")


def _folder_link(site: Path) -> None:
    layers = site / "vllm/model_executor/layers"
    layers.rename(site / "vllm/real_layers")
    layers.symlink_to("../real_layers")


def _package_link(site: Path) -> None:
    (site / "vllm").rename(site / "vllm_real")
    (site / "vllm").symlink_to("vllm_real")


@pytest.mark.parametrize("action", ["apply", "check"])
@pytest.mark.parametrize("make_link", [_link_to_other, _dangling_target, _dangling_new, _new_links_to_existing,
                                       _folder_link, _package_link])
def test_a_symbolic_link_on_a_mod_path_is_refused_in_one_line(tmp_path: Path, make_link, action: str) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods", patch=CREATES)
    make_link(site)
    before = tree(site)
    for _ in range(2):  # and again: never "applied"
        line = one_error(run_sh(mod, site, tmp_path, action), 2, "symbolic link", "nothing was changed")
        assert "applied" not in line
    assert tree(site) == before
    assert not (site / STATE_DIR).exists()


def test_revert_refuses_a_link_put_in_place_of_a_patched_file(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods", patch=CREATES)
    assert run_sh(mod, site, tmp_path).returncode == 0
    (site / "vllm/copy.py").write_text(PATCHED)
    (site / TARGET).unlink()
    (site / TARGET).symlink_to(os.path.relpath(site / "vllm/copy.py", (site / TARGET).parent))
    one_error(run_sh(mod, site, tmp_path, "revert"), 2, "symbolic link", TARGET)
    assert (site / TARGET).is_symlink() and (site / "vllm/copy.py").read_text() == PATCHED
    assert (site / NEW).read_text() == NEW_BODY  # nothing was reverted


def test_transact_that_cannot_finish_raises_and_rolls_back(tmp_path: Path) -> None:
    """A journal whose new bytes are staged nowhere settling can find: an error, never silence."""
    site = realtree.write_site(tmp_path, "0.19.1", {"vllm/a.py": b"A\n"})
    before, after = (hashlib.sha256(b).hexdigest() for b in (b"A\n", b"A2\n"))
    entry = Entry("vllm/a.py", before, after, f"{STATE_DIR}/m/elsewhere/vllm/a.py", f"{STATE_DIR}/m/orig/vllm/a.py")
    with pytest.raises(JournalError, match=r"vllm/a\.py"):
        transact(site, Journal("apply", "m", [entry], {"files": {}}), {entry.old: b"A\n"})
    assert (site / "vllm/a.py").read_bytes() == b"A\n"
    clean(site, [])


# 3. A vLLM installed over an applied mod, and a mod updated while its older version is applied.

def pip_install(site: Path, old: Path, new: Path) -> None:
    """What `pip install -U vllm` does to site: the files of the old release (`old`, a pristine
    tree) go, the new release's are written; files a mod created and the state folder stay."""
    for rel in snapshot(old):
        (site / rel).unlink(missing_ok=True)
    for dist in site.glob("vllm-*.dist-info"):
        shutil.rmtree(dist)
    shutil.copytree(new, site, dirs_exist_ok=True)


def test_turboquant_under_an_upgraded_vllm_is_said_and_revert_then_apply_work(tmp_path: Path) -> None:
    """turboquant applied to 0.19.1 (with the files it created), then vLLM 0.20.0 installed over it."""
    mod = REPO_MOD["turboquant"]
    old = realtree.synthesized_site(tmp_path / "old", [mod], "0.19.1")
    new = realtree.synthesized_site(tmp_path / "new", [mod], "0.20.0")
    site = realtree.copy_tree(old, tmp_path / "site")
    assert run_sh(mod, site, tmp_path).returncode == 0
    created = sorted(set(snapshot(site)) - set(snapshot(old)))
    assert len(created) >= 3, created  # its backend, format and kernels
    pip_install(site, old, new)
    upgraded = snapshot(site)
    for action in ("check", "apply"):
        one_error(run_sh(mod, site, tmp_path, action), 1, "vLLM 0.20.0 was installed over", "0.19.1",
                  "run.sh revert", "nothing was changed")
        assert snapshot(site) == upgraded
    out = run_sh(mod, site, tmp_path, "revert")
    assert out.returncode == 0 and all(f"removed {rel}" in out.stdout for rel in created), out.stdout
    assert snapshot(site) == snapshot(new) and not (site / STATE_DIR / "turboquant").exists()
    out = run_sh(mod, site, tmp_path)
    assert out.returncode == 0 and "applied variant v0.20.0 to vLLM 0.20.0" in out.stdout, out.stdout
    fresh = realtree.copy_tree(new, tmp_path / "fresh")
    assert run_sh(mod, fresh, tmp_path).returncode == 0 and snapshot(site) == snapshot(fresh)
    clean(site, ["turboquant"])


@pytest.mark.parametrize("version,then", [
    ("0.20.0", "applied variant v1 to vLLM 0.20.0"),  # same variant, newer release
    ("0.22.0", "no variant covers vLLM 0.22.0"),       # past every variant
    ("0.19.1", "applied variant v1 to vLLM 0.19.1"),   # the same release reinstalled
])
def test_a_vllm_installed_over_the_mod_is_said_and_revert_removes_what_it_created(
        tmp_path: Path, version: str, then: str) -> None:
    mod = make_mod(tmp_path / "mods", patch=CREATES)
    old = make_site(tmp_path / "old")
    new = make_site(tmp_path / "new", version=version)
    site = realtree.copy_tree(old, tmp_path / "site")
    assert run_sh(mod, site, tmp_path).returncode == 0
    pip_install(site, old, new)
    assert (site / NEW).read_text() == NEW_BODY and (site / TARGET).read_text() == ORIGINAL
    upgraded = snapshot(site)
    for action in ("check", "apply"):
        one_error(run_sh(mod, site, tmp_path, action), 1, f"vLLM {version} was installed over", "vLLM 0.19.1",
                  "run.sh revert", NEW)
    assert snapshot(site) == upgraded
    out = run_sh(mod, site, tmp_path, "revert")
    assert out.returncode == 0 and f"removed {NEW}" in out.stdout and "restored" not in out.stdout, out.stdout
    assert snapshot(site) == snapshot(new)
    out = run_sh(mod, site, tmp_path)
    assert then in out.stdout, out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_an_upgrade_that_left_nothing_of_the_mod_needs_no_revert(tmp_path: Path) -> None:
    """Only patched files, all replaced by the new release: the saved state is stale, apply goes on."""
    mod = make_mod(tmp_path / "mods")
    old, new = make_site(tmp_path / "old"), make_site(tmp_path / "new", version="0.20.0")
    site = realtree.copy_tree(old, tmp_path / "site")
    assert run_sh(mod, site, tmp_path).returncode == 0
    pip_install(site, old, new)
    assert run_sh(mod, site, tmp_path, "check").returncode == 0
    out = run_sh(mod, site, tmp_path)
    assert out.returncode == 0 and "applied variant v1 to vLLM 0.20.0" in out.stdout, out.stdout
    clean(site, ["demo"])


CREATE_NEW = CREATES[len(unified(TARGET, ORIGINAL, PATCHED)):]


@pytest.mark.parametrize("patch_of", [
    lambda: unified(TARGET, ORIGINAL, PATCHED.replace("y + 1", "y + 2")) + CREATE_NEW,  # another line
    lambda: unified(TARGET, ORIGINAL, PATCHED),  # the update creates no file any more
    lambda: CREATES + "--- /dev/null\n+++ b/vllm/sparkmods_more.py\n@@ -0,0 +1 @@\n+y = 2\n",  # one more
])
def test_a_mod_updated_while_its_older_version_is_applied(tmp_path: Path, patch_of) -> None:
    site = make_site(tmp_path / "site")
    pristine = snapshot(site)
    mod = make_mod(tmp_path / "mods", patch=CREATES)
    assert run_sh(mod, site, tmp_path).returncode == 0
    applied = snapshot(site)
    (mod / "patches/v1/demo.patch").write_text(patch_of())
    sync(mod)
    for action in ("check", "apply"):
        one_error(run_sh(mod, site, tmp_path, action), 1, "earlier version of this mod", "run.sh revert")
        assert snapshot(site) == applied
    out = run_sh(mod, site, tmp_path, "revert")
    assert out.returncode == 0 and snapshot(site) == pristine, out.stdout
    out = run_sh(mod, site, tmp_path)
    assert out.returncode == 0 and "applied variant v1" in out.stdout, out.stdout
    assert "already applied" in run_sh(mod, site, tmp_path).stdout


# 11. A hand edit of a patched file is said, not "already applied".

@pytest.mark.parametrize("stamped", [True, False])
@pytest.mark.parametrize("edit", [
    lambda text: text + "# a local edit\n",          # outside the mod's hunk
    lambda text: text.replace("import torch", "import torch  # edited"),
])
def test_check_after_a_hand_edit_says_so(tmp_path: Path, edit, stamped: bool) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    assert run_sh(mod, site, tmp_path).returncode == 0
    if not stamped:
        (site / STATE_DIR / "demo" / "stamp").unlink()
    (site / TARGET).write_text(edit(PATCHED))
    edited = snapshot(site)
    for action in ("check", "apply"):
        line = one_error(run_sh(mod, site, tmp_path, action), 1, TARGET, "changed since this mod was applied")
        assert "already applied" not in line
    assert snapshot(site) == edited
    (site / TARGET).write_text(PATCHED)  # the edit undone: applied again
    assert "already applied" in run_sh(mod, site, tmp_path, "check").stdout


# 11. The chat-template mod's revert removes the template it installed into the workspace.

def test_chat_template_revert_removes_its_template(tmp_path: Path) -> None:
    mod = REPO_MOD["chat-template"]
    site = make_site(tmp_path / "site", version="0.23.0")
    ws = tmp_path / "ws"
    ws.mkdir()
    name = "qwen3.5-sparkmods.jinja"
    assert run_sh(mod, site, ws).returncode == 0 and (ws / name).is_file()
    dry = run_sh(mod, site, ws, "revert", "--dry-run")
    assert dry.returncode == 0 and f"would remove {name}" in dry.stdout and (ws / name).is_file(), dry.stdout
    out = run_sh(mod, site, ws, "revert")
    assert out.returncode == 0 and f"removed {name} from {ws}" in out.stdout, out.stdout
    assert not (ws / name).exists() and list(ws.iterdir()) == []
    assert run_sh(mod, site, ws, "revert").returncode == 0  # nothing left: still fine
    assert run_sh(mod, site, ws).returncode == 0 and (ws / name).is_file()
    (ws / name).write_text((ws / name).read_text() + "{# my edit #}\n")
    out = run_sh(mod, site, ws, "revert")
    assert out.returncode == 0 and f"kept {name}" in out.stdout and (ws / name).is_file(), out.stdout


def test_revert_removes_the_workspace_install_with_the_vllm_files(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_template_mod(tmp_path / "mods")
    assert run_sh(mod, site, tmp_path).returncode == 0 and (tmp_path / "t.jinja").exists()
    out = run_sh(mod, site, tmp_path, "revert")
    assert out.returncode == 0 and "removed t.jinja" in out.stdout and not (tmp_path / "t.jinja").exists()
    assert (site / TARGET).read_text() == ORIGINAL


# 4. Output that fails after the change: the change stands and the exit code says so.

@pytest.mark.parametrize("shell", ["{run} >&-", "{run} | head -c0", "{run} | (exec 0<&-; sleep 0.2)",
                                   "{run} >/dev/full"])
def test_output_failing_after_the_change_is_not_a_failure(tmp_path: Path, shell: str) -> None:
    site = make_site(tmp_path / "site")
    mod = make_template_mod(tmp_path / "mods")
    for args, state in (((), PATCHED), ((), PATCHED), (("check",), PATCHED), (("revert",), ORIGINAL),
                        (("revert",), ORIGINAL)):
        out = run_sh(mod, site, tmp_path, *args, shell=shell)
        assert out.stderr.strip().splitlines()[-1] == "rc=0" and "Traceback" not in out.stderr, out.stderr
        assert (site / TARGET).read_text() == state
    assert not (tmp_path / "t.jinja").exists()
    clean(site, [])


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "PYTHONUTF8": "0",
                                                                 "PYTHONIOENCODING": "ascii:strict"}])
def test_an_ascii_only_output_with_non_ascii_paths(tmp_path: Path, env: Dict[str, str]) -> None:
    site = make_site(tmp_path / "sité")
    mod = make_template_mod(tmp_path / "mods")
    ws = tmp_path / "wörk"
    ws.mkdir()
    for args, says in (((), "applied variant v1"), ((), "already applied"), (("check",), "already applied"),
                       (("revert",), "reverted")):
        out = run_sh(mod, site, ws, *args, env=env)
        assert out.returncode == 0 and says in out.stdout and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert (site / TARGET).read_text() == ORIGINAL


# 4. A folder, a FIFO or a file where the mod creates a file or a folder: refused in one line.

def _empty_folder(site: Path) -> None:
    (site / NEW).mkdir()


def _fifo(site: Path) -> None:
    os.mkfifo(site / NEW)


def _folder_as_target(site: Path) -> None:
    (site / TARGET).unlink()
    (site / TARGET).mkdir()


@pytest.mark.parametrize("make_odd,word", [(_empty_folder, "folder"), (_fifo, "FIFO"), (_folder_as_target, "folder")])
def test_a_folder_or_fifo_where_the_mod_writes_is_refused_and_nothing_sticks(tmp_path: Path, make_odd, word) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods", patch=CREATES)
    other = make_mod(tmp_path / "mods", name="other", patch=unified("vllm/o.py", "", "o = 1\n").replace(
        "--- a/vllm/o.py", "--- /dev/null"))
    make_odd(site)
    before = tree(site)
    for action in ("check", "apply", "apply"):
        one_error(run_sh(mod, site, tmp_path, action), 2, word, "nothing was changed")
    assert tree(site) == before and not (site / STATE_DIR).exists()
    assert run_sh(other, site, tmp_path).returncode == 0  # another mod is not stuck
    odd = site / (TARGET if make_odd is _folder_as_target else NEW)
    (odd.rmdir() if odd.is_dir() else odd.unlink())
    if make_odd is _folder_as_target:
        odd.write_text(ORIGINAL)
    assert run_sh(mod, site, tmp_path).returncode == 0 and (site / NEW).read_text() == NEW_BODY
    clean(site, ["demo", "other"])


def test_a_file_where_the_mod_needs_a_folder_is_refused(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods", patch="--- /dev/null\n+++ b/vllm/pkg/new.py\n@@ -0,0 +1 @@\n+x = 1\n")
    (site / "vllm/pkg").write_text("not a folder\n")
    one_error(run_sh(mod, site, tmp_path), 2, "vllm/pkg", "not a folder")


# 6. State another user could have written: never trusted; created safe whatever the umask.

def test_umask_000_creates_no_writable_state(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods", patch=CREATES + "--- /dev/null\n+++ b/vllm/newpkg/x.py\n@@ -0,0 +1 @@\n+x = 1\n")
    for args in ((), (), ("revert",), ()):
        out = run_sh(mod, site, tmp_path, *args, shell="umask 000; {run}")
        assert out.returncode == 0, out.stdout + out.stderr
    found = [site / STATE_DIR, *(site / STATE_DIR).rglob("*"), site / "vllm/newpkg"]
    assert (site / STATE_DIR / "demo" / "stamp").exists()
    loose = {str(p): oct(p.lstat().st_mode) for p in found if p.lstat().st_mode & 0o022}
    assert loose == {}


def plant_journal(site: Path, entries: List[dict], op: str = "revert", mod: str = "demo",
                  files: Optional[Dict[str, bytes]] = None) -> None:
    state = site / STATE_DIR
    state.mkdir(exist_ok=True)
    for rel, data in (files or {}).items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    doc = {"op": op, "mod": mod, "direction": "forward", "state": None,
           "entries": [{"mode": 0o644, "new": None, "old": None, "before": None, "after": None, **e} for e in entries]}
    (state / JOURNAL_NAME).write_bytes(dump_json(doc))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


EVIL = b"import os; os.system('id')\n"


@pytest.mark.parametrize("spoil", ["world", "group", "owner"])
def test_a_journal_another_user_could_have_planted_is_refused(tmp_path: Path, spoil: str) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    orig = f"{STATE_DIR}/demo/orig/{TARGET}"
    plant_journal(site, [{"path": TARGET, "before": sha(ORIGINAL.encode()), "after": sha(EVIL), "new": orig,
                          "old": f"{STATE_DIR}/demo/applied/{TARGET}"}], files={orig: EVIL})
    victim = {"world": site / STATE_DIR, "group": site / STATE_DIR / JOURNAL_NAME, "owner": site / STATE_DIR / "demo"}
    if spoil == "owner":
        os.chown(victim[spoil], 65534, 65534)
    else:
        victim[spoil].chmod(0o777 if spoil == "world" else 0o664)
    before = snapshot(site)
    for action in ("check", "apply", "revert"):
        one_error(run_sh(mod, site, tmp_path, action), 1, str(victim[spoil]), "another user")
    assert snapshot(site) == before and (site / TARGET).read_text() == ORIGINAL


@pytest.mark.parametrize("entry", [
    {"path": "evil.pth", "after": sha(EVIL), "new": f"{STATE_DIR}/demo/orig/evil.pth"},
    {"path": "vllm/../evil.py", "after": sha(EVIL), "new": f"{STATE_DIR}/demo/orig/evil.py"},
    {"path": "othe_pkg/x.py", "after": sha(EVIL), "new": f"{STATE_DIR}/demo/orig/othe_pkg/x.py"},
    {"path": "vllm/x.pth", "after": sha(EVIL), "new": f"{STATE_DIR}/demo/orig/vllm/x.pth"},
    {"path": "vllm/evil.py", "after": sha(EVIL), "new": "vllm/__init__.py"},          # bytes from elsewhere
    {"path": "vllm/evil.py", "after": sha(EVIL), "new": f"{STATE_DIR}/other/orig/vllm/evil.py"},
    {"path": "vllm/evil.py", "after": sha(EVIL), "new": f"{STATE_DIR}/demo/orig/vllm/evil.py", "mode": "0755"},
])
def test_a_journal_naming_paths_outside_the_mod_s_own_is_refused(tmp_path: Path, entry: dict) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    plant_journal(site, [entry], files={entry["new"]: EVIL} if entry["new"].startswith(STATE_DIR) else {})
    before = snapshot(site)
    one_error(run_sh(mod, site, tmp_path, "check"), 1, "journal")
    assert snapshot(site) == before and not (site / "evil.pth").exists() and not (site / "vllm/evil.py").exists()


def test_a_replayed_journal_never_widens_a_file_s_mode(tmp_path: Path) -> None:
    """An interrupted revert whose journal asks for setuid and world-writable bits: the file
    gets the mode it had."""
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    assert run_sh(mod, site, tmp_path).returncode == 0
    (site / TARGET).chmod(0o640)
    plant_journal(site, [{"path": TARGET, "before": sha(PATCHED.encode()), "after": sha(ORIGINAL.encode()),
                          "new": f"{STATE_DIR}/demo/orig/{TARGET}", "old": f"{STATE_DIR}/demo/applied/{TARGET}",
                          "mode": 0o6777}], files={f"{STATE_DIR}/demo/applied/{TARGET}": PATCHED.encode()})
    out = run_sh(mod, site, tmp_path, "check")
    assert "found an interrupted revert of demo: finished it" in out.stdout, out.stdout + out.stderr
    assert (site / TARGET).read_text() == ORIGINAL and stat.S_IMODE((site / TARGET).stat().st_mode) == 0o640


@pytest.mark.parametrize("files", [
    {"evil.pth": {"before": None, "after": None}},
    {"vllm/../x.py": {"before": None, "after": None}},
    {TARGET: {"before": "not a sha", "after": None}},
])
def test_a_saved_state_naming_paths_outside_vllm_is_refused(tmp_path: Path, files: dict) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    assert run_sh(mod, site, tmp_path).returncode == 0
    state = site / STATE_DIR / "demo" / "state.json"
    doc = json.loads(state.read_text())
    doc["files"].update(files)
    state.write_text(json.dumps(doc))
    before = snapshot(site)
    one_error(run_sh(mod, site, tmp_path, "revert"), 1, str(state))
    assert snapshot(site) == before


def test_a_state_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_mod(tmp_path / "mods")
    (tmp_path / "elsewhere").mkdir()
    (site / STATE_DIR).symlink_to(tmp_path / "elsewhere")
    one_error(run_sh(mod, site, tmp_path), 1, str(site / STATE_DIR), "symbolic link")
    assert list((tmp_path / "elsewhere").iterdir()) == [] and (site / TARGET).read_text() == ORIGINAL


def test_a_new_version_label_over_untouched_files_is_still_applied(tmp_path: Path) -> None:
    """Only the reported version changed (a source build reinstalled at another commit with the
    same files): the mod is on as it was, and a revert restores every file."""
    site = make_site(tmp_path / "site", version="0.19.1.dev5+g1a2b3c4")
    pristine = snapshot(site)
    mod = make_mod(tmp_path / "mods", patch=CREATES, vllm=">=0.19.0,<0.19.1", verified='["0.19.0"]')
    assert run_sh(mod, site, tmp_path).returncode == 0
    dist = next(site.glob("vllm-*.dist-info"))
    meta = (dist / "METADATA").read_text().replace("dev5+g1a2b3c4", "dev6+g5d6e7f8")
    shutil.rmtree(dist)
    write = site / "vllm-0.19.1.dev6+g5d6e7f8.dist-info"
    write.mkdir()
    (write / "METADATA").write_text(meta)
    out = run_sh(mod, site, tmp_path, "check")
    assert out.returncode == 0 and "already applied" in out.stdout, out.stdout
    out = run_sh(mod, site, tmp_path, "revert")
    assert out.returncode == 0 and f"restored {TARGET}" in out.stdout and f"removed {NEW}" in out.stdout, out.stdout
    assert {k: v for k, v in snapshot(site).items() if "dist-info" not in k} == \
        {k: v for k, v in pristine.items() if "dist-info" not in k}


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder other users can reach (pytest's tmp_path is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="sparkmods-shared-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base)


def test_state_written_by_root_or_the_tree_s_owner_is_trusted_by_another_user(shared_dir: Path) -> None:
    """vLLM installed by uid 65534, applied once with sudo (state owned by root): that user's
    own check trusts it; state of a third user is refused."""
    base = shared_dir
    site = make_site(base / "site")
    mod = make_mod(base / "mods")
    assert run_sh(mod, site, base).returncode == 0
    for path in [site, *site.rglob("*")]:
        if STATE_DIR not in path.relative_to(site).parts:
            os.chown(path, 65534, 65534)
    as_user = "setpriv --reuid=65534 --regid=65534 --clear-groups {run}"
    env = {"SPARKMODS_PYTHON": "/usr/bin/python3", "SPARKMODS_LOCK_TIMEOUT": "5"}  # the full path
    out = run_sh(mod, site, base, "check", env=env, shell=as_user)
    assert "already applied" in out.stdout and out.stderr.strip().endswith("rc=0"), out.stdout + out.stderr
    os.chown(site / STATE_DIR / "demo" / "state.json", 12345, 12345)
    out = run_sh(mod, site, base, "check", env=env, shell=as_user)
    assert "owned by uid 12345" in out.stdout and out.stderr.strip().endswith("rc=1"), out.stdout + out.stderr


def test_a_workspace_install_failing_after_vllm_was_patched_says_what_was_done(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    mod = make_template_mod(tmp_path / "mods")
    (tmp_path / "ws").write_text("a file, not a folder")
    out = run_sh(mod, site, tmp_path, env={"WORKSPACE_DIR": str(tmp_path / "ws")})
    assert out.returncode == 1 and "rolled back" not in out.stdout and "nothing was changed" not in out.stdout
    assert "applied variant v1" in out.stdout and "t.jinja" in out.stdout.splitlines()[-1], out.stdout
    assert (site / TARGET).read_text() == PATCHED
