"""Two standard pieces the runtime uses in a lighter form, for run.sh's start-up.

run.sh starts a fresh Python on every container start, and what it imports is much of what
it costs (ci/bench/results/check.md gives run.sh's times beside `python -c pass`). The
standard modules the runtime does without are the ones tests/test_runsh_lean.py keeps out of
run.sh's apply.

  Record   plain data classes without `dataclasses`: that module imports `inspect`, and each
           class built its methods with exec at import.
           A Record subclass lists its fields in `__slots__` (a subclass of it, the fields
           it adds) and writes its own typed `__init__`; Record adds what a dataclass would:
           equality field by field (same class only) and a repr that names every field.
           Records are not hashable, like mutable dataclasses.
  sha256   the interpreter's own SHA-256 module: hashlib loads OpenSSL's (`_hashlib`), a
           heavier import for the few hundred KB an apply hashes.

And `say_to`, the one way run.sh writes what it says.
"""

try:
    from _sha2 import sha256  # Python >= 3.12
except ImportError:
    try:
        from _sha256 import sha256  # Python 3.9 - 3.11
    except ImportError:  # an interpreter built without its own hashes
        from hashlib import sha256

__all__ = ["Record", "sha256", "say_to"]


def say_to(stream: object, text: str) -> None:
    """Write and flush text; never raise. What run.sh says comes after or between changes it
    has made or settled, so output that cannot be written (stdout closed, a reader gone with
    `| head -1`, a full device) is dropped rather than turned into a failure, and characters
    the stream cannot encode (an ASCII locale, a non-ASCII path) are written as escapes."""
    if stream is None:  # started with stdout closed
        return
    try:
        try:
            stream.write(text)  # type: ignore[attr-defined]
        except UnicodeEncodeError:  # raised before anything is written
            encoding = getattr(stream, "encoding", None) or "ascii"
            stream.write(text.encode(encoding, "backslashreplace").decode(encoding))  # type: ignore[attr-defined]
        stream.flush()  # type: ignore[attr-defined]
    except (OSError, ValueError):
        pass


class Record:
    """Equality and repr over the fields named in `__slots__`, the base classes' first."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # equality by value on mutable fields

    def _names(self) -> "list[str]":
        return [name for cls in reversed(type(self).__mro__) for name in cls.__dict__.get("__slots__", ())]

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self._names())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._names())
        return f"{self.__class__.__name__}({fields})"
