"""The package's layering: the import graph of ``adaflash_hf`` has no cycles, and no module imports from a layer
above its own.

Built from the source (``ast``), so it sees every import, module-level or inside a function, without importing
anything. Layers, lowest first (a module may import from its own layer and those below):

0. foundation: the package root, ``_compat``, ``_pypi``, ``heap``, ``kernels``, ``prompting``, ``provenance``,
   ``checks``, ``detokenizer``, the drafter and length-head configuration/modeling files, ``dflash_format``, ``data``,
   ``vllm_runner`` (a script for the vLLM environment, which imports nothing of the package);
1. ``decoding``: the speculative-decoding engine;
2. models, cards and command-line fields: ``targets``, ``drafters``, ``integration``, ``model_card``,
   ``model_card_files``, ``cli_args`` (whose target field names the presets);
3. ``training``: offline drafter and length-head training;
4. built on trained parts: ``quality`` (task results), ``policies`` (verify-length policies, which read a length head);
5. ``serving``: the continuous-batching server and its load test;
6. ``online``: on-line distillation, which runs inside the server's scheduler;
7. commands: ``bench`` (and ``bench_report``), ``profile``, ``serve``, ``demo`` (and ``demo_race``), ``export`` (and
   ``export_target``), ``cli``, ``vllm_env`` (``setup-vllm``, and driving vLLM from this environment).

Any layer may import a command's config dataclasses (``training.configs``, ``online.configs``): they are torch-free
and exist so that cards and the CLI can name a command's settings.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "adaflash_hf"
LAYERS = (
    (
        "adaflash_hf",
        "adaflash_hf._compat",
        "adaflash_hf._pypi",
        "adaflash_hf.heap",
        "adaflash_hf.kernels",
        "adaflash_hf.prompting",
        "adaflash_hf.provenance",
        "adaflash_hf.checks",
        "adaflash_hf.detokenizer",
        "adaflash_hf.configuration_adaflash",
        "adaflash_hf.modeling_adaflash",
        "adaflash_hf.configuration_length_head",
        "adaflash_hf.modeling_length_head",
        "adaflash_hf.dflash_format",
        "adaflash_hf.data",
        "adaflash_hf.vllm_runner",
    ),
    ("adaflash_hf.decoding",),
    (
        "adaflash_hf.targets",
        "adaflash_hf.drafters",
        "adaflash_hf.integration",
        "adaflash_hf.model_card",
        "adaflash_hf.model_card_files",
        "adaflash_hf.cli_args",
    ),
    ("adaflash_hf.training",),
    ("adaflash_hf.quality", "adaflash_hf.policies"),
    ("adaflash_hf.serving",),
    ("adaflash_hf.online",),
    (
        "adaflash_hf.bench",
        "adaflash_hf.bench_report",
        "adaflash_hf.profile",
        "adaflash_hf.serve",
        "adaflash_hf.demo",
        "adaflash_hf.demo_race",
        "adaflash_hf.export",
        "adaflash_hf.export_target",
        "adaflash_hf.cli",
        "adaflash_hf.vllm_env",
    ),
)
SHARED_CONFIGS = ("adaflash_hf.training.configs", "adaflash_hf.online.configs")


def module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def import_graph() -> dict[str, set[str]]:
    """Module -> the adaflash_hf modules it imports (``from pkg import name`` counts as importing ``pkg.name``
    when that is a module, else ``pkg``). The bundled Hub folders are copies for remote code, not the package."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py") if "bundled" not in p.relative_to(PACKAGE).parts}
    modules = {name for name, _ in files}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for (name, is_package), path in files.items():
        base = name if is_package else name.rpartition(".")[0]
        imported = set()
        tree = ast.parse(path.read_text(), str(path))
        # imports for type annotations only never run, so they create no dependency
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
            for stmt in block.body
            for n in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                imported |= {known(alias.name) for alias in node.names if alias.name.startswith("adaflash_hf")}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = base.split(".")[: len(base.split(".")) - node.level + 1]
                    source = ".".join(parts + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source == "adaflash_hf" or source.startswith("adaflash_hf."):
                    for alias in node.names:
                        full = f"{source}.{alias.name}"
                        imported.add(full if full in modules else known(source))
        graph[name] = imported - {None, name}
    return graph


def layer_of(module: str) -> int:
    best = None
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix != "adaflash_hf":
                if best is None or len(prefix) > best[1]:
                    best = (level, len(prefix))
    if best is None:
        if module == "adaflash_hf":
            return 0
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py")
    return best[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_import_graph_has_no_cycles(graph):
    assert cycles(graph) == []


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_has_a_layer(graph):
    for module in graph:
        layer_of(module)


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (module, imported)
        for module, imports in graph.items()
        for imported in imports
        if imported not in SHARED_CONFIGS and layer_of(imported) > layer_of(module)
    }


def test_no_module_imports_from_a_layer_above(graph):
    assert upward(graph) == set()


def test_decoding_imports_nothing_from_serving_online_training_or_the_cli(graph):
    above = ("adaflash_hf.serving", "adaflash_hf.online", "adaflash_hf.training", "adaflash_hf.cli")
    wrong = {
        (m, i)
        for m, imports in graph.items()
        if m.startswith("adaflash_hf.decoding")
        for i in imports
        if i.startswith(above)
    }
    assert wrong == set()
