"""Every pointer the documentation gives resolves, checked on the source (nothing imported):

- a repository path (`jaxspeech/...`, `configs/...`, `benchmarks/...`, `tests/...`,
  `docs/...`, `data_prep/...`, `examples/...`, `launch/...`, `colabs/...`) names a file or
  folder that exists;
- a module (`python -m jaxspeech.teach`, `jaxspeech.config.validate`,
  `jaxspeech.decoding.search.LM_WEIGHT`) names a module, and what follows the module a
  name it defines (a function, class, constant or import);
- a short reference (`longform.SpeechGate`, `hifigan.DEMO_GENERATOR`) names a module of
  ours (by its last name) that defines the symbol (config keys such as
  `mesh.stage` are config keys, not modules: tests/test_config_keys.py checks them);
- a config's variant (`configs/demo.py:ctc`, `configs/conformer.py:M`) is one its
  VARIANTS or SIZES name (an upper-case word of three letters or more is a placeholder);
- a section cited by its title (`docs/reference.md, "Input formats"`, `README "Clusters"`)
  is a heading of that file.

Read: README.md, docs/*.md, docs/results/*.md, benchmarks/README.md, colabs/README.md, and
the docstrings and comments of configs/, jaxspeech/, data_prep/ and benchmarks/ (where
modules cite each other and the docs). About a second in all.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("jaxspeech", "data_prep", "benchmarks")

# A repository path: not the tail of another path (`~/.cache/jaxspeech/jit`, `RUN/eval/x`).
PATH = re.compile(
    r"(?<![\w/.~$-])((?:jaxspeech|configs|benchmarks|tests|docs|data_prep|examples|launch"
    r"|colabs)/[\w./-]*)"
)
# A dotted name rooted at one of our packages (`python -m X` included).
DOTTED = re.compile(r"(?<![\w/.-])((?:jaxspeech|data_prep|benchmarks)(?:\.[A-Za-z_]\w*)+)")
# A command: the whole name must be a module.
PYTHON_M = re.compile(r"python -m ((?:jaxspeech|data_prep|benchmarks)(?:\.\w+)*)")
# A short reference: the whole of a `backticked` span, `module.symbol[.more]`, maybe called.
SHORT_TICKED = re.compile(r"`([a-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`")
# ... and unticked where the symbol is a class or constant (`hifigan.DEMO_GENERATOR`).
SHORT_CAPS = re.compile(r"(?<![\w./-])([a-z_]\w*)\.([A-Z]\w*)\b")
# A config with its argument: `configs/demo.py:ctc`, `configs/conformer.py:M`.
CONFIG_ARG = re.compile(r"(configs/\w+\.py):(\w+)")
# A section cited by its title, after the file that holds it.
SECTION = re.compile(r"(?<![\w/.-])([\w/.-]*\.md|README)(?:\s+section)?,?\s+\"([^\"]+)\"")
TRIPLE_QUOTED = re.compile(r'"""(.*?)"""', re.DOTALL)
COMMENT = re.compile(r"^[^#\n\"']*#+ ?(.*)$", re.MULTILINE)
# A file name is not a module reference (`events.jsonl`, `ctc.int8.onnx`).
FILE_SUFFIXES = frozenset(
    "py json jsonl onnx stablehlo md txt wav npy arpa flac ogg log csv yaml toml ipynb gz".split()
)
# Other libraries' usual names that are also a module's of ours (tensorflow_datasets).
EXTERNAL_ALIASES = frozenset({"tfds"})
MARKDOWN = (
    "README.md",
    "docs/*.md",
    "docs/results/*.md",
    "benchmarks/README.md",
    "colabs/README.md",
)
PYTHON = ("configs/*.py", "jaxspeech/**/*.py", "data_prep/**/*.py", "benchmarks/**/*.py")


def documents() -> list[pathlib.Path]:
    found = [p for pattern in MARKDOWN + PYTHON for p in sorted(ROOT.glob(pattern))]
    return [p for p in found if "__pycache__" not in p.parts]


@functools.cache
def prose(path: pathlib.Path) -> str:
    """What a file says to a reader: a Markdown file whole; of a Python file its
    triple-quoted strings (docstrings) and its comments, with comment markers dropped so
    that a citation wrapped over two comment lines reads as one (found by pattern: parsing
    every module would cost a second)."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    strings = TRIPLE_QUOTED.findall(text)
    comments = [m.group(1) for m in COMMENT.finditer(text)]
    return "\n".join(strings) + "\n" + " ".join(comments)


