"""A module's action key (SPEC 3.4): the parts it hashes, and the checkout-specific case.

A module's key hashes (:func:`module_parts`, through :func:`metrale_orch.cache.cache_key`): the
toolchain name and identity, the arch, the argv with the program *name* and
paths relative to the module's role directory (its cwd), the values of the
toolchain's environment allow-list, the module's entry and artefact name, and
the content hash of every file of its include closure
(:func:`~metrale_orch.steps.includes.module_closure`). Closure paths enter the
key relative to the module's cwd, so the same module in two models or two
checkouts shares one key, while an unrelated file changes no key. Flags that
embed absolute paths in the artefact (line or debug info) make the key
specific to the checkout. The bytes of every key are a compatibility promise:
a change here is a cache-wide miss.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from metrale_orch.paths import stage_relpath
from metrale_orch.steps.deps import FileHasher
from metrale_orch.steps.includes import EdgeMemo, Includes, effective_flags, module_closure
from metrale_orch.steps.plan import PLAN_SCHEMA
from metrale_orch.steps.plan_values import ModulePlan, TargetPlan
from metrale_orch.steps.staging import StagedTarget

__all__ = ["checkout_of", "embeds_paths", "module_key_parts", "module_parts"]


#: Flags that embed absolute source paths in the artefact (line info, debug info).
_PATH_EMBEDDING_FLAGS = frozenset(
    {"-lineinfo", "--generate-line-info", "-G", "--device-debug", "-g", "--debug"}
)


def embeds_paths(flags: Sequence[str]) -> bool:
    """Whether ``flags`` make the artefact name the compiled files' absolute paths (pure)."""
    return any(f in _PATH_EMBEDDING_FLAGS or f.startswith(("-g", "-Xcompiler=-g")) for f in flags)


def _embeds_paths(plan: TargetPlan, staged: StagedTarget) -> bool:
    """Whether this target's compiles embed paths: through its flags, the flag variables
    the compiler reads (``NVCC_APPEND_FLAGS`` ...), or an options file's content."""
    words: list[str] = []
    for value in plan.env.values():
        words.extend(value.split())
    for cwd in {m.cwd for m in plan.modules}:
        before, after = effective_flags(plan, os.path.abspath(staged.dir / cwd))
        words.extend((*before, *after))
    return embeds_paths(words)


def module_key_parts(
    plan: TargetPlan,
    module: ModulePlan,
    closure: Sequence[str],
    hashes: Mapping[str, str],
    *,
    flag_inputs: Sequence[Sequence[str]] = (),
    checkout: str = "",
) -> dict[str, object]:
    """The parts hashed into a module's action key (pure; see the module docstring).

    ``flag_inputs`` are ``[path, hash]`` of files named by flags that lie outside
    the stage; ``checkout`` is the absolute stage path when the flags embed
    paths (the entry is then specific to this checkout), else "".
    """
    parts: dict[str, object] = {
        "plan_schema": PLAN_SCHEMA,
        "toolchain": plan.toolchain.name,
        "identity": plan.identity,
        "arch": plan.arch,
        "argv": list(module.argv),
        "env": dict(plan.env),
        "module": {"entry": module.entry, "artefact": module.artefact},
        "inputs": sorted([stage_relpath(p, module.cwd), hashes[p]] for p in closure),
    }
    if flag_inputs:
        parts["flag_inputs"] = sorted([str(p), str(h)] for p, h in flag_inputs)
    if checkout:
        parts["checkout"] = checkout
    return parts


def checkout_of(plan: TargetPlan, staged: StagedTarget) -> str:
    """The absolute stage path when this target's compiles embed paths (then its keys
    are specific to this checkout), else "" (reads options files)."""
    return os.path.abspath(staged.dir) if _embeds_paths(plan, staged) else ""


def module_parts(
    plan: TargetPlan,
    module: ModulePlan,
    *,
    staged: StagedTarget,
    includes: Mapping[str, Includes],
    words: tuple[tuple[str, ...], tuple[str, ...]],
    layer_include: str,
    checkout: str,
    hasher: FileHasher,
    memo: EdgeMemo | None = None,
) -> dict[str, object]:
    """The parts a module's action key hashes (its key is
    :func:`cache_key <metrale_orch.cache.cache_key>` of them): its scanned closure over the
    stage (plus files named by flags, hashed through ``hasher``) and everything in
    :func:`module_key_parts`.
    ``words`` are :func:`~metrale_orch.steps.includes.effective_flags` in the module's
    cwd; ``layer_include`` the ``-I`` the compile adds for its layer directory ("");
    ``memo``: the includes resolved by the keys of the target's other modules
    (:func:`~metrale_orch.steps.includes.resolve_closure`)."""
    before, after = words
    closure = module_closure(
        module,
        staged=staged.hashes,
        includes_of=includes,
        before=before,
        after=after,
        layer_include=layer_include,
        memo=memo,
    )
    flag_inputs: list[tuple[str, str]] = []
    for path in closure.outside:
        full = path if path.startswith("/") else os.path.join(staged.dir, module.cwd, path)
        if os.path.isdir(full):  # -ccbin may name the compiler's directory
            full = os.path.join(full, "gcc")
        flag_inputs.append((path, hasher.digest(os.path.abspath(full))))
    parts = module_key_parts(
        plan, module, closure.files, staged.hashes, flag_inputs=flag_inputs, checkout=checkout
    )
    if layer_include:  # run_compile adds it to the argv
        parts["layer_include"] = layer_include
    return parts
