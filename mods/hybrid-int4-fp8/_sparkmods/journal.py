"""The journal: every apply and revert is a recorded plan, so a killed run is always repairable.

Before the first file inside vllm/ is renamed, `<site-packages>/.sparkmods/.journal.json`
lists every file the run changes: its sha256 before and after, where a copy of its old bytes
is kept (`old`) and where its new bytes are staged (`new`). Then the copies are written and
fsynced, then the new bytes are staged, then renamed into place, and only then is the
journal removed. Whatever the moment a run dies, the next run (apply, check, revert, dry
run, or `sparkmods apply`) finds the journal and settles it:

  forward  when every new file is present and verified (and, for an apply, every pristine
           copy too, or a later revert would have nothing to restore);
  back     otherwise, from the verified copies of the old bytes.

Copies are removed only after the tree has been verified to be entirely on one side, so the
pristine files are never lost. Settling is idempotent: it can itself be killed and redone.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from . import fsops
from .engine import check_relpath, safe_target
from .interrupts import Interrupted, shielded

__all__ = ["STATE_DIR", "JOURNAL_NAME", "STATE_FILE", "FORWARD", "BACK", "Entry", "Journal", "JournalError",
           "state_dir", "orig_rel", "applied_rel", "temp_rel", "transact", "recover", "sweep", "drop_bytecode"]

STATE_DIR = ".sparkmods"
JOURNAL_NAME = ".journal.json"
STATE_FILE = "state.json"
APPLY, REVERT = "apply", "revert"
FORWARD, BACK = "forward", "back"


class JournalError(RuntimeError):
    """An interrupted run that can be neither finished nor rolled back (files changed by others)."""


@dataclass
class Entry:
    """One file of vLLM the run changes; sha256 None means the file is absent on that side."""

    path: str
    before: Optional[str]
    after: Optional[str]
    new: Optional[str]  # site-relative file holding the `after` bytes (None when after is None)
    old: Optional[str]  # site-relative file holding the `before` bytes (None when before is None)
    mode: int = 0o644


@dataclass
class Journal:
    op: str  # apply | revert
    mod: str
    entries: List[Entry]
    state: Optional[dict] = None  # apply: the state.json written when it completes
    direction: Optional[str] = None  # set once settling has started: forward | back

    def save(self, site: Path) -> None:
        fsops.write_file(_journal_path(site), json.dumps(asdict(self), indent=1, sort_keys=True).encode())

    @classmethod
    def load(cls, site: Path) -> "Journal":
        path = _journal_path(site)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            entries = [Entry(**e) for e in doc.pop("entries")]
            journal = cls(entries=entries, **doc)
            for e in journal.entries:
                for rel in (e.path, e.new, e.old):
                    if rel is not None:
                        check_relpath(rel)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise JournalError(f"{path}: unreadable journal ({exc}); move it away and reinstall vLLM "
                               "if its files are half-patched") from None
        if journal.op not in (APPLY, REVERT) or journal.direction not in (None, FORWARD, BACK):
            raise JournalError(f"{path}: unknown op {journal.op!r} or direction {journal.direction!r}")
        return journal


def state_dir(site: Path, mod: str) -> Path:
    return site / STATE_DIR / mod


def orig_rel(mod: str, rel: str) -> str:
    """Where the pristine copy of a vLLM file lives while the mod is applied."""
    return f"{STATE_DIR}/{mod}/orig/{rel}"


def applied_rel(mod: str, rel: str) -> str:
    """Where a revert keeps the patched bytes until it is complete (to roll back to)."""
    return f"{STATE_DIR}/{mod}/applied/{rel}"


def temp_rel(rel: str) -> str:
    """The staging name beside a vLLM file (fsops.temp_path, relative to site-packages)."""
    head, _, name = rel.rpartition("/")
    return f"{head}/.{name}{fsops.TMP_SUFFIX}" if head else f".{name}{fsops.TMP_SUFFIX}"


def _journal_path(site: Path) -> Path:
    return site / STATE_DIR / JOURNAL_NAME


def _holds(site: Path, rel: Optional[str], sha: Optional[str]) -> bool:
    """Does site/rel hold bytes with this sha256 (None: must be absent)?"""
    if rel is None:
        return sha is None
    path = safe_target(site, rel)
    if sha is None:
        return not os.path.lexists(path)
    return fsops.digest(path) == sha


def _side(e: Entry, direction: str) -> "tuple[Optional[str], Optional[str]]":
    return (e.after, e.new) if direction == FORWARD else (e.before, e.old)


def _blockers(site: Path, journal: Journal, direction: str) -> List[str]:
    """Why the tree cannot be settled in this direction (empty: it can)."""
    out = []
    for e in journal.entries:
        sha, copy = _side(e, direction)
        if not (sha is None or _holds(site, e.path, sha) or _holds(site, copy, sha)):
            out.append(f"{e.path}: no verified copy of its {'new' if direction == FORWARD else 'old'} bytes")
        if journal.op == APPLY and direction == FORWARD and e.before is not None and not _holds(site, e.old, e.before):
            out.append(f"{e.path}: its pristine copy {e.old} is missing or differs")
    return out


def drop_bytecode(target: Path) -> None:
    """Remove cached bytecode of a rewritten module so Python cannot run a stale .pyc."""
    if target.suffix == ".py":
        for pyc in sorted((target.parent / "__pycache__").glob(f"{target.stem}.*.pyc")):
            fsops.remove(pyc)


def _bytes_to_write(site: Path, journal: Journal, direction: str) -> List["tuple[Path, str, Callable[[], bytes], int]"]:
    """(target, sha256, bytes, mode) of every file the settle must write, state.json included."""
    out = []
    for e in journal.entries:
        sha, copy = _side(e, direction)
        if sha is not None and not _holds(site, e.path, sha):
            out.append((safe_target(site, e.path), sha, lambda c=copy: (site / c).read_bytes(), e.mode))
    if journal.op == APPLY and direction == FORWARD:
        data = json.dumps(journal.state, indent=1, sort_keys=True).encode()
        out.append((state_dir(site, journal.mod) / STATE_FILE, hashlib.sha256(data).hexdigest(), lambda: data, 0o644))
    return out


def _stage(target: Path, sha: str, data: Callable[[], bytes], mode: int) -> None:
    """Stage target's new bytes beside it, unless its temp already holds them (an apply's)."""
    if fsops.digest(fsops.temp_path(target)) != sha:
        fsops.stage(target, data(), mode)


def _put(site: Path, e: Entry, direction: str) -> None:
    sha, _ = _side(e, direction)
    target = safe_target(site, e.path)
    if _holds(site, e.path, sha):
        return
    if sha is None:
        fsops.remove(target)
    else:
        fsops.publish(fsops.temp_path(target), target)
    drop_bytecode(target)


def _finish(site: Path, journal: Journal, direction: str) -> None:
    """Record the outcome in the mod's state folder; copies go only once the tree is verified."""
    target_side = FORWARD if direction == FORWARD else BACK
    off = [e.path for e in journal.entries if not _holds(site, e.path, _side(e, target_side)[0])]
    if off:
        raise JournalError(f"{off[0]} changed while the {journal.op} of {journal.mod} was being settled")
    folder = state_dir(site, journal.mod)
    if journal.op == APPLY and direction == FORWARD:
        fsops.publish(fsops.temp_path(folder / STATE_FILE), folder / STATE_FILE)  # staged by settle
    elif journal.op == APPLY or direction == FORWARD:
        fsops.remove_tree(folder)  # apply rolled back / revert complete: the tree is pristine
    else:
        fsops.remove_tree(folder / "applied")  # revert rolled back: the mod stays applied
        if not (folder / STATE_FILE).is_file():
            fsops.remove_tree(folder)


