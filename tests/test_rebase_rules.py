"""Every placement rule of the rebase: a case it must resolve, and a near case it must flag.

Each resolved case is checked byte for byte against the intended result, through the
regenerated patch applied by the engine (every hunk exact); each flagged case must name the
edit and produce no patch.
"""

from __future__ import annotations

from rebasecase import PATH, carried, one, rules, src

BASE = src('''
    """Demo module."""

    import os
    from vllm.logger import init_logger
    from vllm.model_executor.layers.linear import (
        LinearBase,
        UnquantizedLinearMethod,
    )

    logger = init_logger(__name__)


    class DemoConfig:
        """A config."""

        def __init__(self, bits: int, group_size: int) -> None:
            self.bits = bits
            self.group_size = group_size
            self.extra = {}

        def get_quant_method(self, layer, prefix: str):
            if prefix in self.extra:
                return UnquantizedLinearMethod()
            method = self.pick(layer)
            logger.debug("picked %s for %s", method, prefix)
            return method

        def pick(self, layer):
            if isinstance(layer, LinearBase):
                return "linear"
            return None

        def build(self):
            a = 1
            layer = make_layer(
                self.bits,
                self.group_size,
            )
            return layer, a


    def helper(x, y):
        total = x + y
        scaled = total * 2
        return scaled


    def forward(
        self,
        x,
    ):
        y = x * 2
        return y


    def backward(
        self,
        g,
    ):
        return g
    ''')


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def placed(patched: str, onto: str, expected: str, rule: str) -> None:
    result = one(BASE, patched, onto)
    assert rules(result) == [rule], result.to_dict()
    assert carried(result, {PATH: onto})[PATH] == expected


def flagged(patched: str, onto: str, why: str) -> None:
    result = one(BASE, patched, onto)
    assert not result.clean and result.patch is None
    reasons = [o.reason for f in result.files for p in f.parts for o in p.outcomes if o.outcome == "conflict"]
    assert reasons and why in reasons[0], reasons


# -- diff3: far from upstream changes ------------------------------------------------------
INSERT_INIT = ("        self.extra = {}\n", "        self.extra = {}\n        self.checked = True\n")


def test_diff3_carries_an_edit_far_from_upstream_changes():
    patched = edit(BASE, *INSERT_INIT)
    onto = edit(BASE, "    scaled = total * 2\n", "    scaled = total * 4\n")
    placed(patched, onto, edit(onto, *INSERT_INIT), "diff3")


def test_diff3_alone_refuses_generic_lines_next_to_a_change():
    """A text file (no Python anchors) where upstream added a block identical to the one the
    insertion follows: which `)` is the original cannot be told (GNU patch picks the second
    one, at an offset, silently); the edit is refused."""
    base = "start\nblock (\n  x\n)\n\nend\n"
    patched = "start\nblock (\n  x\n)\nafter-first\n\nend\n"
    onto = "start\nblock (\n  x\n)\n\nblock (\n  x\n)\n\nend\n"
    result = one(base, patched, onto, path="vllm/demo.txt")
    assert not result.clean and "generic" in result.files[0].reason


# -- statement: between two statements, one of them changed ---------------------------------------
INSERT_MID = ("        method = self.pick(layer)\n", "        method = self.pick(layer)\n        method = self.refine(method)\n")


def test_statement_anchor_when_the_next_statement_changed():
    patched = edit(BASE, *INSERT_MID)
    onto = edit(BASE, '        logger.debug("picked %s for %s", method, prefix)\n',
                '        logger.debug("picked %s for layer %s", method, prefix)\n')
    placed(patched, onto, edit(onto, *INSERT_MID), "statement")


def test_statement_anchor_flags_a_next_statement_replaced_by_other_code():
    patched = edit(BASE, *INSERT_MID)
    onto = edit(BASE, '        logger.debug("picked %s for %s", method, prefix)\n',
                "        self.stats[prefix] = len(self.extra)\n")
    flagged(patched, onto, "changed beyond recognition")


def test_statement_anchor_flags_new_code_between_the_neighbours():
    patched = edit(BASE, *INSERT_MID)
    onto = edit(BASE, "        method = self.pick(layer)\n",
                "        method = self.pick(layer)\n        self.count += 1\n")
    flagged(patched, onto, "other code between")


# -- block-start: the top of a body whose first lines changed -----------------------------------
INSERT_TOP = ("    def get_quant_method(self, layer, prefix: str):\n",
              "    def get_quant_method(self, layer, prefix: str):\n        self.calls += 1\n")
NEW_HEAD = ("    def get_quant_method(self, layer, prefix: str):\n        if prefix in self.extra:\n",
            "    def get_quant_method(self, layer, prefix: str, *, fast: bool = False):\n"
            "        if prefix in self.extra or fast:\n")


def test_block_start_when_signature_and_first_statement_changed():
    patched = edit(BASE, *INSERT_TOP)
    onto = edit(BASE, *NEW_HEAD)
    expected = edit(onto, NEW_HEAD[1], NEW_HEAD[1].replace("= False):\n", "= False):\n        self.calls += 1\n"))
    placed(patched, onto, expected, "block-start")


