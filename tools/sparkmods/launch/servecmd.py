"""The `vllm serve` command of a recipe, as an argv we can query and re-render safely.

A recipe command is shell text: one `vllm serve MODEL ...` invocation, possibly continued over
lines with backslashes, with `{placeholders}`. We split the TEMPLATE into words the way bash
would (shlex, POSIX mode), refusing anything bash would treat as a second command, and only
then fill each word with str.format. So a value is data inside its word: a path with spaces
stays one argument and nothing in a value is ever parsed by a shell (run-recipe.sh pastes the
values into the text first, which splits them). Rendering goes back through shlex.quote on
ONE line: launchers append flags to the last line of the launch script.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

from sparkmods.errors import SparkmodsError

__all__ = ["ServeCommand", "ServeCommandError", "canonical"]

# Short forms vLLM's parser accepts for the flags our rules look at.
ALIASES: Dict[str, str] = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-sc": "--speculative-config",
    "-q": "--quantization",
}
_OPERATORS = "();<>|&\n"
_NUMBER = re.compile(r"^-\d+(\.\d+)?$")


class ServeCommandError(SparkmodsError):
    """The command is not one plain `vllm serve` invocation."""


def canonical(option: str) -> str:
    """`-tp` -> `--tensor-parallel-size`; `--max_model_len` -> `--max-model-len` (vLLM accepts both)."""
    name = option.split("=", 1)[0]
    name = ALIASES.get(name, name)
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name


def _split(text: str) -> List[str]:
    joined = re.sub(r"\\\r?\n", " ", text).strip()
    lex = shlex.shlex(joined, posix=True, punctuation_chars=_OPERATORS)
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        tokens = list(lex)
    except ValueError as exc:  # unbalanced quotes
        raise ServeCommandError(f"command: {exc} (check the quotes)") from None
    for tok in tokens:
        if tok and all(c in _OPERATORS for c in tok):
            what = "a line break without a trailing backslash" if "\n" in tok else f"the shell operator {tok!r}"
            raise ServeCommandError(f"command: must be one `vllm serve` invocation, found {what}")
        if tok.startswith("#"):
            raise ServeCommandError(f"command: comments ({tok!r}) cannot appear inside the command")
        if "$" in tok or "`" in tok:
            # The launch script quotes every word, so bash would not expand these: say so now.
            raise ServeCommandError(f"command: {tok!r}: shell expansions ($VAR, `...`) are not supported; "
                                    "write the value out or make it a {placeholder}")
    return tokens


def _fill(word: str, values: Mapping[str, str]) -> str:
    try:
        return word.format(**values)
    except KeyError as exc:
        raise ServeCommandError(f"command: placeholder {{{exc.args[0]}}} has no value: add it to defaults") from None
    except (ValueError, IndexError) as exc:
        raise ServeCommandError(f"command: {word!r} is not a valid format template ({exc}): "
                                "write literal braces as {{ and }}") from None


@dataclass
class ServeCommand:
    """`vllm serve MODEL ARGS...`: the model and the option tokens after it."""

    model: str
    args: List[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str, values: Optional[Mapping[str, str]] = None) -> "ServeCommand":
        """Split text into words, then (with values) fill each word's {placeholders}."""
        tokens = _split(text)
        if values is not None:
            tokens = [_fill(tok, values) for tok in tokens]
        if tokens[:1] == ["exec"]:
            tokens = tokens[1:]
        if tokens[:2] != ["vllm", "serve"]:
            raise ServeCommandError(f"command: must start with `vllm serve`, got {' '.join(tokens[:2])!r}")
        if len(tokens) < 3 or tokens[2].startswith("-"):
            raise ServeCommandError("command: `vllm serve` needs the model as its first argument")
        return cls(tokens[2], tokens[3:])

    def _options(self) -> List["tuple[int, str, Optional[str]]"]:
        """(index, canonical name, value or None) for every option token."""
        out: List["tuple[int, str, Optional[str]]"] = []
        i = 0
        while i < len(self.args):
            tok = self.args[i]
            if tok.startswith("-") and not _NUMBER.match(tok):
                if "=" in tok and tok.startswith("--"):
                    out.append((i, canonical(tok), tok.split("=", 1)[1]))
                    i += 1
                    continue
                nxt = self.args[i + 1] if i + 1 < len(self.args) else None
                if nxt is not None and (not nxt.startswith("-") or _NUMBER.match(nxt)):
                    out.append((i, canonical(tok), nxt))
                    i += 2
                    continue
                out.append((i, canonical(tok), None))
            i += 1
        return out

    def has(self, option: str) -> bool:
        return any(name == canonical(option) for _, name, _ in self._options())

    def get(self, option: str) -> Optional[str]:
        """The value of the last occurrence (argparse semantics), or None."""
        found = None
        for _, name, value in self._options():
            if name == canonical(option):
                found = value
        return found

    def options(self) -> List["tuple[str, Optional[str]]"]:
        """(canonical name, value or None) for every option, in order."""
        return [(name, value) for _, name, value in self._options()]

    def names(self) -> List[str]:
        return [name for name, _ in self.options()]

    def set(self, option: str, value: str) -> None:
        """Replace every occurrence of option by one `option value` (or append it)."""
        self.remove(option)
        self.args += [option, value]

    def remove(self, option: str) -> None:
        drop: List[int] = []
        for i, name, value in self._options():
            if name == canonical(option):
                drop.append(i)
                if value is not None and "=" not in self.args[i]:
                    drop.append(i + 1)
        self.args = [a for k, a in enumerate(self.args) if k not in drop]

    @staticmethod
    def grouped(argv: Sequence[str]) -> List[List[str]]:
        """argv split for reading: `vllm serve MODEL`, then each option with its value."""
        groups = [list(argv[:3])]
        for tok in argv[3:]:
            is_option = tok.startswith("-") and not _NUMBER.match(tok)
            if not is_option and len(groups) > 1 and len(groups[-1]) == 1:
                groups[-1].append(tok)  # the value of the option just before
            else:
                groups.append([tok])
        return groups

    def argv(self, extra: Sequence[str] = ()) -> List[str]:
        return ["vllm", "serve", self.model, *self.args, *extra]

    def line(self, extra: Sequence[str] = ()) -> str:
        """The command on one line, every word shell-quoted."""
        return " ".join(shlex.quote(a) for a in self.argv(extra))
