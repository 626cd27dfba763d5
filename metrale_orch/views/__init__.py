"""Views of the build that have no doit task: ``metrale-orch status``, ``why`` and
``rdeps`` (:mod:`.status`), and ``compdb`` (:mod:`.editor`). Each generates the tasks
``doit`` would and reads what doit saved through the doit integration
(:mod:`metrale_orch.tasks`), without building."""
