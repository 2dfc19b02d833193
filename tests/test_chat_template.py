"""The chat-template mod's Jinja template, rendered the way vLLM renders it (no vLLM needed).

vLLM hands the template to transformers' `apply_chat_template`, which compiles it in an
ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols) with its own `tojson`
(json.dumps, ensure_ascii=False, key order kept) and a `raise_exception` global
(transformers/utils/chat_template_utils.py, `_compile_jinja_template`). `hf_environment`
(sparkmods.verify.template, which `sparkmods verify` renders with) builds the same;
test_chat_template_vllm.py checks it against the real transformers inside vLLM's venvs.

`CASES` are whole conversations. For each one the text the model writes is derived from the template
itself: the rendered history with the assistant turn, minus the generation prompt, minus the closing
<|im_end|>. That is the format the template teaches, and it is what the vLLM parsers must read back.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

import jinja2
import pytest

from chatcases import (
    ASK_WEATHER,
    CASES,
    END,
    GEN_NO_THINK,
    GEN_THINK,
    MOD_DIR,
    PY_SOURCE,
    SYSTEM,
    TEMPLATE_NAME,
    TOOLS,
    WEATHER_RESULTS,
    WEATHER_STEP,
    Message,
    call,
    render,
    tool_result,
)
from sparkmods.runtime.manifest import Install, load_manifest
from sparkmods.runtime.pep440 import Version


def test_system_and_user_exact() -> None:
    out = render([SYSTEM, {"role": "user", "content": "Hello"}], add_generation_prompt=True)
    assert out == (
        "<|im_start|>system\nYou are a concise assistant for a DGX Spark lab.<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_without_system_starts_with_user() -> None:
    assert render([{"role": "user", "content": "Hi"}]) == "<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.parametrize("kwargs, tail", [({}, GEN_THINK), ({"enable_thinking": True}, GEN_THINK),
                                          ({"enable_thinking": False}, GEN_NO_THINK)])
def test_generation_prompt_thinking(kwargs: Dict[str, Any], tail: str) -> None:
    out = render([{"role": "user", "content": "Hi"}], add_generation_prompt=True, **kwargs)
    assert out == "<|im_start|>user\nHi<|im_end|>\n" + tail


def test_no_generation_prompt_ends_after_last_turn() -> None:
    out = render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}])
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nHello.<|im_end|>\n")


def _system_turn(out: str) -> str:
    assert out.startswith("<|im_start|>system\n")
    return out[len("<|im_start|>system\n"):out.index(END)]


@pytest.mark.parametrize("with_system", [True, False])
def test_tools_in_system_turn(with_system: bool) -> None:
    messages = ([SYSTEM] if with_system else []) + [{"role": "user", "content": "Hi"}]
    out = render(messages, TOOLS, add_generation_prompt=True)
    system = _system_turn(out)
    assert out.count("<|im_start|>system") == 1
    assert system.startswith("# Tools\n\n")
    listed = system[system.index("<tools>\n") + len("<tools>\n"):system.index("\n</tools>")]
    assert [json.loads(line) for line in listed.split("\n")] == TOOLS
    example = system[system.index("</tools>"):]
    assert "<tool_call>\n<function=" in example and "<parameter=" in example and "</function>\n</tool_call>" in example
    if with_system:
        assert system.endswith("\n\n" + SYSTEM["content"])
    else:
        assert SYSTEM["content"] not in out
    assert out.endswith("<|im_start|>user\nHi<|im_end|>\n" + GEN_THINK)


def test_no_tools_block_without_tools() -> None:
    for tools in (None, []):
        assert "# Tools" not in render([SYSTEM, {"role": "user", "content": "Hi"}], tools)


def test_reasoning_only_after_last_user_query() -> None:
    out = render([
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "reasoning_content": "OLD-THOUGHT", "content": "A1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "reasoning_content": "NEW-THOUGHT", "content": "A2"},
    ])
    assert "OLD-THOUGHT" not in out
    assert "<|im_start|>assistant\nA1<|im_end|>\n" in out
    assert "<|im_start|>assistant\n<think>\nNEW-THOUGHT\n</think>\n\nA2<|im_end|>\n" in out


def test_tool_results_do_not_count_as_user_query() -> None:
    """Inside one tool loop every step keeps its reasoning, also with results sent back as user text."""
    step = {"role": "assistant", "reasoning_content": "STEP-ONE", "content": "",
            "tool_calls": [call("get_weather", {"city": "Paris"}, "c1")]}
    as_tool = render([ASK_WEATHER, step, tool_result("c1", "sunny")], TOOLS)
    as_user = render([ASK_WEATHER, step, {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}], TOOLS)
    for out in (as_tool, as_user):
        assert "<think>\nSTEP-ONE\n</think>\n\n<tool_call>" in out


@pytest.mark.parametrize("message", [
    {"role": "assistant", "reasoning_content": " R \n", "content": "\nC"},
    {"role": "assistant", "reasoning": "R", "content": "C"},
    {"role": "assistant", "content": "R\n</think>\n\nC"},
    {"role": "assistant", "content": "<think>\nR\n</think>\n\nC"},
])
def test_reasoning_sources_render_alike(message: Message) -> None:
    out = render([{"role": "user", "content": "Q"}, message])
    assert out.endswith("<|im_start|>assistant\n<think>\nR\n</think>\n\nC<|im_end|>\n")


def test_tool_calls_layout() -> None:
    out = render([ASK_WEATHER, WEATHER_STEP], TOOLS)
    turn = out[out.index("<|im_start|>assistant\n"):]
    assert turn == (
        "<|im_start|>assistant\n<think>\nTwo cities, two forecasts: call get_weather twice.\n</think>\n\n"
        "I will check both cities.\n\n"
        "<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "<parameter=units>\nmetric\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nLyon\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
        "<|im_end|>\n"
    )


def test_tool_call_without_content_or_arguments() -> None:
    out = render([{"role": "user", "content": "Q"},
                  {"role": "assistant", "content": None, "tool_calls": [call("ping", {}, "c"), call("ping", "", "d")]}])
    assert out.endswith("<think>\n\n</think>\n\n<tool_call>\n<function=ping>\n</function>\n</tool_call>\n"
                        "<tool_call>\n<function=ping>\n</function>\n</tool_call><|im_end|>\n")


def _turn_for(arguments: Any) -> str:
    return render([{"role": "user", "content": "Q"},
                   {"role": "assistant", "content": "", "tool_calls": [call("f", arguments, "c")]}])


def test_argument_values_strings_raw_others_json() -> None:
    out = _turn_for({"s": "two\nlines <b>&", "i": 7, "x": 0.5, "t": True, "n": None,
                     "o": {"k": ["é", 1]}, "a": [1, "two"]})
    for name, text in [("s", "two\nlines <b>&"), ("i", "7"), ("x", "0.5"), ("t", "true"), ("n", "null"),
                       ("o", '{"k": ["é", 1]}'), ("a", '[1, "two"]')]:
        assert f"<parameter={name}>\n{text}\n</parameter>\n" in out


ARGUMENT_OBJECTS = [
    {},
    {"city": "Paris"},
    {"path": "a/b.py", "content": PY_SOURCE},
    {"quote": 'say "hi"', "backslash": "C:\\temp\\new", "tab": "a\tb", "slash": "a/b", "controls": "\b\f\r"},
    {"unicode": "é ü 中文 😀", "escaped_braces": "{ [ } ] , :", "empty": ""},
    {"trailing_backslash": "dir\\", "backslash_quote": '\\"x\\"', "only_backslashes": "\\\\", 'key "q"': 1},
    {"nested": {"deep": {"list": [1, {"x": "}"}], "flag": False}}, "none": None, "num": -1.5e-3},
]


def _parameters(text: str) -> Dict[str, Any]:
    """The <parameter> blocks of a rendered call; JSON values decoded so layout does not count."""
    found: Dict[str, Any] = {}
    for block in text.split("<parameter=")[1:]:
        name, _, rest = block.partition(">\n")
        value = rest[:rest.index("\n</parameter>")]
        try:
            found[name] = json.loads(value)
        except ValueError:
            found[name] = value
    return found


@pytest.mark.parametrize("arguments", ARGUMENT_OBJECTS)
@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_json_text_arguments_render_like_mappings(arguments: dict, ensure_ascii: bool) -> None:
    """Arguments given as JSON text (the OpenAI wire form) render exactly as the decoded object."""
    assert _turn_for(json.dumps(arguments, ensure_ascii=ensure_ascii)) == _turn_for(arguments)


@pytest.mark.parametrize("arguments", ARGUMENT_OBJECTS)
@pytest.mark.parametrize("layout", [{"indent": 2}, {"separators": (",", ":")}])
def test_json_text_arguments_any_layout(arguments: dict, layout: Dict[str, Any]) -> None:
    """Other JSON layouts give the same parameters; nested values keep their own JSON spacing."""
    text = _turn_for(json.dumps(arguments, **layout))
    assert _parameters(text) == _parameters(_turn_for(arguments))
    assert len(_parameters(text)) == len(arguments)


@pytest.mark.parametrize("bad", ['["a"]', "not json", '"text"'])
def test_json_text_arguments_must_be_an_object(bad: str) -> None:
    with pytest.raises(jinja2.exceptions.TemplateError, match="must be a JSON object"):
        _turn_for(bad)


def test_consecutive_tool_results_share_one_user_turn() -> None:
    out = render([ASK_WEATHER, WEATHER_STEP, *WEATHER_RESULTS, {"role": "user", "content": "Thanks"}], TOOLS)
    assert ("<|im_start|>user\n<tool_response>\n{\"rain_mm\": [0, 4.5, 1.0]}\n</tool_response>\n"
            "<tool_response>\n{\"rain_mm\": [0, 0]}\n</tool_response><|im_end|>\n"
            "<|im_start|>user\nThanks<|im_end|>\n") in out
    assert out.count("<|im_start|>user\n") == 3


def test_list_of_parts_with_media() -> None:
    out = render([{"role": "user", "content": [
        {"type": "text", "text": "Compare "}, {"type": "image"}, {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "with"}, {"type": "video"},
    ]}])
    assert out == ("<|im_start|>user\nCompare <|vision_start|><|image_pad|><|vision_end|>"
                   "<|vision_start|><|image_pad|><|vision_end|>with<|vision_start|><|video_pad|><|vision_end|><|im_end|>\n")


def test_string_and_parts_content_render_alike() -> None:
    as_parts = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    as_text = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(as_parts, TOOLS) == render(as_text, TOOLS)


def test_developer_is_a_system_prompt_and_later_system_turns_stay() -> None:
    out = render([{"role": "developer", "content": "Dev rules."}, {"role": "user", "content": "Q"},
                  {"role": "system", "content": "Late note."}])
    assert out == ("<|im_start|>system\nDev rules.<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                   "<|im_start|>system\nLate note.<|im_end|>\n")


@pytest.mark.parametrize("messages, match", [
    ([], "no messages"),
    ([{"role": "narrator", "content": "x"}], 'unknown message role "narrator"'),
    ([{"role": "user", "content": [{"type": "input_audio"}]}], 'part of type "input_audio"'),
    ([{"role": "user", "content": {"text": "x"}}], "string or a list of parts"),
])
def test_bad_input_fails_with_a_clear_message(messages: List[Message], match: str) -> None:
    with pytest.raises(jinja2.exceptions.TemplateError, match=match):
        render(messages)


@pytest.mark.parametrize("c", CASES, ids=[c["name"] for c in CASES])
def test_case_model_output_shape(c: Dict[str, Any]) -> None:
    """What the model writes after the generation prompt, per case (the parsers' input)."""
    out, expect = c["output"], c["expect"]
    if c["enable_thinking"]:
        assert c["prompt"].endswith(GEN_THINK)
        reasoning, _, rest = out.partition("\n</think>\n\n")
        assert reasoning == expect["reasoning"]
    else:
        assert c["prompt"].endswith(GEN_NO_THINK) and "</think>" not in out
        rest = out
    assert rest.split("<tool_call>")[0].strip() == (expect["content"] or "")
    assert rest.count("<tool_call>\n<function=") == rest.count("</function>\n</tool_call>") == len(expect["tool_calls"])


def test_manifest_installs_the_template_for_every_release() -> None:
    manifest = load_manifest(MOD_DIR)
    assert manifest.name == "chat-template"
    [variant] = manifest.variants
    assert variant.install == [Install("files/" + TEMPLATE_NAME, TEMPLATE_NAME)]
    assert f"--chat-template {TEMPLATE_NAME}" in variant.notes
    for release in ("0.18.0", "0.24.0", "0.33.0", "0.40.0"):
        assert manifest.select(Version(release)) is variant
    assert (MOD_DIR / variant.install[0].src).is_file()
    assert manifest.raw["variant"][0]["vllm"] == ">=0.18.0"
