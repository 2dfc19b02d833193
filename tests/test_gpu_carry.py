"""ci/gpu/carry.py: pieces reassemble into the exact files, and any damage is refused.

The GPU machine gets vLLM only through this path, so a wrong byte would surface as an
obscure import error there, minutes into a scarce lease; these tests run the split, receive
and reassemble halves for real on files written here (the download half needs PyPI).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from scriptload import load_script

ROOT = Path(__file__).resolve().parents[1]


def _carry():
    return load_script(ROOT / "ci" / "gpu" / "carry.py")


@pytest.fixture()
def files(tmp_path: Path) -> list[Path]:
    src = tmp_path / "src"
    src.mkdir()
    out = []
    for i, size in enumerate([10_000, 1, 25_000, 7]):
        f = src / f"pkg{i}-1.0-py3-none-any.whl"
        f.write_bytes(os.urandom(size))
        out.append(f)
    return out


def test_the_repository_and_one_piece_fit_one_call() -> None:
    """A call carries the tracked tree beside one piece (and its manifest, under 1 MiB): a tree grown
    past what PIECE_BYTES leaves would make every carry fail on the GPU machine, so it fails here."""
    carry = _carry()
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    tree = sum((ROOT / n).stat().st_size for n in names.decode().split("\0") if n and (ROOT / n).is_file())
    assert tree + carry.PIECE_BYTES + (1 << 20) <= carry.CALL_BYTES, (
        f"tracked files {tree / 2**20:.1f} MiB + a {carry.PIECE_BYTES / 2**20:.0f} MiB piece exceed "
        f"{carry.CALL_BYTES / 2**20:.0f} MiB: lower PIECE_BYTES in ci/gpu/carry.py and prepare the carries again")


def _ship(carry, files, tmp_path: Path, piece: int) -> Path:
    out = tmp_path / "carry"
    carry._split(files, out, piece_bytes=piece)
    return out


def test_pieces_reassemble_exactly_in_any_arrival_order(files, tmp_path):
    carry = _carry()
    out = _ship(carry, files, tmp_path, piece=4096)
    pieces = sorted(out.iterdir())
    assert len(pieces) == -(-sum(f.stat().st_size for f in files) // 4096)
    stage = tmp_path / "stage"
    for folder in reversed(pieces):  # one call per piece, any order
        one = tmp_path / "call" / folder.name
        one.parent.mkdir(exist_ok=True)
        os.replace(folder, one)
        carry.receive(one.parent, stage)
        os.replace(one, folder)
    rebuilt = carry.reassemble(stage)
    assert [p.name for p in rebuilt] == sorted(f.name for f in files)
    for f in files:
        assert (stage / "wheels" / f.name).read_bytes() == f.read_bytes()


def test_missing_piece_is_named(files, tmp_path, capsys):
    carry = _carry()
    out = _ship(carry, files, tmp_path, piece=8192)
    stage = tmp_path / "stage"
    carry.receive(out, stage)
    (stage / "p01.part").unlink()
    with pytest.raises(SystemExit) as exc:
        carry.reassemble(stage)
    assert exc.value.code == 2
    assert "pieces not received yet: p01" in capsys.readouterr().err


def test_damaged_piece_is_refused_on_receive(files, tmp_path, capsys):
    carry = _carry()
    out = _ship(carry, files, tmp_path, piece=8192)
    data = out / "p02" / "data"
    raw = bytearray(data.read_bytes())
    raw[5] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(SystemExit):
        carry.receive(out, tmp_path / "stage")
    assert "p02/data: sha256 differs" in capsys.readouterr().err


def test_damage_after_staging_is_caught_by_the_file_hash(files, tmp_path, capsys):
    carry = _carry()
    out = _ship(carry, files, tmp_path, piece=8192)
    stage = tmp_path / "stage"
    carry.receive(out, stage)
    part = stage / "p00.part"
    raw = bytearray(part.read_bytes())
    raw[-1] ^= 0x01
    part.write_bytes(bytes(raw))
    with pytest.raises(SystemExit):
        carry.reassemble(stage)
    assert "sha256 differs after reassembly" in capsys.readouterr().err


def _wheel(folder: Path, name: str, requires: list[str], version: str = "1.0") -> Path:
    """A wheel holding only METADATA with these Requires-Dist lines."""
    import zipfile

    whl = folder / f"{name}-{version}-py3-none-any.whl"
    meta = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
                     + [f"Requires-Dist: {r}" for r in requires])
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return whl


def test_requirements_follow_markers_and_extras(tmp_path):
    carry = _carry()
    whl = _wheel(tmp_path, "demo", ["always>=1", "winonly; sys_platform == 'win32'",
                                    "armonly; platform_machine == 'aarch64'", "x86only; platform_machine == 'x86_64'",
                                    "extraone; extra == 'standard'", "oldpy; python_version < '3.10'"])
    names = [r.split(">")[0].split(";")[0] for r in carry._requirements(whl)]
    assert names == ["always", "x86only"]
    with_extra = [r.split(";")[0] for r in carry._requirements(whl, ["standard"])]
    assert "extraone" in with_extra


def test_extras_asked_later_for_a_chosen_package_are_resolved(tmp_path, monkeypatch):
    """fastapi[standard] pulls pydantic-extra-types bare, mistral-common then needs its
    [pycountry]: the closure must carry pycountry (vLLM 0.21.0's server failed without it)."""
    carry = _carry()
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "vllm", ["fastapi", "mistral-common"])
    _wheel(index, "fastapi", ["pet"])
    _wheel(index, "mistral_common", ["pet[country]>=1"])
    _wheel(index, "pet", ["country; extra == 'country'"])
    _wheel(index, "country", [])
    got = [p.name.split("-")[0] for p in _resolve_against(carry, index, monkeypatch)]
    assert got == ["country", "fastapi", "mistral_common", "pet"]


