"""The journal: every apply and revert is a recorded plan, so a killed run is always repairable.

Before the first file inside vllm/ is renamed, `<site-packages>/.sparkmods/.journal.json`
lists every file the run changes: its sha256 before and after, where a copy of its old bytes
is kept (`old`) and where its new bytes are staged (`new`). Then the copies are written,
then the new bytes are staged, then renamed into place, and only then is the journal
removed; each of these writes is a complete file renamed into place (fsops.py, which also
says why nothing is fsynced). Whatever the moment a run dies, the next run (apply, check,
revert, dry run, or `sparkmods apply`) finds the journal and settles it:

  forward  when every new file is present and verified (and, for an apply, every pristine
           copy too, or a later revert would have nothing to restore);
  back     otherwise, from the verified copies of the old bytes.

Copies are removed only after the tree has been verified to be entirely on one side, so the
pristine files are never lost. Settling is idempotent: it can itself be killed and redone.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from hashlib import sha256
from typing import Any, Callable, Dict, List, Optional

from . import fsops
from .engine import confine, plain_path
from .fsops import JOURNAL_NAME, STATE_DIR, StrPath
from .interrupts import Interrupted, shielded
from .manifest import MOD_NAME

__all__ = ["STATE_DIR", "JOURNAL_NAME", "STATE_FILE", "FORWARD", "BACK", "Entry", "Journal", "JournalError",
           "state_dir", "orig_rel", "applied_rel", "temp_rel", "check_state", "transact", "recover", "sweep",
           "drop_bytecode"]

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
    """The plan of one apply or revert, as `.journal.json` holds it."""

    op: str  # apply | revert
    mod: str
    entries: List[Entry]
    state: Optional[dict] = None  # apply: the state.json written when it completes
    direction: Optional[str] = None  # forward | back: the side settling goes to first (None: forward)

    def save(self, site: StrPath) -> None:
        fsops.write_file(_journal_path(site), dump_json(asdict(self)))

    @classmethod
    def load(cls, site: StrPath) -> "Journal":
        path = _journal_path(site)
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
            entries = [Entry(**e) for e in doc.pop("entries")]
            journal = cls(entries=entries, **doc)
            journal.confine()
            if journal.op == APPLY:
                check_state(journal.state)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise JournalError(f"{path}: refusing this journal ({exc}); nothing was changed: move it away, and "
                               "reinstall vLLM if its files are half-patched") from None
        return journal

    def confine(self) -> None:
        """Refuse (ValueError) a journal this runtime would not have written: every file a mod's
        target inside vllm/ (as apply confines them), each copy and temp at the one name the
        runtime gives it, sha256 sums and modes well formed."""
        if self.op not in (APPLY, REVERT) or self.direction not in (None, FORWARD, BACK):
            raise ValueError(f"unknown op {self.op!r} or direction {self.direction!r}")
        if not (isinstance(self.mod, str) and MOD_NAME.fullmatch(self.mod)):
            raise ValueError(f"mod {self.mod!r} is no mod name")
        saved = orig_rel if self.op == APPLY else applied_rel
        for e in self.entries:
            if not isinstance(e.path, str) or confine(e.path) != e.path:
                raise ValueError(f"{e.path!r} is not a mod's file inside vllm/")
            news = (temp_rel(e.path),) if self.op == APPLY else (temp_rel(e.path), orig_rel(self.mod, e.path))
            for sha, copy, allowed in ((e.after, e.new, news), (e.before, e.old, (saved(self.mod, e.path),))):
                if not _is_sha(sha) or (copy is None) != (sha is None) or (copy is not None and copy not in allowed):
                    raise ValueError(f"{e.path}: copy {copy!r} of sha256 {sha!r} is not where this runtime keeps it")
            if not isinstance(e.mode, int) or isinstance(e.mode, bool) or not 0 <= e.mode <= 0o7777:
                raise ValueError(f"{e.path}: mode {e.mode!r}")


def _is_sha(value: object) -> bool:
    """None or 64 lowercase hex digits (a sha256 as the journal writes it)."""
    return value is None or (isinstance(value, str) and len(value) == 64 and not value.strip("0123456789abcdef"))


def check_state(state: object) -> dict:
    """A mod's saved state (state.json, or the one an apply's journal will write), refused
    (ValueError) unless every file it names is a mod's file inside vllm/ with well-formed sums."""
    files = state["files"]  # type: ignore[index]  # untyped JSON: the checks below give it its shape
    for rel, sums in files.items():
        if not isinstance(rel, str) or confine(rel) != rel:
            raise ValueError(f"{rel!r} is not a mod's file inside vllm/")
        if set(sums) != {"before", "after"} or not all(_is_sha(v) for v in sums.values()):
            raise ValueError(f"{rel}: bad sums {sums!r}")
    return state  # type: ignore[return-value]  # a dict with checked "files", as the lines above proved


