"""Fingerprints: sha256 digests of what decides a result, and of nothing else.

  mod      a mod's manifest (its data, as manifest.json holds it), the patches and install
           sources its variants name, and the runtime's code: what decides its matrix cells
           and check rows. The generated copies in the mod folder (run.sh, _sparkmods.py,
           manifest.json) are left out: `sparkmods sync --check` keeps them equal to tools/.
  variant  one variant's patches and install sources: what a GPU run that served it vouches for.
  patch    a loose patch file: its name, -p and bytes (check-patch rows).
  checker  the drift checks (recorded in the matrix: a change there re-checks every cell).
  code     the runtime and the other host modules that decide a row (the result cache's key).

Code is fingerprinted by what it does: its source without comments, docstrings (any statement
that is only a string literal) and blank lines, so editing a docstring changes no fingerprint
and leaves the committed matrix current. The text is read with tokenize, whose tokens for
these are the same on every Python the tools run on.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import tokenize
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

from sparkmods.errors import SparkmodsError
from sparkmods.runtime.manifest import load_manifest
from sparkmods.runtime.modcheck import mod_file
from sparkmods.sources.cache import cache_root, read_bytes, write_atomic

_HERE = Path(__file__).resolve().parent.parent  # sparkmods/
RUNTIME = _HERE / "runtime"
# The drift checks, relative to this package.
DRIFT_CODE = ("checking/drift.py", "checking/driftmemo.py", "checking/linediff.py", "pyindex/defscan.py",
              "pyindex/resolve.py")
# Host code besides the drift checks that decides a row, and the form a stored row is read back in.
DECIDING_CODE = ("checking/batch.py", "checking/fingerprints.py", "checking/resultcache.py", "checking/rows.py",
                 "patchfile.py", "pyindex/safeparse.py")

__all__ = ["DRIFT_CODE", "DECIDING_CODE", "behaviour", "mod_fingerprint", "variant_fingerprints", "patch_fingerprint",
           "runtime_fingerprint", "checker_fingerprint", "code_fingerprint"]


# Token kinds that are no part of a statement; f-string parts exist from Python 3.12 (else None).
_LAYOUT = frozenset((tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER))
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def behaviour(source: str) -> str:
    """Python source without its comments, string-only statements (docstrings) and blank lines;
    a line inside a multi-line string is kept as it is."""
    dropped: Set[int] = set()  # rows of string-only statements
    verbatim: Set[int] = set()  # rows that end inside a string
    comment_at = {}  # row -> column where its comment starts
    statement: List[tokenize.TokenInfo] = []
    opened: List[int] = []  # rows of f-strings not yet closed (Python >= 3.12 tokenizes their parts)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        kind = tok.type
        if kind == tokenize.COMMENT:
            comment_at[tok.start[0]] = tok.start[1]
        elif kind == _FSTRING_START:
            opened.append(tok.start[0])
        elif kind == _FSTRING_END:
            verbatim.update(range(opened.pop(), tok.end[0]))
        elif kind == tokenize.STRING:
            verbatim.update(range(tok.start[0], tok.end[0]))
        if kind == tokenize.NEWLINE:
            if statement and all(_plain_string(t) for t in statement):
                dropped.update(range(statement[0].start[0], statement[-1].end[0] + 1))
            statement = []
        elif kind not in _LAYOUT:
            statement.append(tok)
    kept = []
    for row, line in enumerate(source.splitlines(keepends=True), 1):
        if row in dropped:
            continue
        if row in verbatim:
            kept.append(line)
            continue
        text = line[:comment_at.get(row, len(line))].rstrip()
        if text:
            kept.append(text + "\n")
    return "".join(kept)


def _plain_string(tok: tokenize.TokenInfo) -> bool:
    """A string literal that is no f-string (an f-string statement can call code)."""
    if tok.type != tokenize.STRING:
        return False
    prefix = tok.string[:len(tok.string) - len(tok.string.lstrip("bBrRuUfF"))]
    return "f" not in prefix.lower()


def _digest(parts: Iterable[Tuple[str, bytes]]) -> str:
    """sha256 over (name, bytes) pairs, each name and the sha256 of its bytes."""
    digest = hashlib.sha256()
    for name, data in parts:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


BEHAVIOUR_CACHE = "behaviour-v1"  # <cache>/behaviour-v1/<sha256 of a module's bytes>: sha256 of its behaviour()


@functools.cache
def file_behaviour(path: Path) -> bytes:
    """sha256 of behaviour() of one module, once per process (the runtime's modules are in three
    digests) and kept on disk by the sha256 of the module's bytes: the tokenizer is most of a warm
    `sparkmods check`, and the same bytes always give the same behaviour. An entry that is not a
    digest is made again."""
    raw = path.read_bytes()
    entry = cache_root() / BEHAVIOUR_CACHE / hashlib.sha256(raw).hexdigest()
    stored = read_bytes(entry)
    if stored is not None and len(stored) == hashlib.sha256().digest_size:
        return stored
    made = hashlib.sha256(behaviour(raw.decode("utf-8")).encode()).digest()
    try:
        write_atomic(entry, made)
    except SparkmodsError:
        pass  # a cache that cannot be written costs the next run time, not correctness
    return made


def _code(paths: Iterable[Path]) -> str:
    return _digest((p.relative_to(_HERE).as_posix(), file_behaviour(p)) for p in paths)


@functools.lru_cache(maxsize=1)
def runtime_fingerprint() -> str:
    """The runtime's code (every module that _sparkmods.py holds, boot.py included)."""
    return _code(sorted(RUNTIME.glob("*.py")))


