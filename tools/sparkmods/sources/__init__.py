"""Host-side vLLM sources: "a vLLM" as a read-only tree, wherever it is stored.

`open_targets(spec)` turns a target string (0.19.1, pypi:0.19.1, latest, '>=0.18',
index:URL#VERSION, wheel:PATH, dir:PATH, git:PATH@REF, image:NAME) into VllmSources.
Remote wheels are read over HTTP range requests and cached; `stats` counts what that cost.

The names below are imported on first use (PEP 562), so a module that needs only the cache
helpers (sources.cache) does not pay for the index and HTTP layers.
"""

from importlib import import_module
from typing import Any

__all__ = ["VllmSource", "FetchStats", "stats", "open_targets"]
_HOMES = {"VllmSource": "base", "FetchStats": "fetchstats", "stats": "fetchstats", "open_targets": "spec"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