def test_extra_requirements_are_carried_with_their_closure(tmp_path, monkeypatch, capsys):
    """`prepare --extra ray`: Ray is not among vLLM's requirements, so --executor ray needs it
    carried, with what it needs and the machine lacks; a malformed line is one error, exit 2."""
    carry = _carry()
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "vllm", ["fastapi"])
    _wheel(index, "fastapi", [])
    _wheel(index, "ray", ["msgpack", "cgraph-only; extra == 'cgraph'"])
    _wheel(index, "msgpack", [])
    got = [p.name.split("-")[0] for p in _resolve_against(carry, index, monkeypatch, extra=["ray"])]
    assert got == ["fastapi", "msgpack", "ray"]
    assert [p.name.split("-")[0] for p in _resolve_against(carry, index, monkeypatch)] == ["fastapi"]
    with pytest.raises(SystemExit) as exc:
        carry.main(["prepare", "--vllm", "0.21.0", "--extra", "ray[", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and "carry: error: --extra:" in capsys.readouterr().err


def _resolve_against(carry, index: Path, monkeypatch, extra=(), machine=None, cuda_libs=(),
                     left: list | None = None, machine_libs=()) -> list[Path]:
    """carry._resolve of index/vllm-1.0 with `_download` answering from index as pip would
    (the newest wheel the requirement accepts) and `machine` (name -> version or None) on the
    machine; the CUDA pins left to the machine are appended to `left`."""
    left = [] if left is None else left
    from packaging.requirements import Requirement
    from packaging.version import Version

    def download(spec: str, dest: Path) -> Path:
        req = Requirement(spec)
        found = [w for w in index.glob(carry._norm(req.name).replace("-", "_") + "-*.whl")
                 if req.specifier.contains(w.name.split("-")[1])]
        if not found:
            raise SystemExit(f"no wheel for {spec}")
        return max(found, key=lambda w: Version(w.name.split("-")[1]))

    monkeypatch.setattr(carry, "_machine", lambda: dict(machine or {}))
    monkeypatch.setattr(carry, "_download", download)
    closure = carry._resolve(index / "vllm-1.0-py3-none-any.whl", index, extra, cuda_libs, machine_libs)
    left.extend(closure.left)
    return sorted(closure.chosen.values())


def test_a_release_that_refuses_vllms_pin_gives_way_to_an_older_one(tmp_path, monkeypatch):
    """vLLM 0.26.0 pins apache-tvm-ffi==0.1.10; the newest xgrammar wants >=0.1.11 (the server
    then failed on the GPU machine): an older xgrammar that accepts the pin is carried."""
    carry = _carry()
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "vllm", ["ffi==1.0", "grammar>=1"])
    _wheel(index, "ffi", [], version="1.0")
    _wheel(index, "ffi", [], version="1.1")
    _wheel(index, "grammar", ["ffi>=1.1"], version="2.0")
    _wheel(index, "grammar", ["ffi>=1.1"], version="1.9")
    _wheel(index, "grammar", ["ffi>=1.0"], version="1.8")
    got = sorted(p.name for p in _resolve_against(carry, index, monkeypatch))
    assert got == ["ffi-1.0-py3-none-any.whl", "grammar-1.8-py3-none-any.whl"]


def test_a_clash_between_two_chosen_packages_stops_naming_both(tmp_path, monkeypatch, capsys):
    carry = _carry()
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "vllm", ["ffi", "grammar"])
    _wheel(index, "ffi", [], version="1.0")
    _wheel(index, "grammar", ["ffi>=2"])
    with pytest.raises(SystemExit):
        _resolve_against(carry, index, monkeypatch)
    assert "grammar needs 'ffi>=2' but ffi-1.0-py3-none-any.whl was chosen" in capsys.readouterr().err