@functools.lru_cache(maxsize=1)
def checker_fingerprint() -> str:
    """The drift checks' code, recorded in the matrix beside each mod's fingerprint."""
    return _code(_HERE / rel for rel in DRIFT_CODE)


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The runtime and the other host modules that decide a row (the result cache's key)."""
    return _code(sorted(RUNTIME.glob("*.py")) + [_HERE / rel for rel in DECIDING_CODE])


def mod_fingerprint(mod_dir: Path) -> str:
    """What decides a mod's cells: its manifest data, every patch and install source its
    variants name, and the runtime's code."""
    manifest = load_manifest(mod_dir)
    files: Dict[str, str] = {}  # relative path -> what it is, for the error a file that cannot be read gets
    for v in manifest.variants:
        files.update((rel, f"patch of variant {v.label!r}") for rel in v.patches)
        files.update((i.src, f"install source of variant {v.label!r}") for i in v.install)
    parts = [("manifest", json.dumps(manifest.raw, sort_keys=True).encode()),
             ("runtime", runtime_fingerprint().encode())]
    return _digest(parts + [(f"files/{rel}", mod_file(mod_dir, rel, files[rel])) for rel in sorted(files)])


def variant_fingerprints(mod_dir: Path) -> Dict[str, str]:
    """label -> what that variant writes into vLLM: its patches and install sources (where each
    goes). A GPU run records it, and vouches for these bytes only (served.py)."""
    out: Dict[str, str] = {}
    for variant in load_manifest(mod_dir).variants:
        label = variant.label
        files = {rel: f"patch of variant {label!r}" for rel in variant.patches}
        files.update((i.src, f"install source of variant {label!r}") for i in variant.install)
        targets = json.dumps([[i.src, i.name, i.site] for i in variant.install]).encode()
        out[label] = _digest([("variant", label.encode()), ("installs", targets)]
                             + [(f"files/{rel}", mod_file(mod_dir, rel, files[rel])) for rel in sorted(files)])
    return out


def patch_fingerprint(name: str, strip: int, data: bytes) -> str:
    """A loose patch's subject: its name (the row's `mod`), -p and bytes."""
    return hashlib.sha256(f"patch\0{name}\0{strip}\0".encode() + data).hexdigest()
