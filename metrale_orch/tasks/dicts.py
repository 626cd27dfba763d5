"""doit task dictionaries for the build, as pure functions of values.

Every function here is pure: it takes targets, plans, messages and paths, and
returns the dicts doit's loader turns into tasks. The actions they name are
module-level functions of :mod:`metrale_orch.tasks.actions` with string arguments
only, so ``doit -n N -P process`` can pickle every task.

Three kinds of ``build:<hw>/<model>/<quant>`` sub-task:

- **build**: ``file_dep`` = exactly the plan's file dependencies (root-relative
  POSIX), ``uptodate`` = a :class:`~metrale_orch.tasks.checker.SignatureCheck` over the
  plan's signature, ``targets`` = the target's ``manifest.json`` (a deleted
  build directory rebuilds), ``clean`` removes the target's outputs.
- **skip**: the target's toolchain is not installed. The action succeeds with
  ``{"skipped": reason}`` when the target was selected broadly (``doit build``,
  ``doit 'build:hopper/*'``, the default tasks, a task dependency) and fails with
  the reason when it was named exactly on the command line
  (``doit build:hopper/m/q``); see :func:`~metrale_orch.graph.selection.explicit_targets`.
- **error**: the target does not resolve (tree error) or cannot be planned; the
  action fails with the one-line message. Other targets are unaffected. A target
  named exactly on the command line that the tree does not generate (its
  hardware or the configuration is broken, or it is no target of the tree) is an
  error task too, so doit runs it and fails with the reason rather than
  answering ``Invalid parameter``.

Skip and error tasks carry their reason in ``doc``: ``doit list --status`` prints
it on the target's own line. Each is made from a
:class:`~metrale_orch.graph.specs.BuildSpec` by :func:`task_dict` (the specs carry their
file dependencies and signature parts; nothing is read back out of a dict).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from metrale_orch.graph.specs import BuildSpec, signature_parts
from metrale_orch.paths import BUILD_TASK, rel_posix
from metrale_orch.tasks import actions as _actions
from metrale_orch.tasks.checker import SignatureCheck

__all__ = [
    "BUILD",
    "KIND",
    "TaskDict",
    "build_task",
    "one_line",
    "plan_build_task",
    "plan_error_task",
    "plan_skip_task",
    "task_dict",
]

#: Base name of the build tasks.
BUILD = BUILD_TASK

#: Key in a task's ``meta`` saying which kind of build sub-task it is (build, skip, error).
KIND = "metrale_orch"

#: A doit task dict (doit reads it by key; values are doit's own kinds of thing).
TaskDict = dict[str, object]


def plan_build_task(
    *,
    root: Path,
    target: str,
    file_deps: Iterable[Path | str],
    signature: Mapping[str, object],
    manifest: Path,
    doc: str = "",
) -> TaskDict:
    """The task dict of a target that can be built (pure)."""
    return build_task(
        root=root,
        target=target,
        file_dep=sorted({rel_posix(p, root) for p in file_deps}),
        parts=signature_parts(signature),
        manifest=rel_posix(manifest, root),
        doc=doc,
    )


def task_dict(spec: BuildSpec, root: Path) -> TaskDict:
    """The doit task dict of ``spec`` (pure): the one place a spec of the graph becomes
    what doit loads, whether it was generated now or replayed from the task cache."""
    if spec.kind == "build":
        return build_task(
            root=root,
            target=spec.target,
            file_dep=list(spec.file_dep),
            parts=spec.parts,
            manifest=spec.manifest,
        )
    if spec.kind == "skip":
        return plan_skip_task(
            root=root, target=spec.target, reason=spec.message, explicit=spec.explicit
        )
    return plan_error_task(root=root, target=spec.target, message=spec.message, clean=spec.clean)


def build_task(
    *,
    root: Path,
    target: str,
    file_dep: list[str],
    parts: Mapping[str, str],
    manifest: str,
    doc: str = "",
) -> TaskDict:
    """:func:`plan_build_task` from its finished parts (pure): ``file_dep`` as doit
    will hold it (root-relative, unique, sorted; taken as is), the signature's
    per-part digests (:func:`~metrale_orch.tasks.checker.signature_parts`) and the
    root-relative manifest path. What the task cache rebuilds tasks with.
    """
    return {
        "name": target,
        "doc": doc or f"build {target}",
        "actions": [(_actions.build_action, [str(root), target])],
        "file_dep": file_dep,
        "uptodate": [SignatureCheck(parts)],
        "targets": [manifest],
        "clean": [(_actions.clean_action, [str(root), target])],
        "verbosity": 0,
        "meta": {KIND: "build"},
    }


def one_line(text: str) -> str:
    """``text`` on one line (pure): doit shows only a doc's first line, and a reason
    cut there would lose its second half."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def plan_skip_task(*, root: Path, target: str, reason: str, explicit: bool) -> TaskDict:
    """The task dict of a target whose toolchain is missing (pure). Its doc carries the
    reason, so ``doit list --status`` shows it on the target's line."""
    return {
        "name": target,
        "doc": f"build {target} (skipped: {one_line(reason)})",
        "actions": [(_actions.skip_action, [target, reason, explicit])],
        "uptodate": [False],
        "clean": [(_actions.clean_action, [str(root), target])],
        "verbosity": 0,
        "meta": {KIND: "skip"},
    }


def plan_error_task(*, root: Path, target: str, message: str, clean: bool = True) -> TaskDict:
    """The task dict of a target that does not resolve or plan (pure). Its doc carries the
    message, so ``doit list --status`` shows it on the target's line.

    ``clean=False`` for a name that is not a target of the tree (e.g. one named on the
    command line, see :func:`~metrale_orch.graph.selection.explicit_targets`): ``doit clean``
    then removes nothing.
    """
    task: TaskDict = {
        "name": target,
        "doc": f"build {target} (error: {one_line(message)})",
        "actions": [(_actions.error_action, [target, message])],
        "uptodate": [False],
        "verbosity": 0,
        "meta": {KIND: "error"},
    }
    if clean:
        task["clean"] = [(_actions.clean_action, [str(root), target])]
    return task
