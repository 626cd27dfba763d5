"""Where compile actions run: one interface, a local implementation (a remote one next).

An :class:`~metrale_orch.executor.action.Action` is one compiler invocation: an argv,
a working directory, an environment, a deadline, the files it writes. An
:class:`~metrale_orch.executor.action.Executor` runs actions; it knows nothing of
targets, modules, caches or doit. :class:`~metrale_orch.executor.local.LocalExecutor`
runs at most ``jobs`` of them at once on this machine, longest expected first,
each in its own process group, and can stop every one in flight at once.
"""

from metrale_orch.executor.action import Action, ActionStopped, Executor, RemoteForm
from metrale_orch.executor.local import LocalExecutor
from metrale_orch.executor.slots import MachineSlots, PrioritySlots

__all__ = [
    "Action",
    "ActionStopped",
    "Executor",
    "LocalExecutor",
    "MachineSlots",
    "PrioritySlots",
    "RemoteForm",
]
