"""Read a loose unified diff named on the command line (check-patch, rebase-patch)."""

from __future__ import annotations

from pathlib import Path
from typing import List

from sparkmods.errors import SparkmodsError
from sparkmods.runtime.udiff import FilePatch, PatchParseError, parse_patch


def read_patch_file(path: Path, strip: int = 1) -> List[FilePatch]:
    """The file's patches; an unreadable or malformed file is one line naming it."""
    try:
        return parse_patch(path.read_text(encoding="utf-8"), strip=strip)
    except OSError as exc:
        raise SparkmodsError(f"{path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SparkmodsError(f"{path}: not UTF-8 text (want a unified diff)") from None
    except PatchParseError as exc:
        raise SparkmodsError(f"{path}: {exc}") from None
