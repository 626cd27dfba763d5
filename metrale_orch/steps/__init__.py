"""The build steps of one target: plan, stage, key, obtain (memo, cache or the executor),
install; the run's shared session; the profile. Toolchains live in
:mod:`metrale_orch.toolchain`, compile actions run on :mod:`metrale_orch.executor`.

Each step is callable without doit; the doit integration (:mod:`metrale_orch.tasks`) drives them.
"""
