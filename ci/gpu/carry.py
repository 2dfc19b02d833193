#!/usr/bin/env python3
"""Carry vLLM releases (and the torch they pin) to a GPU machine that has no network, in pieces.

Why it exists: the GPU machine we test on (an H100 with torch 2.11.0+cu130, no package index)
accepts at most 64 MiB per call, while a vLLM wheel is ~300 MiB and needs ~90 small
requirements the machine lacks; vLLM 0.27-0.32 pin torch 2.13 and 0.33 pins torch 2.14. The work
splits in two halves:

  here (network):  python3 ci/gpu/carry.py prepare --vllm 0.33.0 --vllm 0.32.0 --out .carry
      downloads each release's x86_64 wheel (sha256 checked against the index), resolves what the
      machine does not have from each wheel's METADATA (ci/gpu/device_packages.txt: the machine's
      packages, with versions where one matters): the requirements it lacks, and the ones it has
      at a version the release refuses (torch, torchvision, triton). CUDA libraries a carried
      torch asks for stay behind unless named with --cuda-lib: the machine's CUDA 13 ones are
      tried first (torch 2.13 and 2.14 need a newer NCCL than the machine's: --cuda-lib
      nvidia-nccl-cu13; the others load).
      Writes pieces `.carry/p00`, `.carry/p01`, ... each under the limit, every file once, the
      releases' files in the order given, with `manifest.json` (sha256 of every piece and every
      file, its offset, which files make which release) in each.
  there (one call per piece, consecutive: the machine keeps /tmp while it is held):
      python3 ci/gpu/carry.py receive --from .carry                    # stages + verifies pieces
      python3 ci/gpu/carry.py install --release 0.33.0 --site /tmp/site-0.33.0
          as soon as the pieces holding that release's files arrived (the first release given
          needs only the first pieces).

`install` rebuilds the release's files from their pieces, verifies every sha256, and installs
with pip --no-index --no-deps --target, so nothing is resolved on the machine and nothing
unverified is installed; where it installed a torch without CUDA libraries, it links the site's
nvidia/ to the machine's own (torch finds them beside itself). The receive/install half needs
only the stdlib and pip.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path
from typing import Dict, Iterable, List, NoReturn, Optional, Set

INDEX = "https://pypi.org/simple"
CALL_BYTES = 64 * 1024 * 1024  # the most one call to the GPU machine carries: the working tree and one piece
PIECE_BYTES = 40 * 1024 * 1024  # leaves 24 MiB for the tree (tests/test_gpu_carry.py checks it still fits)
STAGE = Path(os.environ.get("SPARKMODS_CARRY_STAGE", "/tmp/sparkmods-carry"))
HERE = Path(__file__).resolve().parent
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + [  # pip matches each tag exactly
    "manylinux2014_x86_64", "manylinux1_x86_64"]
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fail(message: str) -> NoReturn:
    print(f"carry: error: {message}", file=sys.stderr)
    raise SystemExit(2)


# ---------------------------------------------------------------- prepare (host, network)

def _vllm_wheel(version: str, cache: Path) -> Path:
    """Download the x86_64 wheel of `version` (highest build tag), verified against the index."""
    req = urllib.request.Request(f"{INDEX}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        files = json.load(resp)["files"]
    pattern = re.compile(rf"^vllm-{re.escape(version)}(-(\d+))?-cp\d+-abi3-manylinux_[\d_]+_x86_64\.whl$")
    found = [(int(m.group(2) or 0), f) for f in files if (m := pattern.match(f["filename"]))]
    if not found:
        _fail(f"vllm {version}: no x86_64 wheel on {INDEX}; name a release that has one (0.18.0 or newer)")
    _, entry = max(found, key=lambda item: item[0])
    dest = cache / entry["filename"]
    want = entry["hashes"]["sha256"]
    if not dest.is_file() or _sha256(dest) != want:
        print(f"downloading {entry['filename']} ({entry.get('size', 0) / 2**20:.0f} MiB)", flush=True)
        tmp = dest.with_suffix(".part")
        with urllib.request.urlopen(entry["url"], timeout=600) as resp, tmp.open("wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)
        if _sha256(tmp) != want:
            tmp.unlink()
            _fail(f"{entry['filename']}: sha256 differs from the index; try again")
        os.replace(tmp, dest)
    return dest


def _requirements(wheel: Path, extras: Iterable[str] = ()) -> List[str]:
    """Requires-Dist lines of a wheel that apply on the GPU machine (Linux x86_64, CPython 3.12)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode("utf-8", "replace")
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        wanted = [""] + list(extras)
        if req.marker is None or any(req.marker.evaluate({**MARKER_ENV, "extra": e}) for e in wanted):
            out.append(str(req))
    return out


