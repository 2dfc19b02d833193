"""Hostile recipes and hostile values for `sparkmods recipe check`, `sparkmods launch` and the
standalone script.

- A YAML alias bomb under a key the schema knows (`mods:`, `build_args:`) is one line, quickly,
  from the real commands (subprocess: no hang, no traceback); so is a recipe that is a FIFO.
- The standalone script reaches other nodes with ssh, whose remote command a login shell parses:
  it is run here through a stand-in ssh that hands that one string to `dash -c` or `bash -c` on
  this machine, with a `docker` stand-in on PATH that records the argv it receives. Values with
  newlines, quotes, `$`, backticks and spaces (serve arguments, the image, a mod's folder name)
  must arrive byte for byte.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from clirun import one_line_error, sparkmods
from sparkmods.launch.plan import STANDALONE, LaunchOptions, build_plan
from sparkmods.launch.recipe import MAX_EXPANDED, RecipeError, load_recipe
from sparkmods.launch.standalone import container_prefix, render_standalone, serve_argv


def _remote_nodes() -> "tuple[str, str]":
    """Two documentation addresses this machine does not have (the script reaches them with ssh)."""
    local = set(subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split())
    free = [ip for ip in ("198.51.100.7", "203.0.113.9", "192.0.2.77", "198.51.100.8") if ip not in local]
    return free[0], free[1]


NODES = _remote_nodes()

# Every character class a shell treats specially (a line break in a value is refused before
# any script is written: test_recipe_refusals.py).
HOSTILE = ["it's", 'say "hi"', "$HOME ${PATH} $(id) `id`", "tab\tand  two spaces ",
           "back\\slash \\n", "'", "''\\''", "*?[a]", "~root", "semi;colon|pipe&amp>x", "!bang #hash",
           "caf\u00e9 \u4e2d"]


def _bomb(key: str, depth: int = 9) -> str:
    """A recipe whose `key` holds 9**depth strings once its aliases are followed (a few lines)."""
    rows = ["  - &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    rows += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, depth)]
    return textwrap.dedent('''\
        recipe_version: "1"
        name: bomb
        container: img
        command: vllm serve m
        ''') + f"{key}:\n" + "\n".join(rows) + "\n"


@pytest.mark.parametrize("text", [_bomb("mods"), _bomb("build_args")], ids=["mods", "build_args"])
def test_an_alias_bomb_is_one_line_and_quick(tmp_path, text):
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    message = (f"{path}: (size): the YAML expands to more than {MAX_EXPANDED} values and characters with "
               f"its aliases followed (an alias bomb?); write the values out")
    done, seconds = sparkmods("recipe", "check", str(path), timeout=60)
    assert done.returncode == 1 and done.stdout.splitlines()[0] == \
        f"{path}: error: schema: {message.replace(f'{path}: ', '', 1)}"
    assert len(done.stdout) < 1000 and seconds < 20  # before: minutes and gigabytes
    done, seconds = sparkmods("launch", str(path), "--solo", "--vllm", f"dir:{tmp_path}", timeout=60)
    assert one_line_error(done) == f"sparkmods: error: {message}" and seconds < 20


def test_a_huge_value_is_shortened_in_the_message(tmp_path):
    """Under the expansion cap, a wrong type is still named, never printed whole."""
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({"recipe_version": "1", "name": "n", "container": "c",
                                    "command": "vllm serve m", "mods": "m" * 100_000}))
    with pytest.raises(RecipeError) as refused:
        load_recipe(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: mods: must be a list of non-empty strings, got 'mmm")
    assert message.endswith("...") and len(message) < len(str(path)) + 120


def test_a_recipe_that_is_a_fifo_is_refused_without_waiting(tmp_path):
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    done, seconds = sparkmods("launch", str(path), "--solo", "--vllm", f"dir:{tmp_path}", timeout=30)
    assert one_line_error(done) == (f"sparkmods: error: {path}: a FIFO, not a regular file "
                                    f"(want a run-recipe.sh v1 YAML recipe)")
    assert seconds < 20


# --- the standalone script's remote commands, through dash and bash -----------------------------

DOCKER_STAND_IN = r'''#!/bin/sh
# Records its argv (NUL-separated) and the node it ran on; answers like docker would, briefly.
n=$(cat "$RECORD/n" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" >"$RECORD/n"
printf '%s\0' "$NODE" "$@" >"$RECORD/call-$n"
case "$1 ${2:-}" in
    "run "*) cat >/dev/null; echo 0123456789ab ;;
    "exec -i") cat >/dev/null ;;
    "version "*) echo 27.0.0 ;;
esac
exit 0
'''

SSH_STAND_IN = r'''#!/bin/sh
# ssh [OPTIONS] -- HOST COMMAND: hands COMMAND, which must be ONE string as ssh sends it, to the
# shell named first, as a login shell on HOST would run it.
shell=$1
shift
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
node=$1
shift
if [ "$#" -ne 1 ]; then echo "ssh stand-in: want one remote command, got $#" >&2; exit 255; fi
NODE=$node exec "$shell" -c "$1"
'''


def _stand_ins(folder: Path) -> Path:
    folder.mkdir()
    for name, text in (("docker", DOCKER_STAND_IN), ("ssh", SSH_STAND_IN)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def _hostile_plan(tmp_path: Path):
    root = tmp_path / "repo"
    mod = root / "mods" / "it's $HOME `id` \"q\"\nmod"
    mod.mkdir(parents=True)
    (mod / "run.sh").write_text("#!/bin/sh\n")
    defaults = {f"v{i}": value for i, value in enumerate(HOSTILE)}
    command = "vllm serve /models/m " + " ".join(f"--x{i} {{v{i}}}" for i in range(len(HOSTILE)))
    recipe = root / "hostile.yaml"
    recipe.write_text(yaml.safe_dump({"recipe_version": "1", "name": "hostile", "command": command,
                                      "container": "registry/img:tag 'q' $x `y`\nz", "defaults": defaults,
                                      "mods": [str(mod.relative_to(root))]}))
    plan = build_plan(load_recipe(recipe), LaunchOptions(nodes=NODES, ray=False, form=STANDALONE), root=root)
    return plan, mod


def _calls(record: Path) -> List[List[str]]:
    count = int((record / "n").read_text())
    return [(record / f"call-{i}").read_bytes().decode().split("\0")[:-1] for i in range(1, count + 1)]


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_remote_commands_reach_a_posix_login_shell_exactly(tmp_path, shell):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} not installed (apt-get install -y {shell})")
    plan, mod = _hostile_plan(tmp_path)
    script = tmp_path / "launch.sh"
    script.write_text(render_standalone(plan, ["hostile values"]))
    record = tmp_path / "record"
    record.mkdir()
    bin_dir = _stand_ins(tmp_path / "bin")
    env: Dict[str, str] = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record),
                           "SPARKMODS_SSH": f"{bin_dir / 'ssh'} {shell}", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]

    calls = _calls(record)
    head, worker = f"{container_prefix(plan)}-0", f"{container_prefix(plan)}-1"
    argv = serve_argv(plan)
    assert argv[3:5] == ["--x0", HOSTILE[0]] and argv[-1] == HOSTILE[-1]  # the values are in there
    ranks = ["--nnodes", "2", "--master-addr", NODES[0], "--master-port", "29501"]
    assert [NODES[0], "exec", head, *argv, "--nnodes", "2", "--node-rank", "0", *ranks[2:]] in calls
    assert [NODES[1], "exec", "-d", worker, *argv, *ranks[:2], "--node-rank", "1", *ranks[2:], "--headless"] in calls
    runs = [c for c in calls if c[1] == "run"]
    assert len(runs) == 2 and all(c[-3:] == [plan.image, "sleep", "infinity"] for c in runs)
    assert {c[0] for c in runs} == set(NODES)
    for node in NODES:  # the mod's folder name, as a path and as an argument, on both nodes
        assert [node, "exec", head if node == NODES[0] else worker, "mkdir", "-p",
                f"/workspace/mods/{mod.name}"] in calls
        assert any(c[0] == node and c[-2:] == ["bash", mod.name] for c in calls)


def test_the_script_with_hostile_values_passes_shellcheck(tmp_path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck; ci/setup-docker.sh installs it)")
    plan, _ = _hostile_plan(tmp_path)
    script = tmp_path / "launch.sh"
    script.write_text(render_standalone(plan, ["hostile values"]))
    # Warnings and errors: the info-level notes (SC2016 "expressions don't expand in single
    # quotes", SC1003) are about the hostile values, which are meant literally here.
    done = subprocess.run(["shellcheck", "--severity=warning", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


# What OpenSSH prints when a node's host key changed (BatchMode: it refuses), with its CRLFs.
CHANGED_HOST_KEY = "\r\n".join([
    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@",
    "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @",
    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@",
    "IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!",
    "Someone could be eavesdropping on you right now (man-in-the-middle attack)!",
    "Host key for {node} has changed and you have requested strict checking.",
    "Host key verification failed.", ""])


def test_a_failed_ssh_login_is_one_readable_line(tmp_path):
    """ssh's banner and warnings stay out of the error; its verdict, the last line, is kept."""
    plan, _ = _hostile_plan(tmp_path)
    script = tmp_path / "launch.sh"
    script.write_text(render_standalone(plan, ["hostile values"]))
    bin_dir = _stand_ins(tmp_path / "bin")
    (bin_dir / "ssh").write_text("#!/bin/sh\nprintf '%s' \"$BANNER\" >&2\nexit 255\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(tmp_path), "HOME": str(tmp_path),
           "BANNER": CHANGED_HOST_KEY.format(node=NODES[0])}
    env.pop("SPARKMODS_SSH", None)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and not (tmp_path / "n").exists(), done.stderr  # no docker call anywhere
    assert done.stderr == (
        f"sparkmods-launch: error: cannot log in to node {NODES[0]} with ssh -o BatchMode=yes -o ConnectTimeout=10 "
        "(Host key verification failed.): the head needs key login there without a prompt and the node's host key "
        f"in known_hosts (run ssh {NODES[0]} true once by hand), or set SPARKMODS_SSH; nothing was started\n")


