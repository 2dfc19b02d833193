"""Sub-commands of the `sparkmods` CLI; every module here registers itself (see cli.py)."""
