"""Training code from the running interpreter's standard library: functions, methods and small classes as chunks.

:func:`stdlib_chunks` walks a standard-library folder and yields :class:`CodeChunk` records;
:func:`adaflash_hf.data.corpora.read_stdlib_code` caches them like every other corpus.
"""

from __future__ import annotations

import ast
import logging
import sysconfig
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# Standard-library folders that are tests, tools with their own test data, generated tables
# (codec maps, pydoc topics) or third-party code: poor or foreign training text.
STDLIB_SKIP_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "__pycache__", "encodings", "pydoc_data"})
STDLIB_MAX_CHUNK_LINES = 150
STDLIB_MAX_CLASS_LINES = 60


@dataclass(frozen=True)
class CodeChunk:
    """A function, method or small class from a standard-library module."""

    doc_id: str  # module path relative to the stdlib root, e.g. "json/decoder.py"
    name: str  # qualified name inside the module, e.g. "JSONDecoder.decode"
    kind: str  # "function" | "method" | "class"
    code: str  # dedented source, decorators included
    header: str  # signature + docstring (dedented); "" when there is no docstring


def stdlib_root() -> Path:
    """Source folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_chunks(root: Path) -> Iterable[CodeChunk]:
    if not root.is_dir():
        raise FileNotFoundError(f"Standard-library folder {root} does not exist (sysconfig stdlib path).")
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if STDLIB_SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        source = path.read_bytes().decode("utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            logger.debug("Skipping %s: not parseable by this Python", rel)
            continue
        yield from _module_chunks(rel.as_posix(), source.splitlines(keepends=True), tree)


def _module_chunks(doc_id: str, lines: list[str], tree: ast.Module) -> Iterable[CodeChunk]:
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, functions):
            yield from _chunk(doc_id, lines, node, node.name, "function")
        elif isinstance(node, ast.ClassDef):
            if node.end_lineno - _first_line(node) + 1 <= STDLIB_MAX_CLASS_LINES:
                yield from _chunk(doc_id, lines, node, node.name, "class")
            else:
                for child in node.body:
                    if isinstance(child, functions):
                        yield from _chunk(doc_id, lines, child, f"{node.name}.{child.name}", "method")


def _first_line(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> int:
    return min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])


def _chunk(
    doc_id: str, lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, name: str, kind: str
) -> Iterable[CodeChunk]:
    start, end = _first_line(node), node.end_lineno
    if not 3 <= end - start + 1 <= STDLIB_MAX_CHUNK_LINES:
        return
    code = textwrap.dedent("".join(lines[start - 1 : end]))
    header = ""
    if ast.get_docstring(node, clean=False) is not None and len(node.body) > 1:
        header = textwrap.dedent("".join(lines[start - 1 : node.body[0].end_lineno]))
    yield CodeChunk(doc_id, name, kind, code, header)
