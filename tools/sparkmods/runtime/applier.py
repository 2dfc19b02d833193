"""Apply, check or revert one mod on an installed vLLM; the entry point of every run.sh.

Inside the container this is all that runs: stdlib only, Python >= 3.9. On the host the same
functions back `sparkmods apply MOD --vllm dir:PATH`.

Every run takes the tree's lock (lock.py), then settles whatever an interrupted run left
(journal.recover), then decides with modcheck and changes vLLM only through a journaled
transaction (journal.transact): a killed, interrupted or failing run never leaves vLLM
half-patched, and the pristine files, saved under `<site-packages>/.sparkmods/<mod>/orig/`,
are kept until the tree is verified pristine again.

Exit codes: 0 done (or nothing to do), 1 the mod cannot be applied or reverted here (nothing
changed), 2 bad input (mod, paths, interpreter), 3 an internal error (a bug: __main__.py says
so in one line), 130 / 143 interrupted by SIGINT / SIGTERM (rolled back first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from hashlib import sha256
from typing import Callable, ContextManager, Dict, List, Optional, Sequence, TextIO

from . import fsops, stamp
from .engine import APPLIED, CONFLICT, OK, OK_OFFSET, UnsafePath, plain_path, plan
from .fsops import StrPath
from .interrupts import Interrupted, deferred, exit_code, handled
from .journal import (
    JOURNAL_NAME,
    STATE_DIR,
    STATE_FILE,
    Entry,
    Journal,
    JournalError,
    applied_rel,
    check_state,
    orig_rel,
    recover,
    state_dir,
    sweep,
    temp_rel,
    transact,
)
from .locate import LocateError, find_vllm, named_site, read_version
from .lock import LockTimeout, ReadOnlyTree, UntrustedState, tree_lock
from .manifest import Install, Manifest, ManifestError, Variant, load_manifest
from .modcheck import BASE_ENV, GREEN, NO_VARIANT, UPSTREAM, ModInputs, ModResult, decide, mod_inputs, settle
from .output import say_to
from .udiff import reverse

__all__ = ["main", "run", "apply_mod", "revert_mod", "Printer", "STATE_DIR"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class Printer:
    """Every line goes out prefixed with `[<mod>]` so cluster logs show who said it; a line
    that cannot be written never fails the run (output.say_to)."""

    def __init__(self, mod: str, stream: Optional[TextIO] = None) -> None:
        self.prefix = f"[{mod}]"
        self.stream = stream or sys.stdout

    def __call__(self, message: str) -> None:
        say_to(self.stream, f"{self.prefix} {message}\n")


def _sha256(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else sha256(data).hexdigest()


def _reader(site: StrPath) -> "Callable[[str], Optional[bytes]]":
    def read(rel: str) -> Optional[bytes]:
        return fsops.read_regular(plain_path(site, rel, leaf=True))
    return read


def _lock(site: StrPath, say: Printer, dry_run: bool) -> ContextManager[None]:
    """The tree's lock; a dry run on a read-only vLLM goes ahead unlocked unless a journal
    needs settling. Taken with SIGINT/SIGTERM deferred, then `recover` settles any
    interrupted run before the caller decides."""
    required = not dry_run or os.path.exists(os.path.join(site, STATE_DIR, JOURNAL_NAME))
    return tree_lock(os.path.join(site, STATE_DIR), say, required)


def _explain_failure(say: Printer, manifest: Manifest, result: ModResult) -> None:
    say(f"ERROR: cannot apply to vLLM {result.version}: {result.status}"
        + (f" (variant {result.variant})" if result.variant else ""))
    if result.reason:
        say(f"  reason: {result.reason}")
    for f in result.files:
        for h in f.hunks:
            if h.outcome != CONFLICT:
                continue
            say(f"  {f.path}: hunk {h.index} (stated line {h.stated_line}): {h.reason}")
            if h.near is not None:
                say(f"    closest match at line {h.near.line}: {h.near.matching}/{h.near.total} lines equal")
                for line, expected, found in h.near.differing[:5]:
                    say(f"    line {line}: expected {expected.strip()!r}, found {found.strip()!r}")
    if result.status != NO_VARIANT:  # a no-variant reason already lists them
        say(f"  variants: {manifest.describe_variants()}")
    say("  nothing was changed; pin a vLLM a variant was verified on, or rebase the mod "
        "(sparkmods rebase MOD --onto VERSION)")


def _install_files(say: Printer, mod_dir: StrPath, inputs: ModInputs, workspace: StrPath, dry_run: bool) -> None:
    for item, data in zip(inputs.variant.install, inputs.sources):
        if item.site:
            continue  # installed into vLLM with the patches, through the journal
        dest = os.path.join(workspace, item.name)
        try:
            present = fsops.read_regular(dest) == data
            if not (present or dry_run):
                fsops.remove(fsops.temp_path(dest))  # left by a killed run
                fsops.write_file(dest, data, _install_mode(mod_dir, item))
        except OSError as exc:  # after vLLM's files were settled: the lines above say what was done
            raise JournalError(f"{exc.filename or dest}: {exc.strerror or exc}; {item.name} cannot be installed "
                               f"into {workspace}: fix that and run again") from None
        if present:
            say(f"{item.name} already installed in {workspace}")
        else:
            say(f"{'would install' if dry_run else 'installed'} {item.name} into {workspace}")


def _install_mode(mod_dir: StrPath, item: Install) -> int:
    """An installed file's mode: its source's bits filtered by the umask (as `cp` copies)."""
    return fsops.umasked(os.stat(os.path.realpath(os.path.join(mod_dir, item.src))).st_mode)


def _new_file_mode(mod_dir: StrPath, variant: Variant, rel: str) -> int:
    """The mode of a file the apply creates inside vllm/: a site install's as `cp` would give it;
    a file a patch creates, what any new file gets (0666 filtered by the umask)."""
    item = next((i for i in variant.install if i.site and i.name == rel), None)
    return _install_mode(mod_dir, item) if item is not None else fsops.umasked(0o666)


def _load_state(site: StrPath, mod: str) -> Optional[dict]:
    path = os.path.join(state_dir(site, mod), STATE_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return check_state(json.load(fh))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise JournalError(f"{path}: refusing this saved state ({exc}); nothing was changed; the originals are in "
                           f"{os.path.join(state_dir(site, mod), 'orig')}") from None


def _drop_stale_state(site: StrPath, manifest: Manifest, state: Optional[dict], say: Printer) -> None:
    """Before applying to a tree the mod is not on, forget an earlier apply's leftover state:
    none of its files still holds what that apply wrote (`_refuse_earlier_apply` saw to it),
    so its originals are copies of files no longer there."""
    folder = state_dir(site, manifest.name)
    if not os.path.exists(folder):
        return
    if state is not None:
        say("removed the saved state of an earlier apply that this vLLM no longer has")
    fsops.remove_tree(folder)


def _held(site: StrPath, state: dict) -> "tuple[List[str], List[str], Dict[str, Optional[bytes]]]":
    """Of the files an earlier apply wrote (its state.json): those still holding what it wrote,
    those holding neither that nor the original (changed since), and each one's bytes now."""
    sums = state["files"]
    current = {rel: fsops.read_regular(plain_path(site, rel, leaf=True)) for rel in sorted(sums)}
    ours = [rel for rel in current if _sha256(current[rel]) == sums[rel]["after"]]
    foreign = [rel for rel in current if _sha256(current[rel]) not in (sums[rel]["before"], sums[rel]["after"])]
    return ours, foreign, current


