"""What a community run.sh does, read without running it: its patch steps and its blockers.

The launcher runs `cd /workspace/mods/<name> && ./run.sh` as root in the container, with vLLM
in site-packages. Walking the script's syntax tree (shell.py) with that start, this module
follows variables (`${X:-default}`, arrays, the usual `$(dirname "$0")` and
`$(python3 -c "...site...")` look-ups), `cd`, loops over literal words or globs, and
functions, and records each `patch` / `git apply` that changes files: which diff, -p, -R,
`-d`/`--directory`, `--include`/`--exclude`, and whether run.sh goes on when it fails
(`|| echo skipping`, a dry run guarding it with a harmless `else`, no `set -e`). Everything
else that changes files (Python or sed edits, downloads, copies, other scripts, patches to
packages other than vLLM) is a blocker: the mod cannot be judged, and the line says why.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from sparkmods.community.shell import (
    AndOr,
    Func,
    Group,
    If,
    Loop,
    Node,
    Opaque,
    Script,
    ShellError,
    Simple,
    parse_script,
    sub_pattern,
)
from sparkmods.runtime.engine import PACKAGE
from sparkmods.runtime.udiff import FilePatch, PatchParseError, parse_patch, reverse

__all__ = ["Blocker", "PatchStep", "CommunityMod", "read_mod", "is_community_mod", "MOD", "SITE"]

MOD, SITE, WORKSPACE = "<mod>", "<site>", "<workspace>"  # roots of the paths run.sh names
RUN_SH = "run.sh"
_PY_WRITES = re.compile(r"\.write\(|write_text|write_bytes|open\([^)]*['\"][wa]\+?b?['\"]|shutil\.(copy|move)|"
                        r"os\.(replace|rename|remove|unlink)|subprocess|os\.system")
_SITE_MARKS = ("site-packages", "dist-packages")
_SETUP = {"pip", "pip3", "uv", "apt", "apt-get", "conda", "mamba", "dnf", "yum", "apk", "ldconfig", "sysctl"}
_COPIES = {"cp", "mv", "install", "rsync", "ln", "tar", "unzip", "dd", "tee"}
_DOWNLOADS = {"curl", "wget"}
_SCRIPTS = {"bash", "sh", "source", ".", "zsh"}
_PYTHONS = re.compile(r"^python(3(\.\d+)?)?$")


@dataclass(frozen=True)
class Blocker:
    """A run.sh line that changes files by means no patch check can judge."""

    kind: str  # python, sed, download, other-package, copies, script, unresolved, loop, setup, unreadable, tool
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"run.sh line {self.line}: {self.why}: {self.text}" if self.line else f"run.sh {self.why}"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "line": self.line, "text": self.text, "why": self.why}


@dataclass
class PatchStep:
    """One `patch` or `git apply` that changes vLLM, as run.sh runs it."""

    tool: str  # "patch" or "git apply"
    source: str  # the diff's file name in the mod (or "here-document")
    line: int
    text: str
    strip: int
    reverse: bool
    patches: List[FilePatch]  # paths already turned into vllm/... package paths, reversed if -R
    excluded: List[str] = field(default_factory=list)  # paths git apply --exclude/--include leaves out
    tolerated: str = ""  # why run.sh goes on when it fails ("" = run.sh stops)
    guarded: bool = False  # a dry run decides first: nothing is written when it fails
    batch: bool = False  # GNU patch -t: a patch that looks applied is reversed instead

    def to_dict(self) -> dict:
        return {"tool": self.tool, "file": self.source, "line": self.line, "strip": self.strip,
                "reverse": self.reverse, "paths": sorted({fp.path for fp in self.patches}),
                "excluded": self.excluded, "tolerated": self.tolerated or None, "guarded": self.guarded}


@dataclass
class CommunityMod:
    name: str
    path: Path
    steps: List[PatchStep]
    blockers: List[Blocker]
    setup: List[Blocker]  # container set-up seen (pip, apt, ...): the mod's own business

    @property
    def checkable(self) -> bool:
        return not self.blockers and bool(self.steps)

    def why_not(self) -> str:
        """One line: why the mod cannot be judged ("" when it can)."""
        if self.blockers:
            more = f" (+{len(self.blockers) - 1} more)" if len(self.blockers) > 1 else ""
            return str(self.blockers[0]) + more
        if not self.steps:
            if self.setup:
                return f"nothing to check: it sets up the container ({self.setup[0]})"
            return "nothing to check: run.sh applies no patch to vLLM"
        return ""


def is_community_mod(path: Path) -> bool:
    """A folder with a run.sh and no mod.toml."""
    return (path / RUN_SH).is_file() and not (path / "mod.toml").exists()


Value = Union[str, List[str], None]  # None: not known statically


class _Walker:
    def __init__(self, mod_dir: Path, script: Script) -> None:
        self.mod_dir, self.script = mod_dir, script
        self.vars: Dict[str, Value] = {"0": f"{MOD}/{RUN_SH}", "BASH_SOURCE": f"{MOD}/{RUN_SH}",
                                       "WORKSPACE_DIR": WORKSPACE, "PWD": MOD}
        self.cwd: Optional[str] = MOD
        self.errexit = False
        self.funcs: Dict[str, Func] = {}
        self.steps: List[PatchStep] = []
        self.blockers: List[Blocker] = []
        self.setup: List[Blocker] = []
        self.depth = 0
        self.final: Optional[Node] = script.body[-1] if script.body else None

    def block(self, node: Simple, kind: str, why: str) -> None:
        self.blockers.append(Blocker(kind, node.line, node.text, why))

    # -- expansion -----------------------------------------------------------------------------
    def expand(self, word: str) -> Value:
        """The word's value; None when it depends on what only run time knows."""
        whole = re.fullmatch(r'\$\{?([A-Za-z_][A-Za-z0-9_]*)\[@\]\}?', word)
        if whole:
            return self.vars.get(whole.group(1))
        unknown = False

        def var(match: "re.Match[str]") -> str:
            nonlocal unknown
            name, op, default = match.group(1) or match.group(4), match.group(2), match.group(3)
            value = self.vars.get(name.split("[")[0])
            if isinstance(value, list):
                value = value[0] if value else ""
            if value is None and op is not None:
                value = self.expand(default or "")
            if value is None or isinstance(value, list):
                unknown = True
                return ""
            return value

        def sub(match: "re.Match[str]") -> str:
            nonlocal unknown
            value = self.substitution(self.script.subs[int(match.group(1))])
            if value is None:
                unknown = True
                return ""
            return value

        text = sub_pattern().sub(sub, word)
        text = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*(?:\[[^\]]*\])?)(?:(:?[-=])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*|\d)",
                      var, text)
        return None if unknown else text

    def substitution(self, inner: str) -> Optional[str]:
        """The few command substitutions mod scripts use to find their folder or vLLM."""
        if "dirname" in inner and ("BASH_SOURCE" in inner or "$0" in inner):
            return MOD
        if re.search(r"\bpython3?\b", inner) and "vllm" in inner and "__file__" in inner:
            return f"{SITE}/{PACKAGE}" if "dirname" in inner else f"{SITE}/{PACKAGE}/__init__.py"
        if re.search(r"\bpython3?\b", inner) and re.search(r"getsitepackages|purelib|platlib", inner):
            return SITE
        match = re.fullmatch(r'\s*dirname\s+(\S+)\s*', inner)
        if match:
            value = self.expand(match.group(1).strip('"'))
            return posixpath.dirname(value) if isinstance(value, str) else None
        if inner.strip() == "pwd":
            return self.cwd
        return None

    def words(self, node: Simple) -> Optional[List[str]]:
        out: List[str] = []
        for word in node.words:
            value = self.expand(word)
            if value is None:
                return None
            out.extend(value if isinstance(value, list) else [value])
        return out

    def path(self, value: str, base: Optional[str] = None) -> Optional[str]:
        """An absolute form of a path run.sh names (relative ones from `base`, else the cwd)."""
        container = f"/workspace/mods/{self.mod_dir.name}"  # where the launcher copies the mod
        if value == container or value.startswith(container + "/"):
            value = MOD + value[len(container):]
        if value.startswith(("/", "<")):
            return posixpath.normpath(value) if value.startswith("/") else value
        start = base if base is not None else self.cwd
        return None if start is None else posixpath.normpath(posixpath.join(start, value))

    # -- walking -------------------------------------------------------------------------------
    def run(self, body: Sequence[Node], tolerated: str = "") -> None:
        for node in body:
            # without `set -e` a failure stops nothing, unless it is run.sh's last command
            why = tolerated or ("" if self.errexit or node is self.final else "run.sh has no `set -e`")
            self.node(node, why)

    def node(self, node: Node, tolerated: str) -> None:
        if isinstance(node, Simple):
            self.simple(node, tolerated)
        elif isinstance(node, AndOr):
            self.andor(node, tolerated)
        elif isinstance(node, If):
            self.if_(node, tolerated)
        elif isinstance(node, Loop):
            self.loop(node, tolerated)
        elif isinstance(node, Group):
            self.run(node.body, tolerated)
        elif isinstance(node, Func):
            self.funcs[node.name] = node
        elif isinstance(node, Opaque) and re.search(r"\bpatch\b|git apply", node.text):
            self.blockers.append(Blocker("loop", node.line, node.text[:80], f"patches inside a `{node.kind}`"))

    def andor(self, node: AndOr, tolerated: str) -> None:
        for i, part in enumerate(node.parts):
            if i == len(node.parts) - 1:
                why = tolerated or ("`!` in front" if node.negated[i] else "")
            elif node.ops[i] == "||":
                rescue = node.parts[i + 1]
                why = "" if _exits_nonzero(rescue) else f"`|| {_text(rescue)}`"
            else:
                why = "a failure before `&&` does not stop run.sh"
            self.node(part, why)

    def if_(self, node: If, tolerated: str) -> None:
        for i, (cond, body) in enumerate(node.branches):
            guard = _dry_run(cond)
            self.run(cond, "a failure in an `if` condition does not stop run.sh")
            rest = [b for c, b in node.branches if b is not body] + [node.orelse]
            fallback = "" if any(_exits_nonzero_all(b) for b in rest) else "its dry run failing skips it"
            before = len(self.steps)
            self.run(body, tolerated)
            for step in self.steps[before:]:
                if guard is not None and guard == _signature(step):
                    step.guarded = True
                    step.tolerated = step.tolerated or fallback
            self.undecided(node.branches[:i], before)
        before = len(self.steps)
        self.run(node.orelse, tolerated)
        self.undecided(node.branches, before)

    def undecided(self, earlier: Sequence[Tuple[List[Node], List[Node]]], before: int) -> None:
        """A blocker when the patch steps from `before` on run only if an earlier branch's
        condition, one no reading can decide (a function, grep, a file test), was false and that
        branch goes on quietly: whether run.sh patches or skips depends on vLLM's content."""
        if len(self.steps) == before:
            return
        for cond, body in earlier:
            opaque = _opaque_condition(cond)
            if opaque is not None and not _exits_nonzero_all(body):
                self.blockers.append(Blocker("unresolved", opaque.line, opaque.text,
                                             "patches only when this `if` condition is false, which only "
                                             "running it can tell"))
                return

    def loop(self, node: Loop, tolerated: str) -> None:
        items: Optional[List[str]] = None
        if node.items is not None:
            items = []
            for word in node.items:
                value = self.expand(word)
                if value is None:
                    items = None
                    break
                if isinstance(value, str) and any(c in value for c in "*?["):
                    value = self.glob(value)
                items.extend(value if isinstance(value, list) else ([value] if value is not None else []))
        if items is None:
            before = (len(self.steps), len(self.blockers))
            saved = self.vars.get(node.var)
            self.vars[node.var] = None
            self.run(node.body, tolerated)
            self.vars[node.var] = saved
            if len(self.steps) > before[0] or len(self.blockers) > before[1]:
                del self.steps[before[0]:]
                self.blockers.append(Blocker("loop", node.line, node.text, "patches in a loop over values known only at run time"))
            return
        for item in items:
            self.vars[node.var] = item
            self.run(node.body, tolerated)

    def glob(self, pattern: str) -> Optional[List[str]]:
        """A glob in the mod folder, sorted as bash sorts it (C locale)."""
        absolute = self.path(pattern)
        if absolute is None or not absolute.startswith(MOD + "/"):
            return None
        rel = absolute[len(MOD) + 1:]
        found = sorted(p.relative_to(self.mod_dir).as_posix() for p in self.mod_dir.rglob("*")
                       if fnmatch.fnmatchcase(p.relative_to(self.mod_dir).as_posix(), rel))
        return [f"{MOD}/{f}" for f in found] or [absolute]

    def simple(self, node: Simple, tolerated: str) -> None:
        if node.assign is not None:
            name, items = node.assign
            values = [self.expand(w) for w in items]
            known = [v for v in values if isinstance(v, str)]
            self.vars[name] = known if len(known) == len(values) else None  # a list or an unknown word: not known
            return
        if node.words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", node.words[0], re.S):
            for word in node.words:
                if "=" in word and re.match(r"[A-Za-z_]", word):
                    name, _, value = word.partition("=")
                    self.vars[name] = self.expand(value)
            return
        words = self.words(node)
        head = node.words[0] if node.words else ""
        if head in ("export", "local", "readonly", "declare"):
            for word in node.words[1:]:
                if "=" in word:
                    name, _, value = word.partition("=")
                    self.vars[name] = self.expand(value)
            return
        if head in self.funcs and self.depth < 8:
            self.depth += 1
            self.run(self.funcs[head].body, tolerated)
            self.depth -= 1
            return
        self.command(node, words, tolerated)

    def command(self, node: Simple, words: Optional[List[str]], tolerated: str) -> None:
        head = node.words[0] if node.words else ""
        if head == "set" and words:
            for flag in words[1:]:
                if re.fullmatch(r"-[a-zA-Z]*e[a-zA-Z]*", flag) or flag == "errexit":
                    self.errexit = True
                elif re.fullmatch(r"\+[a-zA-Z]*e[a-zA-Z]*", flag):
                    self.errexit = False
            return
        if head in ("cd", "pushd"):
            target = words[1] if words and len(words) > 1 else None
            self.vars["OLDPWD"] = self.cwd
            self.cwd = self.path(target) if target else None
            return
        if head == "patch" or (head == "git" and "apply" in node.words[1:3]):
            self.patch_command(node, words, tolerated)
            return
        if head == "git" and len(node.words) > 1 and node.words[1] in ("clone", "fetch", "pull", "am", "cherry-pick"):
            self.block(node, "download", f"runs `git {node.words[1]}` at run time")
        elif _PYTHONS.match(head):
            self.python(node, words)
        elif head in ("sed", "perl") and any(w.startswith("-i") or w == "--in-place" or w.startswith("-pi")
                                             for w in node.words[1:]):
            self.block(node, "sed", f"edits files with {head} -i")
        elif head in _DOWNLOADS:
            self.block(node, "download", "downloads at run time")
        elif head in _COPIES:
            self.block(node, "copies", f"copies files ({head})")
        elif head in _SCRIPTS or head.startswith("./"):
            self.block(node, "script", "runs another script")
        elif head in _SETUP:
            self.setup.append(Blocker("setup", node.line, node.text, f"container set-up ({head})"))
        for op, target in node.redirects:
            value = self.expand(target)
            if op in (">", ">>", ">|") and isinstance(value, str) and _in_site(self.path(value) or ""):
                self.block(node, "copies", "writes a file into site-packages with a shell redirection")

    def python(self, node: Simple, words: Optional[List[str]]) -> None:
        args = words or node.words
        if "-m" in args and any(a in ("pip", "ensurepip") for a in args):
            self.setup.append(Blocker("setup", node.line, node.text, "container set-up (pip)"))
            return
        code = node.heredoc or ""
        if "-c" in args and args.index("-c") + 1 < len(args):
            code = args[args.index("-c") + 1]
        elif not code:
            script = next((a for a in args[1:] if not a.startswith("-")), None)
            path = self.path(script) if script else None
            if path is None or not path.startswith(MOD + "/"):
                self.block(node, "python", "runs a Python script this check cannot read")
                return
            local = self.mod_dir / path[len(MOD) + 1:]
            code = local.read_text(errors="replace") if local.is_file() else ""
            if not local.is_file():
                self.block(node, "python", f"runs {script}, which is not in the mod")
                return
        if _PY_WRITES.search(code):
            self.block(node, "python", "edits files with Python")

    # -- patch and git apply -------------------------------------------------------------------
    def patch_command(self, node: Simple, words: Optional[List[str]], tolerated: str) -> None:
        if words is None:
            self.block(node, "unresolved", "names its diff or folder through a value known only at run time")
            return
        try:
            opts = _gnu_patch(words) if words[0] == "patch" else _git_apply(words)
        except ValueError as exc:
            self.block(node, "tool", str(exc))
            return
        if opts.dry_run:
            return  # a guard: judged with the step it guards
        texts = self.inputs(node, opts)
        if texts is None:
            return
        base = self.path(opts.chdir) if opts.chdir else self.cwd
        if base is None:
            self.block(node, "unresolved", "applies in a folder known only at run time")
            return
        for name, text in texts:
            self.step(node, opts, base, name, text, tolerated)

    def inputs(self, node: Simple, opts: "_Options") -> Optional[List[Tuple[str, str]]]:
        """(name, text) of each diff the command reads: files, a redirect, a here-document."""
        names = list(opts.files)
        if not names:
            redirect = next((t for op, t in node.redirects if op == "<"), None)
            if node.heredoc is not None:
                return [("here-document", node.heredoc)]
            upstream = node.pipe_from
            if redirect is None and isinstance(upstream, Simple) and upstream.words[:1] == ["cat"]:
                names = upstream.words[1:]
            elif redirect is None:
                why = "downloads the diff at run time" if isinstance(upstream, Simple) and \
                    upstream.words[:1] and upstream.words[0] in _DOWNLOADS else "reads its diff from a pipe"
                self.block(node, "download" if "downloads" in why else "unresolved", why)
                return None
            else:
                names = [redirect]
            relative_to = self.cwd
        else:
            relative_to = self.path(opts.chdir) if opts.chdir and opts.tool == "patch" else self.cwd
        out = []
        for name in names:
            value = self.expand(name)
            where = self.path(value, relative_to) if isinstance(value, str) else None
            if where is None or not where.startswith(MOD + "/"):
                self.block(node, "unresolved", f"reads {name}, which is not a file of the mod")
                return None
            local = self.mod_dir / where[len(MOD) + 1:]
            if not local.is_file():
                self.block(node, "unresolved", f"reads {name}, which the mod does not have")
                return None
            out.append((local.relative_to(self.mod_dir).as_posix(), local.read_text(encoding="utf-8", errors="replace")))
        return out

    def step(self, node: Simple, opts: "_Options", base: str, name: str, text: str, tolerated: str) -> None:
        try:
            parsed = parse_patch(text, strip=opts.strip)
        except PatchParseError as exc:
            self.block(node, "unreadable", f"{name} at -p{opts.strip}: {exc}")
            return
        kept, excluded = [], []
        for fp in parsed:
            named = posixpath.join(opts.directory, fp.path) if opts.directory else fp.path
            if not opts.keeps(named):  # git matches --include/--exclude after --directory
                excluded.append(named)
                continue
            full = self.path(named, base)
            package, other = _package_path(full or "")
            if package is None:
                self.block(node, "other-package", f"{name} patches {other}, not vLLM")
                return
            moved = FilePatch(package if fp.old_path is not None else None,
                              package if fp.new_path is not None else None, fp.hunks)
            kept.append(reverse(moved) if opts.reverse else moved)
        if not kept:
            self.block(node, "unresolved", f"{name}: every file is excluded")
            return
        self.steps.append(PatchStep(opts.tool, name, node.line, node.text, opts.strip, opts.reverse, kept,
                                    excluded, tolerated, batch=opts.batch))


