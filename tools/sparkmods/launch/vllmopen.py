"""Which vLLM a launch will run, opened as one VllmSource, and the mod check wired to it.

The image's own vLLM is the truth, so we read it with `image:NAME` when the local Docker engine
has the image; otherwise the user tells us the version with `--vllm SPEC` (any target spec
`sparkmods check` accepts; repeated, or a range, every vLLM it names is checked).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

from sparkmods.errors import SparkmodsError
from sparkmods.runtime.modcheck import ModResult

if TYPE_CHECKING:
    from sparkmods.sources.base import VllmSource

__all__ = ["image_present", "open_launch_targets", "check_with_engine"]

log = logging.getLogger("sparkmods.launch")


def image_present(image: str) -> Optional[bool]:
    """Whether the local Docker engine holds the image (no pull, no network); None when no engine
    answers (or the docker package is missing)."""
    try:
        import docker
        from docker.errors import DockerException, ImageNotFound
    except ImportError:
        return None
    try:
        client = docker.from_env(timeout=10)
        try:
            client.images.get(image)
            return True
        finally:
            client.close()
    except ImageNotFound:
        return False
    except DockerException:
        return None


def open_launch_targets(image: str, vllm: Sequence[str], *, index_url: Optional[str] = None,
                offline: bool = False) -> List:
    """The VllmSources to check against: `image:IMAGE` if the engine has it, else every --vllm
    (repeatable, as for `sparkmods check`; a range names each release in it)."""
    from sparkmods.sources import open_targets

    present = image_present(image)
    if present:
        (source,) = open_targets(f"image:{image}")
        for spec in vllm:
            if not _same_release(spec, source.version):
                log.warning("image %s holds vLLM %s, not %s: checking the image", image, source.version, spec)
        return [source]
    if not vllm:
        if present is None:
            raise SparkmodsError(f"no Docker engine answers, so the vLLM inside image {image!r} cannot be read: "
                                 "pass --vllm VERSION, the vLLM release the image holds (e.g. --vllm 0.21.0)")
        from sparkmods.sources.image import absent_image_hint

        raise SparkmodsError(f"image {image!r} is not in the local Docker engine, so its vLLM cannot be read: "
                             f"pass --vllm VERSION (the vLLM inside that image), or get the image "
                             f"({absent_image_hint(image)})")
    return [s for spec in vllm for s in open_targets(spec, index_url=index_url, offline=offline)]


def _same_release(spec: str, version: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(spec.split(":", 1)[-1]).public == Version(version).public
    except InvalidVersion:
        return True  # a non-version spec (wheel:, dir:): nothing to compare


def check_with_engine(mod_dirs: Sequence[Path], source: VllmSource) -> List[ModResult]:
    """`sparkmods check`'s engine on one source: one ModResult per mod folder, in order."""
    from sparkmods.checking.batch import check_mods

    return [row.result for row in check_mods(list(mod_dirs), [source])]