@functools.cache
def module_file(dotted: str) -> pathlib.Path | None:
    """The source of a module or package named `a.b.c`, or None."""
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def defined(path: pathlib.Path) -> frozenset[str] | None:
    """The names a module defines at its top level (functions, classes, assignments,
    imports), or None when it computes names at run time (a module `__getattr__`)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):  # `A = ...`, `A, B = ...`
            names.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:`, optional imports
            names.update(defined_in_block(node))
    if "__getattr__" in names:
        return None
    if path.name == "__init__.py":  # a package's submodules are its attributes too
        names.update(p.stem for p in path.parent.glob("*.py"))
        names.update(p.name for p in path.parent.iterdir() if (p / "__init__.py").is_file())
    return frozenset(names)


def defined_in_block(node: ast.stmt) -> set[str]:
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in child.names)
        elif isinstance(child, ast.Assign):
            names.update(t.id for t in child.targets if isinstance(t, ast.Name))
    return names


def dotted_problem(dotted: str) -> str | None:
    """Why `pkg.mod[.symbol...]` does not resolve, or None when it does."""
    parts = dotted.split(".")
    module = None
    for end in range(len(parts), 0, -1):
        if module_file(".".join(parts[:end])):
            module = end
            break
    if module is None:
        return "no such module"
    if module == len(parts):
        return None
    names = defined(module_file(".".join(parts[:module])))
    if names is not None and parts[module] not in names:
        return f"{'.'.join(parts[:module])} defines no {parts[module]}"
    return None


@functools.cache
def modules_by_name() -> dict[str, list[str]]:
    """Every module and package of ours by its last name (`loading` ->
    `jaxspeech.runs.loading`, `jaxspeech.tts.loading`, ...; `conformer` ->
    `configs.conformer` too)."""
    index: dict[str, list[str]] = {}
    paths = [p for package in (*PACKAGES, "configs") for p in (ROOT / package).rglob("*.py")]
    for path in sorted(paths):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        index.setdefault(parts[-1], []).append(".".join(parts))
    return index


@functools.cache
def config_sections() -> frozenset[str]:
    """The config's top-level keys (`data`, `mesh`, `decoding`, ...): a `mesh.stage` is a
    key, not the module `parallel/mesh.py`'s symbol."""
    source = (ROOT / "jaxspeech/config/defaults.py").read_text()
    return frozenset(re.findall(r"^\s+c\.(\w+)\s*=", source, re.MULTILINE)) | {"config"}


def short_problem(reference: str, source: str) -> str | None:
    """Why `module.symbol` names no symbol of a module of ours called `module`, or None
    (also when `module` is no module's name, or a config section's, and when the citing
    file's `source` defines the symbol itself: `recognizer.transcribe(...)`, the method of
    an object named like a module)."""
    head, *rest = reference.split(".")
    if head in config_sections() | EXTERNAL_ALIASES or head not in modules_by_name():
        return None
    candidates = modules_by_name()[head]
    if any(dotted_problem(".".join([c, *rest])) is None for c in candidates):
        return None
    if f"def {rest[0]}(" in source:
        return None
    return f"no module named {head} ({', '.join(candidates)}) defines {rest[0]}"


