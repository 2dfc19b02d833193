"""Host-side vLLM sources: "a vLLM" as a read-only tree, wherever it is stored.

`open_targets(spec)` turns a target string (0.19.1, pypi:0.19.1, latest, '>=0.18',
index:URL#VERSION, wheel:PATH, dir:PATH, git:PATH@REF, image:NAME) into VllmSources.
Remote wheels are read over HTTP range requests and cached; `stats` counts what that cost.
"""

from sparkmods.sources.base import VllmSource
from sparkmods.sources.fetchstats import FetchStats, stats
from sparkmods.sources.spec import open_targets

__all__ = ["VllmSource", "FetchStats", "stats", "open_targets"]