@functools.cache
def _download(requirement: str, dest: Path) -> Path:
    """One py3.12 manylinux x86_64 wheel for `requirement` (no dependencies), via pip; asked once
    per prepare (releases share most requirement lines).

    The file is the one pip names ("Saved ..." or "File was already downloaded ..."): dest may
    hold other versions of the same project from an earlier resolution.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest), requirement]
    for plat in PLATFORMS:
        cmd[-1:-1] = ["--platform", plat]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        _fail(f"cannot download a py3.12 x86_64 wheel for {requirement!r}: {proc.stderr.strip().splitlines()[-1:]}")
    named = re.findall(r"^\s*(?:Saved|File was already downloaded) (.+\.whl)\s*$", proc.stdout, re.MULTILINE)
    if len(named) != 1:
        _fail(f"pip download {requirement!r} named {len(named)} wheels; expected one")
    return Path(named[0])


def _version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def _clashes(wheel: Path, pins: Dict[str, str]) -> Optional[str]:
    """The first requirement of `wheel` that refuses a version vLLM pins (`==`), or None; pins of
    what is left behind (SKIP) never clash, since that is not carried."""
    from packaging.requirements import Requirement

    for line in _requirements(wheel):
        req = Requirement(line)
        pinned = None if _norm(req.name) in _SKIPPED else pins.get(_norm(req.name))
        if pinned is not None and not req.specifier.contains(pinned, prereleases=True):
            return line
    return None


def _pins(wheel: Path) -> Dict[str, str]:
    """vLLM's exact pins (`name==X`): the versions its own build was made against."""
    from packaging.requirements import Requirement

    out = {}
    for line in _requirements(wheel):
        req = Requirement(line)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            out[_norm(req.name)] = exact[0]
    return out


# Requirements left behind on purpose: optional kernel stacks that vLLM imports only when asked
# for (FlashInfer: avoided with VLLM_USE_FLASHINFER_SAMPLER=0 and the Triton DeltaNet prefill;
# TileLang, CuTe DSL, QuACK, TokenSpeed: alternative kernels for other models), together
# ~560 MiB, ten times the rest; from 0.26: video decoding (torchcodec, PyNvVideoCodec) and the
# CUDA JIT compilers behind them (nvcc, NVVM), ~165 MiB, unused by a text model). A run that
# needs one fails at import with its name. xgrammar's apache-tvm-ffi is NOT skipped: vLLM's
# server imports xgrammar at start-up.
SKIP = {"flashinfer-python", "flashinfer-cubin", "tilelang", "nvidia-cutlass-dsl", "quack-kernels",
        "tokenspeed-triton", "tokenspeed-mla", "z3-solver", "cuda-tile", "torchcodec", "pynvvideocodec",
        "nvidia-cuda-nvcc", "nvidia-nvvm"}


_SKIPPED = {_norm(n) for n in SKIP}
# CUDA libraries: a carried torch asks for exact versions of these; the machine's own CUDA 13 ones
# are tried first (`prepare --cuda-lib NAME` carries NAME at the version torch pins instead).
CUDA_LIB = re.compile(r"^(nvidia-(?!ml-py$)|cuda-toolkit$)")


def _machine() -> Dict[str, Optional[str]]:
    """What the machine has: name -> version where the file gives one (`name==X`), else None."""
    lines = (HERE / "device_packages.txt").read_text(encoding="utf-8").splitlines()
    have: Dict[str, Optional[str]] = {}
    for line in lines:
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            have[_norm(name)] = version or None
    return have


class _Closure:
    """The wheels one release needs on the machine, and the CUDA pins left to the machine's own."""

    def __init__(self) -> None:
        self.chosen: Dict[str, Path] = {}
        self.extras: Dict[str, Set[str]] = {}  # extras already resolved per chosen name
        self.left: List[str] = []


