from spotrun.cli import main

raise SystemExit(main())