def sweep(site: Path, rels: List[str]) -> None:
    """Remove our temp files beside these vLLM files and anywhere in the state folder."""
    folders = {safe_target(site, r).parent for r in rels}
    found = [p for folder in sorted(folders) for p in fsops.stray_temps(folder)]
    found += fsops.stray_temps(site / STATE_DIR, recursive=True)
    for path in found:
        fsops.remove(path)


def settle(site: Path, journal: Journal, prefer: str) -> str:
    """Bring the tree to one side of the journal (prefer, else the other); returns the side."""
    other = BACK if prefer == FORWARD else FORWARD
    blocked = {d: _blockers(site, journal, d) for d in (prefer, other)}
    choice = next((d for d in (prefer, other) if not blocked[d]), None)
    if choice is None:
        raise JournalError(
            f"an interrupted {journal.op} of {journal.mod} can be neither finished nor rolled back: "
            f"{blocked[prefer][0]}; {blocked[other][0]} (files changed by something else?); "
            f"the journal {_journal_path(site)} is kept: reinstall vLLM, then delete it")
    if journal.direction != choice and any(not _holds(site, e.path, _side(e, choice)[0]) for e in journal.entries):
        journal.direction = choice  # recorded only when files must move: on a full disk, a run
        journal.save(site)  # that failed before its first rename rolls back without writing
    for item in _bytes_to_write(site, journal, choice):  # every byte is on disk before the first
        _stage(*item)  # rename, so a full disk fails here, where nothing has moved yet
    for e in journal.entries:
        _put(site, e, choice)
    _finish(site, journal, choice)
    sweep(site, [e.path for e in journal.entries])
    with shielded():  # once the journal is gone there is nothing left to roll back
        fsops.remove(_journal_path(site))
    return choice