def test_a_machine_package_at_a_refused_version_is_carried(tmp_path, monkeypatch):
    """vLLM 0.27+ pins torch==2.13.0 where the machine has 2.11.0: torch comes along, with the
    triton it pins; a machine package without a known version, or at an accepted one, stays."""
    carry = _carry()
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "vllm", ["torch==2.13.0", "torchaudio==2.11.0", "numpy"])
    _wheel(index, "torch", ["triton==3.7.1", "sympy>=1.13"], version="2.13.0")
    _wheel(index, "triton", [], version="3.7.1")
    machine = {"torch": "2.11.0", "torchaudio": "2.11.0", "triton": "3.6.0", "numpy": None, "sympy": None}
    got = [p.name for p in _resolve_against(carry, index, monkeypatch, machine=machine)]
    assert got == ["torch-2.13.0-py3-none-any.whl", "triton-3.7.1-py3-none-any.whl"]
    machine["torch"] = "2.13.0"
    assert _resolve_against(carry, index, monkeypatch, machine=machine) == []


def test_cuda_libraries_of_a_carried_torch_stay_with_the_machine_unless_named(tmp_path, monkeypatch):
    carry = _carry()
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "vllm", ["torch==2.13.0", "nvidia-ml-py"])
    _wheel(index, "torch", ["nvidia-cudnn-cu13==9.20.0.48", "cuda-toolkit[cublas]==13.0.3"], version="2.13.0")
    _wheel(index, "nvidia_cudnn_cu13", [], version="9.20.0.48")
    _wheel(index, "cuda_toolkit", [], version="13.0.3")
    machine = {"torch": "2.11.0", "nvidia-cudnn-cu13": None, "cuda-toolkit": None, "nvidia-ml-py": None}
    left: list = []
    got = [p.name.split("-")[0] for p in _resolve_against(carry, index, monkeypatch, machine=machine, left=left)]
    assert got == ["torch"]
    assert left == ["nvidia-cudnn-cu13==9.20.0.48 (torch)", "cuda-toolkit==13.0.3 (torch)"]
    got = [p.name.split("-")[0] for p in _resolve_against(carry, index, monkeypatch, machine=machine,
                                                          cuda_libs=["nvidia_cudnn_cu13"])]
    assert got == ["nvidia_cudnn_cu13", "torch"]


def test_a_cuda_12_library_named_as_machine_lib_stays_behind(tmp_path, monkeypatch):
    """vLLM 0.19.1's torch 2.10 asks for CUDA 12 wheels the machine lacks: those named with
    --machine-lib (a CUDA 13 package there gives the same file in the same folder) stay behind
    and are listed as left; the others are carried."""
    carry = _carry()
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "vllm", ["torch==2.10.0"])
    _wheel(index, "torch", ["nvidia-cudnn-cu12==9.10.2.21", "nvidia-cublas-cu12==12.8.4.1"], version="2.10.0")
    _wheel(index, "nvidia_cudnn_cu12", [], version="9.10.2.21")
    _wheel(index, "nvidia_cublas_cu12", [], version="12.8.4.1")
    machine = {"torch": "2.11.0", "nvidia-cudnn-cu13": None}
    got = [p.name.split("-")[0] for p in _resolve_against(carry, index, monkeypatch, machine=machine)]
    assert got == ["nvidia_cublas_cu12", "nvidia_cudnn_cu12", "torch"]
    left: list = []
    got = [p.name.split("-")[0] for p in _resolve_against(carry, index, monkeypatch, machine=machine, left=left,
                                                          machine_libs=["nvidia_cudnn_cu12"])]
    assert got == ["nvidia_cublas_cu12", "torch"]
    assert left == ["nvidia-cudnn-cu12==9.10.2.21 (torch, a file of the same name and folder)"]