def _refuse_earlier_apply(site: StrPath, state: dict, version: str, result: ModResult) -> None:
    """Say it (JournalError, one line) when this mod's earlier apply is on the tree but not as
    it left it: a vLLM installed over it (pip leaves the files a mod created: they are in no
    RECORD), one of its files changed since, or the mod changed since (a newer version of it).
    A green answer there would be wrong, and a refusal without the way out no better."""
    ours, foreign, _ = _held(site, state)
    was = state.get("vllm")
    if was == version and foreign:
        raise JournalError(f"{foreign[0]} changed since this mod was applied (it holds neither what the apply wrote "
                           f"nor vLLM's original): undo that change, or reinstall vLLM {version} and run "
                           "`./run.sh revert`, then `./run.sh`; nothing was changed")
    if not ours:
        return  # nothing of it is left: stale state, dropped by the next apply
    named = ours[0] + (f" and {len(ours) - 1} more file(s)" if len(ours) > 1 else "")
    if len(ours) < len(state["files"]):
        still = "is" if len(ours) == 1 else "are"
        raise JournalError(f"vLLM {version} was installed over this mod's apply to vLLM {was} (variant "
                           f"{state.get('variant')}): {named} that it wrote {still} still there; run `./run.sh "
                           f"revert` to remove what it left, then `./run.sh` to apply to vLLM {version}; nothing was "
                           "changed")
    if result.status != APPLIED or {f.path for f in result.files} != set(state["files"]):
        raise JournalError(f"vLLM {version} holds an earlier version of this mod (variant {state.get('variant')}, "
                           f"{named}): run `./run.sh revert` to restore vLLM's files, then `./run.sh` to apply "
                           "this version; nothing was changed")


