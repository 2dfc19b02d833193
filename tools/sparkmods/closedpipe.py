"""Standard output that survives its reader going away (`sparkmods check | head -2`).

When the reader of a pipe exits early, the next write raises BrokenPipeError. A traceback and
exit 1 would read as "a finding", so the first such error points file descriptor 1 at
/dev/null and the command runs to its end: it returns the exit code it would have returned
with the whole output read, and nothing is printed about the lost output. Interpreter
shutdown then flushes whatever is left in the buffer into /dev/null instead of failing again.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs start-up time (this is imported by every command)
if TYPE_CHECKING:
    from typing import Any, TextIO

__all__ = ["ClosedPipeGuard"]


class ClosedPipeGuard:
    """Wraps sys.stdout; every other attribute (isatty, encoding, fileno, ...) is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def _to_devnull(self) -> None:
        self.reader_gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._to_devnull()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._to_devnull()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
