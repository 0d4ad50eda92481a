"""Griffe extension for mkdocstrings: a module's lazy exports become documented aliases.

``adaflash_hf`` and ``adaflash_hf.online`` load their public names on first use (PEP 562) from a
module-level table ``_EXPORTS = {name: ".submodule"}``, which static analysis cannot follow. This
extension reads that table and adds ``name`` as an alias of ``<module><submodule>.name``, so
``::: adaflash_hf.generate`` documents whatever object the package exports under that name.
"""

from __future__ import annotations

import ast

import griffe


class LazyExports(griffe.Extension):
    def on_module_members(self, *, node: ast.AST, mod: griffe.Module, **kwargs) -> None:
        if not isinstance(node, ast.Module):
            return
        for statement in node.body:
            if isinstance(statement, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "_EXPORTS" for target in statement.targets
            ):
                for name, module in ast.literal_eval(statement.value).items():
                    if name not in mod.members:
                        source = mod.path + module if module.startswith(".") else module
                        mod.set_member(name, griffe.Alias(name, f"{source}.{name}", parent=mod))
