"""The chat-template mod's template rendered on the host, exactly as the server would render it.

vLLM hands a chat template to transformers' `apply_chat_template`, which compiles it in an
ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols) with its own `tojson`
(json.dumps, ensure_ascii=False, key order kept) and a `raise_exception` global
(transformers/utils/chat_template_utils.py, `_compile_jinja_template`). `hf_environment` builds the
same; tests/test_chat_template_vllm.py checks it against the real transformers in vLLM's venvs.

`PROBE_MESSAGES` is the conversation verify asks the server to render (POST /tokenize with
`messages`). It has what tells templates apart while nothing in it depends on how a vLLM
release dumps request objects: a system prompt, a tool call with an integer and a boolean
argument (ours writes JSON `true`, Qwen's own layout writes `True`), and a tool result. vLLM
decodes tool-call arguments to a mapping before rendering (vllm/entrypoints/chat_utils.py,
`_postprocess_messages`), so `messages_as_rendered` does too.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from sparkmods.errors import SparkmodsError

TEMPLATE_FILE = "qwen3.5-sparkmods.jinja"

PROBE_MESSAGES: List[Dict[str, Any]] = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "Will it rain in Paris in the next 3 days? Use metric units."},
    {"role": "assistant", "content": "Let me check the forecast.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3, "metric": True})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"forecast": ["sun", "rain", "sun"]})},
]


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def hf_environment() -> Any:
    """The Jinja environment transformers' apply_chat_template compiles chat templates in."""
    try:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise SparkmodsError("rendering the chat template needs jinja2: pip install jinja2") from None

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    return env


def messages_as_rendered(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The messages as vLLM passes them to the template: tool-call arguments decoded."""
    out = copy.deepcopy(messages)
    for message in out:
        for call in message.get("tool_calls") or []:
            arguments = call["function"].get("arguments")
            if not arguments:
                call["function"]["arguments"] = {}
            elif not isinstance(arguments, (dict, list)):
                call["function"]["arguments"] = json.loads(arguments)
    return out


def render(template_path: Path, messages: List[Dict[str, Any]], tools: Optional[List[dict]] = None,
           add_generation_prompt: bool = False, **kwargs: Any) -> str:
    """Render like apply_chat_template(tokenize=False); kwargs are chat_template_kwargs."""
    try:
        source = template_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SparkmodsError(f"{template_path}: cannot read the chat template: {exc.strerror or exc}") from None
    template = hf_environment().from_string(source)
    return template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)