@dataclass
class _Options:
    tool: str
    strip: int = 1
    reverse: bool = False
    dry_run: bool = False
    chdir: str = ""  # patch -d, git -C: where the command runs
    directory: str = ""  # git apply --directory: a prefix for every path
    files: List[str] = field(default_factory=list)
    rules: List[Tuple[str, bool]] = field(default_factory=list)  # git apply --include (True) / --exclude
    batch: bool = False

    def keeps(self, path: str) -> bool:
        """git apply's --include/--exclude: the first pattern that matches decides; with an
        --include and no match, the file is left out."""
        for pattern, keep in self.rules:
            if fnmatch.fnmatchcase(path, pattern):
                return keep
        return not any(keep for _, keep in self.rules)


_PATCH_FLAGS = {"-s", "--silent", "--quiet", "-u", "--unified", "-b", "--backup", "--no-backup-if-mismatch",
                "-E", "--remove-empty-files", "-f", "--force", "-N", "--forward", "-l", "--ignore-whitespace",
                "--verbose", "-e", "-n", "--normal", "-c", "--context", "-Z", "--set-utc", "-T", "--set-time"}
_PATCH_VALUES = {"-F", "--fuzz", "-r", "--reject-file", "-z", "--suffix", "-B", "--prefix", "-V", "--version-control",
                 "-Y", "--basename-prefix", "-D", "--ifdef", "-g", "--get", "--quoting-style", "--merge"}