def _machine_keeps(req, have: Dict[str, Optional[str]], cuda_libs: Set[str], by: str, closure: _Closure,
                   machine_libs: Set[str] = frozenset()) -> bool:
    """True when the machine's own package serves `req` (so nothing is carried for it)."""
    name = _norm(req.name)
    if name in _SKIPPED:
        return True
    if name in machine_libs:
        closure.left.append(f"{req.name}{req.specifier} ({by}, a file of the same name and folder)")
        return True
    if name not in have:
        return False
    version = have[name]
    if CUDA_LIB.match(name):
        if name in cuda_libs and by != "vllm":
            return False
        if version is None or not req.specifier.contains(version, prereleases=True):
            closure.left.append(f"{req.name}{req.specifier} ({by})")
        return True
    return version is None or req.specifier.contains(version, prereleases=True)


def _resolve(vllm_wheel: Path, deps_dir: Path, extra: Iterable[str] = (), cuda_libs: Iterable[str] = (),
             machine_libs: Iterable[str] = ()) -> _Closure:
    """Breadth-first closure of what the machine lacks, one wheel per name, from vLLM's own and
    the `extra` requirement lines (e.g. "ray": vLLM does not require it).

    A package the machine has is carried when the machine's version (where device_packages.txt
    names one) is refused: torch, torchvision and triton for a release that pins another torch.
    Not pip's backtracking resolver, but the two conflicts that occur: a package whose newest
    release needs another version than vLLM pins is taken at an older release that accepts the
    pin (vLLM 0.26.0 pins apache-tvm-ffi==0.1.10, xgrammar 0.2.8 wants >=0.1.11, 0.2.7 takes it);
    any other clash between two chosen versions stops with both named.
    """
    from packaging.requirements import Requirement

    have = _machine()
    carried_cuda, standing_in = {_norm(n) for n in cuda_libs}, {_norm(n) for n in machine_libs}
    pins = _pins(vllm_wheel)
    todo = [(r, "vllm") for r in _requirements(vllm_wheel)] + [(r, "--extra") for r in extra]
    out = _Closure()
    while todo:
        line, by = todo.pop(0)
        req = Requirement(line)
        name = _norm(req.name)
        if name == "vllm" or _machine_keeps(req, have, carried_cuda, by, out, standing_in):
            continue
        if name in out.chosen:
            if not req.specifier.contains(_version(out.chosen[name]), prereleases=True):
                _fail(f"{by} needs {line!r} but {out.chosen[name].name} was chosen; resolve it by hand")
            # A later requirement may ask for extras of a package chosen without them
            # (fastapi[standard] pulls pydantic-extra-types; mistral-common needs its [pycountry]).
            more = set(req.extras) - out.extras[name]
            if more:
                out.extras[name] |= more
                todo.extend((r, name) for r in _requirements(out.chosen[name], more))
            continue
        spec = f"{req.name}{req.specifier}"
        wheel = _download(spec, deps_dir)
        for _ in range(10):
            clash = _clashes(wheel, pins)
            if clash is None:
                break
            spec = req.name + ",".join(filter(None, [str(req.specifier), f"<{_version(wheel)}"]))
            print(f"  ~ {wheel.name} needs {clash!r} against vLLM's pin; trying {spec}", flush=True)
            wheel = _download(spec, deps_dir)
        else:
            _fail(f"no release of {req.name} in the last ten accepts vLLM's pins; resolve it by hand")
        out.chosen[name], out.extras[name] = wheel, set(req.extras)
        print(f"  + {wheel.name}", flush=True)
        todo.extend((r, name) for r in _requirements(wheel, req.extras))
    return out


