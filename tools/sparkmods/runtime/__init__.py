"""The mod runtime: stdlib only, Python >= 3.9.

`sparkmods sync` copies these modules verbatim into every mod as `_sparkmods.py`, so the code
that decides and applies inside the container is byte-for-byte the code the host tests.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable


def cached(name: str, path: str, source: object, make: "Callable[[], Any]") -> "Any":
    """make(). Inside a mod the package is `_sparkmods.py` (boot.py), whose `cached` keeps the
    result in the user's cache while `source` (what it is made from) is unchanged; the host
    has caches of its own, so here it is made every time."""
    return make()