def dump_json(value: Any) -> bytes:
    """The journal's and state.json's bytes."""
    return json.dumps(value, indent=1, sort_keys=True).encode()


def state_dir(site: StrPath, mod: str) -> str:
    return os.path.join(site, STATE_DIR, mod)


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


def _journal_path(site: StrPath) -> str:
    return os.path.join(site, STATE_DIR, JOURNAL_NAME)


def _holds(site: StrPath, rel: Optional[str], sha: Optional[str]) -> bool:
    """Does site/rel hold bytes with this sha256 (None: must be absent)?"""
    if rel is None:
        return sha is None
    path = plain_path(site, rel)
    if sha is None:
        return not os.path.lexists(path)
    return fsops.digest(path) == sha


def _side(e: Entry, direction: str) -> "tuple[Optional[str], Optional[str]]":
    return (e.after, e.new) if direction == FORWARD else (e.before, e.old)


def _blockers(site: StrPath, journal: Journal, direction: str) -> List[str]:
    """Why the tree cannot be settled in this direction (empty: it can)."""
    out = []
    for e in journal.entries:
        sha, copy = _side(e, direction)
        if not (sha is None or _holds(site, e.path, sha) or _holds(site, copy, sha)):
            out.append(f"{e.path}: no verified copy of its {'new' if direction == FORWARD else 'old'} bytes")
        if journal.op == APPLY and direction == FORWARD and e.before is not None and not _holds(site, e.old, e.before):
            out.append(f"{e.path}: its pristine copy {e.old} is missing or differs")
    return out


def drop_bytecode(target: str) -> None:
    """Remove cached bytecode of a rewritten module so Python cannot run a stale .pyc."""
    folder, name = os.path.split(target)
    stem, suffix = os.path.splitext(name)
    cache = os.path.join(folder, "__pycache__")
    if suffix != ".py" or not os.path.isdir(cache):
        return
    for pyc in sorted(n for n in os.listdir(cache) if n.startswith(f"{stem}.") and n[len(stem) + 1:].endswith(".pyc")):
        fsops.remove(os.path.join(cache, pyc))


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _reader(site: StrPath, rel: str) -> Callable[[], bytes]:
    """The bytes of site/rel, read when the write is due."""
    return lambda: _read(plain_path(site, rel))


def _bytes_to_write(site: StrPath, journal: Journal, direction: str
                    ) -> List["tuple[str, str, Callable[[], bytes], int]"]:
    """(target, sha256, bytes, mode) of every file the settle must write, state.json included."""
    out: List["tuple[str, str, Callable[[], bytes], int]"] = []
    for e in journal.entries:
        sha, copy = _side(e, direction)
        if sha is not None and not _holds(site, e.path, sha):
            assert copy is not None  # Journal.confine: a copy beside every sha256
            target = plain_path(site, e.path)
            out.append((target, sha, _reader(site, copy), _mode(target, e.mode)))
    if journal.op == APPLY and direction == FORWARD:
        data = dump_json(journal.state)
        target = os.path.join(state_dir(site, journal.mod), STATE_FILE)
        out.append((target, sha256(data).hexdigest(), lambda: data, 0o644))
    return out


def _mode(target: str, mode: int) -> int:
    """The mode the journal names, never more than the file has now (a patched file keeps its
    mode, a revert gives back the one the apply kept) or, where there is none, than a new file
    gets: a journal cannot make a file setuid or world-writable that was not."""
    try:
        return mode & stat.S_IMODE(os.lstat(target).st_mode)
    except FileNotFoundError:
        return mode & fsops.umasked(0o777)


def _stage(target: str, sha: str, data: Callable[[], bytes], mode: int) -> None:
    """Stage target's new bytes beside it, unless its temp already holds them with that mode
    (an apply's)."""
    temp = fsops.temp_path(target)
    if fsops.digest(temp) != sha or stat.S_IMODE(os.lstat(temp).st_mode) != mode:
        fsops.stage(target, data(), mode)


