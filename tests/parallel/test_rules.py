"""config.mesh.rules: the logical-axis table as config keys, its errors, and its effect."""

import jax
import pytest

from configs import demo
from jaxspeech.config import build
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from tests.test_config_keys import TINY, parse


def test_default_config_is_todays_table():
    assert build.rules_from_config(demo.get_config("tiny")) == rules.DEFAULT_RULES
    legacy = demo.get_config("tiny")
    del legacy.mesh["rules"]  # a run directory written before the key existed
    assert build.rules_from_config(legacy) == rules.DEFAULT_RULES


def test_command_line_overrides_reach_the_table():
    config = parse(TINY, "--config.mesh.rules.embed=", "--config.mesh.rules.mlp=fsdp,tensor")
    table = dict(build.rules_from_config(config))
    assert table["embed"] is None and table["mlp"] == ("fsdp", "tensor")
    assert table["batch"] == ("replica", "stage", "data", "fsdp")  # the others: defaults


@pytest.mark.parametrize(
    "change,message",
    [
        ({"embed": "fdsp"}, r"mesh.rules.embed: unknown mesh axes \['fdsp'\]"),
        ({"heads": None}, r"missing \['heads'\]"),
        ({"experts": "tensor"}, r"unknown \['experts'\]"),
    ],
)
def test_bad_tables_are_one_clear_error(change, message):
    entries = rules.rules_to_config()
    for name, value in change.items():
        if value is None:
            del entries[name]
        else:
            entries[name] = value
    with pytest.raises(ValueError, match=message):
        rules.rules_from_config(entries)


def test_table_in_force_decides_parameter_and_batch_layout():
    config = demo.get_config("tiny")
    config.mesh.data, config.mesh.fsdp = 2, 4
    mesh = build.mesh_from_config(config, devices=jax.devices()[:8])
    default = build.abstract_model(config, 30, mesh)
    kernel = default.param_shardings["encoder"]["blocks"]["ff1"]["up"]["kernel"]
    assert kernel.spec[1] == "fsdp" and mesh_lib.num_batch_shards(mesh) == 8
    config.mesh.rules.embed = ""
    config.mesh.rules.batch = "data"
    with rules.axis_rules(build.rules_from_config(config)):
        spec = build.abstract_model(config, 30, mesh)
        assert mesh_lib.num_batch_shards(mesh) == 2
    kernel = spec.param_shardings["encoder"]["blocks"]["ff1"]["up"]["kernel"]
    assert kernel.spec[:2] == ("stage", None)  # (layers, embed): embed no longer on fsdp
    assert rules.active_rules() == rules.DEFAULT_RULES  # the block restored the default
