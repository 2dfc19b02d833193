"""What the server log says: vLLM's start-up lines, our mods' own lines and run.sh's lines.

Line formats read (vLLM 0.19.1-0.26.0; the fixture README cites file and line):
- vLLM's logger: `[(PROCESS pid=N) ]LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE`, with ANSI colours
  when the server ran on a terminal (stripped here);
- `non-default args: {...}`: the serve flags that differ from the defaults, as a Python dict repr;
- `Using NAME attention backend out of potential backends: [...]` (automatic choice) or
  `Using AttentionBackendEnum.NAME backend.` (`--attention-backend NAME`);
- `SpecDecoding metrics: ... Accepted: N tokens, Drafted: N tokens, ...`: per logging interval;
- our mods' runtime lines, `sparkmods <mod>: ...`, from the code they patch into vLLM;
- run.sh's lines, `[<mod>] ...` (`applied variant`, `already applied`, `installed`, `not needed`,
  `ERROR: ...`): printed by the launcher when it applies the mod, so they are in a log that
  captured the launcher's output, not in `docker logs` of a container started before.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from sparkmods.errors import SparkmodsError
from sparkmods.verify.metrics import SpecCounts

DOCKER_TIMEOUT_S = 60

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ARGS = re.compile(r"non-default args: (\{.*\})\s*$")
_BACKEND = re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]*) (?:attention )?backend")
_SPEC = re.compile(r"SpecDecoding metrics: .*?Accepted: (\d+) tokens, Drafted: (\d+) tokens")
_MOD_LINE = re.compile(r"\bsparkmods ([a-z0-9][a-z0-9-]*): (.*?)\s*$")
# Flags whose values verify reads; used when the dict repr holds something literal_eval refuses.
_ARG_KEYS = ("model", "served_model_name", "max_model_len", "kv_cache_dtype", "speculative_config",
             "chat_template", "attention_backend", "block_size")


@dataclass
class LogFacts:
    """The facts of one log (the last server start where a fact appears more than once)."""

    source: str
    serve_args: Optional[Dict[str, Any]] = None
    backends: List[str] = field(default_factory=list)
    mod_lines: Dict[str, List[str]] = field(default_factory=dict)
    runsh_lines: Dict[str, List[str]] = field(default_factory=dict)
    spec: Optional[SpecCounts] = None

    def runsh(self, mod: str) -> List[str]:
        return self.runsh_lines.get(mod, [])

    def said(self, mod: str) -> List[str]:
        return self.mod_lines.get(mod, [])


def _parse_args(text: str) -> Dict[str, Any]:
    try:
        value = ast.literal_eval(text)
        if isinstance(value, dict):
            return value
    except (ValueError, SyntaxError):
        pass
    found: Dict[str, Any] = {}
    for key in _ARG_KEYS:
        match = re.search(rf"'{key}': ('(?:[^'\\]|\\.)*'|\{{[^{{}}]*\}}|[\w.+-]+)", text)
        if match:
            try:
                found[key] = ast.literal_eval(match.group(1))
            except (ValueError, SyntaxError):
                found[key] = match.group(1)
    return found


def parse(text: str, source: str, mods: Iterable[str]) -> LogFacts:
    """Read the facts out of a whole log; `mods` are the names whose `[mod]` lines count."""
    runsh = re.compile(r"\[(" + "|".join(re.escape(m) for m in mods) + r")\] (.*?)\s*$")
    facts = LogFacts(source)
    accepted = drafted = 0
    spec_seen = False
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        args = _ARGS.search(line)
        if args:
            # A new server start: what earlier starts said no longer describes the server.
            facts.serve_args = _parse_args(args.group(1))
            facts.backends, facts.mod_lines = [], {}
            accepted = drafted = 0
            spec_seen = False
            continue
        backend = _BACKEND.search(line)
        if backend:
            facts.backends.append(backend.group(1))
        spec = _SPEC.search(line)
        if spec:
            spec_seen = True
            accepted += int(spec.group(1))
            drafted += int(spec.group(2))
        said = _MOD_LINE.search(line)
        if said:
            facts.mod_lines.setdefault(said.group(1), []).append(said.group(2))
            continue
        step = runsh.search(line)
        if step:
            facts.runsh_lines.setdefault(step.group(1), []).append(step.group(2))
    if spec_seen:
        facts.spec = SpecCounts(drafts=0, draft_tokens=drafted, accepted=accepted)
    return facts


def read_file(path: str) -> str:
    try:
        return Path(path).read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise SparkmodsError(f"--log {path}: cannot read it: {exc.strerror or exc}") from None


def read_container(name: str) -> str:
    """`docker logs NAME`, stdout and stderr in one stream (vLLM logs to stdout by default)."""
    docker = shutil.which("docker")
    if docker is None:
        raise SparkmodsError(f"--container {name}: the docker command is not on PATH; save the log and pass --log FILE")
    try:
        done = subprocess.run([docker, "logs", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=DOCKER_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SparkmodsError(f"--container {name}: docker logs gave no answer in {DOCKER_TIMEOUT_S} s") from None
    text = done.stdout.decode("utf-8", errors="replace")
    if done.returncode != 0:
        first = text.strip().splitlines()[0] if text.strip() else f"exit {done.returncode}"
        raise SparkmodsError(f"--container {name}: docker logs failed: {first}")
    return text
