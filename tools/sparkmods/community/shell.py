"""A bash reader for run.sh files: enough of the grammar to follow what a mod script does.

Never executes anything. It understands simple commands with redirections and here-documents,
pipelines, `&&`/`||` lists, `!`, `if/elif/else`, `for ... in`, `while`/`until`, `{ }` and
`( )` groups, function definitions and array assignments. `$(...)` and backquotes are kept
as opaque placeholders (their text is in `Script.subs`) for the interpreter to recognise;
`case` and C-style `for ((...))` are kept as opaque nodes. Quote removal is done here, so a
word's expansions (`$VAR`, `${VAR:-x}`) are left for the interpreter.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

__all__ = ["ShellError", "Simple", "AndOr", "If", "Loop", "Group", "Func", "Opaque", "Script", "parse_script"]

SUB = "\x00sub{}\x00"  # placeholder of the n-th command substitution inside a word
_SUB_RE = re.compile("\x00sub(\\d+)\x00")
_HEREDOC_RE = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
_REDIRECTS = {"<", ">", ">>", "&>", "&>>", ">&", "<&", "<<", "<<-", "<<<", ">|", "<>"}
_SEPARATORS = {";", "&", "\n", "&&", "||", "|", "|&", ";;"}
_STARTERS = {"then", "do", "else", "elif", "fi", "done", "esac", "}", ")"}


class ShellError(ValueError):
    """run.sh cannot be read; the message names the line."""


@dataclass
class Simple:
    words: List[str]
    line: int
    text: str  # the source line, for messages
    redirects: List[Tuple[str, str]] = field(default_factory=list)  # (operator, target)
    heredoc: Optional[str] = None
    pipe_from: Optional["Node"] = None  # the command whose output this one reads
    assign: Optional[Tuple[str, List[str]]] = None  # NAME=(a b c)


@dataclass
class AndOr:
    parts: List["Node"]
    ops: List[str]  # between parts: "&&" or "||"
    negated: List[bool]


@dataclass
class If:
    branches: List[Tuple[List["Node"], List["Node"]]]  # (condition, body) for if and each elif
    orelse: List["Node"]
    line: int


@dataclass
class Loop:
    kind: str  # for, while, until
    var: str
    items: Optional[List[str]]  # None: not a `for VAR in WORDS` loop (C-style, while, until)
    body: List["Node"]
    line: int
    text: str


@dataclass
class Group:
    body: List["Node"]


@dataclass
class Func:
    name: str
    body: List["Node"]


@dataclass
class Opaque:
    kind: str
    line: int
    text: str


Node = Union[Simple, AndOr, If, Loop, Group, Func, Opaque]


@dataclass
class Script:
    body: List[Node]
    subs: List[str]  # the text inside each $(...) or `...`
    lines: List[str]


def _cut_substitutions(text: str, subs: List[str]) -> str:
    """Replace each outermost $(...) and `...` with a placeholder, keeping quotes balanced."""
    out, i, quote = [], 0, ""
    while i < len(text):
        c = text[i]
        if quote != "'" and c == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i += 2
            continue
        if c in "'\"" and (not quote or quote == c):
            if not (c == "'" and quote == '"'):
                quote = "" if quote == c else c
            out.append(c)
            i += 1
            continue
        if quote != "'" and text.startswith("$(", i) and not text.startswith("$((", i):
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            subs.append(text[i + 2:j - 1])
            out.append(SUB.format(len(subs) - 1))
            i = j
            continue
        if quote != "'" and c == "`":
            j = text.find("`", i + 1)
            j = len(text) if j < 0 else j
            subs.append(text[i + 1:j])
            out.append(SUB.format(len(subs) - 1))
            i = j + 1
            continue
        if not quote and c == "#" and (i == 0 or text[i - 1] in " \t;&|(") :
            break  # a comment runs to the end of the line
        out.append(c)
        i += 1
    return "".join(out)


def _logical_lines(source: str) -> Tuple[List[Tuple[int, str]], Dict[int, List[str]]]:
    """(line number, text) with continuations joined and comments cut; here-document bodies
    by the line that opens them."""
    raw = source.splitlines()
    out: List[Tuple[int, str]] = []
    bodies: Dict[int, List[str]] = {}
    i = 0
    while i < len(raw):
        start, text = i + 1, raw[i]
        while text.endswith("\\") and i + 1 < len(raw):
            i += 1
            text = text[:-1] + " " + raw[i].lstrip()
        i += 1
        for dash, _, word in _HEREDOC_RE.findall(text):
            body = []
            while i < len(raw) and (raw[i].lstrip("\t") if dash else raw[i]) != word:
                body.append(raw[i])
                i += 1
            i += 1
            bodies.setdefault(start, []).append("\n".join(body) + "\n")
        out.append((start, text))
    return out, bodies


class _Parser:
    def __init__(self, source: str) -> None:
        self.subs: List[str] = []
        self.lines = source.splitlines()
        self.toks: List[Tuple[str, int]] = []
        self.heredocs: Dict[int, List[str]] = {}
        logical, self.heredocs = _logical_lines(source)
        for number, text in logical:
            lexer = shlex.shlex(_cut_substitutions(text, self.subs), posix=True, punctuation_chars=";&|<>()")
            lexer.whitespace_split = True
            lexer.commenters = ""
            try:
                self.toks.extend((tok, number) for tok in lexer)
            except ValueError as exc:
                raise ShellError(f"line {number}: {exc}") from None
            self.toks.append(("\n", number))
        self.pos = 0

    # -- tokens ------------------------------------------------------------------------------
    def peek(self) -> str:
        return self.toks[self.pos][0] if self.pos < len(self.toks) else ""

    def line(self) -> int:
        return self.toks[min(self.pos, len(self.toks) - 1)][1] if self.toks else 0

    def take(self) -> str:
        tok = self.peek()
        self.pos += 1
        return tok

    def expect(self, word: str) -> None:
        self.skip_newlines()
        if self.take() != word:
            raise ShellError(f"line {self.line()}: expected `{word}`")

    def skip_newlines(self) -> None:
        while self.peek() in ("\n", ";"):
            self.pos += 1

    # -- grammar -----------------------------------------------------------------------------
    def parse_list(self, stops: Tuple[str, ...]) -> List[Node]:
        body: List[Node] = []
        while True:
            self.skip_newlines()
            tok = self.peek()
            if not tok or tok in stops:
                return body
            if tok in _STARTERS:
                raise ShellError(f"line {self.line()}: unexpected `{tok}`")
            body.append(self.parse_andor())
            if self.peek() == "&":
                self.take()

    def parse_andor(self) -> Node:
        negated = [self._bang()]
        parts = [self.parse_pipeline()]
        ops: List[str] = []
        while self.peek() in ("&&", "||"):
            ops.append(self.take())
            self.skip_newlines()
            negated.append(self._bang())
            parts.append(self.parse_pipeline())
        return parts[0] if not ops and not negated[0] else AndOr(parts, ops, negated)

    def _bang(self) -> bool:
        if self.peek() == "!":
            self.take()
            return True
        return False

    def parse_pipeline(self) -> Node:
        node = self.parse_command()
        while self.peek() in ("|", "|&"):
            self.take()
            self.skip_newlines()
            nxt = self.parse_command()
            if isinstance(nxt, Simple):
                nxt.pipe_from = node
            node = nxt
        return node

    def parse_command(self) -> Node:
        tok, line = self.peek(), self.line()
        if tok == "if":
            return self.parse_if()
        if tok in ("for", "while", "until"):
            return self.parse_loop()
        if tok == "case":
            return self.opaque_until("esac", "case")
        if tok in ("{", "("):
            self.take()
            body = self.parse_list(("}" if tok == "{" else ")",))
            self.take()
            return Group(body)
        if tok == "function":
            self.take()
            name = self.take()
            if self.peek() == "()":
                self.take()
            elif self.peek() == "(":
                self.take()
                self.expect(")")
            return self.func_body(name)
        return self.parse_simple(line)

    def func_body(self, name: str) -> Func:
        self.skip_newlines()
        opener = self.take()
        if opener not in ("{", "("):
            raise ShellError(f"line {self.line()}: function {name} has no body")
        body = self.parse_list(("}" if opener == "{" else ")",))
        self.take()
        return Func(name, body)

    def opaque_until(self, end: str, kind: str) -> Opaque:
        line = self.line()
        words = []
        while self.peek() and self.peek() != end:
            words.append(self.take())
        self.take()
        return Opaque(kind, line, " ".join(w for w in words if w != "\n"))

    def parse_if(self) -> If:
        line = self.line()
        branches = []
        orelse: List[Node] = []
        self.take()  # if
        while True:
            cond = self.parse_list(("then",))
            self.expect("then")
            body = self.parse_list(("elif", "else", "fi"))
            branches.append((cond, body))
            tok = self.take()
            if tok == "elif":
                continue
            if tok == "else":
                orelse = self.parse_list(("fi",))
                self.expect("fi")
            elif tok != "fi":
                raise ShellError(f"line {line}: `if` without `fi`")
            return If(branches, orelse, line)

    def parse_loop(self) -> Loop:
        line, kind = self.line(), self.take()
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else kind
        var, items = "", None
        if kind == "for" and self.peek().startswith("(("):
            while self.peek() and self.peek() != "do":
                self.take()
        elif kind == "for":
            var = self.take()
            self.skip_newlines() if self.peek() == "\n" else None
            if self.peek() == "in":
                self.take()
                items = []
                while self.peek() not in ("\n", ";", ""):
                    items.append(self.take())
        else:
            self.parse_list(("do",))
        self.expect("do")
        body = self.parse_list(("done",))
        self.expect("done")
        return Loop(kind, var, items, body, line, text)

    def parse_simple(self, line: int) -> Node:
        node = Simple([], line, self.lines[line - 1].strip() if 0 < line <= len(self.lines) else "")
        heredocs = self.heredocs.get(line, [])
        while True:
            tok = self.peek()
            if not tok or tok in _SEPARATORS or (tok == ")" and node.words):
                break
            if tok == ")" or (tok in ("}",) and not node.words):
                break
            if tok == "(" and len(node.words) == 1 and node.words[0].endswith("=") and node.assign is None:
                self.take()
                items = []
                while self.peek() not in (")", ""):
                    tok = self.take()
                    if tok != "\n":
                        items.append(tok)
                self.take()
                node.assign = (node.words.pop()[:-1], items)
                continue
            if tok in ("(", "()") and len(node.words) == 1:  # name() { ...: shlex may join the parentheses
                self.take()
                if tok == "(":
                    self.expect(")")
                return self.func_body(node.words[0])
            self.take()
            if tok in _REDIRECTS:
                if node.words and node.words[-1].isdigit():
                    node.words.pop()  # 2>/dev/null: the number is the descriptor
                target = self.take()
                node.redirects.append((tok, target))
                if tok in ("<<", "<<-") and heredocs:
                    node.heredoc = heredocs.pop(0)
                continue
            node.words.append(tok)
        if not node.words and node.assign is None and not node.redirects:
            raise ShellError(f"line {line}: unexpected `{self.peek()}`")
        return node


def parse_script(source: str) -> Script:
    """The syntax tree of a run.sh; ShellError (naming the line) when it cannot be read."""
    parser = _Parser(source)
    body = parser.parse_list(())
    if parser.peek():
        raise ShellError(f"line {parser.line()}: unexpected `{parser.peek()}`")
    return Script(body, parser.subs, parser.lines)


def substitutions(word: str) -> List[int]:
    """The placeholder numbers inside a word."""
    return [int(n) for n in _SUB_RE.findall(word)]


def sub_pattern() -> "re.Pattern[str]":
    return _SUB_RE