def _apply_journal(manifest: Manifest, result: ModResult, site: StrPath, mod_dir: StrPath, variant: Variant
                   ) -> "tuple[Journal, Dict[str, bytes]]":
    """The apply journal; a patched file keeps its mode, a new one gets `_new_file_mode`."""
    entries: List[Entry] = []
    payload: Dict[str, bytes] = {}
    files = {}
    for f in result.files:
        if not f.changes:
            continue
        target = plain_path(site, f.path)
        mode = os.stat(target).st_mode & 0o7777 if f.before is not None else _new_file_mode(mod_dir, variant, f.path)
        old = orig_rel(manifest.name, f.path) if f.before is not None else None
        new = temp_rel(f.path) if f.after is not None else None
        sums = {"before": _sha256(f.before), "after": _sha256(f.after)}
        entries.append(Entry(f.path, sums["before"], sums["after"], new, old, mode))
        if old is not None and f.before is not None:  # (old is set exactly when there are before bytes)
            payload[old] = f.before
        if new is not None and f.after is not None:
            payload[new] = f.after
        files[f.path] = sums
    state = {"mod": manifest.name, "variant": result.variant, "vllm": result.version, "files": files}
    return Journal("apply", manifest.name, entries, state), payload


def apply_mod(mod_dir: StrPath, site: StrPath, workspace: StrPath, dry_run: bool = False, say: Optional[Printer] = None,
              base: Optional[str] = None) -> int:
    """Apply the variant that fits the vLLM in site (base: the release a build is based on,
    $SPARKMODS_VLLM_BASE); returns the exit code."""
    manifest = load_manifest(mod_dir)
    say = say or Printer(manifest.name)
    version = read_version(site)
    # Bad input is an error before anything is written: the mod's (read once here, for every
    # decision below) and a vLLM path reached through a link, or that is no regular file.
    weighed = mod_inputs(manifest, mod_dir, version, base)
    for rel in weighed.paths():
        plain_path(site, rel, leaf=True)
    with _lock(site, say, dry_run), deferred():
        recover(site, say)
        inputs, result = settle(weighed, _reader(site))
        state = _load_state(site, manifest.name)
        if state is not None:
            _refuse_earlier_apply(site, state, version, result)
        if result.how:
            say(f"chose variant {result.variant} {result.how}" if result.green and result.variant else result.how)
        if result.status not in GREEN:
            _explain_failure(say, manifest, result)
            return EXIT_FAIL
        if result.status == UPSTREAM:
            say(f"not needed: {result.reason}")
            return EXIT_OK
        variant = inputs.variant
        if not dry_run:
            sweep(site, [f.path for f in result.files])
        if result.status == APPLIED:
            say(f"already applied (variant {variant.label}) to vLLM {version}")
        elif dry_run:
            for f in result.files:
                say(f"would patch {f.path}: {f.status}")
            say(f"dry run: variant {variant.label} applies cleanly to vLLM {version}; nothing written")
        elif result.changes():
            _drop_stale_state(site, manifest, state, say)
            transact(site, *_apply_journal(manifest, result, site, mod_dir, variant))
            for f in result.files:
                if f.changes:
                    moved = [h for h in f.hunks if h.offset]
                    extra = f" ({len(moved)} hunk(s) at an offset)" if moved else ""
                    say(f"{'installed' if f.path in _site_installs(variant) else 'patched'} {f.path}{extra}")
            say(f"applied variant {variant.label} to vLLM {version} in {site}")
        else:
            say(f"variant {variant.label} changes no vLLM file (vLLM {version})")
        _install_files(say, mod_dir, inputs, workspace, dry_run)
        if not dry_run and (result.status == APPLIED or result.changes()):
            _stamp(weighed, mod_dir, site)
    if variant.notes:
        say(variant.notes)
    return EXIT_OK


