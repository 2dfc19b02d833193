"""The chat-template mod's template rendered as vLLM renders it (transformers' sandboxed Jinja
environment, sparkmods.verify.template.hf_environment), and `CASES`: whole conversations, each with
the text the model writes, derived from the template itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

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
