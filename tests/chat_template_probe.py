"""Probe for test_chat_template_vllm.py, run by the python of a venv where vLLM is installed.

`python tests/chat_template_probe.py JOB.json` reads {"template": path, "cases": [...]}
(the cases of test_chat_template.py) and prints one line `PROBE-REPORT {json}`: how that release's
transformers renders each case, how vLLM classifies the template's content format, and what its
`qwen3` reasoning parser and `qwen3_coder` / `qwen3_xml` tool parsers extract from the model output
of each case. It holds no tests (pytest does not collect it). Top-level imports are stdlib only.

Tokenizer: the parsers only need a tokenizer whose vocabulary holds Qwen's special tokens as single
ids. `_tokenizer` builds one with `tokenizers`: byte-level BPE over the 256 byte symbols (no merges,
so any text encodes), plus Qwen3.5's ChatML, reasoning, tool and vision tokens as added tokens
(<|im_start|>/<|im_end|>/<|endoftext|> special, the rest not, as in Qwen's tokenizer).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict

TOOL_PARSERS = ("qwen3_coder", "qwen3_xml")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
MARK = "PROBE-REPORT "


def _tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def _detect_content_format(template: str) -> str:
    import vllm.multimodal  # noqa: F401  (imported first: vllm.renderers alone hits an import cycle in 0.18)
    from vllm.renderers.hf import _detect_content_format as detect

    return detect(template, default="string")


def _tool_parser(name: str, tokenizer: Any, request: Any, kwargs: Dict[str, Any]) -> Any:
    import inspect

    from vllm.tool_parsers import ToolParserManager

    cls = ToolParserManager.get_tool_parser(name)
    # As vLLM's own Parser builds them: engine adapters (0.24+) take the tools and the chat template
    # kwargs, later legacy parsers (tokenizer, tools), the oldest the tokenizer alone (tools come
    # from the request).
    if hasattr(cls, "_parser_engine_cls"):
        return cls(tokenizer, request.tools, **kwargs)
    if "tools" in inspect.signature(cls.__init__).parameters:
        return cls(tokenizer, request.tools)
    return cls(tokenizer)


def _probe_case(c: Dict[str, Any], template: str, tokenizer: Any) -> Dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    kwargs = {"chat_template_kwargs": {"enable_thinking": c["enable_thinking"]}}
    template_kwargs = {} if c["enable_thinking"] else {"enable_thinking": False}
    history = c["messages"][:-1]
    rendered_prompt = tokenizer.apply_chat_template(history, tools=c["tools"], chat_template=template,
                                                    add_generation_prompt=True, tokenize=False, **template_kwargs)
    rendered_full = tokenizer.apply_chat_template(c["messages"], tools=c["tools"], chat_template=template,
                                                  tokenize=False, **template_kwargs)
    request = ChatCompletionRequest(model="qwen3.5", messages=[{"role": "user", "content": "x"}],
                                    tools=c["tools"], **kwargs)
    reasoning_parser = ReasoningParserManager.get_reasoning_parser("qwen3")(tokenizer, **kwargs)
    prompt_ids = tokenizer.encode(c["prompt"], add_special_tokens=False)
    # The serving layer's two steps (serving_chat in 0.18-0.23, DelegatingParser.parse later):
    # split reasoning off, then read tool calls from what is left.
    reasoning, content = reasoning_parser.extract_reasoning(c["output"], request)
    tools: Dict[str, Any] = {}
    for name in TOOL_PARSERS:
        info = _tool_parser(name, tokenizer, request, kwargs).extract_tool_calls(content or "", request)
        tools[name] = {
            "called": info.tools_called,
            "calls": [{"name": t.function.name, "arguments": json.loads(t.function.arguments)} for t in info.tool_calls],
            "content": info.content,
        }
    return {"rendered_prompt": rendered_prompt, "rendered_full": rendered_full,
            "prompt_ends_reasoning": reasoning_parser.is_reasoning_end(prompt_ids),
            "reasoning": reasoning, "content": content, "tools": tools}


def probe_main(job_path: str) -> None:
    """Read the job file, print the findings as one JSON line."""
    import logging

    import transformers
    import vllm

    logging.disable(logging.WARNING)
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    template = Path(job["template"]).read_text(encoding="utf-8")
    tokenizer = _tokenizer()
    report = {"vllm": vllm.__version__, "transformers": transformers.__version__,
              "content_format": _detect_content_format(template),
              "cases": {c["name"]: _probe_case(c, template, tokenizer) for c in job["cases"]}}
    print(MARK + json.dumps(report))


if __name__ == "__main__":
    probe_main(sys.argv[1])
