"""The main of a benchmark that writes one JSON and one Markdown report into --out.

Bad arguments are one line on stderr and exit 2; the report is written, then printed; the exit
code is 1 when `failed(results)` says a case failed (its row says why), else 0.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Dict, Optional, Sequence

from bench_turboquant import InputError


def report_main(prog: str, stem: str, argv: Optional[Sequence[str]], parse_args: Callable[[Sequence[str]], Any],
                run: Callable[[Any], Dict[str, Any]], render: Callable[[Dict[str, Any]], str],
                failed: Callable[[Dict[str, Any]], bool]) -> int:
    """Parse argv (sys.argv[1:] when None), run, write OUT/STEM.json and OUT/STEM.md, print the report."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except InputError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    report = render(results)
    (args.out / f"{stem}.md").write_text(report)
    print(report)
    return 1 if failed(results) else 0
