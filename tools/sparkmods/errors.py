"""Errors that the CLI turns into one clear line and exit code 2."""

from __future__ import annotations


class SparkmodsError(Exception):
    """Bad input or an environment problem: printed as one line, never a traceback."""
