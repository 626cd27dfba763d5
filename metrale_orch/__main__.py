"""``python -m metrale_orch`` runs the CLI (as the ``metrale-orch`` command does)."""

from metrale_orch.cli import main

raise SystemExit(main())
