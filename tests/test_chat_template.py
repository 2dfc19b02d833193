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
from pathlib import Path
from typing import Any, Dict, List, Optional

import jinja2
import pytest

from sparkmods.runtime.manifest import Install, load_manifest
from sparkmods.runtime.pep440 import Version
from sparkmods.verify.template import hf_environment

MOD_DIR = Path(__file__).resolve().parent.parent / "mods" / "chat-template"
TEMPLATE_NAME = "qwen3.5-sparkmods.jinja"
TEMPLATE_PATH = MOD_DIR / "files" / TEMPLATE_NAME
END = "<|im_end|>\n"
GEN_THINK = "<|im_start|>assistant\n<think>\n"
GEN_NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"

Message = Dict[str, Any]


_TEMPLATE = hf_environment().from_string(TEMPLATE_PATH.read_text(encoding="utf-8"))


def render(messages: List[Message], tools: Optional[List[dict]] = None, add_generation_prompt: bool = False,
           **kwargs: Any) -> str:
    """Render like apply_chat_template(tokenize=False); kwargs are chat_template_kwargs."""
    return _TEMPLATE.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)


def fn(name: str, description: str, properties: Dict[str, dict], required: List[str]) -> dict:
    """An OpenAI-style tool definition."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOLS = [
    fn("get_weather", "Current weather and a forecast for a city.", {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "days": {"type": "integer", "description": "Forecast length in days"},
        "units": {"type": "string", "enum": ["metric", "imperial"]},
    }, ["city"]),
    fn("write_file", "Write text to a file in the workspace.", {
        "path": {"type": "string"},
        "content": {"type": "string", "description": "The whole new file content"},
    }, ["path", "content"]),
    fn("set_config", "Change serving settings.", {
        "options": {"type": "object", "description": "Setting name to value"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "ratio": {"type": "number"},
        "dry_run": {"type": "boolean"},
    }, ["options"]),
]

PY_SOURCE = 'def area(r: float) -> float:\n    """Disk area; r < 0 is an error & raises."""\n    return 3.14159 * r ** 2\n'


def call(name: str, arguments: Any, call_id: str) -> dict:
    """An OpenAI-style tool call; arguments as a mapping or as JSON text."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_result(call_id: str, content: Any) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def case(name: str, history: List[Message], answer: Message, enable_thinking: bool = True,
         tools: Optional[List[dict]] = None, expect_calls: Optional[List[dict]] = None) -> Dict[str, Any]:
    """One assistant turn: what the template renders before it and what the model writes for it."""
    kwargs = {} if enable_thinking else {"enable_thinking": False}
    prompt = render(history, tools, add_generation_prompt=True, **kwargs)
    full = render(history + [answer], tools, **kwargs)
    assert full.startswith(prompt) and full.endswith(END), f"{name}: generation prompt is not a prefix of the answer"
    calls = expect_calls if expect_calls is not None else [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in answer.get("tool_calls", [])
    ]
    return {
        "name": name, "messages": history + [answer], "tools": tools, "enable_thinking": enable_thinking,
        "prompt": prompt, "output": full[len(prompt):-len(END)],
        "expect": {"reasoning": answer.get("reasoning_content") if enable_thinking else None,
                   "content": answer.get("content") or None, "tool_calls": calls},
    }


SYSTEM = {"role": "system", "content": "You are a concise assistant for a DGX Spark lab."}
ASK_WEATHER = {"role": "user", "content": "Will it rain in Paris or Lyon this weekend?"}
WEATHER_CALLS = [
    call("get_weather", {"city": "Paris", "days": 3, "units": "metric"}, "call_1"),
    call("get_weather", json.dumps({"city": "Lyon", "days": 2}), "call_2"),
]
WEATHER_STEP = {"role": "assistant", "content": "I will check both cities.",
                "reasoning_content": "Two cities, two forecasts: call get_weather twice.", "tool_calls": WEATHER_CALLS}
WEATHER_RESULTS = [tool_result("call_1", '{"rain_mm": [0, 4.5, 1.0]}'),
                   tool_result("call_2", [{"type": "text", "text": '{"rain_mm": [0, 0]}'}])]
CONFIG_ARGS = {"options": {"max_num_seqs": 8, "attention": {"backend": "FLASHINFER", "prefix_caching": False}},
               "tags": ["spark", "qwen3.5"], "ratio": 0.88, "dry_run": True}

CASES: List[Dict[str, Any]] = [
    case("system+user", [SYSTEM, {"role": "user", "content": "What is 17 * 23?"}],
         {"role": "assistant", "reasoning_content": "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.",
          "content": "17 * 23 = 391."}),
    case("multi-turn", [
        SYSTEM, {"role": "user", "content": "Name a prime above 10."},
        {"role": "assistant", "reasoning_content": "11 is prime.", "content": "11."},
        {"role": "user", "content": [{"type": "text", "text": "And one above 100?"}]},
    ], {"role": "assistant", "reasoning_content": "101 has no divisor up to 10.", "content": "101."}),
    case("tool-calls", [SYSTEM, ASK_WEATHER], WEATHER_STEP, tools=TOOLS, expect_calls=[
        {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "units": "metric"}},
        {"name": "get_weather", "arguments": {"city": "Lyon", "days": 2}},
    ]),
    case("after-tool-results", [SYSTEM, ASK_WEATHER, WEATHER_STEP, *WEATHER_RESULTS],
         {"role": "assistant", "reasoning_content": "Paris gets rain on day 2, Lyon stays dry.",
          "content": "Paris: rain on Saturday (4.5 mm). Lyon: dry."}, tools=TOOLS),
    case("typed-arguments", [{"role": "user", "content": "Save area.py and set the serving options."}],
         {"role": "assistant", "reasoning_content": "Write the file, then apply the settings.", "content": "",
          "tool_calls": [call("write_file", {"path": "src/area.py", "content": PY_SOURCE}, "call_a"),
                         call("set_config", json.dumps(CONFIG_ARGS), "call_b")]},
         tools=TOOLS, expect_calls=[{"name": "write_file", "arguments": {"path": "src/area.py", "content": PY_SOURCE}},
                                    {"name": "set_config", "arguments": CONFIG_ARGS}]),
    case("thinking-off", [SYSTEM, {"role": "user", "content": "Say hi."}],
         {"role": "assistant", "content": "Hi!"}, enable_thinking=False),
    case("thinking-off-tool-call", [ASK_WEATHER],
         {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"}, "call_x")]},
         enable_thinking=False, tools=TOOLS),
]


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
