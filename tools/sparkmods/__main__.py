from sparkmods.cli import main

raise SystemExit(main())