def _split(files: List[Path], out: Path, piece_bytes: int = PIECE_BYTES,
           releases: Optional[Dict[str, dict]] = None) -> None:
    """Concatenate `files` into one stream cut into pieces of piece_bytes, with a manifest that
    gives every file's offset in the stream, so any file can be rebuilt from its own pieces."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    entries, offset = [], 0
    for f in files:
        size = f.stat().st_size
        entries.append({"name": f.name, "size": size, "sha256": _sha256(f), "offset": offset})
        offset += size
    index, piece, written = 0, None, 0
    for f in files:
        with f.open("rb") as fh:
            while True:
                if piece is None or written >= piece_bytes:
                    if piece is not None:
                        piece.close()
                    folder = out / f"p{index:02d}"
                    folder.mkdir()
                    piece, written = (folder / "data").open("wb"), 0
                    index += 1
                block = fh.read(min(1 << 20, piece_bytes - written))
                if not block:
                    break
                piece.write(block)
                written += len(block)
    if piece is not None:
        piece.close()
    manifest = {"piece_bytes": piece_bytes, "files": entries, "releases": releases or {},
                "pieces": [{"name": f.name, "sha256": _sha256(f / "data")} for f in sorted(out.iterdir())]}
    for folder in sorted(out.iterdir()):
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def prepare(versions: List[str], out: Path, cache: Path, extra: Iterable[str] = (), cuda_libs: Iterable[str] = (),
            machine_libs: Iterable[str] = ()) -> None:
    """Pieces holding every file the releases need, each file once, in the order given."""
    cache.mkdir(parents=True, exist_ok=True)
    files: Dict[str, Path] = {}
    releases: Dict[str, dict] = {}
    for version in versions:
        wheel = _vllm_wheel(version, cache)
        deps_dir = cache / "deps"
        deps_dir.mkdir(exist_ok=True)
        print(f"resolving requirements of {wheel.name} the GPU machine lacks", flush=True)
        closure = _resolve(wheel, deps_dir, extra, cuda_libs, machine_libs)
        mine = sorted(closure.chosen.values()) + [wheel]
        for path in mine:
            files.setdefault(path.name, path)
        releases[version] = {"wheels": [p.name for p in mine], "left_to_machine": closure.left}
        for line in closure.left:
            print(f"  = {line}: left to the machine's own CUDA libraries", flush=True)
    _split(list(files.values()), out, releases=releases)
    total = sum(p.stat().st_size for p in out.glob("p*/data"))
    pieces = sorted(p.name for p in out.glob("p*"))
    print(f"{len(files)} wheels for vLLM {', '.join(versions)}: {total / 2**20:.0f} MiB in {len(pieces)} pieces "
          f"under {out}/ ({pieces[0]}-{pieces[-1]}); carry one piece per call")


# ---------------------------------------------------------------- receive / install (GPU machine)

def receive(src: Path, stage: Path = STAGE) -> None:
    """Copy the pieces that travelled with this call into the stage, verifying each."""
    stage.mkdir(parents=True, exist_ok=True)
    got = 0
    for folder in sorted(src.glob("p*")):
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        want = {p["name"]: p["sha256"] for p in manifest["pieces"]}[folder.name]
        if _sha256(folder / "data") != want:
            _fail(f"{folder}/data: sha256 differs from the manifest; prepare again")
        shutil.copyfile(folder / "data", stage / f"{folder.name}.part")
        shutil.copyfile(folder / "manifest.json", stage / "manifest.json")
        got += 1
    have = sorted(p.stem for p in stage.glob("p*.part"))
    print(f"received {got} piece(s); staged: {', '.join(have) or 'none'}")


def _pieces_of(entry: dict, manifest: dict) -> List[str]:
    """Names of the pieces that hold the bytes of one file."""
    size, names = manifest.get("piece_bytes") or PIECE_BYTES, [p["name"] for p in manifest["pieces"]]
    first, last = entry["offset"] // size, (entry["offset"] + max(entry["size"], 1) - 1) // size
    return names[first:last + 1]


def reassemble(stage: Path = STAGE, release: Optional[str] = None) -> List[Path]:
    """Rebuild the carried files (all, or one release's) from the staged pieces; each one's
    sha256 must match."""
    manifest = json.loads((stage / "manifest.json").read_text(encoding="utf-8"))
    entries = manifest["files"]
    if release is not None:
        if release not in manifest.get("releases", {}):
            _fail(f"vLLM {release} was not prepared in these pieces (prepared: "
                  f"{', '.join(manifest.get('releases', {})) or 'none'}); prepare it")
        wanted = set(manifest["releases"][release]["wheels"])
        entries = [e for e in entries if e["name"] in wanted]
    needed = sorted({n for e in entries for n in _pieces_of(e, manifest)})
    missing = [n for n in needed if not (stage / f"{n}.part").is_file()]
    if missing:
        _fail(f"pieces not received yet: {', '.join(missing)}; carry them with `receive` first")
    wheels = stage / "wheels"
    wheels.mkdir(exist_ok=True)
    size = manifest.get("piece_bytes") or PIECE_BYTES
    for entry in entries:
        dest = wheels / entry["name"]
        h = hashlib.sha256()
        with dest.open("wb") as out:
            pos, left = entry["offset"], entry["size"]
            while left:
                part = stage / f"{manifest['pieces'][pos // size]['name']}.part"
                with part.open("rb") as fh:
                    fh.seek(pos % size)
                    block = fh.read(min(left, size - pos % size))
                if not block:
                    _fail(f"{entry['name']}: pieces end early; prepare again")
                out.write(block)
                h.update(block)
                pos, left = pos + len(block), left - len(block)
        if h.hexdigest() != entry["sha256"]:
            _fail(f"{entry['name']}: sha256 differs after reassembly; prepare again")
    return sorted(wheels / e["name"] for e in entries)


def _machine_nvidia(site: Path) -> Optional[Path]:
    """The machine's own nvidia/ package folder (CUDA libraries), outside `site`."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for place in (spec.submodule_search_locations or []) if spec else []:
        if Path(place).resolve().parent != site.resolve():
            return Path(place)
    return None


def install(site: Path, release: Optional[str] = None, stage: Path = STAGE) -> None:
    """Rebuild and verify the staged files (all, or one release's), install them into `site`."""
    wheels = reassemble(stage, release)
    site.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--target", str(site)] + [str(p) for p in wheels]
    subprocess.run(cmd, check=True)
    note = ""
    machine = _machine_nvidia(site) if (site / "torch").is_dir() else None
    if machine is not None and not (site / "nvidia").exists():
        (site / "nvidia").symlink_to(machine, target_is_directory=True)
        note = f"; torch uses the machine's CUDA libraries ({machine})"
    elif machine is not None and not (site / "nvidia").is_symlink():
        # Carried CUDA libraries of another major beside the ones left behind (--machine-lib): the
        # torch's rpath names nvidia/<lib>/lib, so each folder the site lacks points at the machine's.
        linked = [p.name for p in sorted(machine.iterdir()) if p.is_dir() and not (site / "nvidia" / p.name).exists()]
        for name in linked:
            (site / "nvidia" / name).symlink_to(machine / name, target_is_directory=True)
        if linked:
            note = f"; the machine's {', '.join(linked)} linked into {site / 'nvidia'}"
    print(f"installed {len(wheels)} wheels into {site} (sha256 verified){note}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="download and cut into pieces (here, with network)")
    p.add_argument("--vllm", required=True, action="append", metavar="VERSION",
                   help="a release to carry (repeatable; the first given arrives first)")
    p.add_argument("--out", type=Path, default=Path(".carry"))
    p.add_argument("--extra", action="append", default=[], metavar="REQUIREMENT",
                   help="also carry this requirement and what it needs (repeatable), e.g. ray for --executor ray")
    p.add_argument("--cuda-lib", action="append", default=[], metavar="NAME",
                   help="carry this CUDA library at the version a carried torch pins instead of using the "
                        "machine's own (repeatable), e.g. nvidia-nccl-cu13")
    p.add_argument("--cache", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparkmods" / "carry")
    p.add_argument("--machine-lib", action="append", default=[], metavar="NAME",
                   help="leave this CUDA library of a carried torch behind although the machine has it for "
                        "another CUDA major only: the machine's library of the same file name and folder "
                        "stands in (repeatable), e.g. nvidia-cudnn-cu12")
    r = sub.add_parser("receive", help="stage the pieces that came with this call (GPU machine)")
    r.add_argument("--from", dest="src", type=Path, default=Path(".carry"))
    i = sub.add_parser("install", help="rebuild, verify and install (GPU machine)")
    i.add_argument("--site", type=Path, required=True)
    i.add_argument("--release", metavar="VERSION", help="install only this release's files (default: all)")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        from packaging.requirements import InvalidRequirement, Requirement  # the prepare half only

        try:
            extra = [str(Requirement(line)) for line in args.extra]
        except InvalidRequirement as exc:
            _fail(f"--extra: {exc}")
        prepare(args.vllm, args.out, args.cache, extra, args.cuda_lib, args.machine_lib)
    elif args.cmd == "receive":
        receive(args.src)
    else:
        install(args.site, args.release)
    return 0


if __name__ == "__main__":
    sys.exit(main())
