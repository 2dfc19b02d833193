"""File moves: a patched file that onto no longer has is followed to where its code went,
per hunk and only when one file clearly holds the hunk's surroundings."""

from __future__ import annotations

from rebasecase import carried, rebase, src

OLD = "vllm/model_executor/layers/quantization/inc.py"
NEW = "vllm/model_executor/layers/quantization/inc/inc.py"
CONFIG = "vllm/model_executor/layers/quantization/inc/config_parser.py"

CLASS = src('''
    class INCConfig(QuantizationConfig):
        """Config class for Intel Neural Compressor."""

        def __init__(self, weight_bits: int, group_size: int) -> None:
            self.weight_bits = weight_bits
            self.group_size = group_size

        def get_quant_method(self, layer: torch.nn.Module, prefix: str):
            if prefix and self.extra_config:
                return UnquantizedLinearMethod()
            return self.apply_gptq_quant_layer(layer, prefix)
    ''')
PARSER = src('''
    def parse_extra_config(config: dict) -> dict:
        extra = config.get("extra_config") or {}
        normalized = {name.removeprefix("model."): value for name, value in extra.items()}
        return normalized
    ''')
HEAD = "import torch\n\nfrom vllm.model_executor.layers.quantization import QuantizationConfig\n\n\n"
BASE = {OLD: HEAD + CLASS + "\n\n" + PARSER, "vllm/__init__.py": ""}

INSERT = ("    def get_quant_method(self, layer: torch.nn.Module, prefix: str):\n",
          "    def get_quant_method(self, layer: torch.nn.Module, prefix: str):\n"
          "        fp8 = self.fp8_method(layer, prefix)\n        if fp8 is not None:\n            return fp8\n")
PARSE = ('    return normalized\n', '    normalized.pop("lm_head", None)\n    return normalized\n')


def patched(*edits) -> dict:
    text = BASE[OLD]
    for old, new in edits:
        text = text.replace(old, new)
    return {OLD: text}


def test_a_module_turned_into_a_package_is_followed():
    body = CLASS.replace("        if prefix and", "        from .schemes import factory\n\n        if prefix and").replace(
        "            return UnquantizedLinearMethod()\n",
        "            if isinstance(layer, RoutedExperts):\n                return None\n            return UnquantizedLinearMethod()\n")
    onto = {NEW: HEAD + body,
            "vllm/model_executor/layers/quantization/inc/__init__.py": "from .inc import INCConfig\n",
            "vllm/__init__.py": ""}
    result = rebase(BASE, patched(INSERT), onto)
    assert result.files[0].to_dict()["moved_to"] == [NEW]
    after = carried(result, onto)[NEW]
    assert after == onto[NEW].replace(INSERT[0], INSERT[1])
    assert result.patch.startswith(f"--- a/{NEW}\n+++ b/{NEW}\n")


def test_hunks_split_across_the_files_their_code_went_to():
    onto = {NEW: HEAD + CLASS, CONFIG: PARSER, "vllm/__init__.py": ""}
    result = rebase(BASE, patched(INSERT, PARSE), onto)
    assert sorted(result.files[0].to_dict()["moved_to"]) == [CONFIG, NEW]
    after = carried(result, onto)
    assert after[NEW] == onto[NEW].replace(INSERT[0], INSERT[1])
    assert after[CONFIG] == PARSER.replace(PARSE[0], PARSE[1])


def test_two_equally_good_homes_are_reported_not_chosen():
    copy = "vllm/model_executor/layers/quantization/inc_legacy.py"
    onto = {NEW: HEAD + CLASS, copy: HEAD + CLASS, "vllm/__init__.py": ""}
    result = rebase(BASE, patched(INSERT), onto)
    (f,) = result.files
    assert f.status == "missing-file" and result.patch is None
    assert {c.path for c in f.candidates[:2]} == {NEW, copy}
    assert "candidates" in f.reason


def test_code_that_vanished_is_missing_with_no_candidates():
    onto = {"vllm/model_executor/layers/quantization/other.py": "X = 1\n", "vllm/__init__.py": ""}
    result = rebase(BASE, patched(INSERT), onto)
    (f,) = result.files
    assert f.status == "missing-file" and not f.candidates


def test_the_hunk_context_decides_not_the_whole_file():
    """Most of the old module landed in inc.py, but the function the hunk edits went to
    config_parser.py: the hunk follows its own code."""
    onto = {NEW: HEAD + CLASS, CONFIG: PARSER, "vllm/__init__.py": ""}
    result = rebase(BASE, patched(PARSE), onto)
    assert result.files[0].to_dict()["moved_to"] == [CONFIG]
    assert carried(result, onto)[CONFIG] == PARSER.replace(PARSE[0], PARSE[1])
