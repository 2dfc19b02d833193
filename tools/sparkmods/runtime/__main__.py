"""run.sh's program: `python3 -c 'import _sparkmods.__main__' [apply|check|revert]` with the mod
folder first on sys.path.

A SIGINT outside applier.run (which turns it into an orderly interruption) raises Python's
KeyboardInterrupt: while the runtime is still being imported, or in the instant after run
returned. Either way no change to vLLM is under way: one line instead of a traceback, and
exit 130 as after any SIGINT. One from before, during the interpreter's start-up (which run.sh
leaves to boot.py) or the import of _sparkmods.py, was held there and is raised here.

Any other exception is a bug in the runtime (applier.run turns every expected failure into its
exit code): one line saying so and exit 3, the traceback only with SPARKMODS_DEBUG=1.

The exit skips tearing the interpreter down, as sparkmods' own `cli.entry` does: the exit
handlers run and the standard streams are flushed, nothing else is needed.
"""

try:  # first: a SIGINT at any later line is caught
    import os
    import sys

    def _exit(code: int) -> None:
        """Exit handlers, flushed streams, then the exit without the interpreter's teardown."""
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass  # a reader that went away, a closed stream, or none (started with it closed)
        os._exit(code)

    if sys.modules[__package__].sigint_held():  # one arrived while _sparkmods.py itself ran
        raise KeyboardInterrupt
    from .stamp import quick

    code = quick(sys.argv[1:], os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    if code is None:  # not the stamped already-applied case: the full runtime decides
        from .applier import main

        code = main()
    _exit(code)
except KeyboardInterrupt:
    import os

    print(f"[{os.path.basename(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))}] interrupted by "
          "SIGINT outside a change to vLLM's files: nothing is half-done (the lines above say what was done)",
          flush=True)
    # Not sys.exit: CPython marks a KeyboardInterrupt that ends a string exec/eval (dataclasses
    # and namedtuple build their methods so) as unhandled even once it is caught, and under
    # `python -m` then ends the process by SIGINT instead of with the exit code.
    os._exit(130)
except Exception as exc:  # noqa: BLE001  a bug: one line, exit 3. SystemExit (argparse's usage, -h) is no bug and passes
    if os.environ.get("SPARKMODS_DEBUG"):
        import traceback

        traceback.print_exc()
    print(f"[{os.path.basename(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))}] INTERNAL ERROR: a "
          f"bug in sparkmods' run.sh runtime ({type(exc).__name__}: {exc}); please report it to the "
          "spark-vllm-mods maintainers with the output of SPARKMODS_DEBUG=1 ./run.sh (the same arguments), "
          "which shows the traceback", flush=True)
    _exit(3)