def _stamp(weighed: ModInputs, mod_dir: StrPath, site: StrPath) -> None:
    """Inside a mod (run.sh), after a run that leaves the mod on: the stamp that lets the next
    run.sh say `already applied` without this module (stamp.py), if deciding again (from the
    inputs before any choice, `weighed`) says so."""
    if __package__ != "_sparkmods":
        return  # the host's `sparkmods apply`: its manifest is mod.toml, not what run.sh reads
    if weighed.base:
        return  # stamp.quick never runs under $SPARKMODS_VLLM_BASE: a run without it decides anew
    inputs, result = settle(weighed, _reader(site))
    if result.status != APPLIED:
        return
    variant = inputs.variant
    installs = [(item.name, data) for item, data in zip(variant.install, inputs.sources) if not item.site]
    # A choice by content also read the other variants' patches and files.
    variants = weighed.manifest.variants if weighed.options else [variant]
    mod_files = [rel for v in variants for rel in list(v.patches) + [i.src for i in v.install]]
    try:
        stamp.record(os.fspath(mod_dir), os.fspath(site), variant.label, inputs.version, mod_files, weighed.paths(),
                     installs, variant.notes, result.how)
    except OSError:
        pass  # a cache: without it the next run takes the full path


def _site_installs(variant: Variant) -> List[str]:
    return [item.name for item in variant.install if item.site]


def _revert_from_state(site: StrPath, inputs: ModInputs, state: dict) -> "Optional[tuple[Journal, Dict[str, bytes]]]":
    """The revert journal from the saved originals; None when the tree is already pristine.

    Files still holding what the apply wrote are restored; files already back at their
    pristine bytes (vLLM reinstalled over the mod) are left alone; any other content is
    someone else's change and stops the revert. Where another vLLM release was installed over
    the apply, the files the mod created are removed and every other file is the new
    release's own, left alone.
    """
    name = inputs.manifest.name
    sums = state["files"]
    patched, foreign, current = _held(site, state)
    if state.get("vllm") != inputs.version and len(patched) < len(sums):  # another release installed over it
        patched, foreign = [rel for rel in patched if sums[rel]["before"] is None], []
    if foreign:
        if decide(inputs, _reader(site)).status in (OK, OK_OFFSET):
            return None  # another vLLM is installed and the mod is not on it: the state is stale
        raise JournalError(f"{foreign[0]} changed since the mod was applied; not reverting anything "
                           f"(originals are kept in {os.path.join(state_dir(site, name), 'orig')})")
    if not patched:
        return None
    entries, payload = [], {}
    for rel in sorted(patched):
        s = sums[rel]
        new = orig_rel(name, rel) if s["before"] is not None else None
        if new is not None and fsops.digest(os.path.join(site, new)) != s["before"]:
            raise JournalError(f"{os.path.join(site, new)}: the saved original of {rel} is missing or corrupt; "
                               "reinstall vLLM")
        old = applied_rel(name, rel) if s["after"] is not None else None
        now = current[rel]  # not None where s["after"] is: the foreign check above compared it
        if old is not None and now is not None:
            payload[old] = now
        mode = os.stat(plain_path(site, rel)).st_mode & 0o7777 if current[rel] is not None else 0o644
        entries.append(Entry(rel, s["after"], s["before"], new, old, mode))
    return Journal("revert", name, entries), payload