def transact(site: Path, journal: Journal, payload: Dict[str, bytes]) -> None:
    """Carry out a journaled change: journal, copies (payload: site-relative file -> bytes), rename.

    Copies of old bytes are written durably first, then new bytes are staged beside their
    targets, then `settle` renames them into place. Any failure, Ctrl-C and SIGTERM
    included, rolls the tree back before it propagates.
    """
    staged = {e.new: e for e in journal.entries if e.new is not None and e.new == temp_rel(e.path)}
    try:
        journal.save(site)
        for rel in sorted(r for r in payload if r not in staged):
            fsops.write_file(safe_target(site, rel), payload[rel])
        for rel in sorted(r for r in payload if r in staged):
            fsops.stage(safe_target(site, staged[rel].path), payload[rel], staged[rel].mode)
        settle(site, journal, FORWARD)
    except BaseException as exc:
        with shielded():
            side = BACK
            try:
                if _journal_path(site).exists():
                    side = settle(site, Journal.load(site), BACK)
                else:
                    sweep(site, [e.path for e in journal.entries])
            except (OSError, JournalError) as failed:
                raise JournalError(f"{_what(exc)}; rolling back failed too ({_what(failed)}); the journal "
                                   f"{_journal_path(site)} is kept: the next run.sh (any action) settles it")
        if isinstance(exc, Interrupted):
            exc.completed = side == FORWARD  # too late to roll back: the change was finished instead
        raise


def _what(exc: BaseException) -> str:
    """An error in a few words, naming its file."""
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc) or type(exc).__name__


def recover(site: Path, say: Callable[[str], None]) -> None:
    """Settle a journal an interrupted run left behind, say in one line what was done."""
    if not _journal_path(site).exists():
        sweep(site, [])
        return
    with shielded():
        journal = Journal.load(site)
        side = settle(site, journal, journal.direction or FORWARD)
    if journal.op == APPLY:
        what = ("finished it (every staged file was present and verified)" if side == FORWARD
                else "rolled it back (its vLLM files are pristine again)")
    else:
        what = ("finished it (pristine files restored)" if side == FORWARD
                else "rolled it back (the mod stays applied)")
    say(f"found an interrupted {journal.op} of {journal.mod}: {what}")
