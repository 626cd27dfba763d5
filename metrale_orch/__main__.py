"""``python -m metrale_orch`` runs the CLI."""

from metrale_orch.cli import main

raise SystemExit(main())
