"""Every third-party module the package, its data tools and its configs import is a
declared dependency (pyproject.toml: the main list, or the extra that its feature needs),
so a fresh install (`make demo`: the main list and [lm]) has what a run reads. Modules
imported only by JAX at run time, which no source line names, are listed with why."""

from __future__ import annotations

import ast
import importlib.metadata as md
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIRST_PARTY = {"jaxspeech", "data_prep", "configs", "benchmarks", "tests", "__future__"}
# Imported only inside the ONNX converter's own environment (`make install-onnx` installs it).
CONVERTER_ONLY = {"jax2onnx"}
# Distributions the main install needs though no source line imports them.
RUNTIME = {
    # jax's persistent compilation cache locks its entries under the size bound that
    # training/compile_cache.py sets; without it every cache read fails.
    "filelock",
}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement)[0].lower().replace("_", "-")


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    main = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for rs in project["optional-dependencies"].values() for r in rs}
    return main, extras


def _imported_modules() -> set[str]:
    names = set()
    for top in ("jaxspeech", "data_prep", "configs"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - FIRST_PARTY - CONVERTER_ONLY


def test_every_imported_module_is_a_declared_dependency():
    main, extras = _declared()
    distributions = md.packages_distributions()
    undeclared = []
    for module in sorted(_imported_modules()):
        names = {_name(d) for d in distributions.get(module, [module])}
        if not names & (main | extras):
            undeclared.append(f"{module} (distribution {sorted(names)})")
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def test_what_jax_needs_at_run_time_is_in_the_main_install():
    main, _ = _declared()
    assert RUNTIME <= main, sorted(RUNTIME - main)
