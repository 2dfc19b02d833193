"""The mod runtime: stdlib only, Python >= 3.9.

`sparkmods sync` copies these modules verbatim into every mod as `_sparkmods.py`, so the code
that decides and applies inside the container is byte-for-byte the code the host tests.
"""
