"""Merge results folders of one served benchmark: a run split over two GPUs or two leases.

    python3 ci/bench/bench_served.py merge INTO FROM [FROM ...]

Each FROM is a served-<model>-<vllm>-<gpu>/ folder holding other configurations of the same model,
vLLM and GPU as INTO. INTO's served.json becomes its rows followed by each FROM's (order kept), each
FROM's servers/<config>/ folders are copied into INTO/servers/, and each FROM's bench.log is appended
to INTO's under a line `# merged from <FROM folder name> (<its configurations>)` (the line alone when
that FROM has no bench.log, so the log still records the merge); served.md and served.svg are then
written again. Everything is checked before anything is written: folders without rows, rows of
another model, vLLM or GPU, a configuration measured twice, or a servers/<config>/ folder INTO has
already are refused, INTO untouched. FROM folders are only read.

Needs tools/ on the path (sparkmods.outputfile), as bench_served.py puts it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from benchlib.served_report import KEYS, write_report
from sparkmods.errors import SparkmodsError
from sparkmods.outputfile import write_atomic


class MergeError(ValueError):
    """A merge refused or failed; the message names the folder and what to do."""


@dataclass(frozen=True)
class Merged:
    """What one FROM brought into INTO: for the line the command prints."""

    source: Path
    rows: int
    configs: tuple[str, ...]


def _rows(folder: Path) -> list[dict]:
    """The rows of folder/served.json, each a bench_served.py row."""
    path = folder / "served.json"
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MergeError(f"{folder}: cannot read served.json ({exc}); pass a results folder bench_served.py "
                         "wrote") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(KEYS) <= set(r) for r in rows):
        raise MergeError(f"{path}: not a list of bench_served.py rows (each needs {', '.join(KEYS)}); pass a "
                         "results folder bench_served.py wrote")
    return rows


def _identity(folder: Path, rows: Sequence[dict]) -> tuple[str, str, str] | None:
    """(model, vllm, gpu) all of folder's rows share; None when it has none."""
    found = {(r["model"], r["vllm"], r["gpu"]) for r in rows}
    if len(found) > 1:
        named = "; ".join(", ".join(map(str, i)) for i in sorted(found, key=str))
        raise MergeError(f"{folder}: rows of more than one model, vLLM and GPU ({named}); split them by hand first")
    return next(iter(found), None)


def _configs(rows: Sequence[dict]) -> list[str]:
    return list(dict.fromkeys(str(r["config"]) for r in rows))


def _servers(folder: Path) -> list[Path]:
    """folder/servers/<config>/ folders, by name."""
    servers = folder / "servers"
    return sorted(p for p in servers.iterdir() if p.is_dir()) if servers.is_dir() else []


def _check(into: Path, sources: Sequence[Path]) -> tuple[list[dict], list[list[dict]]]:
    """INTO's rows and each FROM's, once every refusal has been ruled out."""
    rows = _rows(into)
    identity, owner = _identity(into, rows), into
    seen = {c: into for c in _configs(rows)}
    servers = into / "servers"
    served = {p.name: into for p in servers.iterdir()} if servers.is_dir() else {}
    merged = []
    for source in sources:
        if source.resolve() == into.resolve():
            raise MergeError(f"{source}: is INTO itself; pass the other run's results folder as FROM")
        theirs = _rows(source)
        if not theirs:
            raise MergeError(f"{source}: served.json holds no rows; nothing to merge, leave the folder out")
        other = _identity(source, theirs)
        if identity is None:
            identity, owner = other, source
        elif other != identity:
            raise MergeError(f"{source}: rows of {', '.join(map(str, other or ()))}, but {owner} holds rows of "
                             f"{', '.join(map(str, identity))}; merge only folders of one model, vLLM and GPU")
        for config in _configs(theirs):
            if config in seen:
                raise MergeError(f"{source}: configuration {config} is in {seen[config]} already; merge each "
                                 "configuration once (remove its rows from one folder, or leave that folder out)")
        for folder in _servers(source):
            if folder.name in served:
                raise MergeError(f"{source}: servers/{folder.name}/ is in {served[folder.name]} already; keep one "
                                 "of the two and remove the other first")
        seen.update({c: source for c in _configs(theirs)})
        served.update({p.name: source for p in _servers(source)})
        merged.append(theirs)
    return rows, merged


def _log(into: Path, sources: Sequence[Path], merged: Sequence[list[dict]]) -> bytes:
    """INTO's bench.log with each FROM's appended under its `# merged from` line."""
    log = into / "bench.log"
    out = log.read_bytes() if log.is_file() else b""
    for source, rows in zip(sources, merged):
        if out and not out.endswith(b"\n"):
            out += b"\n"
        out += f"# merged from {source.name} ({', '.join(_configs(rows))})\n".encode()
        if (source / "bench.log").is_file():
            out += (source / "bench.log").read_bytes()
    return out


def merge(into: Path, sources: Sequence[Path]) -> list[Merged]:
    """Merge each of sources into `into` (see the module's docstring); what each brought.

    A step that fails undoes the ones before it (copied servers/ folders removed, bench.log put
    back), so the merge can simply be run again; served.json is replaced last, by rename."""
    log_path, servers = into / "bench.log", into / "servers"
    try:
        rows, merged = _check(into, sources)
        old_log = log_path.read_bytes() if log_path.is_file() else None
    except OSError as exc:
        raise MergeError(f"{exc.filename or into}: cannot read it ({exc.strerror or exc}); make it readable "
                         "and run the merge again") from None
    made: list[Path] = []  # what to remove on failure, newest last
    try:
        for folder in (f for source in sources for f in _servers(source)):
            if not servers.is_dir():
                servers.mkdir()
                made.append(servers)
            made.append(servers / folder.name)
            shutil.copytree(folder, servers / folder.name)
        write_atomic(log_path, _log(into, sources, merged))
        write_atomic(into / "served.json", json.dumps(rows + [r for m in merged for r in m], indent=1) + "\n")
    except (OSError, SparkmodsError) as exc:
        for path in reversed(made):
            shutil.rmtree(path, ignore_errors=True)
        try:
            if old_log is None:
                log_path.unlink(missing_ok=True)
            else:
                write_atomic(log_path, old_log)
        except (OSError, SparkmodsError):
            pass
        raise MergeError(f"{into}: merge failed and was undone ({exc}); fix that and run it again") from None
    try:
        write_report(into)
    except OSError as exc:
        raise MergeError(f"{into}: rows merged, but served.md/.svg not written ({exc}); run "
                         f"`python3 ci/bench/benchlib/served_report.py {into}`") from None
    return [Merged(source, len(m), tuple(_configs(m))) for source, m in zip(sources, merged)]