def test_install_links_the_machines_folders_a_site_with_carried_cuda_libraries_lacks(tmp_path, monkeypatch, capsys):
    """A site holding carried CUDA 12 libraries (nvidia/cublas) gets the machine's other folders
    (nvidia/cudnn, nvidia/cu13) linked in beside them, its own left as carried."""
    carry = _carry()
    src = tmp_path / "src"
    src.mkdir()
    torch = _installable(src, "torch", "torch")
    cublas = _installable(src, "nvidia_cublas_cu12", "nvidia/cublas")
    machine = tmp_path / "machine"
    for folder in ("cudnn/lib", "cu13/lib", "cublas/lib"):
        (machine / "nvidia" / folder).mkdir(parents=True)
    monkeypatch.syspath_prepend(str(machine))
    out, stage, site = tmp_path / "carry", tmp_path / "stage", tmp_path / "site"
    carry._split([torch, cublas], out, releases={"9.9": {"wheels": [torch.name, cublas.name], "left_to_machine": []}})
    carry.receive(out, stage)
    carry.install(site, "9.9", stage)
    nvidia = site / "nvidia"
    assert nvidia.is_dir() and not nvidia.is_symlink()
    assert not (nvidia / "cublas").is_symlink() and (nvidia / "cublas" / "__init__.py").is_file()
    assert sorted(p.name for p in nvidia.iterdir() if p.is_symlink()) == ["cu13", "cudnn"]
    assert (nvidia / "cudnn").resolve() == (machine / "nvidia" / "cudnn").resolve()
    assert "the machine's cu13, cudnn linked into" in capsys.readouterr().out


def test_a_release_is_rebuilt_from_its_own_pieces_only(files, tmp_path, capsys):
    """The first release given arrives first: it installs before the other's pieces came;
    the other names the pieces it still needs; an unknown release is one line."""
    carry = _carry()
    out = tmp_path / "carry"
    releases = {"1.0": {"wheels": [files[0].name, files[1].name], "left_to_machine": []},
                "2.0": {"wheels": [files[1].name, files[2].name, files[3].name], "left_to_machine": []}}
    carry._split(files, out, piece_bytes=4096, releases=releases)
    stage = tmp_path / "stage"
    first = sorted(out.iterdir())[:3]  # 10,001 bytes of release 1.0 lie in the first three pieces
    call = tmp_path / "call"
    call.mkdir()
    for folder in first:
        os.replace(folder, call / folder.name)
    carry.receive(call, stage)
    rebuilt = carry.reassemble(stage, "1.0")
    assert [p.read_bytes() for p in rebuilt] == [files[0].read_bytes(), files[1].read_bytes()]
    with pytest.raises(SystemExit):
        carry.reassemble(stage, "2.0")
    assert "pieces not received yet: p03, p04, p05, p06, p07, p08;" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        carry.reassemble(stage, "3.0")
    assert "vLLM 3.0 was not prepared in these pieces (prepared: 1.0, 2.0)" in capsys.readouterr().err


def _installable(folder: Path, name: str, package: str) -> Path:
    """A minimal valid wheel that pip installs offline: one package folder."""
    import zipfile

    whl = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(f"{package}/__init__.py", "")
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return whl


def test_install_links_the_machines_cuda_libraries_beside_a_carried_torch(tmp_path, monkeypatch, capsys):
    """A torch carried without its CUDA wheels finds libraries by its rpath ($ORIGIN/../../nvidia):
    install points SITE/nvidia at the machine's own nvidia/ folder."""
    carry = _carry()
    src = tmp_path / "src"
    src.mkdir()
    wheel = _installable(src, "torch", "torch")
    machine = tmp_path / "machine"
    (machine / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(machine))
    out, stage, site = tmp_path / "carry", tmp_path / "stage", tmp_path / "site"
    carry._split([wheel], out, releases={"9.9": {"wheels": [wheel.name], "left_to_machine": []}})
    carry.receive(out, stage)
    carry.install(site, "9.9", stage)
    assert (site / "torch" / "__init__.py").is_file()
    assert (site / "nvidia").is_symlink() and (site / "nvidia").resolve() == (machine / "nvidia").resolve()
    assert "torch uses the machine's CUDA libraries" in capsys.readouterr().out


def test_a_pin_on_what_is_left_behind_never_holds_a_requirement_back(tmp_path, monkeypatch):
    """vLLM 0.32 pins nvidia-cutlass-dsl, which is not carried (SKIP): the newest
    nvidia-cudnn-frontend, which asks for a newer cutlass, is still the one carried."""
    carry = _carry()
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "vllm", ["kernels==1.0", "front>=1"])
    _wheel(index, "front", ["kernels>=2"], version="2.0")
    _wheel(index, "front", ["kernels>=1"], version="1.0")
    monkeypatch.setattr(carry, "_SKIPPED", {"kernels"})
    got = [p.name for p in _resolve_against(carry, index, monkeypatch)]
    assert got == ["front-2.0-py3-none-any.whl"]
