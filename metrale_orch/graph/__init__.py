"""The build graph without doit: what a run selects (its scope), the keys of task
generation and the task cache. Imports nothing of doit nor of :mod:`metrale_orch.tasks`
(the doit adapter, which turns the graph into doit's task dicts); the layering test
checks it, so a watch loop or any other driver can use the graph alone."""