def _revert_by_reverse_patch(site: StrPath, inputs: ModInputs, say: Printer
                             ) -> "Optional[tuple[Journal, Dict[str, bytes]]]":
    """No saved originals: undo an applied mod with its reverse patch; None if not applied."""
    read = _reader(site)
    manifest, version = inputs.manifest, inputs.version
    inputs, forward = settle(inputs, read)
    chosen = inputs.chosen
    if not isinstance(chosen, Variant):
        say(f"nothing to revert: no variant of this mod for vLLM {version}")
        return None
    if forward.status != APPLIED:
        if forward.status not in (OK, OK_OFFSET):
            raise JournalError(f"the mod is neither applied nor cleanly applicable to vLLM {version} "
                               f"({forward.status}: {forward.reason}); nothing reverted")
        say(f"nothing to revert: the mod is not applied to vLLM {version} ({forward.status})")
        return None
    files = plan([reverse(fp) for fp in inputs.patches], read)
    if any(f.status not in (OK, OK_OFFSET) for f in files):
        raise JournalError("no saved originals and the reverse patch does not apply cleanly; reinstall vLLM")
    changes: Dict[str, Optional[bytes]] = {f.path: f.after for f in files}
    changes.update({rel: None for rel in _site_installs(chosen)})
    entries, payload = [], {}
    for rel, after in sorted(changes.items()):
        before = read(rel)
        new = temp_rel(rel) if after is not None else None
        old = applied_rel(manifest.name, rel)
        if before is not None:  # the applied file (read by the plan above)
            payload[old] = before
        if new is not None and after is not None:  # (new is set exactly when there are after bytes)
            payload[new] = after
        mode = os.stat(plain_path(site, rel)).st_mode & 0o7777
        entries.append(Entry(rel, _sha256(before), _sha256(after), new, old, mode))
    return Journal("revert", manifest.name, entries), payload


def _remove_installs(say: Printer, inputs: ModInputs, workspace: StrPath, dry_run: bool) -> None:
    """A revert takes back what the apply put into the workspace (a chat template), where it
    is still byte for byte what the mod installs: an edited copy is the user's and stays."""
    sources: Dict[str, List[bytes]] = {}
    for option in inputs.options or [inputs]:  # a choice by content: what any variant installs
        if isinstance(option.chosen, Variant):
            for item, data in zip(option.chosen.install, option.sources):
                if not item.site:
                    sources.setdefault(item.name, []).append(data)
    for name, datas in sources.items():
        dest = os.path.join(workspace, name)
        current = fsops.read_regular(dest)
        if current is None:
            continue
        if current not in datas:
            say(f"kept {name} in {workspace}: it differs from what this mod installs")
        elif dry_run:
            say(f"would remove {name} from {workspace}")
        else:
            fsops.remove(dest)
            say(f"removed {name} from {workspace}")


def revert_mod(mod_dir: StrPath, site: StrPath, dry_run: bool = False, say: Optional[Printer] = None,
               base: Optional[str] = None, workspace: Optional[StrPath] = None) -> int:
    """Restore the pristine files of a mod applied to site, and remove its workspace installs."""
    manifest = load_manifest(mod_dir)
    say = say or Printer(manifest.name)
    inputs = mod_inputs(manifest, mod_dir, read_version(site), base)  # bad mod input: an error before any write
    with _lock(site, say, dry_run), deferred():
        recover(site, say)
        _revert_vllm(site, inputs, dry_run, say)
        if workspace is not None:
            _remove_installs(say, inputs, workspace, dry_run)
    return EXIT_OK


