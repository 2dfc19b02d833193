"""`wheel:PATH`: a wheel file on disk, read with the same CRC-checked zip layer as remote ones."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from sparkmods.errors import SparkmodsError
from sparkmods.sources.base import VllmSource, check_member
from sparkmods.sources.remote import commit_of
from sparkmods.sources.zipread import ZipMembers


def metadata_version(text: str) -> Optional[str]:
    """The `Version:` header of a dist-info METADATA file."""
    for line in text.splitlines():
        if not line.strip():
            break  # headers end at the first blank line
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return None


class LocalWheel(VllmSource):
    def __init__(self, label: str, path: Path, members: ZipMembers, version: str) -> None:
        super().__init__(label, version, commit_of(version))
        self.path = path
        self._zip = members

    def read(self, path: str) -> Optional[bytes]:
        return self._zip.read(check_member(self.label, path))

    def list_files(self) -> List[str]:
        return self._zip.names()


def open_wheel(text: str, label: str) -> LocalWheel:
    path = Path(text).expanduser()
    if not path.is_file():
        raise SparkmodsError(f"{label}: no wheel file at {path}")
    members = ZipMembers(label, path.open("rb"))
    names = members.names()
    if not any(n.startswith("vllm/") for n in names):
        raise SparkmodsError(f"{label}: {path.name} holds no vllm/ package; is it a vLLM wheel?")
    metas = [n for n in names if n.startswith("vllm-") and n.endswith(".dist-info/METADATA") and n.count("/") == 1]
    metadata = members.read(metas[0]) if len(metas) == 1 else None
    version = metadata_version(metadata.decode("utf-8", "replace")) if metadata is not None else None
    if version is None:
        try:
            version = str(parse_wheel_filename(path.name)[1])
        except InvalidWheelFilename:
            raise SparkmodsError(f"{label}: no vllm-*.dist-info/METADATA and no version in the file name "
                                 f"{path.name}") from None
    return LocalWheel(label, path, members, version)
