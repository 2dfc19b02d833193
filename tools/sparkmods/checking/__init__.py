"""The host's check pipeline: mods x vLLM sources -> rows -> a table or a document.

Data flows source (sources/) -> tree (pyindex/) -> engine (runtime/modcheck.py, the decision
run.sh makes too) -> result -> report; this package holds the host's part of the last three:

  batch.py        mods x sources -> CheckRows: the sources' members prefetched, the checks run
                  in parallel (cpuslots.py bounds how many at once), rows reused from the
                  result cache
  drift.py        semantic drift: a patch that applies but cannot work on that release
                  (driftmemo.py remembers findings by the questions asked, linediff.py finds the
                  lines a patch wrote)
  resultcache.py  rows kept on disk, keyed by everything they are a function of
  report.py       rows as a table, one JSON document, a summary line and an exit code
"""
