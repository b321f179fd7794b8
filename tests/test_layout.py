"""The package's house rules, checked on its source (no import of the code itself):

- Import layers: a module imports only from its own layer or the layers below it, so a
  change low in the stack never needs one high up. Evaluation never imports training.
- No import cycles between modules (lazy imports inside functions count too).
- The package stands alone: it imports none of the tools around it (data_prep, configs,
  benchmarks, tests), which import it.
- Entry points (`python -m jaxspeech.<cli>`) are imported by no library module, sit at the
  top of the package (never inside a library package) and share no basename with a
  library module; at most MAX_TOP_MODULES modules sit at the top of jaxspeech/.
- Tasks over one core: the task packages (TASK_PACKAGES) sit above every core package;
  the core never imports one; a task imports another only through its declared interface
  (TASK_INTERFACES); task-named files (`tts_*`, `vocoder_*`) live only in their packages.
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
        "jaxspeech.teach",
        "jaxspeech.synthesize",
        "jaxspeech.common.cli",  # what the entry points share (flags, exit codes); not one itself
    ),
    ("jaxspeech.tasks",),  # the registry: each task's code, imported lazily by name
    ("jaxspeech.asr", "jaxspeech.tts", "jaxspeech.vocoder"),  # the tasks, over the core
    ("jaxspeech.serving",),
    ("jaxspeech.training",),
    # below training: the trainer reads a teacher's soft targets through distill.student
    ("jaxspeech.distill",),
    ("jaxspeech.evaluation",),
    ("jaxspeech.runs",),
    ("jaxspeech.config", "jaxspeech.decoding"),
    ("jaxspeech.models",),
    (
        "jaxspeech.data",
        "jaxspeech.audio",
        "jaxspeech.losses",
        "jaxspeech.metrics",
        "jaxspeech.parallel",
        "jaxspeech.common",
    ),
]
ENTRY_POINTS = set(LAYERS[0]) - {"jaxspeech.common.cli"}
TASK_PACKAGES = ("jaxspeech.asr", "jaxspeech.tts", "jaxspeech.vocoder")
CORE = [p for layer in LAYERS[LAYERS.index(TASK_PACKAGES) + 1 :] for p in layer]
# The only modules one task package may import of another: (importer, module).
TASK_INTERFACES = {("jaxspeech.tts", "jaxspeech.vocoder.inference")}
TASK_FILE_PREFIXES = {"tts_": "jaxspeech/tts", "vocoder_": "jaxspeech/vocoder"}
MAX_TOP_MODULES = 10  # modules directly in jaxspeech/ (its __init__.py aside)
# Run with `python -m` in the ONNX converter's own environment (`make install-onnx`) by the
# exports, not by users: library modules with a __main__ block of their own.
CONVERTERS = {
    "jaxspeech.serving.onnx_convert",
    "jaxspeech.tts.acoustic",
    "jaxspeech.vocoder.generator",
}
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


def test_the_package_imports_none_of_the_tools_around_it():
    outside = ("data_prep", "configs", "benchmarks", "tests")
    found = []
    for path in sorted((ROOT / "jaxspeech").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in outside]
    assert not found, found


def test_no_module_imports_an_entry_point(graph):
    bad = [f"{m} imports {d}" for m, deps in graph.items() for d in deps if d in ENTRY_POINTS]
    assert not bad, "entry points are imported by nothing:\n" + "\n".join(sorted(bad))


def package_of(module: str, packages) -> str | None:
    """The one of `packages` that holds `module` (None: none does)."""
    return next((p for p in packages if module == p or module.startswith(p + ".")), None)


def test_the_core_never_imports_a_task(graph):
    bad = [
        f"{m} imports {d}"
        for m, deps in graph.items()
        if package_of(m, CORE)
        for d in deps
        if package_of(d, TASK_PACKAGES)
    ]
    assert not bad, "the core imports a task package:\n" + "\n".join(sorted(bad))


def test_tasks_import_each_other_only_through_their_interfaces(graph):
    missing = [p for p in TASK_PACKAGES if p not in graph]
    missing += [d for _, d in TASK_INTERFACES if d not in graph]
    assert not missing, f"task packages or interfaces that do not exist: {missing}"
    bad = []
    for m, deps in graph.items():
        own = package_of(m, TASK_PACKAGES)
        for d in deps:
            other = package_of(d, TASK_PACKAGES)
            if own and other and other != own and (own, d) not in TASK_INTERFACES:
                bad.append(f"{m} imports {d}")
    assert not bad, (
        f"tasks import each other only through {sorted(TASK_INTERFACES)}:\n"
        + "\n".join(sorted(bad))
    )


def test_task_named_files_live_in_their_task_packages():
    homes = tuple(ROOT / h for h in TASK_FILE_PREFIXES.values())
    bad = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "jaxspeech").rglob("*.py"))
        if path.name.startswith(tuple(TASK_FILE_PREFIXES))
        and not any(path.is_relative_to(h) for h in homes)
    ]
    assert not bad, f"task-named files outside {sorted(TASK_FILE_PREFIXES.values())}: {bad}"


def test_few_modules_at_the_top():
    top = sorted(p.name for p in (ROOT / "jaxspeech").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of jaxspeech/: {top}"


def has_main_block(path: pathlib.Path) -> bool:
    """Whether the module runs code under `if __name__ == "__main__":`."""
    return any(
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        for node in ast.parse(path.read_text()).body
    )


def test_entry_points_sit_at_the_top_under_names_of_their_own():
    modules = package_modules()
    mains = {m for m, p in modules.items() if has_main_block(p)}
    bad = [f"{m}: an entry point inside a package" for m in ENTRY_POINTS if m.count(".") != 1]
    bad += [
        f"{m}: a __main__ block in no entry point"
        for m in sorted(mains - ENTRY_POINTS - CONVERTERS)
    ]
    names = {m.rpartition(".")[2] for m in ENTRY_POINTS}
    bad += [
        f"{m}: shares its name with the entry point jaxspeech.{m.rpartition('.')[2]}"
        for m, path in modules.items()
        if m not in ENTRY_POINTS and path.name != "__init__.py" and m.rpartition(".")[2] in names
    ]
    assert not bad, "\n".join(bad)


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
