"""A small byte-level BPE tokenizer with Qwen3.5's special tokens, built with `tokenizers`.

The tiny model needs a tokenizer that vLLM and transformers load exactly like Qwen's: a
`tokenizer.json` (byte-level BPE, so any text encodes), the chat-format special tokens with
the roles Qwen gives them (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>` and the vision
markers are *special*, so the server drops them from output text; `<think>`, `</think>`,
`<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>` are *not*, because vLLM's
`qwen3` reasoning parser and Qwen tool parsers read them in the text), and a
`tokenizer_config.json` naming Qwen2Tokenizer with a plain stock chat template (the baseline
must not already use the chat-template mod's template).

`SCRIPT` are further non-special tokens, each one piece of a scripted assistant reply
(reasoning, `</think>`, a tool call, `<|im_end|>`). The peaked model walks them one after the
other (tiny_weights.py), so the chat-template scenario gets a real reply for the parsers to read.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# Special tokens, in Qwen's order (ids follow the trained vocabulary).
SPECIAL = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
# Added but not special: the reasoning and tool-call markers stay in decoded text.
MARKERS = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>")
# The scripted reply, piece by piece; each piece is one token (see the module docstring).
SCRIPT = (
    "The user asks for the weather in Paris.",
    "</think>",
    "\n\n",
    "<tool_call>",
    "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n",
    "</tool_call>",
    "<|im_end|>",
)
EOS = "<|im_end|>"
PAD = "<|endoftext|>"
TRAINED_VOCAB = 640

# A stock ChatML template: roles and text only, no tools, no thinking block.
STOCK_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_CORPUS = """\
A small model is written on the machine that runs the test, so nothing is downloaded.
The tokenizer learns its merges from these lines: common English words, numbers such as 12,
128, 256 and 2048, punctuation, code like def main(): return 0, and paths like /models/qwen.
Weather reports say it is sunny in Paris, rainy in London and windy in Berlin today.
The server answers requests, streams tokens, and reports metrics for every request it serves.
Speculative decoding drafts tokens with a small head and the target model accepts or rejects them.
"""


def _train() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_VOCAB, min_frequency=1, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    lines = _CORPUS.splitlines(keepends=True)
    tok.train_from_iterator(lines * 4, trainer=trainer)
    return tok


def build_tokenizer() -> Tokenizer:
    """The trained BPE plus SPECIAL (special), MARKERS and SCRIPT (plain added tokens)."""
    tok = _train()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    plain = [t for t in dict.fromkeys(MARKERS + SCRIPT) if t not in SPECIAL]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    return tok


def write_tokenizer(root: Path, tok: Tokenizer) -> dict[str, int]:
    """Write tokenizer.json and tokenizer_config.json into root; returns the special ids."""
    tok.save(str(root / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 32768,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "bos_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": STOCK_TEMPLATE,
    }
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {name: tok.token_to_id(name) for name in SPECIAL + MARKERS}
