"""`python3 -m _sparkmods [apply|check|revert]` from run.sh inside a mod folder."""

from .boot import main

raise SystemExit(main())
