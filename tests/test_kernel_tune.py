"""The rule both kernel mods share (mods/turboquant/files/sparkmods_kerneltune.py) and the tune table.

- fitting: a config is lowered by the shared rule until its byte model fits, and no config the
  mods can pick on an sm_12x part (99 KiB) is over that budget, shipped or tuned;
- the table: written by `sparkmods tune`, read by both mods (int8-lm-head's tuned_dispatch,
  turboquant's tuned_decode_table), refused in one log line when made on another GPU, with other
  kernels, malformed, writable by others or owned by someone else;
- `sparkmods tune` end to end on CPU under TRITON_INTERPRET=1 (tiny shapes): its table is one
  both mods read back on the same "GPU";
- both mods' patches carry the shared file byte for byte.

The GB10 readiness check (tests/test_gb10_readiness.py) proves the byte models cover what
Triton allocates; here the models are taken as given.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

import pytest

from extras import need

torch = need("torch")

from int8_lm_head_interp import REPO  # noqa: E402

SHARED = REPO / "mods" / "turboquant" / "files" / "sparkmods_kerneltune.py"
SM12X = 101376
GPU = {"name": "NVIDIA GB10", "capability": [12, 1]}


@pytest.fixture(scope="module")
def mods(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, ModuleType]:
    """int8_lm_head and tq_triton as the mods install them (from their patches); no kernel is
    launched here. Loaded with TRITON_INTERPRET=1, so that a first import of triton here leaves it
    in the mode the interpreter tests of this session need (see bench_turboquant.load_modules)."""
    import importlib

    from sparkmods.tuning import load_mod_package

    work = tmp_path_factory.mktemp("mods")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        need("triton")
        import triton.experimental.gluon  # noqa: F401  (bench_turboquant.load_modules imports it in the same mode)

        int8 = load_mod_package(REPO / "mods/int8-lm-head/patches/common/int8_lm_head.patch", "kt_test_int8", work)
        tq = load_mod_package(REPO / "mods/turboquant/patches/common/turboquant_files.patch", "kt_test_tq", work)

    return {"int8": importlib.import_module(int8.__name__ + ".int8_lm_head"),
            "tq": importlib.import_module(tq.__name__ + ".sparkmods_tq_triton"),
            "fmt": importlib.import_module(tq.__name__ + ".sparkmods_tq_format")}


def test_both_mods_install_the_shared_file_byte_for_byte(mods: Dict[str, ModuleType]) -> None:
    shared = SHARED.read_bytes()
    assert Path(mods["int8"].kt.__file__).read_bytes() == shared
    assert Path(mods["tq"].kt.__file__).read_bytes() == shared
    text = (REPO / "mods/int8-lm-head/patches/common/int8_lm_head.patch").read_text()
    assert "+++ b/vllm/model_executor/layers/sparkmods_kerneltune.py" in text


# ---- the fitting rule ----


@dataclasses.dataclass(frozen=True)
class Tile:
    num_stages: int
    block_k: int


def test_fit_lowers_stages_first_then_halves_the_tile_and_gives_up_at_the_floors(mods: Dict[str, ModuleType]) -> None:
    kt = mods["int8"].kt
    seen: List[Tile] = []

    def size(t: Tile) -> int:
        seen.append(t)
        return t.num_stages * t.block_k

    steps = (("num_stages", 2), ("block_k", 32))
    assert kt.fit(Tile(4, 256), size, 1024, steps) == Tile(4, 256)  # fits: unchanged
    assert kt.fit(Tile(4, 256), size, 600, steps) == Tile(2, 256)  # 3 stages are 768
    seen.clear()
    assert kt.fit(Tile(4, 256), size, 200, steps) == Tile(2, 64)
    assert [t for t in dict.fromkeys(seen)] == [Tile(4, 256), Tile(3, 256), Tile(2, 256), Tile(2, 128), Tile(2, 64)]
    assert kt.fit(Tile(4, 256), size, 63, steps) is None  # 2 x 32 is the floor
    assert kt.budget(SM12X) == SM12X - kt.SCRATCH_RESERVE


def test_no_int8_config_picked_on_sm12x_exceeds_the_budget(mods: Dict[str, ModuleType]) -> None:
    int8 = mods["int8"]
    budget = int8.kt.budget(SM12X)
    huge = int8.KernelConfig(int8.GEMV, block_m=256, block_n=512, block_k=512, num_warps=8, num_stages=8)
    tuned = tuple((limit, huge) for limit, _ in int8.DISPATCH)
    assert int8.shared_memory_estimate(huge) > 4 * budget
    for table in (int8.DISPATCH, tuned):
        for m in range(1, 1100):
            cfg = int8.choose_config(m, table, SM12X)
            assert int8.shared_memory_estimate(cfg) <= budget, (m, cfg)
    shipped = [int8.choose_config(limit or 4096, int8.DISPATCH, SM12X) for limit, _ in int8.DISPATCH]
    assert any(c != entry for c, (_, entry) in zip(shipped, int8.DISPATCH))  # some H100 entries had to be lowered
    assert [int8.choose_config(limit or 4096, int8.DISPATCH, 232448) for limit, _ in int8.DISPATCH] == [c for _, c in int8.DISPATCH]


def test_no_turboquant_decode_config_picked_on_sm12x_exceeds_the_budget(mods: Dict[str, ModuleType],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    tq, fmt = mods["tq"], mods["fmt"]
    budget = tq.kt.budget(SM12X)
    huge = tq.DecodeConfig(512, 8, 4, 128, 4, 0, 4)
    tuned = {**tq.DEFAULT_DECODE, **{(h, "*", "*", "*"): huge for h in (128, 256)}}
    lowered = 0
    for table in (tq.DEFAULT_DECODE, tuned):
        monkeypatch.setattr(tq, "_device_tuning", lambda _index, table=table: (SM12X, table))
        for head in (16, 32, 64, 128, 256, 512):
            for name in fmt.DTYPES:
                spec = fmt.tq_spec(name)
                for group in (1, 4, 8, 16, 32):
                    for batch, context in ((1, 4096), (1, 65536), (8, 4096), (8, 65536)):
                        cfg = tq.decode_config(spec, head, group, batch, context, torch.device("cuda", 0))
                        assert tq.decode_shared_bytes(cfg, spec, head, group) <= budget, (head, name, group, cfg)
                        lowered += cfg != tq.default_decode_config(head, batch, context, name, table)
    assert lowered  # head 512 with 3-bit keys and the huge tuned tile had to be lowered


# ---- the table and the mods' reading of it ----


@pytest.fixture()
def table(tmp_path: Path, mods: Dict[str, ModuleType]) -> Path:
    int8, tq = mods["int8"], mods["tq"]
    path = tmp_path / "kernel-tune.json"
    int8.kt.write_table(path, GPU, {
        "int8-lm-head": {"kernels_sha256": int8.kt.source_digest(int8.__file__),
                         "entries": [[limit, c.kernel, c.block_m, c.block_n * 2, c.block_k, c.num_warps, 3] for limit, c in int8.DISPATCH]},
        "turboquant": {"kernels_sha256": tq.kt.source_digest(tq.__file__),
                       "entries": [[256, "1", "long", "turboquant_k3v4_nc", 32, 2, 2, 64, 8, 0, 4]]}})
    return path


def read_both(mods: Dict[str, ModuleType], path: Path, caplog: pytest.LogCaptureFixture, gpu: Dict[str, Any] = GPU) -> tuple:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        return mods["int8"].tuned_dispatch(gpu, path), mods["tq"].tuned_decode_table(gpu, path)


def test_the_mods_read_their_sections_of_the_table(mods: Dict[str, ModuleType], table: Path, caplog: pytest.LogCaptureFixture) -> None:
    int8, tq = mods["int8"], mods["tq"]
    assert oct(table.stat().st_mode & 0o777) == "0o644"
    dispatch, decode = read_both(mods, table, caplog)
    assert [limit for limit, _ in dispatch] == [limit for limit, _ in int8.DISPATCH]
    assert [c.block_n for _, c in dispatch] == [2 * c.block_n for _, c in int8.DISPATCH] and {c.num_stages for _, c in dispatch} == {3}
    assert decode[(256, "1", "long", "turboquant_k3v4_nc")] == tq.DecodeConfig(32, 2, 2, 64, 8, 0, 4)
    assert tq.default_decode_config(256, 1, 65536, "turboquant_k3v4_nc", decode).programs_per_sm == 8
    assert tq.default_decode_config(256, 1, 65536, "turboquant_3bit_nc", decode) == tq.default_decode_config(256, 1, 65536, "turboquant_3bit_nc")
    assert sum("from the tune table" in r.getMessage() for r in caplog.records) == 2


def test_no_table_means_the_shipped_tables_and_no_log(mods: Dict[str, ModuleType], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert read_both(mods, tmp_path / "absent.json", caplog) == (mods["int8"].DISPATCH, mods["tq"].DEFAULT_DECODE)
    assert not caplog.records


def _refusals(mods: Dict[str, ModuleType], path: Path, caplog: pytest.LogCaptureFixture, gpu: Dict[str, Any] = GPU) -> List[str]:
    assert read_both(mods, path, caplog, gpu) == (mods["int8"].DISPATCH, mods["tq"].DEFAULT_DECODE)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line and "tune table not used" in line for line in lines)
    return lines


def _edit(path: Path, change: Any) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_a_table_from_another_gpu_is_refused_in_one_line(mods: Dict[str, ModuleType], table: Path, caplog: pytest.LogCaptureFixture) -> None:
    lines = _refusals(mods, table, caplog, {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]})
    assert all(f"{table} was made on NVIDIA GB10 (sm [12, 1]), this is NVIDIA H100 80GB HBM3 (sm [9, 0])" in line for line in lines)
    assert all("run `sparkmods tune` on this GPU again" in line for line in lines)


def test_a_table_made_with_other_kernels_is_refused(mods: Dict[str, ModuleType], table: Path, caplog: pytest.LogCaptureFixture) -> None:
    _edit(table, lambda d: [s.update(kernels_sha256="0" * 64) for s in d["mods"].values()])
    lines = _refusals(mods, table, caplog)
    assert "another version of int8-lm-head" in lines[0] and "another version of turboquant" in lines[1]


@pytest.mark.parametrize("change, says, refused", [
    (lambda d: d.update(schema=2), "not a schema 1 tune table", "both"),
    (lambda d: d["mods"]["int8-lm-head"].update(entries=[[16, "gemv", 16, 64, 256, 4, 3]]), "bad entry (the row bands must be DISPATCH's", "int8"),
    (lambda d: d["mods"]["int8-lm-head"]["entries"][0].__setitem__(3, 48), "tile sides and warps must be powers of two", "int8"),
    (lambda d: d["mods"]["turboquant"].update(entries=[[256, "1", "long", "fp8", 32, 2, 2, 64, 8, 0, 4]]), "names no band or dtype", "tq"),
    (lambda d: d["mods"]["turboquant"].update(entries=[[256, "1", "long", "*", 24, 2, 2, 64, 8, 0, 4]]), "block_n must be a multiple of 16", "tq"),
])
def test_a_malformed_table_is_refused(mods: Dict[str, ModuleType], table: Path, caplog: pytest.LogCaptureFixture,
                                      change: Any, says: str, refused: str) -> None:
    _edit(table, change)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        got = (mods["int8"].tuned_dispatch(GPU, table), mods["tq"].tuned_decode_table(GPU, table))
    lines = [r.getMessage() for r in caplog.records if "tune table not used" in r.getMessage()]
    assert len(lines) == (2 if refused == "both" else 1) and all(says in line for line in lines), lines
    assert (got[0] is mods["int8"].DISPATCH) == (refused in ("both", "int8"))
    assert (got[1] is mods["tq"].DEFAULT_DECODE) == (refused in ("both", "tq"))


def test_a_table_not_valid_json_is_refused(mods: Dict[str, ModuleType], table: Path, caplog: pytest.LogCaptureFixture) -> None:
    table.write_text("{ half")
    assert all("cannot be read" in line for line in _refusals(mods, table, caplog))


def test_a_table_others_may_write_is_refused(mods: Dict[str, ModuleType], table: Path, caplog: pytest.LogCaptureFixture) -> None:
    table.chmod(0o664)
    assert all("writable by group or others: chmod go-w it" in line for line in _refusals(mods, table, caplog))


@pytest.mark.skipif(os.getuid() != 0, reason="giving the file to another user needs root")
def test_a_table_owned_by_another_user_is_refused_unless_named(mods: Dict[str, ModuleType], table: Path,
                                                              caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    os.chown(table, 4242, 4242)
    monkeypatch.delenv("SPARKMODS_TUNE_TABLE", raising=False)
    assert all("belongs to uid 4242, not to you" in line for line in _refusals(mods, table, caplog))
    monkeypatch.setenv("SPARKMODS_TUNE_TABLE", str(table))  # named by the owner of the process: trusted
    assert read_both(mods, table, caplog)[0] != mods["int8"].DISPATCH


def test_the_default_path_is_under_the_cache_and_the_variable_overrides_it(mods: Dict[str, ModuleType],
                                                                            monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kt = mods["int8"].kt
    monkeypatch.delenv("SPARKMODS_TUNE_TABLE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kt.table_path() == tmp_path / "sparkmods" / "kernel-tune.json"
    monkeypatch.setenv("SPARKMODS_TUNE_TABLE", str(tmp_path / "x.json"))
    assert kt.table_path() == tmp_path / "x.json"


# ---- sparkmods tune end to end on CPU (Triton's interpreter) ----

TUNE_SCRIPT = """
import sys
sys.path[:0] = [{bench!r}, {tools!r}]
from benchlib import int8_lm_head_kernel
int8_lm_head_kernel.enable_interpreter()  # Triton 3.6's interpreter on NumPy >= 2.4 (see there)
from sparkmods import tuning
tuning.CONTEXTS.update(short=32, long=48)  # tiny caches: the interpreter runs the kernels in Python
from sparkmods.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # tunes both mods end to end under Triton's interpreter
def test_tune_writes_a_table_both_mods_read_back(mods: Dict[str, ModuleType], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "cache" / "kernel-tune.json"
    script = TUNE_SCRIPT.format(bench=str(REPO / "ci" / "bench"), tools=str(REPO / "tools"))
    env = {**os.environ, "TRITON_INTERPRET": "1", "SPARKMODS_TUNE_TABLE": str(out)}
    proc = subprocess.run([sys.executable, "-c", script, "tune", "--mods-dir", str(REPO / "mods"), "--head", "200x64",
                           "--head-size", "32", "--heads", "4/2", "--dtypes", "turboquant_k3v4_nc", "--candidates", "1"],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[int8-lm-head] band 5/5" in proc.stderr and "[turboquant] 4/4 turboquant_k3v4_nc head 32" in proc.stderr
    assert "tuning on cpu (Triton interpreter)" in proc.stderr
    said = proc.stdout.splitlines()
    assert said[0].startswith("int8-lm-head: tuned ") and "x the shipped defaults' speed (geometric mean over 5 shapes" in said[0]
    assert said[1].startswith("turboquant: tuned ") and "over 4 shapes" in said[1] and said[2].startswith(f"wrote {out}")
    doc = json.loads(out.read_text())
    gpu = {"name": "cpu (Triton interpreter)", "capability": [0, 0]}
    assert doc["gpu"] == gpu and doc["schema"] == 1
    assert [m["tuned_us"] <= m["shipped_us"] for s in doc["mods"].values() for m in s["measured"]] == [True] * 9
    dispatch, decode = read_both(mods, out, caplog, gpu)
    int8 = mods["int8"]
    assert [(limit, c.kernel) for limit, c in dispatch] == [(limit, c.kernel) for limit, c in int8.DISPATCH]  # kinds kept
    assert {k for k in decode if k[3] == "turboquant_k3v4_nc"} == {(32, b, c, "turboquant_k3v4_nc") for b in ("1", "many") for c in ("short", "long")}
    assert sum("from the tune table" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize("args, says", [
    ([], "no CUDA GPU: run `sparkmods tune` where vLLM runs"),
    (["--heads", "3/2"], "--heads 3/2: the query heads must be a multiple of the KV heads"),
    (["--dtypes", "fp8"], "--dtypes: unknown fp8; valid: turboquant_k8v4,"),
    (["--head-size", "96"], "--head-size 96: TurboQuant supports powers of two in [16, 512]"),
])
def test_tune_refuses_in_one_line(tmp_path: Path, args: List[str], says: str) -> None:
    if not args and torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tune would run")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "sparkmods", "tune", "--out", str(tmp_path / "t.json"), *args],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert not (tmp_path / "t.json").exists()
