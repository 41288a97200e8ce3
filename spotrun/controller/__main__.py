"""`python -m spotrun.controller CLUSTER`: the controller daemon."""

from spotrun.controller.daemon import main

raise SystemExit(main())
