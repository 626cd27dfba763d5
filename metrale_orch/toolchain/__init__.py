"""Toolchains: the compiler definitions (TOML), where a compiler is installed, what it is
(its probed identity and dry run), and how it is called (argv templates, environment)."""
