"""metrale-orch: a build orchestrator for GPU kernel trees.

The package root only re-exports; each idea a user can name lives in its own
module (``layout``, ``defaults``, ``toolchains``, ``staging``, ``compile``,
``cache``, ``dodo``, ``smoke``, ``matrix``, ``cli``).
"""

from metrale_orch.errors import MetraleError

__all__ = ["MetraleError", "__version__"]

__version__ = "0.1.0"