def test_block_start_flags_a_docstring_added_where_the_insertion_goes():
    patched = edit(BASE, *INSERT_TOP)
    onto = edit(BASE, *NEW_HEAD).replace("        if prefix in self.extra or fast:\n",
                                         '        """Pick a method."""\n        if prefix in self.extra or fast:\n')
    flagged(patched, onto, "docstring")


def test_block_start_flags_a_renamed_function():
    patched = edit(BASE, *INSERT_TOP)
    onto = edit(BASE, *NEW_HEAD).replace("def get_quant_method(", "def get_method(")
    flagged(patched, onto, "not found")


# -- import: an import block reformatted and extended upstream ------------------------------------
INSERT_IMPORT = ("from vllm.logger import init_logger\n",
                 "from vllm.logger import init_logger\nfrom vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod\n")
NEW_IMPORTS = ("from vllm.logger import init_logger\nfrom vllm.model_executor.layers.linear import (\n"
               "    LinearBase,\n    UnquantizedLinearMethod,\n)\n",
               "from vllm.logger import init_logger, print_once\nfrom vllm.model_executor.layers.linear import "
               "LinearBase, ReplicatedLinear, UnquantizedLinearMethod\n")


def test_import_anchored_by_module_in_a_reformatted_block():
    patched = edit(BASE, *INSERT_IMPORT)
    onto = edit(BASE, *NEW_IMPORTS)
    expected = edit(onto, "print_once\n", "print_once\nfrom vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod\n")
    placed(patched, onto, expected, "import")


def test_import_rule_applies_to_imports_only():
    patched = edit(BASE, "from vllm.logger import init_logger\n", "from vllm.logger import init_logger\nFP8 = True\n")
    flagged(patched, edit(BASE, *NEW_IMPORTS), "changed upstream")


def test_import_flags_when_both_neighbouring_modules_are_gone():
    patched = edit(BASE, *INSERT_IMPORT)
    onto = edit(BASE, NEW_IMPORTS[0], "from vllm.utils import logger_for\nfrom vllm.layers import LinearBase\n")
    flagged(patched, onto, "changed upstream")


# -- replace: the removed statements are still there, their surroundings are not ---------------
REPLACE = ("    scaled = total * 2\n", "    scaled = total * 3\n")
AROUND = [("    total = x + y\n", "    total = x + y + 1\n"), ("    return scaled\n", "    return int(scaled)\n")]


def around(text: str) -> str:
    for old, new in AROUND:
        text = edit(text, old, new)
    return text


def test_replace_a_statement_whose_neighbours_both_changed():
    patched = edit(BASE, *REPLACE)
    onto = around(BASE)
    placed(patched, onto, edit(onto, *REPLACE), "replace")


def test_replace_flags_a_statement_changed_upstream():
    patched = edit(BASE, *REPLACE)
    onto = edit(around(BASE), "    scaled = total * 2\n", "    scaled = total * 2.0\n")
    flagged(patched, onto, "changed or removed upstream")


def test_replace_flags_a_statement_that_now_occurs_twice():
    patched = edit(BASE, *REPLACE)
    onto = edit(around(BASE), "    scaled = total * 2\n", "    scaled = total * 2\n    scaled = total * 2\n")
    flagged(patched, onto, "more than once")


def test_replace_a_statement_reformatted_upstream():
    patched = edit(BASE, "        method = self.pick(layer)\n", "        method = self.pick(layer, prefix)\n")
    onto = edit(BASE, "        method = self.pick(layer)\n        logger.debug(",
                "        method = self.pick(\n            layer\n        )\n        logger.info(")
    expected = edit(onto, "        method = self.pick(\n            layer\n        )\n", "        method = self.pick(layer, prefix)\n")
    placed(patched, onto, expected, "replace-reformatted")


# -- intra: inside one statement ------------------------------------------------------------------
INTRA = ("        layer = make_layer(\n", "        layer = make_fast_layer(\n")


def test_intra_statement_edit_when_the_line_above_changed():
    patched = edit(BASE, *INTRA)
    onto = edit(BASE, "        a = 1\n", "        a = 2\n")
    placed(patched, onto, edit(onto, *INTRA), "intra")


def test_intra_statement_edit_flags_a_statement_both_sides_changed():
    """diff3 alone would merge these two edits of one call; the call changed meaning upstream."""
    patched = edit(BASE, *INTRA)
    onto = edit(BASE, "            self.group_size,\n", "            self.group_size * 2,\n")
    flagged(patched, onto, "both sides changed this statement")


def test_an_edit_cutting_into_a_statement_upstream_changed_is_flagged():
    """The edit replaces one whole statement and the first line of the next; upstream
    changed the last line of that next statement: one statement edited on both sides."""
    patched = edit(BASE, "        a = 1\n        layer = make_layer(\n", "        a = 2\n        layer = make_fast_layer(\n")
    onto = edit(BASE, "            self.group_size,\n", "            self.group_size * 2,\n")
    flagged(patched, onto, "both sides changed this statement")


