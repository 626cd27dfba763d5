"""The build graph without doit: the tree made into specs (``generate``), the specs with
their file dependencies and signature parts (``specs``), through the task cache
(``cached``, ``taskcache``, ``taskkey``), what a run selects (``selection``, ``scope``),
and readiness (``check``: will the build accept this tree). Imports nothing of doit nor of
:mod:`metrale_orch.tasks` (the doit adapter, which turns the graph into doit's task
dicts); the layering test checks it, so a watch loop or any other driver can use the
graph alone."""