def _put(site: StrPath, e: Entry, direction: str) -> None:
    sha, _ = _side(e, direction)
    target = plain_path(site, e.path)
    if _holds(site, e.path, sha):
        return
    if sha is None:
        fsops.remove(target)
    else:
        fsops.publish(fsops.temp_path(target), target)
    drop_bytecode(target)


def _finish(site: StrPath, journal: Journal, direction: str) -> None:
    """Record the outcome in the mod's state folder; copies go only once the tree is verified."""
    target_side = FORWARD if direction == FORWARD else BACK
    off = [e.path for e in journal.entries if not _holds(site, e.path, _side(e, target_side)[0])]
    if off:
        raise JournalError(f"{off[0]} changed while the {journal.op} of {journal.mod} was being settled")
    folder = state_dir(site, journal.mod)
    state = os.path.join(folder, STATE_FILE)
    if journal.op == APPLY and direction == FORWARD:
        fsops.publish(fsops.temp_path(state), state)  # staged by settle
    elif journal.op == APPLY or direction == FORWARD:
        fsops.remove_tree(folder)  # apply rolled back / revert complete: the tree is pristine
    else:
        fsops.remove_tree(os.path.join(folder, "applied"))  # revert rolled back: the mod stays applied
        if not os.path.isfile(state):
            fsops.remove_tree(folder)


def sweep(site: StrPath, rels: List[str]) -> None:
    """Remove our temp files beside these vLLM files and anywhere in the state folder."""
    folders = {os.path.dirname(plain_path(site, r)) for r in rels}
    found = [p for folder in sorted(folders) for p in fsops.stray_temps(folder)]
    found += fsops.stray_temps(os.path.join(site, STATE_DIR), recursive=True)
    for path in found:
        fsops.remove(path)


def settle(site: StrPath, journal: Journal, prefer: str, fallback: bool = True) -> str:
    """Bring the tree to one side of the journal (prefer, else, with fallback, the other);
    returns the side."""
    other = BACK if prefer == FORWARD else FORWARD
    blocked = {prefer: _blockers(site, journal, prefer)}
    if blocked[prefer] and not fallback:
        raise JournalError(f"the {journal.op} of {journal.mod} could not be completed: {blocked[prefer][0]}")
    if blocked[prefer]:  # the other side is looked at only when this one cannot be reached
        blocked[other] = _blockers(site, journal, other)
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


def transact(site: StrPath, journal: Journal, payload: Dict[str, bytes]) -> None:
    """Carry out a journaled change: journal, copies (payload: site-relative file -> bytes), rename.

    Copies of old bytes are written first, then new bytes are staged beside their
    targets, then `settle` renames them into place. Any failure, Ctrl-C and SIGTERM
    included, rolls the tree back before it propagates; so does a change that cannot be
    finished (its new bytes are not where settling looks), which is an error, never silence.
    """
    staged = {e.new: e for e in journal.entries if e.new is not None and e.new == temp_rel(e.path)}
    journal.direction = FORWARD  # how a run killed from here on is settled (what recover prefers anyway)
    try:
        journal.save(site)
        for rel in sorted(r for r in payload if r not in staged):
            fsops.write_file(plain_path(site, rel), payload[rel])
        for rel in sorted(r for r in payload if r in staged):
            fsops.stage(plain_path(site, staged[rel].path), payload[rel], staged[rel].mode)
        settle(site, journal, FORWARD, fallback=False)
    except BaseException as exc:
        with shielded():
            side = BACK
            try:
                if os.path.exists(_journal_path(site)):
                    side = settle(site, journal, BACK)  # the journal as saved (settle saves its direction)
                else:
                    sweep(site, [e.path for e in journal.entries])
            except (OSError, JournalError) as failed:
                raise JournalError(f"{_what(exc)}; rolling back failed too ({_what(failed)}); the journal "
                                   f"{_journal_path(site)} is kept: the next run.sh (any action) settles it") from failed
        if isinstance(exc, Interrupted):
            exc.completed = side == FORWARD  # too late to roll back: the change was finished instead
        raise


def _what(exc: BaseException) -> str:
    """An error in a few words, naming its file."""
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc) or type(exc).__name__


def recover(site: StrPath, say: Callable[[str], None]) -> None:
    """Settle a journal an interrupted run left behind, say in one line what was done."""
    if not os.path.exists(_journal_path(site)):
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
