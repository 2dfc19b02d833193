"""A checkpoint directory as vLLM sees it: config, index and the headers of every shard.

vLLM reads exactly the .safetensors files that `model.safetensors.index.json` names
(every file in the folder when there is no index), so the index is part of the model: a
tensor in a file the index does not name is never loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from sparkmods.checkpoint.header import HeaderError, ShardHeader, TensorInfo, read_header
from sparkmods.errors import SparkmodsError

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"


def _plain_name(name: str) -> bool:
    """A file name inside the checkpoint folder: what vLLM joins to the folder it loads."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0")


@dataclass
class Index:
    """`model.safetensors.index.json`: tensor name -> file name, plus metadata we keep."""

    weight_map: dict[str, str]
    metadata: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_size(self) -> int | None:
        value = self.metadata.get("total_size")
        return value if isinstance(value, int) else None

    @classmethod
    def load(cls, path: Path) -> "Index":
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SparkmodsError(f"{path}: cannot read the index: {exc}") from exc
        except RecursionError:
            raise SparkmodsError(f"{path}: cannot read the index: JSON nested too deeply") from None
        weight_map = doc.pop("weight_map", None) if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise SparkmodsError(f"{path}: not a safetensors index (no weight_map of name -> file)")
        outside = next((f for f in weight_map.values() if not _plain_name(f)), None)
        if outside is not None:
            raise SparkmodsError(f"{path}: weight_map names {outside!r}: an index may name only files in its own "
                                 "folder (no '/', '..' or absolute paths); fix the index")
        metadata = doc.pop("metadata", None) or {}
        if not isinstance(metadata, dict):
            raise SparkmodsError(f"{path}: 'metadata' must be an object")
        return cls(weight_map, metadata, doc)

    def dumps(self) -> str:
        """JSON in the layout Hugging Face writes (metadata first, names sorted)."""
        doc = {"metadata": self.metadata, **self.extra, "weight_map": dict(sorted(self.weight_map.items()))}
        return json.dumps(doc, indent=2) + "\n"


@dataclass
class Checkpoint:
    """Headers of all top-level .safetensors files of a folder, with its index and config."""

    root: Path
    index: Index | None
    shards: dict[str, ShardHeader]
    config: dict[str, Any] | None
    missing_files: list[str]
    broken: dict[str, str]

    @classmethod
    def open(cls, root: Path) -> "Checkpoint":
        root = Path(root)
        if not root.is_dir():
            raise SparkmodsError(f"{root}: not a directory")
        index_path = root / INDEX_NAME
        index = Index.load(index_path) if index_path.exists() else None
        names = {p.name for p in root.glob("*.safetensors") if p.is_file()}
        referenced = set(index.weight_map.values()) if index else set()
        missing = sorted(n for n in referenced if not (root / n).is_file())
        names |= referenced - set(missing)
        if not names:
            raise SparkmodsError(f"{root}: no .safetensors files")
        shards, broken = {}, {}
        for name in sorted(names):
            try:
                shards[name] = read_header(root / name)
            except HeaderError as exc:
                broken[name] = str(exc)
        return cls(root, index, shards, _load_config(root), missing, broken)

    def require_sound(self) -> None:
        """Raise unless every file the index names exists and has a valid header."""
        if self.broken:
            raise SparkmodsError(next(iter(self.broken.values())))
        if self.missing_files:
            raise SparkmodsError(
                f"{self.root / INDEX_NAME} names {self.missing_files[0]}, which does not exist"
            )

    def indexed_files(self) -> set[str]:
        """Files vLLM reads: those the index names, or all of them without an index."""
        if self.index is None:
            return set(self.shards)
        return set(self.index.weight_map.values())

    def tensors(self) -> Iterator[tuple[str, TensorInfo]]:
        """(file name, tensor) for every tensor of every shard."""
        for file_name, shard in self.shards.items():
            for info in shard.tensors.values():
                yield file_name, info

    def owners(self) -> dict[str, list[str]]:
        """Tensor name -> files that hold it (more than one is a broken checkpoint)."""
        found: dict[str, list[str]] = {}
        for file_name, info in self.tensors():
            found.setdefault(info.name, []).append(file_name)
        return found

    def quantization_config(self) -> dict[str, Any] | None:
        """`quantization_config` from config.json (top level or text_config)."""
        for section in _config_sections(self.config):
            qc = section.get("quantization_config")
            if isinstance(qc, dict):
                return qc
        return None

    def text_config_value(self, key: str) -> Any:
        """A model setting, looked up in text_config first (multimodal Qwen3.5 layout)."""
        for section in reversed(_config_sections(self.config)):
            if key in section:
                return section[key]
        return None


def _config_sections(config: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not config:
        return []
    sections = [config]
    text = config.get("text_config")
    if isinstance(text, dict):
        sections.append(text)
    return sections


def _load_config(root: Path) -> dict[str, Any] | None:
    path = root / CONFIG_NAME
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SparkmodsError(f"{path}: not valid JSON: {exc}") from exc
    except RecursionError:
        raise SparkmodsError(f"{path}: not valid JSON: nested too deeply") from None
    return doc if isinstance(doc, dict) else None
