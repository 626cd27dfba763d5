"""The manifests of a tree read and validated: HARDWARE.toml, MODEL.toml, KERNEL.toml.

:class:`ManifestReader` adds to the file view the checks SPEC 1.1-1.4 make
of each manifest (shapes of keys, vendors, ``inherits``, one-hop
``kernel_source`` redirects, ``supported_quants``), each result or error
memoised per pass. A manifest that is absent reads as None; one that is
present but wrong raises the :class:`~metrale_orch.tree.LayoutError` naming
the file and key. Never writes.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from metrale_orch.tree.errors import (
    InheritsError,
    LayoutError,
    ManifestError,
    RedirectError,
    RetiredKey,
    UnknownHardware,
    UnknownVendor,
)
from metrale_orch.tree.files import FileView, Memo
from metrale_orch.tree.names import (
    HARDWARE_TOML,
    KERNEL_TOML,
    MODEL_TOML,
    join_rel,
    source_ext,
    toml_key,
)
from metrale_orch.tree.values import Hardware, KernelManifest

__all__ = ["ManifestReader"]


class ManifestReader(FileView):
    """The file view plus the tree's manifests, parsed and validated once per pass."""

    def __init__(self, root: Path | str) -> None:
        super().__init__(root)
        self._loaded_hardware: Memo[str, Hardware] = Memo()
        self._checked_hardware: Memo[str, Hardware] = Memo()
        self._kernel_manifests: Memo[str, KernelManifest | None] = Memo()
        self._source_dirs: Memo[str, str] = Memo()
        self._allowed_quants: Memo[str, frozenset[str] | None] = Memo()
        self._parent_leaf_sources: Memo[tuple[str, str], tuple[str, tuple[Path, ...]]] = Memo()

    def hardware_raw(self, hw: str) -> Hardware:
        """HARDWARE.toml with its own checks, without the ``inherits`` checks."""
        return self._loaded_hardware.get(hw, self._load_hardware, hw)

    def hardware(self, hw: str) -> Hardware:
        """HARDWARE.toml with ``inherits`` checked."""
        return self._checked_hardware.get(hw, self._load_checked_hardware, hw)

    def _load_checked_hardware(self, hw: str) -> Hardware:
        return self._check_inherits(self.hardware_raw(hw))

    def _load_hardware(self, hw: str) -> Hardware:
        rel = f"kernels/{hw}/{HARDWARE_TOML}"
        path = self.path(rel)
        doc = self.toml(rel)
        if doc is None:
            raise UnknownHardware(hw, path, rel)
        kernels_table = doc.get("kernels")
        if isinstance(kernels_table, dict) and "overrides" in kernels_table:
            raise RetiredKey(path, rel, "[kernels] overrides")
        table = doc.get("hardware")
        if not isinstance(table, dict):
            table = {}
        vendor = table.get("vendor", "nvidia")
        if not isinstance(vendor, str):
            raise ManifestError(path, rel, "[hardware] vendor", not_string(vendor))
        ext = source_ext(vendor)
        if ext is None:
            raise UnknownVendor(path, rel, vendor)
        arch = table.get("arch")
        if arch is not None and not isinstance(arch, str):
            raise ManifestError(path, rel, "[hardware] arch", not_string(arch))
        inherits = table.get("inherits")
        if inherits is not None and not isinstance(inherits, str):
            raise ManifestError(path, rel, "[hardware] inherits", not_string(inherits))
        return Hardware(
            name=hw,
            vendor=vendor,
            arch=arch,
            inherits=inherits,
            source_ext=ext,
            path=path,
            doc=MappingProxyType(doc),
        )

    def _check_inherits(self, hw: Hardware) -> Hardware:
        parent = hw.inherits
        if parent is None:
            return hw
        rel = self.rel(hw.path)
        if parent == hw.name:
            raise InheritsError(
                hw.path, rel, hw.name, parent, "a tree cannot inherit itself; remove the key"
            )
        try:
            phw = self.hardware_raw(parent)
        except LayoutError as exc:
            raise InheritsError(
                hw.path, rel, hw.name, parent, f"the parent tree fails to load: {exc}", exc
            ) from exc
        if phw.inherits is not None:
            raise InheritsError(
                hw.path,
                rel,
                hw.name,
                parent,
                f"the parent inherits {phw.inherits!r} in turn; inheritance chains are "
                "refused (inherit a tree that inherits nothing)",
            )
        if phw.source_ext != hw.source_ext:
            raise InheritsError(
                hw.path,
                rel,
                hw.name,
                parent,
                f"the parent compiles .{phw.source_ext} sources but {hw.name!r} compiles "
                f".{hw.source_ext}; a tree can only inherit one of the same source extension",
            )
        return hw

    def kernel_manifest(self, directory: Path | str) -> KernelManifest | None:
        """``<directory>/KERNEL.toml`` parsed and validated, or None when absent."""
        rel = self.rel(directory)
        return self._kernel_manifests.get(rel, self._load_kernel_manifest, rel)

    def _load_kernel_manifest(self, directory: str) -> KernelManifest | None:
        rel = join_rel(directory, KERNEL_TOML)
        doc = self.toml(rel)
        if doc is None:
            return None
        path = self.path(rel)
        uses: tuple[str, ...] = ()
        if "sources" in doc:
            sources = doc["sources"]
            if not isinstance(sources, dict):
                raise ManifestError(path, rel, "[sources]", "must be a table")
            extra = sorted(k for k in sources if k != "use") if sources.keys() - {"use"} else ()
            if extra:
                raise ManifestError(
                    path, rel, f"[sources] {extra[0]}", "unknown key ([sources] holds only `use`)"
                )
            if "use" in sources:
                use = sources["use"]
                if not isinstance(use, list):
                    raise ManifestError(path, rel, "[sources] use", "must be an array of strings")
                for i, item in enumerate(use):
                    if not isinstance(item, str):
                        raise ManifestError(
                            path, rel, f"[sources] use[{i}]", f"must be a string, {got(item)}"
                        )
                uses = tuple(use)
        shadow: dict[str, str] = {}
        if "shadow" in doc:
            table = doc["shadow"]
            if not isinstance(table, dict):
                raise ManifestError(path, rel, "[shadow]", 'must be a table of stem = "reason"')
            for stem, reason in table.items():
                if not isinstance(reason, str):
                    raise ManifestError(
                        path,
                        rel,
                        f"[shadow] {toml_key(stem)}",
                        f"the reason must be a string, {got(reason)}",
                    )
                if not reason.strip():
                    raise ManifestError(
                        path,
                        rel,
                        f"[shadow] {toml_key(stem)}",
                        "the reason is blank; say why the file replaces another",
                    )
            shadow = dict(table)
        return KernelManifest(
            path=path, uses=uses, shadow=MappingProxyType(shadow), doc=MappingProxyType(doc)
        )

    def model_table(self, model_dir: Path | str) -> tuple[str, dict[str, object] | None]:
        """(MODEL.toml spelling, its ``[model]`` table, or None when the file is absent)."""
        rel = join_rel(self.rel(model_dir), MODEL_TOML)
        doc = self.toml(rel)
        if doc is None:
            return rel, None
        table = doc.get("model")
        return rel, table if isinstance(table, dict) else {}

    def kernel_source_dir(self, model_dir: Path | str) -> str:
        """The source model directory's spelling (``[model] kernel_source`` followed, one hop)."""
        rel = self.rel(model_dir)
        return self._source_dirs.get(rel, self._load_kernel_source_dir, rel)

    def _load_kernel_source_dir(self, model_dir: str) -> str:
        rel, table = self.model_table(model_dir)
        if table is None or "kernel_source" not in table:
            return model_dir
        path = self.path(rel)
        value = table["kernel_source"]
        if not isinstance(value, str):
            raise ManifestError(path, rel, "[model] kernel_source", not_string(value))
        if not value.strip():
            raise ManifestError(
                path, rel, "[model] kernel_source", "is blank; name a sibling model directory"
            )
        # The referent is <hw dir>/<value>, not normalised (pathlib drops "." alone).
        referent_path = self.path(model_dir.rpartition("/")[0]) / value
        referent = self.rel(referent_path)
        if not self.is_dir(referent):
            raise RedirectError(
                path, rel, self.path(model_dir), referent_path, f"{referent} is not a directory"
            )
        ref_rel, ref_table = self.model_table(referent)
        if ref_table is None:
            raise RedirectError(
                path,
                rel,
                self.path(model_dir),
                referent_path,
                f"{referent} is not a model (it has no {MODEL_TOML})",
            )
        if "kernel_source" in ref_table:
            raise RedirectError(
                path,
                rel,
                self.path(model_dir),
                referent_path,
                f"{ref_rel} redirects too; a redirect takes one hop only "
                "(point at the model that owns the sources)",
            )
        return referent

    def supports_quant(self, model_dir: Path | str, quant: str) -> bool:
        """Whether ``[model] supported_quants`` admits ``quant`` (absent list: every quant)."""
        rel = self.rel(model_dir)
        allowed = self._allowed_quants.get(rel, self._load_allowed, rel)
        return allowed is None or quant in allowed

    def _load_allowed(self, model_dir: str) -> frozenset[str] | None:
        rel, table = self.model_table(model_dir)
        if table is None or "supported_quants" not in table:
            return None
        path = self.path(rel)
        key = "[model] supported_quants"
        quants = table["supported_quants"]
        if not isinstance(quants, list) or not quants:
            raise ManifestError(
                path, rel, key, "must be a non-empty array of quant names (or be left out)"
            )
        for i, q in enumerate(quants):
            if not isinstance(q, str) or not q.strip():
                raise ManifestError(
                    path, rel, f"{key}[{i}]", f"must be a non-blank string, {got(q)}"
                )
        return frozenset(quants)

    def parent_source_dir(self, parent: str, name: str) -> str:
        """The parent tree's source-model directory for the own source model ``name``."""
        pmodel = f"kernels/{parent}/{name}"
        if self.toml(join_rel(pmodel, MODEL_TOML)) is not None:
            return self.kernel_source_dir(pmodel)
        return pmodel

    def parent_leaf_source(self, parent: str, name: str) -> tuple[str, tuple[Path, ...]]:
        """(parent source-model dir, the parent MODEL.toml files that took), once per pass."""
        return self._parent_leaf_sources.get(
            (parent, name), self._load_parent_leaf_source, parent, name
        )

    def _load_parent_leaf_source(self, parent: str, name: str) -> tuple[str, tuple[Path, ...]]:
        psource = self.parent_source_dir(parent, name)
        pmodel = f"kernels/{parent}/{name}"
        read: tuple[Path, ...] = ()
        if psource != pmodel or self.is_file(join_rel(pmodel, MODEL_TOML)):
            read = tuple(sorted({self.path(join_rel(d, MODEL_TOML)) for d in (pmodel, psource)}))
        return psource, read


def got(value: object) -> str:
    """``got <TOML type> <value>``, for messages about a value of the wrong type."""
    names = {bool: "boolean", int: "integer", float: "float", dict: "table", list: "array"}
    return f"got {names.get(type(value), type(value).__name__)} {value!r}"


def not_string(value: object) -> str:
    """The message for a value that must be a string."""
    return f"must be a string, {got(value)}"
