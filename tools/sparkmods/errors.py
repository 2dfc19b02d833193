"""Errors that the CLI turns into one clear line and exit code 2."""

from __future__ import annotations


class SparkmodsError(Exception):
    """Bad input or an environment problem: printed as one line, never a traceback."""


class Unreachable(SparkmodsError):
    """The network failed where the on-disk cache may serve. The message names `--offline`; a
    caller whose `--offline` needs other flags with it (ci/nightly_check.py) words the hint from
    `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason} (use --offline to work from the cache)")
        self.reason = reason
