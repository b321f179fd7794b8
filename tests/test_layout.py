"""The package's house rules, checked on its source (no import of the code itself):

- Import layers: a module imports only from its own layer or the layers below it, so a
  change low in the stack never needs one high up. Evaluation never imports training.
- No import cycles between modules (lazy imports inside functions count too).
- Entry points (`python -m jaxspeech.<cli>`) are imported by no library module.
- Sizes: files of at most 600 lines, functions of at most 80 (the demo's sentence lists
  are data, not code).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Top to bottom. A package name covers its modules; the first matching prefix wins.
LAYERS: list[tuple[str, ...]] = [
    (  # command-line entry points: flags -> config -> one library call
        "jaxspeech.train",
        "jaxspeech.evaluate",
        "jaxspeech.transcribe",
        "jaxspeech.export",
        "jaxspeech.status",
        "jaxspeech.devices",
        "jaxspeech.launch_local",
        "jaxspeech.distill.targets",
        "jaxspeech.cli",  # what the entry points share (flags, exit codes); not one itself
    ),
    ("jaxspeech.serving",),
    ("jaxspeech.training",),
    # below training: the trainer reads a teacher's soft targets through distill.student
    ("jaxspeech.distill",),
    ("jaxspeech.evaluation",),
    ("jaxspeech.runs",),
    ("jaxspeech.config", "jaxspeech.decoding"),
    ("jaxspeech.models", "jaxspeech.tts"),
    (
        "jaxspeech.data",
        "jaxspeech.audio",
        "jaxspeech.losses",
        "jaxspeech.metrics",
        "jaxspeech.parallel",
        "jaxspeech.errors",
        "jaxspeech.files",
        "jaxspeech.storage",
    ),
]
ENTRY_POINTS = set(LAYERS[0]) - {"jaxspeech.cli"}
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 80
SIZE_EXEMPT = {"data_prep/demo/sentences.py"}  # sentence lists: data


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted((ROOT / "jaxspeech").rglob("*.py"))}


def imports_of(path: pathlib.Path, modules: dict) -> set[str]:
    """jaxspeech modules `path` imports anywhere in its body (a `from pkg import name`
    that names a module counts as that module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name.startswith("jaxspeech.") and modules.get(name, "").name != "__init__.py":
                out.add(name)
    return out


def layer_of(module: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in layer):
            return i
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {m: imports_of(p, modules) - {m} for m, p in modules.items()}


def test_every_module_has_a_layer(graph):
    unplaced = [m for m in graph if m != "jaxspeech" and layer_of(m) is None]
    assert not unplaced, f"modules in no layer of tests/test_layout.py: {unplaced}"


def test_imports_go_down_the_layers(graph):
    upward = [
        f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
        for m, deps in graph.items()
        for d in deps
        if layer_of(m) is not None and layer_of(d) is not None and layer_of(d) < layer_of(m)
    ]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_no_module_imports_an_entry_point(graph):
    bad = [f"{m} imports {d}" for m, deps in graph.items() for d in deps if d in ENTRY_POINTS]
    assert not bad, "entry points are imported by nothing:\n" + "\n".join(sorted(bad))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as a path m0 -> ... -> m0, or None."""
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d) :] + [d] if d in path else [m, d]
            if d not in state:
                found = visit(d, path + [d])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_no_import_cycles(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_finds_one():  # the checker itself, on a made-up graph
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def source_files() -> list[pathlib.Path]:
    out = []
    for top in ("jaxspeech", "data_prep", "benchmarks"):
        out += sorted((ROOT / top).rglob("*.py"))
    return [p for p in out if str(p.relative_to(ROOT)) not in SIZE_EXEMPT]


def test_files_and_functions_are_small():
    long_files, long_functions = [], []
    for path in source_files():
        text = path.read_text()
        rel = path.relative_to(ROOT)
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert not long_files, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(long_files)
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(
        long_functions
    )
