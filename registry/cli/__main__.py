"""`python -m registry.cli`: the `mmc` command without its entry point on PATH."""

from registry.cli import main

raise SystemExit(main())
