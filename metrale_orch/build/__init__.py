"""The build steps: toolchains, staging, planning, compiling and installing one target.

Each step is callable without doit; the doit integration (:mod:`metrale_orch.tasks`) drives them.
"""
