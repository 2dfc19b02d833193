#!/usr/bin/env python3
"""Write the two small synthetic checkpoints the README's `sparkmods checkpoint` examples use.

    python3 examples/make_demo_checkpoints.py DIR

DIR/Qwen3.5-122B-A10B-int4-AutoRound  Intel-style AutoRound INT4 (MTP head present, not indexed)
DIR/Qwen3.5-122B-A10B-FP8             Qwen-style block-FP8, for `build-hybrid --fp8`

They carry the real Qwen3.5-MoE tensor names, dtypes, quantization configs and file layout at
tiny dimensions (about 5 MB each), so `inspect`, `add-mtp` and `build-hybrid` behave as on the
real 122B checkpoints. The writer is the test suite's own (tests/ckptfactory.py), which writes
through the safetensors library: it needs numpy and safetensors (`pip install numpy safetensors`, or
the `test` extra).
"""

from __future__ import annotations

import sys
from pathlib import Path

INT4, FP8 = "Qwen3.5-122B-A10B-int4-AutoRound", "Qwen3.5-122B-A10B-FP8"


def main(argv: list) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    try:
        import ckptfactory as cf
    except ImportError as exc:
        print(f"make_demo_checkpoints: error: {exc.name} is missing: pip install {exc.name}", file=sys.stderr)
        return 2
    out = Path(argv[0])
    for name in (INT4, FP8):
        if (out / name).exists():
            print(f"make_demo_checkpoints: error: {out / name} exists; remove it or pick another DIR", file=sys.stderr)
            return 2
    cf.write_int4_autoround(out / INT4, mtp="unindexed")
    cf.write_fp8(out / FP8)
    print(f"wrote {out / INT4} and {out / FP8}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
