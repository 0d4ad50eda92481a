"""Griffe extension for mkdocstrings: a module's lazy exports become documented aliases, and Sphinx roles in
docstrings render as code.

``adaflash_hf`` and ``adaflash_hf.online`` load their public names on first use (PEP 562) from a
module-level table ``_EXPORTS = {name: ".submodule"}``, which static analysis cannot follow. This
extension reads that table and adds ``name`` as an alias of ``<module><submodule>.name``, so
``::: adaflash_hf.generate`` documents whatever object the package exports under that name.

The docstrings cite other objects with Sphinx roles (:class:`~.policy.GoodputVerifyLength`), which Markdown
would print as they stand; they are shown as inline code of the name (``GoodputVerifyLength``).
"""

from __future__ import annotations

import ast
import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|mod|obj|exc|const):`(~?)([^`]+)`")


def _role_as_code(match: re.Match) -> str:
    short, target = match.groups()
    target = target.lstrip(".")
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class LazyExports(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_role_as_code, obj.docstring.value)

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