def _revert_vllm(site: StrPath, inputs: ModInputs, dry_run: bool, say: Printer) -> None:
    """Restore vLLM's files: from the saved originals, else with the reverse patch."""
    name, version = inputs.manifest.name, inputs.version
    state = _load_state(site, name)
    if state is not None:
        todo = _revert_from_state(site, inputs, state)
        if todo is None:
            if not dry_run:
                fsops.remove_tree(state_dir(site, name))
            say("nothing to revert: vLLM is pristine; " + ("would remove" if dry_run else "removed")
                + " the stale saved state")
            return
    else:
        if not dry_run and os.path.exists(state_dir(site, name)):
            fsops.remove_tree(state_dir(site, name))  # leftovers without a state file
        todo = _revert_by_reverse_patch(site, inputs, say)
        if todo is None:
            return
    journal, payload = todo
    if dry_run:
        for e in journal.entries:
            say(f"would {'restore' if e.after is not None else 'remove'} {e.path}")
        return
    sweep(site, [e.path for e in journal.entries])
    transact(site, journal, payload)
    for e in journal.entries:
        say(f"{'restored' if e.after is not None else 'removed'} {e.path}")
    was = state.get("vllm") if state is not None else version
    say("reverted" if was == version else
        f"reverted what the apply to vLLM {was} left; run `./run.sh` to apply to vLLM {version}")


def run(action: str, mod_dir: StrPath, site: Optional[StrPath], workspace: StrPath, dry_run: bool, say: Printer) -> int:
    """One run.sh action with every failure turned into one line and an exit code."""
    try:
        with handled():
            site = named_site(os.fspath(site)) if site else find_vllm().site
            base = os.environ.get(BASE_ENV, "").strip() or None
            if action == "revert":
                return revert_mod(mod_dir, site, dry_run, say, base, workspace)
            return apply_mod(mod_dir, site, workspace, dry_run or action == "check", say, base)
    except (LocateError, ManifestError, UnsafePath, ValueError) as exc:
        say(f"ERROR: {exc}")
        return EXIT_USAGE
    except (JournalError, LockTimeout, UntrustedState) as exc:
        say(f"ERROR: {exc}")
        return EXIT_FAIL
    except ReadOnlyTree as exc:
        say(f"ERROR: cannot write to this vLLM ({exc}); nothing was changed")
        return EXIT_FAIL
    except OSError as exc:
        say(f"ERROR: {exc.filename or 'a file'}: {exc.strerror or exc}; rolled back, nothing was changed")
        return EXIT_FAIL
    except Interrupted as exc:
        if not exc.during_change:
            what = "outside a change to vLLM's files: nothing is half-done (the lines above say what was done)"
        elif exc.completed:
            what = "it came after the last step, so the change was completed"
        else:
            what = "rolled back, vLLM is as it was before this run"
        say(f"interrupted by {exc}: {what}")
        return exit_code(exc.signum)


ACTIONS = ("apply", "check", "revert")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """run.sh's command line (action, dry_run, site, workspace); a bad one is the usage and exit 2."""
    parser = argparse.ArgumentParser(prog="run.sh", description="Apply this mod to the installed vLLM.",
                                     allow_abbrev=False)
    parser.add_argument("action", nargs="?", default="apply", choices=ACTIONS,
                        help="apply (the default), check (a dry run) or revert")
    parser.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    parser.add_argument("--site", help="site-packages holding vllm/ (default: $PYTHON_ROOT, then python3's path)")
    parser.add_argument("--workspace", help="where installed files go (default: $WORKSPACE_DIR, then the cwd)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """run.sh's program: the mod is the folder this runtime file is in."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    mod_dir = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # <mod>/_sparkmods.py/applier.py
    fsops.arm_from_env()
    return run(args.action, mod_dir, os.path.realpath(args.site) if args.site else None,
               args.workspace or os.environ.get("WORKSPACE_DIR") or os.getcwd(), args.dry_run,
               Printer(os.path.basename(mod_dir)))
