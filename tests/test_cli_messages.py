"""What the smaller commands say: `apply` takes the `dir:PATH#VERSION` that `check` takes and
names the folder it was given (not PYTHON_ROOT, which the user never set); `sync` says so when
it succeeds; `build-hybrid --dry-run` counts files as the real run then reports them.
"""

from __future__ import annotations

import re
from pathlib import Path

import ckptfactory as cf
from modfactory import ORIGINAL, PATCHED, TARGET, make_mod, make_site
from sparkmods.cli import main


def test_apply_takes_dir_with_version_like_check(tmp_path, capsys):
    site = make_site(tmp_path / "site", "0.19.1")
    make_mod(tmp_path / "mods")
    base = ["apply", "demo", "--mods-dir", str(tmp_path / "mods")]
    assert main(["check", "demo", "--mods-dir", str(tmp_path / "mods"), "--vllm", f"dir:{site}#0.19.1"]) == 0
    assert main(base + ["--vllm", f"dir:{site}#0.19.1"]) == 0 and (site / TARGET).read_text() == PATCHED
    capsys.readouterr()
    assert main(base + ["--vllm", f"dir:{site}#0.20.0"]) == 2
    assert capsys.readouterr().err == (f"sparkmods: error: --vllm dir:{site}#0.20.0: {site.resolve()} holds "
                                       "vLLM 0.19.1, not 0.20.0\n")
    assert main(base + ["--vllm", f"dir:{site}#0.19.1", "--revert"]) == 0 and (site / TARGET).read_text() == ORIGINAL


def test_apply_without_vllm_names_the_folder_given(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PYTHON_ROOT", raising=False)
    make_mod(tmp_path / "mods")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["apply", "demo", "--mods-dir", str(tmp_path / "mods"), "--vllm", f"dir:{empty}"]) == 2
    err = capsys.readouterr().err
    assert err == (f"sparkmods: error: --vllm dir:{empty}: no vllm/ in {empty}; name the site-packages folder "
                   "(or a prefix holding one) where vllm/ is installed\n")
    assert "PYTHON_ROOT" not in err


def test_sync_says_what_it_did_even_when_nothing_changed(tmp_path, capsys):
    mods = tmp_path / "mods"
    make_mod(mods, "one")
    make_mod(mods, "two")
    capsys.readouterr()
    assert main(["sync", "--mods-dir", str(mods)]) == 0
    assert capsys.readouterr().out == "2 mods synced: 0 files written (all up to date)\n"
    (mods / "two" / "run.sh").unlink()
    assert main(["sync", "--check", "--mods-dir", str(mods)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "2 mods checked: 1 generated files stale"
    assert main(["sync", "--mods-dir", str(mods)]) == 0
    assert capsys.readouterr().out == "two: wrote run.sh\n2 mods synced: 1 files written\n"
    assert main(["sync", "--check", "--mods-dir", str(mods)]) == 0
    assert capsys.readouterr().out == "2 mods checked: run.sh, _sparkmods.py and manifest.json up to date\n"


def test_build_hybrid_dry_run_counts_like_the_real_run(tmp_path, capsys):
    int4 = cf.write_int4_autoround(tmp_path / "int4", mtp="unindexed")
    fp8 = cf.write_fp8(tmp_path / "fp8")
    args = ["checkpoint", "build-hybrid", "--int4", str(int4), "--fp8", str(fp8), "--out", str(tmp_path / "out")]
    assert main(args + ["--dry-run"]) == 0
    planned = re.search(r"output: (\d+) files rewritten, (\d+) kept \(hardlinked, or copied across filesystems\), "
                        r"(\d+) other files copied", capsys.readouterr().out)
    assert main(args) == 0
    done = re.search(r"(\d+) files rewritten, (\d+) kept \((\d+) hardlinked, (\d+) copied\), (\d+) other files copied",
                     capsys.readouterr().out)
    assert planned and done, "both runs print their counts"
    rewritten, kept, linked, copied, others = map(int, done.groups())
    assert tuple(map(int, planned.groups())) == (rewritten, kept, others)
    assert kept == linked + copied and rewritten > 0 and kept > 0 and others > 0
    written = {p.name for p in Path(tmp_path / "out").iterdir()} - {"model.safetensors.index.json"}
    assert len(written) == rewritten + kept + others
