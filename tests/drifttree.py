"""A small vLLM tree (the demo module and a quantization package with helpers) and a one-call
drift check of a patched demo module against it."""

from __future__ import annotations

from typing import Dict, List

from rebasecase import src
from sparkmods.checking.drift import check_patched

MOD = "vllm/model_executor/layers/demo.py"
TREE = {
    "vllm/__init__.py": "def __getattr__(name):\n    raise AttributeError(name)\n",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/quantization/__init__.py": (
        "from .base_config import QuantizationConfig\nfrom .helpers import *\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .fp8 import Fp8Config\n"),
    "vllm/model_executor/layers/quantization/base_config.py": src('''
        class QuantizationConfig:
            def __init__(self) -> None:
                self.packed = {}

            def maybe_update_config(self, model_name: str, hf_config=None, revision=None):
                pass

            def get_name(self) -> str:
                return "base"

            @classmethod
            def from_config(cls, config: dict, strict: bool = False):
                return cls()
        '''),
    "vllm/model_executor/layers/quantization/helpers.py": src('''
        __all__ = ["scale", "Box"]


        def scale(x, by, *, clamp: bool = False):
            return x * by


        def _private(x):
            return x


        class Box:
            def __init__(self, size: int) -> None:
                self.size = size
        '''),
    "vllm/model_executor/layers/quantization/fp8.py": "class Fp8Config:\n    pass\n",
    "vllm/model_executor/layers/quantization/records.py": src('''
        from dataclasses import dataclass


        @dataclass
        class Record:
            name: str
        '''),
    MOD: src('''
        import torch

        from vllm.model_executor.layers.quantization import QuantizationConfig


        class DemoConfig(QuantizationConfig):
            def get_name(self) -> str:
                return "demo"

            def forward(self, x):
                y = x * 2
                return y
        '''),
}


def check(patched: str, tree: Dict[str, str] = TREE, path: str = MOD) -> List[str]:
    files = {k: v.encode() for k, v in tree.items()}
    before = files.get(path)
    return [f"{f.kind}: {f.message}" for f in check_patched({path: (before, patched.encode())}, files.get,
                                                                lambda: sorted(files))]


def add(line: str, where: str = "        y = x * 2\n") -> str:
    assert TREE[MOD].count(where) == 1
    return TREE[MOD].replace(where, where + line)


IMPORTS = "        from vllm.model_executor.layers.quantization.helpers import Box, scale\n"
