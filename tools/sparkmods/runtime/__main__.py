"""run.sh's program: `python3 -c 'import _sparkmods.__main__' [apply|check|revert]` with the mod
folder first on sys.path (an import rather than `-m`, which would import runpy and what it
imports).

A SIGINT outside applier.run (which turns it into an orderly interruption) raises Python's
KeyboardInterrupt: while the runtime is still being imported, or in the instant after run
returned. Either way no change to vLLM is under way: one line instead of a traceback, and
exit 130 as after any SIGINT. One from before, during the interpreter's start-up (which run.sh
leaves to boot.py) or the import of _sparkmods.py, was held there and is raised here.

The exit skips tearing the interpreter down, as sparkmods' own `cli.entry` does: freeing every
module and object one by one is work nothing needs once the run is over. What an exit must
still do is done: the exit handlers run and the standard streams are flushed (the
runtime starts no thread and leaves no other file open).
"""

try:  # first: a SIGINT at any later line is caught
    import os
    import sys

    if sys.modules[__package__].sigint_held():  # one arrived while _sparkmods.py itself ran
        raise KeyboardInterrupt
    from .stamp import quick

    code = quick(sys.argv[1:], os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    if code is None:  # not the stamped already-applied case: the full runtime decides
        from .applier import main

        code = main()
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass  # a reader that went away, a closed stream, or none (started with it closed)
    os._exit(code)
except KeyboardInterrupt:
    import os
    import sys

    print(f"[{os.path.basename(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))}] interrupted by "
          "SIGINT outside a change to vLLM's files: nothing is half-done (the lines above say what was done)",
          flush=True)
    # Not sys.exit: CPython marks a KeyboardInterrupt that ends a string exec/eval (dataclasses
    # and namedtuple build their methods so) as unhandled even once it is caught, and under
    # `python -m` then ends the process by SIGINT instead of with the exit code. Nothing but
    # the line above is left to flush.
    os._exit(130)