# --- a node whose Ray join times out (a busy machine) -------------------------------------------

# The docker stand-in above, plus: `ray start --address` fails the first FAIL_JOINS times, and the
# head's count of alive Ray nodes is 2.
RAY_DOCKER_STAND_IN = DOCKER_STAND_IN.replace('''case "$1 ${2:-}" in''', '''case "$*" in
    *"ray start --address"*)
        j=$(cat "$RECORD/joins" 2>/dev/null || echo 0)
        echo $((j + 1)) >"$RECORD/joins"
        if [ "$j" -lt "$FAIL_JOINS" ]; then exit 1; fi ;;
    *"python3 -c"*) echo 2; exit 0 ;;
esac
case "$1 ${2:-}" in''')


def _ray_launch(tmp_path: Path, fail_joins: int) -> subprocess.CompletedProcess:
    root = tmp_path / "repo"
    root.mkdir()
    recipe = root / "r.yaml"
    recipe.write_text(yaml.safe_dump({"recipe_version": "1", "name": "r", "command": "vllm serve /models/m",
                                      "container": "registry/img:tag"}))
    plan = build_plan(load_recipe(recipe), LaunchOptions(nodes=NODES, ray=True, form=STANDALONE), root=root)
    script = tmp_path / "launch.sh"
    script.write_text(render_standalone(plan, ["ray join"]))
    bin_dir = _stand_ins(tmp_path / "bin")
    (bin_dir / "docker").write_text(RAY_DOCKER_STAND_IN)
    record = tmp_path / "record"
    record.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record), "HOME": str(tmp_path),
           "SPARKMODS_SSH": f"{bin_dir / 'ssh'} bash", "FAIL_JOINS": str(fail_joins)}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


def test_a_node_whose_ray_join_fails_once_is_stopped_and_joins_again(tmp_path):
    done = _ray_launch(tmp_path, fail_joins=1)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = _calls(tmp_path / "record")
    joins = [n for n, c in enumerate(calls) if "--address" in " ".join(c)]
    stops = [n for n, c in enumerate(calls) if c[-3:] == ["ray", "stop", "--force"]]
    assert len(joins) == 2 and len(stops) == 1 and joins[0] < stops[0] < joins[1]
    assert calls[stops[0]][0] == NODES[1]  # on the node that failed, not the head
    assert f"node {NODES[1]}: joining the Ray head failed (try 1 of 3)" in done.stderr
    assert "Ray cluster formed: 2 nodes" in done.stderr


def test_a_node_that_cannot_join_ray_ends_the_launch_after_three_tries(tmp_path):
    done = _ray_launch(tmp_path, fail_joins=3)
    assert done.returncode == 1
    assert done.stderr.count("joining the Ray head failed") == 3
    assert f"error: node {NODES[1]} could not join the Ray head at {NODES[0]}:" in done.stderr
    assert "Ray cluster formed" not in done.stderr