def _gnu_patch(words: List[str]) -> _Options:
    opts = _Options("patch", strip=-1)
    rest = iter(words[1:])
    for word in rest:
        key, eq, val = word.partition("=") if word.startswith("--") else (word, "", "")
        if key in ("-p", "--strip") or (key.startswith("-p") and key[2:].isdigit()):
            opts.strip = _level(val if eq else key[2:] if key.startswith("-p") and key != "-p" else next(rest, ""))
        elif key in ("-R", "--reverse"):
            opts.reverse = True
        elif key in ("--dry-run", "--check"):
            opts.dry_run = True
        elif key in ("-d", "--directory"):
            opts.chdir = val if eq else next(rest, "")
        elif key in ("-i", "--input"):
            opts.files.append(val if eq else next(rest, ""))
        elif key in ("-t", "--batch"):
            opts.batch = True
        elif key in ("-o", "--output"):
            raise ValueError("GNU patch -o writes elsewhere: not checkable")
        elif key in _PATCH_FLAGS:
            continue
        elif key in _PATCH_VALUES and not eq:
            next(rest, "")
        elif key in _PATCH_VALUES:
            continue
        elif re.fullmatch(r"-[A-Za-z]+", key) and all(f"-{c}" in _PATCH_FLAGS | {"-R", "-t"} for c in key[1:]):
            opts.reverse |= "R" in key
            opts.batch |= "t" in key
        elif key.startswith("-"):
            raise ValueError(f"patch option {word} is not understood by this check")
        else:
            raise ValueError("patch names the file to patch on its command line: not checkable")
    if opts.strip < 0:
        raise ValueError("patch without -p keeps only each file's base name: not checkable")
    return opts


