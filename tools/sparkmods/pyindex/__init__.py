"""A vLLM tree's Python read as an index, never imported: the tree stage between sources/ (bytes)
and checking/ (verdicts), shared by the drift checks, rebase and launch's facts.

  safeparse.py  the only ast.parse in tools/: one lock (CPython 3.11's parser is not safe in
                the check thread pools), the cyclic collector paused while it builds a tree
  gcpause.py    the cyclic collector paused while a batch of checks holds parsed trees
  defscan.py    a module-level def or class found in a file's bytes without parsing it
  resolve.py    VllmTree: which names a module binds, where a name is really defined, what
                signature a function has (three-valued where Python is dynamic)
"""