@functools.cache
def config_arguments(path: pathlib.Path) -> frozenset[str] | None:
    """What `configs/X.py:ARG` may name: its VARIANTS tuple or SIZES keys, None if neither."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("VARIANTS", "SIZES") for t in node.targets
        ):
            value = node.value
            items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
            return frozenset(e.value for e in items if isinstance(e, ast.Constant))
    return None


def config_problem(config: str, argument: str) -> str | None:
    path = ROOT / config
    if not path.is_file():
        return None  # reported as a missing file
    known = config_arguments(path)
    if known is None or argument in known or (argument.isupper() and len(argument) >= 3):
        return None
    return f"{config} has no variant {argument!r} (it has {', '.join(sorted(known))})"


@functools.cache
def headings(path: pathlib.Path) -> str:
    return "\n".join(
        line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")
    )


def section_problem(source: pathlib.Path, cited: str, title: str) -> str | None:
    """Why the section `title` of the file `cited` (relative to the repository, to the
    citing file, or README: the top-level one) is not a heading there."""
    if cited == "README":
        cited = "README.md"
    for base in (ROOT, source.parent):
        target = base / cited
        if target.is_file():
            wanted = " ".join(title.split()).lower()  # "Sync strategies" in "sync.py: sync ..."
            found = wanted in headings(target).lower()
            return None if found else f"{cited} has no section {title!r}"
    return None  # a file of elsewhere (icefall's RESULTS.md) or a path the path check reports


def problems(path: pathlib.Path) -> list[str]:
    text = prose(path)
    found = []
    for match in PATH.finditer(text):
        target = match.group(1).rstrip(".-/")
        if text[match.end() : match.end() + 1] in ("*", "<", "{"):
            continue  # a pattern (`tests/test_*.py`, `results/<name>.json`)
        if not (ROOT / target).exists():
            found.append(f"{target}: no such file")
    commands = {m.group(1) for m in PYTHON_M.finditer(text)}
    for command in sorted(commands):
        if module_file(command) is None:
            found.append(f"python -m {command}: no such module")
    for match in DOTTED.finditer(text):
        dotted = match.group(1)
        if dotted.endswith((".py", ".md", ".json")) or dotted in commands:
            continue  # a file name, checked as a path; a command, checked above
        if (why := dotted_problem(dotted)) is not None:
            found.append(f"{dotted}: {why}")
    shorts = {m.group(1) for m in SHORT_TICKED.finditer(text)}
    shorts |= {f"{m.group(1)}.{m.group(2)}" for m in SHORT_CAPS.finditer(text)}
    for reference in sorted(shorts):
        if reference.split(".")[0] in PACKAGES or reference.rsplit(".", 1)[1] in FILE_SUFFIXES:
            continue  # a dotted name, checked above; a file name
        if (why := short_problem(reference, path.read_text())) is not None:
            found.append(f"{reference}: {why}")
    for match in CONFIG_ARG.finditer(text):
        if (why := config_problem(*match.groups())) is not None:
            found.append(why)
    for match in SECTION.finditer(text):
        if (why := section_problem(path, match.group(1), match.group(2))) is not None:
            found.append(why)
    return found


def test_every_pointer_resolves():
    """One failure listing every stale pointer, by file."""
    stale = {}
    for path in documents():
        if found := problems(path):
            stale[str(path.relative_to(ROOT))] = found
    assert not stale, "\n".join(f"{f}: {'; '.join(p)}" for f, p in stale.items())


@pytest.mark.parametrize(
    "text, expected",
    [
        ("see `jaxspeech/no_such_module.py`", "jaxspeech/no_such_module.py: no such file"),
        ("`python -m jaxspeech.no_such_entry`", "python -m jaxspeech.no_such_entry: no such"),
        ("`jaxspeech.no_such_module.f`", "jaxspeech defines no no_such_module"),
        ("`jaxspeech.config.defaults.no_such_fn`", "defines no no_such_fn"),
        ("`longform.NoSuchGate`", "defines NoSuchGate"),
        ('(docs/reference.md, "No such section")', "has no section 'No such section'"),
        ("`configs/demo.py:long`", "configs/demo.py has no variant 'long'"),
    ],
)
def test_a_stale_pointer_is_found(tmp_path, text, expected):
    """The walk reports what it should: a missing file, module, symbol, section."""
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    found = problems(doc)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize(
    "text",
    [
        "`jaxspeech/config/defaults.py`, `configs/demo.py:ctc`, `benchmarks/results/`",
        "`configs/demo.py:NAME`, `configs/conformer.py:S|M|L|XL`, `configs/conformer.py:XL`",
        "`python -m jaxspeech.train`, `jaxspeech.config.defaults.get_config`",
        "`mesh.stage` and `config.decoding.method` are config keys; `~/.cache/jaxspeech/jit`",
        '(docs/reference.md, "Input formats"), README "Clusters"',
    ],
)
def test_a_live_pointer_passes(tmp_path, text):
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    assert problems(doc) == []


# A commit hash: seven or more hex digits, with a digit and a letter (not a word or a number).
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def test_the_readme_is_a_guide():
    """README.md stays a guide (issue 57): at most 250 lines and no lab notebook (no commit
    hashes: dated figures go to docs/results/, each entry with its command, commit and
    device, which every results file's entry table has as columns)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert COMMIT.findall(readme) == []
    results = sorted((ROOT / "docs/results").glob("*.md"))
    assert {p.name for p in results} >= {"asr.md", "tts.md", "other.md"}
    for path in results:
        header = next(
            (line for line in path.read_text().splitlines() if line.startswith("| date |")), ""
        )
        assert "commit" in header and "command" in header, path.name
