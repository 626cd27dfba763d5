from metrale_orch.dodo import *  # noqa: F403
