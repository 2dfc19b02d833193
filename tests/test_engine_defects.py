"""Engine defects that eugr's community mods exposed (issue 16), each judged against what the
real tools do: drift on `super(Class, self)`, stacked diffs of one file, reverse patches and
GNU patch's meaning of `-p N`."""

from __future__ import annotations

import pytest

from test_drift import IMPORTS, TREE, add, check


@pytest.mark.parametrize("call", [
    "super(QuantizationConfig, self).maybe_update_config()",  # past QuantizationConfig: not judged
    "super(DemoConfig, self).maybe_update_config('m')",
])
def test_super_naming_a_class_is_not_a_bare_super(call):
    assert check(add(IMPORTS + f"        {call}\n")) == []


def test_super_naming_the_enclosing_class_is_still_checked():
    (finding,) = check(add(IMPORTS + "        super(DemoConfig, self).maybe_update_config()\n"))
    assert "does not pass required 'model_name'" in finding