def _git_apply(words: List[str]) -> _Options:
    opts = _Options("git apply")
    rest = iter(words[1:])
    for word in rest:
        if word == "apply":
            continue
        key, eq, val = word.partition("=") if word.startswith("--") else (word, "", "")
        if key == "-C" and not opts.files:
            opts.chdir = next(rest, "")
        elif key == "-p" or (key.startswith("-p") and key[2:].isdigit()):
            opts.strip = _level(key[2:] if key != "-p" else next(rest, ""))
        elif key in ("-R", "--reverse"):
            opts.reverse = True
        elif key in ("--check", "--stat", "--numstat", "--summary"):
            opts.dry_run = True
        elif key == "--directory":
            opts.directory = val if eq else next(rest, "")
        elif key in ("--include", "--exclude"):
            opts.rules.append((val if eq else next(rest, ""), key == "--include"))
        elif key in ("-v", "--verbose", "-q", "--quiet", "--recount", "--allow-empty", "--unidiff-zero") \
                or key.startswith("--whitespace"):
            continue
        elif key in ("--reject", "--3way", "-3", "--index", "--cached", "--ignore-whitespace", "--ignore-space-change"):
            raise ValueError(f"git apply {key} applies in a way this check does not model")
        elif key.startswith("-"):
            raise ValueError(f"git apply option {word} is not understood by this check")
        else:
            opts.files.append(word)
    return opts


