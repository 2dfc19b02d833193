"""A recipe repository for the `sparkmods launch` tests: real synced mods, a recipe, a `dir:` target
with small config modules shaped like vLLM's, and the stand-in launcher (fixtures/launch-cluster.sh)
that records what it was given."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path
from typing import Dict, List, Optional

from modfactory import make_mod, make_site
from sparkmods.cli import main
from sparkmods.launch.plan import LaunchOptions, build_plan
from sparkmods.launch.recipe import load_recipe
from sparkmods.launch.rules import validate
from sparkmods.launch.vllmfacts import VllmFacts
from sparkmods.launch.vllmopen import check_with_engine
from sparkmods.sources import open_targets
from sparkmods.sync import sync

FIXTURES = Path(__file__).resolve().parent / "fixtures"
STAND_IN = FIXTURES / "launch-cluster.sh"
VERSION = "0.21.0"
# Small modules shaped like vLLM's config files: nested Literal aliases, as the real ones are.
SPECULATIVE_PY = textwrap.dedent('''\
    from typing import Literal
    MTPModelTypes = Literal["deepseek_mtp", "qwen3_next_mtp", "mtp"]
    EagleModelTypes = Literal["eagle", "eagle3", MTPModelTypes]
    SpeculativeMethod = Literal["ngram", "draft_model", "suffix", EagleModelTypes]
    ''')
CACHE_PY = textwrap.dedent('''\
    from typing import Literal
    CacheDType = Literal["auto", "bfloat16", "fp8", "turboquant_k8v4", "turboquant_k3v4_nc"]
    ''')
TEMPLATE_MOD_TOML = textwrap.dedent('''\
    schema = 1
    name = "template"
    summary = "installs a chat template"

    [[variant]]
    label = "any"
    vllm = ">=0.18.0"
    install = [{ src = "files/tpl.jinja", dest = "workspace:tpl.jinja" }]
    verified = ["0.21.0"]
    ''')
RECIPE = textwrap.dedent('''\
    recipe_version: "1"
    name: Test model
    container: test-image
    mods:
      - mods/demo
      - mods/template
    defaults:
      port: 8000
      host: 0.0.0.0
      tensor_parallel: 1
      model_dir: /models/Qwen3.5-test model
    env:
      DEMO_MODE: fast
    command: |
      vllm serve {model_dir} \\
        --host {host} --port {port} \\
        -tp {tensor_parallel} \\
        --no-enable-prefix-caching \\
        --chat-template tpl.jinja \\
        --speculative-config '{{"method": "mtp", "num_speculative_tokens": 2}}'
    ''')


class Repo:
    """A recipe repository in a folder whose name has a space: mods/, a recipe, a target vLLM."""

    def __init__(self, root: Path, recipe_text: str = RECIPE, arg_utils: str = "") -> None:
        self.root = root
        (root / "launch" / "recipes").mkdir(parents=True)
        make_mod(root / "mods", "demo", vllm=">=0.18.0", verified='["0.21.0"]')
        tpl = root / "mods" / "template"
        (tpl / "files").mkdir(parents=True)
        (tpl / "files" / "tpl.jinja").write_text("{{ messages }}\n")
        (tpl / "mod.toml").write_text(TEMPLATE_MOD_TOML)
        sync(tpl)
        self.site = make_site(root.parent / "site", VERSION, {
            "vllm/config/speculative.py": SPECULATIVE_PY, "vllm/config/cache.py": CACHE_PY,
            "vllm/engine/arg_utils.py": arg_utils,
        })
        self.recipe = self.write_recipe("test.yaml", recipe_text)

    def write_recipe(self, name: str, text: str) -> Path:
        path = self.root / "launch" / "recipes" / name
        path.write_text(text)
        return path

    @property
    def target(self) -> str:
        return f"dir:{self.site}#{VERSION}"

    def facts(self) -> VllmFacts:
        return VllmFacts(open_targets(self.target)[0])

    def problems(self, opts: LaunchOptions = LaunchOptions(), recipe: Optional[Path] = None) -> List[str]:
        path = recipe or self.recipe
        plan = build_plan(load_recipe(path), opts)
        return [f"{p.severity}:{p.rule}" for p in validate(plan, self.facts(), check_with_engine).problems]


def launch(repo: Repo, *args: str, out: Optional[Path] = None) -> int:
    argv = ["launch", str(repo.recipe), "--vllm", repo.target, "--launch-cluster", str(STAND_IN), *args]
    if out is not None:
        argv += ["-o", str(out)]
    return main(argv)


def run_script(script: Path, record: Path, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    full.update({"LAUNCH_CLUSTER_RECORD": str(record), "TMPDIR": str(record.parent)})
    full.update(env or {})
    return subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=60)


def calls(record: Path) -> List[Dict[str, object]]:
    out = []
    for folder in sorted(record.glob("call-*"), key=lambda p: int(p.name.split("-")[1])):
        script = folder / "launch-script"
        out.append({
            "args": (folder / "args").read_bytes().decode().split("\0")[:-1],
            "env": dict(line.split("=", 1) for line in (folder / "passed-env").read_text().splitlines()),
            "script": script.read_text() if script.exists() else None,
            "mode": (folder / "mode").read_text().strip(),
        })
    return out
