"""jaxspeech/config/defaults.py holds every config key, its default and a comment; the
shipped configs start from it and set only keys it has, each to a value that differs
from the default in some variant; runs saved before a key existed read its default."""

from __future__ import annotations

import ast
import pathlib

import pytest
from ml_collections import ConfigDict

from configs import conformer, demo, tts, vocoder
from jaxspeech.config import build, defaults, keys
from jaxspeech.decoding import search
from jaxspeech.parallel import rules, sync

DEFAULTS_PY = keys.DEFAULTS_PY
flat = keys.flat
CONFIG_FILES = {
    "demo": (demo, demo.VARIANTS),
    "conformer": (conformer, tuple(conformer.SIZES)),
    "tts": (tts, tts.VARIANTS),
    "vocoder": (vocoder, vocoder.VARIANTS),
}
SHIPPED = [(name, v) for name, (_, variants) in CONFIG_FILES.items() for v in variants]


def shipped(name: str, variant: str) -> ConfigDict:
    module, _ = CONFIG_FILES[name]
    return module.get_config(None if variant == "default" else variant)


def assigned_keys(path: pathlib.Path) -> dict[str, int]:
    """`c.<key> = ...` statements of a config source: dotted key -> line."""
    return {key: a.line for key, a in keys.assignments(path.read_text()).items()}


@pytest.mark.parametrize("name,variant", SHIPPED, ids=[f"{n}:{v}" for n, v in SHIPPED])
def test_every_shipped_config_has_exactly_the_default_keys(name, variant):
    """Its task's keys: the shared sections and the task's own (no other task's)."""
    config = shipped(name, variant)
    assert list(flat(config.to_dict())) == list(flat(defaults.get_config(config.task).to_dict()))


@pytest.mark.parametrize("name", list(CONFIG_FILES))
def test_configs_override_only_default_keys_each_to_another_value(name):
    """Every key a config file sets is a default key (a leaf), and in at least one of the
    file's variants it holds another value than the default: no assignment restates a
    default. The file starts from the defaults, not from another config file."""
    module, variants = CONFIG_FILES[name]
    source = pathlib.Path(module.__file__)
    tree = ast.parse(source.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "defaults" in imported and not imported & set(CONFIG_FILES)
    base = flat(defaults.get_config(shipped(name, "default").task).to_dict())
    built = [flat(shipped(name, v).to_dict()) for v in variants]
    for key, line in assigned_keys(source).items():
        assert key in base, f"{source.name}:{line} sets {key}, which is no default key"
        assert any(cfg[key] != base[key] for cfg in built), (
            f"{source.name}:{line} sets {key} to its default in every variant"
        )


def test_every_default_key_is_set_once_with_a_comment():
    """Each key is one `c.<key> = ...` line in defaults.py (mesh.rules: one table) with a
    comment on that line or the comment block right above it: `jaxspeech.config.keys`
    reads them (`python -m jaxspeech.train --config_help`). Every task's keys."""
    assigned = keys.assignments(DEFAULTS_PY.read_text())
    tables = ("mesh.rules.", "optim2.")  # each set in one statement (optim2: optim's keys)
    names = {k for k in keys.every_key() if not k.startswith(tables)}
    assert names - set(assigned) == set()
    uncommented = [f"defaults.py:{a.line} {key}" for key, a in assigned.items() if not a.comment]
    assert not uncommented, "keys without a comment:\n" + "\n".join(uncommented)


def test_tables_owned_by_lower_layers_are_read_not_copied():
    c = defaults.get_config()
    assert c.sync.to_dict() == sync.default_sync_config()
    assert (c.decoding.lm_weight, c.decoding.word_bonus) == (search.LM_WEIGHT, search.WORD_BONUS)
    assert build.rules_from_config(c) == rules.DEFAULT_RULES
    assert sync.strategy_from_config(c.sync, {"data": 8}) == sync.strategy_from_config({}, {})


def test_get_config_is_fresh_each_time():
    a = defaults.get_config()
    a.train.num_steps = 7
    assert defaults.get_config().train.num_steps == 1350


def _legacy() -> ConfigDict:
    """A run saved before several keys existed."""
    config = demo.get_config("tiny")
    del config.data["read_retries"]
    del config.data["max_corrupt_fraction"]
    del config.mesh["rules"]
    del config["distill"]
    for key in ("lm_path", "lm_weight", "word_bonus", "streaming"):
        del config.decoding[key]
    return config


def test_lookup_reads_the_default_of_a_key_a_run_lacks():
    old, base = _legacy(), defaults.get_config()
    assert defaults.lookup(old, "data.read_retries") == base.data.read_retries
    assert defaults.lookup(old, "distill.other_split") == ""
    assert defaults.lookup(old, "train.num_steps") == 8  # present: the run's own
    assert defaults.lookup({"sync": {"strategy": "bmuf"}}, "sync.strategy") == "bmuf"
    assert defaults.lookup({}, "sync.outer") == base.sync.outer  # a checkpoint's saved dict
    assert build.retry_policy(old).retries == base.data.read_retries
    assert build.max_corrupt_fraction(old) == base.data.max_corrupt_fraction
    assert build.rules_from_config(old) == rules.DEFAULT_RULES
    with pytest.raises(KeyError):
        defaults.lookup(old, "data.no_such_key")


def test_fill_missing_adds_only_what_a_run_lacks():
    old = _legacy()
    old.decoding.beam = 9
    defaults.fill_missing(old, "decoding")
    base = defaults.get_config().decoding
    assert old.decoding.to_dict() == base.to_dict() | {"beam": 9}
    assert "distill" not in old  # only the named sections
    defaults.fill_missing(old)
    assert flat(old.to_dict()).keys() == flat(defaults.get_config().to_dict()).keys()
    assert old.train.num_steps == 8 and old.distill.other_split == ""


def test_evaluation_completes_an_old_runs_decoding_keys_from_the_defaults(tmp_path):
    from jaxspeech.evaluation import run as eval_run

    config = _legacy()
    config.decoding.beam = 9
    (tmp_path / "config.json").write_text(config.to_json())
    loaded = eval_run.run_eval_config(str(tmp_path))
    assert loaded.decoding.to_dict() == defaults.get_config().decoding.to_dict() | {"beam": 9}
    given = eval_run.run_eval_config(str(tmp_path), decoding={"lm_weight": 0.7})
    assert given.decoding.lm_weight == 0.7
