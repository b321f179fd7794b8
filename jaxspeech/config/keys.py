"""Every config key with its default and the comment defaults.py gives it, read from the
source: the comments are the keys' documentation, and reading them keeps one copy of it
(`python -m jaxspeech.train --config_help` prints it; tests/config/test_defaults.py
checks that every key has one).

In `jaxspeech/config/defaults.py` each key is one `c.<key> = ...` statement with a comment
on its line or in the comment block right above it; a table set in one statement
(`c.mesh.rules = ConfigDict(...)`) documents all of its keys. A section
(`c.data = ConfigDict()  # the corpus ...`) is documented the same way.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import pathlib
import textwrap
import tokenize
from collections.abc import Mapping

from ml_collections import ConfigDict

from jaxspeech.config import defaults, sections

DEFAULTS_PY = pathlib.Path(defaults.__file__)


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One `c.<key> = ...` statement of a config source."""

    key: str  # dotted, e.g. "data.eval_split"
    line: int  # 1-based, the statement's first line
    comment: str  # its comment ("" when it has none), the `#`s stripped, lines joined


def assignments(text: str) -> dict[str, Assignment]:
    """The `c.<key> = ...` statements of a config source `text` in source order, by dotted
    key (the last one of a key assigned twice), with their comments."""
    alone, trailing = _comments(text)
    lines = text.splitlines()
    out = {}
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            parts = []
            while isinstance(target, ast.Attribute):
                parts.append(target.attr)
                target = target.value
            if parts and isinstance(target, ast.Name) and target.id == "c":
                key = ".".join(reversed(parts))
                comment = _comment_of(node.lineno, lines, alone, trailing)
                out[key] = Assignment(key, node.lineno, comment)
    return dict(sorted(out.items(), key=lambda kv: kv[1].line))


def _comments(text: str) -> tuple[dict[int, str], dict[int, str]]:
    """({line: text} of lines holding only a comment, {line: text} of comments after code)."""
    alone, trailing = {}, {}
    lines = text.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            body = tok.string.lstrip("#").strip()
            (alone if not lines[row - 1][:col].strip() else trailing)[row] = body
    return alone, trailing


def _comment_of(line: int, lines: list[str], alone: dict, trailing: dict) -> str:
    """The comment block right above `line` (blank lines between allowed), then the
    comment on `line` itself."""
    above = line - 1
    while above > 0 and not lines[above - 1].strip():
        above -= 1
    block = []
    while above in alone:
        block.insert(0, alone[above])
        above -= 1
    return " ".join(block + ([trailing[line]] if line in trailing else []))


def flat(d: Mapping, prefix: str = "") -> dict:
    """{dotted key: value} of the leaves of a nested mapping (a ConfigDict's to_dict())."""
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out |= flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def every_key(task: str | None = None) -> dict:
    """{dotted key: default} of a run of `task`, or (None) of every task's sections (the
    shared ones at the recognizer's values)."""
    if task is not None:
        return flat(defaults.get_config(task).to_dict())
    out: dict = {}
    for name in sections.TASKS:
        out = flat(defaults.get_config(name).to_dict()) | out
    return out


def key_comments(task: str | None = None) -> dict[str, str]:
    """{dotted key: comment} for every leaf key of `defaults.get_config(task)` (None: of
    every task), in defaults.py's order: its own statement's comment, or that of the table
    it was set in (mesh.rules.*; "" for a key set by no statement, which
    tests/config/test_defaults.py forbids)."""
    documented = assignments(DEFAULTS_PY.read_text())
    owners = {}
    for key in every_key(task):
        owner = key
        while owner and owner not in documented:
            owner = owner.rpartition(".")[0]
        owners[key] = documented.get(owner)
    # In defaults.py's order (to_dict sorts the keys), a table's keys by name.
    order = sorted(owners, key=lambda k: (owners[k].line if owners[k] else 0, k))
    return {k: owners[k].comment if owners[k] else "" for k in order}


def describe_keys(config: ConfigDict | None = None, width: int = 92) -> list[str]:
    """One entry per section and key of the defaults, in defaults.py's order: a section
    as `[section] comment`, a key as `key = default` with its comment on the indented
    lines below (a key of a table set in one statement, mesh.rules.*, shares its section's
    comment). With `config`, only its task's sections (`jaxspeech.config.sections`), each
    key with that config's value and the task's default after it where they differ;
    without, every task's, a section one task reads marked with it (the shared ones at
    the recognizer's values). `python -m jaxspeech.train --config_help` prints this."""
    documented = assignments(DEFAULTS_PY.read_text())
    task = sections.task_of(config) if config is not None else None
    base = every_key(task)
    given = flat(config.to_dict()) if config is not None else base
    out, seen = [], set()
    for key, comment in key_comments(task).items():
        section = key.rpartition(".")[0]
        if section and section not in seen:
            seen.add(section)
            if section in documented and documented[section].comment:
                text = f"[{section}] {documented[section].comment}"
                read_by = sections.owners(section.partition(".")[0])
                if task is None and len(read_by) == 1:
                    text += f" (config.task={read_by[0]} only)"
                out.append(_wrap(text, width, ""))
        value = given.get(key, base[key])
        head = f"{key} = {value!r}" + (f"  (default: {base[key]!r})" if value != base[key] else "")
        if key not in documented:  # documented by its table's statement: the section line
            out.append(head)
        else:
            out.append(head + ("\n" + _wrap(comment, width, "    ") if comment else ""))
    return out


def _wrap(text: str, width: int, indent: str) -> str:
    return textwrap.fill(
        text, width, initial_indent=indent, subsequent_indent="    ", break_on_hyphens=False
    )
