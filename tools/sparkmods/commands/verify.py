"""`sparkmods verify --url URL [--log FILE | --container NAME]`: did each mod take effect on a running server?

Exit 0 when every mod that was asked for is in effect, 1 when one is not (or an --expect mod is
not proven), 2 on input errors such as an unreachable server.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sparkmods.commands import help_for
from sparkmods.verify.judges import JUDGES

ENV_API_KEY = "VLLM_API_KEY"


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("verify", help=help_for("verify"),
                       description="Read a running vLLM OpenAI server (/v1/models, /metrics, /tokenize) and its "
                                   "log, and say mod by mod whether it took effect.")
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--log", metavar="FILE", help="the server log (vllm serve's output, with the launcher's)")
    where.add_argument("--container", metavar="NAME", help="read the log with `docker logs NAME`")
    p.add_argument("--expect", action="append", default=[], choices=sorted(JUDGES), metavar="MOD",
                   help="a mod that must be in effect (repeatable); exit 1 unless it is proven")
    p.add_argument("--no-probe", action="store_true",
                   help="never send requests; by default a few short completions are sent when speculative "
                        "decoding has drafted too few tokens to judge acceptance")
    p.add_argument("--api-key", default=os.environ.get(ENV_API_KEY),
                   help=f"the server's --api-key (default: ${ENV_API_KEY})")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request (default 30)")
    p.add_argument("--mods-dir", help="folder holding the mods (default: ./mods or the repository's)")
    p.add_argument("--record", metavar="DIR", help="also write what the server answered as a test scenario folder")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def _log_text(args: argparse.Namespace) -> tuple:
    from sparkmods.verify import serverlog

    if args.log:
        return serverlog.read_file(args.log), args.log
    if args.container:
        return serverlog.read_container(args.container), f"docker logs {args.container}"
    return None, None


def run(args: argparse.Namespace) -> int:
    from sparkmods.modsdir import mods_root
    from sparkmods.verify import capture, facts, judges, report, serverlog
    from sparkmods.verify.client import Server
    from sparkmods.verify.template import TEMPLATE_FILE

    recorder = capture.Recorder() if args.record else None
    server = Server(args.url, timeout=args.timeout, recorder=recorder, api_key=args.api_key)
    text, source = _log_text(args)
    log = serverlog.parse(text, source, JUDGES) if text is not None else None
    template_path = mods_root(args.mods_dir) / "chat-template" / "files" / TEMPLATE_FILE
    evidence = facts.gather(server, log, template_path, probe=not args.no_probe)
    expected = set(args.expect)
    verdicts = judges.judge_all(evidence, expected)
    code = judges.exit_code(verdicts, expected)
    if args.json:
        report.write_json(sys.stdout, evidence, verdicts, code)
    else:
        report.write_text(sys.stdout, evidence, verdicts)
    if recorder is not None:
        extra = [a for mod in args.expect for a in ("--expect", mod)] + (["--no-probe"] if args.no_probe else [])
        capture.write_scenario(Path(args.record), recorder, text, extra, code, {v.mod: v.verdict for v in verdicts})
    return code