def _level(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"strip level {text!r} is not a number")
    return int(text)


def _package_path(full: str) -> Tuple[Optional[str], str]:
    """(vllm/... path, "") for a file in vLLM's package; (None, what it is) otherwise."""
    rest = None
    if full.startswith(SITE + "/"):
        rest = full[len(SITE) + 1:]
    else:
        parts = full.split("/")
        marks = [i for i, p in enumerate(parts) if p in _SITE_MARKS]
        if marks:
            rest = "/".join(parts[marks[-1] + 1:])
    if rest is None:
        return None, f"{full} (outside site-packages)"
    top = rest.split("/")[0]
    return (rest, "") if top == PACKAGE and "/" in rest else (None, f"the {top} package ({rest})")


def _in_site(path: str) -> bool:
    return path.startswith(SITE) or any(f"/{m}/" in path for m in _SITE_MARKS)


def _text(node: Node) -> str:
    if isinstance(node, Simple):
        return " ".join(node.words)[:60]
    if isinstance(node, Group):
        return "{ " + "; ".join(_text(n) for n in node.body) + " }"
    return type(node).__name__.lower()


def _exits_nonzero(node: Node) -> bool:
    """Whether a command ends run.sh with a failure (`exit 1`, `false`, `return 1`)."""
    if isinstance(node, Simple):
        words = node.words
        return bool(words) and (words[0] == "false" or (words[0] in ("exit", "return") and len(words) > 1 and words[1] != "0"))
    if isinstance(node, (Group,)):
        return _exits_nonzero_all(node.body)
    if isinstance(node, AndOr):
        return _exits_nonzero(node.parts[-1]) and all(op == "&&" for op in node.ops)
    return False


