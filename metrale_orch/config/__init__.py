"""Project configuration: built-in defaults < ``pyproject.toml`` < environment < command line.

``load_config`` is the one function that reads configuration; everything
else takes a :class:`Config` value. Every setting remembers where it came
from (``Config.sources``), so ``metrale-orch`` can say why a value is what it
is. Unknown keys in ``[tool.metrale-orch]`` and malformed values are
:class:`ConfigError`\\ s naming the file (or variable) and the key.

``build_dir`` is where the build writes, stages and deletes: it may not be the
root, ``kernels/``, a directory inside ``kernels/``, or one that contains it
(compared after resolving symlinks), whichever level set it.

``hip_compat_dir`` (SPEC 3.3) is the project's HIP compat directory, passed to
hipcc as ``-I``; relative to the root, none by default (an empty value is none).
When set it must be a directory.

Settings, their sources and loading are :mod:`~metrale_orch.config.settings`; how one
value is checked and converted, and the public key lines, :mod:`~metrale_orch.config.values`.
"""

from metrale_orch.config.settings import (
    ENV_VARS,
    EXECUTION_KEYS,
    LOCAL_KEY,
    Config,
    build_dir_problem,
    default_jobs,
    default_local_cache,
    default_local_key,
    find_root,
    load_config,
    read_pyproject,
    setting_variables,
    source_label,
)
from metrale_orch.config.values import (
    CACHE_MODES,
    PUBLIC_KEY_PREFIX,
    ConfigError,
    key_line_name,
    key_line_problem,
    parse_public_key_line,
)

__all__ = [
    "CACHE_MODES",
    "ENV_VARS",
    "EXECUTION_KEYS",
    "LOCAL_KEY",
    "PUBLIC_KEY_PREFIX",
    "Config",
    "ConfigError",
    "build_dir_problem",
    "default_jobs",
    "default_local_cache",
    "default_local_key",
    "find_root",
    "key_line_name",
    "key_line_problem",
    "load_config",
    "parse_public_key_line",
    "read_pyproject",
    "setting_variables",
    "source_label",
]
