"""What run.sh says: every line goes through `say_to`."""

from __future__ import annotations

from typing import Optional, TextIO

__all__ = ["say_to"]


def say_to(stream: Optional[TextIO], text: str) -> None:
    """Write and flush text; never raise. What run.sh says comes after or between changes it
    has made or settled, so output that cannot be written (stdout closed, a reader gone with
    `| head -1`, a full device) is dropped rather than turned into a failure, and characters
    the stream cannot encode (an ASCII locale, a non-ASCII path) are written as escapes."""
    if stream is None:  # started with stdout closed
        return
    try:
        try:
            stream.write(text)
        except UnicodeEncodeError:  # raised before anything is written
            encoding = getattr(stream, "encoding", None) or "ascii"
            stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
        stream.flush()
    except (OSError, ValueError):
        pass
