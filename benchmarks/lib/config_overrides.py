"""`--set KEY=VALUE` overrides of an existing config entry (benchmarks/train_step.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ml_collections import ConfigDict


def apply_overrides(config: ConfigDict, overrides: list[str]) -> None:
    """Sets `KEY=VALUE` entries (dotted keys of an existing config entry; VALUE a Python
    literal, else a string) in place: an unknown key or a value of another type is an error."""
    import ast

    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        *parents, leaf = key.split(".")
        node = config
        for name in parents:
            node = node.get(name) if hasattr(node, "get") else None
        if node is None or not hasattr(node, "get") or leaf not in node:
            raise SystemExit(f"--set {item!r}: the config has no entry {key!r}")
        try:
            setattr(node, leaf, value)
        except TypeError as e:
            raise SystemExit(f"--set {item!r}: {e}") from e