PARAM = ("    x,\n):\n    y = x * 2\n", "    x,\n    scale: float = 1.0,\n):\n    y = x * 2\n")


def test_header_edit_when_the_body_below_changed():
    patched = edit(BASE, *PARAM)
    onto = edit(BASE, "    y = x * 2\n", "    y = x * 3\n")
    expected = edit(onto, "    x,\n):\n    y = x * 3\n", "    x,\n    scale: float = 1.0,\n):\n    y = x * 3\n")
    placed(patched, onto, expected, "intra-header")


def test_header_edit_flags_a_signature_changed_upstream():
    patched = edit(BASE, *PARAM)
    onto = edit(BASE, "    x,\n):\n    y = x * 2\n", "    x,\n    residual=None,\n):\n    y = x * 3\n")
    flagged(patched, onto, "header")


# -- code that moved inside the file -----------------------------------------------------------
PICK = ("    def pick(self, layer):\n        if isinstance(layer, LinearBase):\n            return \"linear\"\n"
        "        return None\n\n")
INSERT_PICK = ("    def pick(self, layer):\n", "    def pick(self, layer):\n        logger.debug(\"pick\")\n")


def test_a_method_moved_within_the_class_is_followed():
    patched = edit(BASE, *INSERT_PICK)
    moved = edit(BASE, PICK, "")
    onto = edit(moved, "    def get_quant_method(", PICK.replace("LinearBase)", "(LinearBase, str))")
                + "    def get_quant_method(")
    placed(patched, onto, edit(onto, *INSERT_PICK), "block-start")


def test_a_method_defined_twice_upstream_is_flagged():
    patched = edit(BASE, *INSERT_PICK)
    twice = PICK.replace("LinearBase)", "(LinearBase, str))")
    onto = edit(edit(BASE, PICK, ""), "    def get_quant_method(",
                "    if os.environ.get('X'):\n" + twice.replace("\n    ", "\n        ").replace("    def", "        def", 1)
                + "    else:\n" + twice.replace("\n    ", "\n        ").replace("    def", "        def", 1)
                + "    def get_quant_method(")
    flagged(patched, onto, "not found")


# -- already there, and one bad edit among good ones --------------------------------------------------
def test_a_patch_onto_already_has_gives_an_empty_result():
    patched = edit(BASE, *INSERT_INIT)
    result = one(BASE, patched, patched)
    assert result.clean and result.patch == ""
    assert [f.status for f in result.files] == ["already-in-onto"]


def test_one_conflicting_edit_blocks_the_file_and_marks_conflicts():
    patched = edit(edit(BASE, *INSERT_INIT), *INSERT_MID)
    onto = edit(BASE, '        logger.debug("picked %s for %s", method, prefix)\n', "        self.stats = {}\n")
    result = one(BASE, patched, onto)
    assert not result.clean and result.patch is None
    outcomes = [o.outcome for f in result.files for p in f.parts for o in p.outcomes]
    assert outcomes == ["placed", "conflict"]
    (marked,) = result.conflict_files().values()
    text = marked.decode()
    assert "        self.checked = True\n" in text  # the placed edit is in
    block = text[text.index("<<<<<<< onto"):text.index(">>>>>>> patch")]
    assert "self.stats = {}" in block and "self.refine(method)" in block and "||||||| base" in block


# -- a new method between two methods (what most mods add) -------------------------------------
HOOK = ("    def pick(self, layer):\n",
        "    def maybe_update_config(self, model_name: str, **kwargs):\n        self.model = model_name\n\n"
        "    def pick(self, layer):\n")


def test_a_new_method_is_anchored_by_its_neighbours_names():
    """Both neighbouring methods changed inside and the next one's signature too: they are
    still the same methods (by qualified name), so the slot between them is unambiguous."""
    patched = edit(BASE, *HOOK)
    onto = edit(edit(BASE, "        return method\n", "        return method or None\n"),
                "    def pick(self, layer):\n", "    def pick(self, layer, strict: bool = False):\n")
    placed(patched, onto, edit(onto, "    def pick(self, layer, strict", HOOK[1].replace(
        "    def pick(self, layer):\n", "") + "    def pick(self, layer, strict"), "statement")


def test_a_new_method_flags_a_method_upstream_put_between_its_neighbours():
    patched = edit(BASE, *HOOK)
    onto = edit(BASE, "    def pick(self, layer):\n", "    def clone(self):\n        return self\n\n    def pick(self, layer):\n")
    flagged(patched, onto, "other code between")


def test_line_endings_of_onto_are_kept():
    base = "def f():\n    a = 1\n    b = 2\n    return a\n"
    patched = base.replace("    b = 2\n", "    b = 2\n    c = 3\n")
    onto = base.replace("return a", "return a + b").replace("\n", "\r\n")
    result = one(base, patched, onto)
    assert carried(result, {PATH: onto})[PATH] == onto.replace("    b = 2\r\n", "    b = 2\r\n    c = 3\r\n")
