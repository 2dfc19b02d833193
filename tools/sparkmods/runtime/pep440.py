"""PEP 440 versions and variant ranges, stdlib only.

This module runs inside containers we do not control, where `packaging` may be absent, so
it carries its own parser. Versions order exactly as `packaging.version.Version` orders them
(the test suite checks that against packaging on thousands of pairs).

Ranges are deliberately simpler than PEP 440 specifiers: a bound compares by version ORDER
on the public version (the local label is ignored). So `<0.19.1` contains `0.19.1.dev0` and
`0.19.1rc1.dev15`, which PEP 440's exclusive-bound rule would drop. A dev or rc build of X
therefore falls into the variant that covers the releases just before X, which is what a
source build taken from main between X-1 and X really contains.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

__all__ = ["InvalidVersion", "Version", "Range", "InvalidRange"]


class InvalidVersion(ValueError):
    """The string is not a PEP 440 version."""


class InvalidRange(ValueError):
    """The string is not a range we accept."""


# The grammar (packaging's).
_VERSION_RE = re.compile(r"""
    ^\s*v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?:[-_.]?(?P<pre_l>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?:-(?P<post_n1>[0-9]+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$
    """, re.VERBOSE | re.IGNORECASE)

_PRE_CANON = {"a": "a", "alpha": "a", "b": "b", "beta": "b", "c": "rc", "rc": "rc", "pre": "rc", "preview": "rc"}
_PRE_RANK = {"a": 0, "b": 1, "rc": 2}
_HEX = frozenset("0123456789abcdef")

# Sort sentinels: -inf sorts below and +inf above every integer in a key tuple.
_NEG = (-1,)
_POS = (1,)


class Version:
    """A parsed PEP 440 version with packaging-compatible ordering."""

    __slots__ = ("text", "epoch", "release", "pre", "post", "dev", "local", "_key")
    epoch: int
    release: Tuple[int, ...]
    pre: Optional[Tuple[str, int]]
    post: Optional[int]
    dev: Optional[int]
    local: Optional[Tuple[str, ...]]

    def __init__(self, text: str) -> None:
        self.text = text.strip()
        match = _VERSION_RE.match(text)
        if not match:
            raise InvalidVersion(f"not a PEP 440 version: {text!r}")
        self.epoch = int(match.group("epoch") or 0)
        self.release = tuple(int(p) for p in match.group("release").split("."))
        pre_l = match.group("pre_l")
        self.pre = (
            (_PRE_CANON[pre_l.lower()], int(match.group("pre_n") or 0)) if pre_l else None
        )
        if match.group("post_n1") is not None:
            self.post = int(match.group("post_n1"))
        elif match.group("post_l"):
            self.post = int(match.group("post_n2") or 0)
        else:
            self.post = None
        self.dev = int(match.group("dev_n") or 0) if match.group("dev_l") else None
        local = match.group("local")
        self.local = (
            tuple(local.lower().replace("-", ".").replace("_", ".").split(".")) if local else None
        )
        self._key = self._sort_key()

    def _sort_key(self) -> tuple:
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        # A dev release with neither pre nor post sorts before every pre-release of its release.
        if self.pre is None and self.post is None and self.dev is not None:
            pre: tuple = _NEG
        elif self.pre is None:
            pre = _POS
        else:
            pre = (0, _PRE_RANK[self.pre[0]], self.pre[1])
        post: tuple = _NEG if self.post is None else (0, self.post)
        dev: tuple = _POS if self.dev is None else (0, self.dev)
        if self.local is None:
            local: tuple = _NEG
        else:
            # Numeric segments sort above alphanumeric ones, as PEP 440 asks.
            local = (0,) + tuple((1, int(s), "") if s.isdigit() else (0, 0, s) for s in self.local)
        return (self.epoch, tuple(release), pre, post, dev, local)

    @property
    def public(self) -> "Version":
        """The same version without its local label."""
        return self if self.local is None else Version(self.text.split("+", 1)[0])

    @property
    def base_version(self) -> str:
        epoch = f"{self.epoch}!" if self.epoch else ""
        return epoch + ".".join(str(p) for p in self.release)

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None

    @property
    def is_devbuild(self) -> bool:
        """True for source builds (dev segment or a local label), not for published releases."""
        return self.dev is not None or self.local is not None

    @property
    def commit(self) -> Optional[str]:
        """The git commit named in a local label such as `+g50cd5674b.d20260403`."""
        for part in self.local or ():
            if part[:1] == "g" and 7 <= len(part) - 1 <= 40 and _HEX.issuperset(part[1:]):
                return part[1:]
        return None

    def __str__(self) -> str:
        out = (f"{self.epoch}!" if self.epoch else "") + ".".join(str(p) for p in self.release)
        if self.pre:
            out += f"{self.pre[0]}{self.pre[1]}"
        if self.post is not None:
            out += f".post{self.post}"
        if self.dev is not None:
            out += f".dev{self.dev}"
        if self.local:
            out += "+" + ".".join(self.local)
        return out

    def __repr__(self) -> str:
        return f"Version({str(self)!r})"

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key == other._key

    def __lt__(self, other: "Version") -> bool:
        return self._key < other._key

    def __le__(self, other: "Version") -> bool:
        return self._key <= other._key

    def __gt__(self, other: "Version") -> bool:
        return self._key > other._key

    def __ge__(self, other: "Version") -> bool:
        return self._key >= other._key


_CLAUSE = re.compile(r"^\s*(>=|<=|==|~=|>|<)\s*([^\s,]+)\s*$")


def _clause(text: str) -> Optional[Tuple[str, str]]:
    """(operator, version text) of one clause such as ` >= 0.19.0 `; None if it is not one."""
    match = _CLAUSE.match(text)
    return (match.group(1), match.group(2)) if match else None


class Range:
    """An interval of versions: the intersection of its clauses, compared by version order.

    Accepted clauses: `>=V`, `>V`, `<=V`, `<V`, `==V` (exactly V) and `~=V` (compatible
    release, turned into `>=V,<next`). `!=` and wildcards are refused: a variant range must be
    one interval so that overlaps between variants can be decided exactly.
    """

    __slots__ = ("text", "lower", "lower_inclusive", "upper", "upper_inclusive")

    def __init__(self, text: str) -> None:
        self.text = text.strip()
        self.lower: Optional[Version] = None
        self.lower_inclusive = True
        self.upper: Optional[Version] = None
        self.upper_inclusive = False
        if not self.text:
            raise InvalidRange("empty range")
        for clause in self.text.split(","):
            parsed = _clause(clause)
            if parsed is None:
                raise InvalidRange(
                    f"bad clause {clause.strip()!r} in {self.text!r} (use >=, >, <=, <, == or ~=)"
                )
            op, raw = parsed
            try:
                version = Version(raw)
            except InvalidVersion as exc:
                raise InvalidRange(f"{exc} in range {self.text!r}") from None
            if version.local is not None:
                raise InvalidRange(f"local version {raw!r} not allowed in range {self.text!r}")
            if op in (">=", ">", "==", "~="):
                self._tighten_lower(version, op != ">")
            if op in ("<=", "<", "=="):
                self._tighten_upper(version, op != "<")
            if op == "~=":
                if len(version.release) < 2:
                    raise InvalidRange(f"~= needs at least two release parts in {self.text!r}")
                nxt = list(version.release[:-1])
                nxt[-1] += 1
                self._tighten_upper(Version(".".join(str(p) for p in nxt) + ".dev0"), False)
        if self.is_empty():
            raise InvalidRange(f"range {self.text!r} contains no version")

    def _tighten_lower(self, version: Version, inclusive: bool) -> None:
        if self.lower is None or version > self.lower or (version == self.lower and not inclusive):
            self.lower, self.lower_inclusive = version, inclusive

    def _tighten_upper(self, version: Version, inclusive: bool) -> None:
        if self.upper is None or version < self.upper or (version == self.upper and not inclusive):
            self.upper, self.upper_inclusive = version, inclusive

    def is_empty(self) -> bool:
        if self.lower is None or self.upper is None:
            return False
        if self.lower > self.upper:
            return True
        return self.lower == self.upper and not (self.lower_inclusive and self.upper_inclusive)

    def contains(self, version: "Version | str") -> bool:
        v = (Version(version) if isinstance(version, str) else version).public
        below = self.lower is not None and (v < self.lower or (v == self.lower and not self.lower_inclusive))
        above = self.upper is not None and (v > self.upper or (v == self.upper and not self.upper_inclusive))
        return not (below or above)

    def __contains__(self, version: "Version | str") -> bool:
        return self.contains(version)

    def overlaps(self, other: "Range") -> bool:
        """True when some version lies in both ranges."""
        lo, lo_inc = self.lower, self.lower_inclusive
        if other.lower is not None and (
            lo is None or other.lower > lo or (other.lower == lo and not other.lower_inclusive)
        ):
            lo, lo_inc = other.lower, other.lower_inclusive
        hi, hi_inc = self.upper, self.upper_inclusive
        if other.upper is not None and (
            hi is None or other.upper < hi or (other.upper == hi and not other.upper_inclusive)
        ):
            hi, hi_inc = other.upper, other.upper_inclusive
        if lo is None or hi is None:
            return True
        return lo < hi or (lo == hi and lo_inc and hi_inc)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Range({self.text!r})"