def _exits_nonzero_all(body: Sequence[Node]) -> bool:
    return any(_exits_nonzero(n) for n in body)


_CONTAINER_TESTS = {"command", "type", "which", "hash", "true", "false"}  # about the image, not vLLM


def _opaque_condition(cond: Sequence[Node]) -> Optional[Simple]:
    """The first command of an `if` condition that is neither a patch's dry run nor a question
    about the container's tools (None when there is none)."""
    if _dry_run(cond) is not None:
        return None
    for node in cond:
        for part in node.parts if isinstance(node, AndOr) else [node]:
            if not isinstance(part, Simple) or not part.words or part.words[0] not in _CONTAINER_TESTS:
                return part if isinstance(part, Simple) else None
    return None


def _signature(step: PatchStep) -> Tuple[str, str]:
    return step.tool, posixpath.basename(step.source)


def _dry_run(cond: Sequence[Node]) -> Optional[Tuple[str, str]]:
    """(tool, diff name) when an `if` condition is a dry run of a patch (`patch --dry-run`,
    `git apply --check`); the step it guards has the same tool and diff."""
    for node in cond:
        simple = node.parts[-1] if isinstance(node, AndOr) and len(node.parts) == 1 else node
        if not isinstance(simple, Simple) or not simple.words:
            continue
        words = simple.words
        tool = "patch" if words[0] == "patch" else "git apply" if words[:2] == ["git", "apply"] else ""
        if tool and any(w in ("--dry-run", "--check", "-C") for w in words):
            redirect = next((t for op, t in simple.redirects if op == "<"), None)
            name = redirect or next((w for w in reversed(words) if not w.startswith("-")), "")
            return tool, posixpath.basename(name)
    return None


def read_mod(path: Path) -> CommunityMod:
    """The steps and blockers of the community mod in `path` (a folder with run.sh)."""
    text = (path / RUN_SH).read_text(encoding="utf-8", errors="replace")
    try:
        script = parse_script(text)
    except ShellError as exc:
        return CommunityMod(path.name, path, [], [Blocker("unreadable", 0, "", f"cannot be read ({exc})")], [])
    walker = _Walker(path, script)
    if text.startswith("#!") and re.search(r"\s-\w*e", text.splitlines()[0]):
        walker.errexit = True
    walker.run(script.body)
    for step in walker.steps:
        step.source = posixpath.basename(step.source) if step.source != "here-document" else step.source
    return CommunityMod(path.name, path, walker.steps, walker.blockers, walker.setup)
