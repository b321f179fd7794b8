"""Config files: every variant builds a model of the advertised size."""

import jax
import numpy as np
import pytest
from flax import nnx

from configs import conformer, demo
from jaxspeech import evaluate as eval_lib


def _num_params(config, vocab: int) -> int:
    model = nnx.eval_shape(lambda: eval_lib.make_model(config, vocab, 0))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


# Millions of parameters with a 500-token vocabulary: the sizes the configs' header states
# (Gulati et al.: S 10M, M 30M, L 120M; XL is our ~600M+ model).
@pytest.mark.parametrize("size,millions", [("S", 9.3), ("M", 28.7), ("L", 116.6), ("XL", 620.8)])
def test_conformer_sizes(size, millions):
    config = conformer.get_config(size)
    assert round(_num_params(config, 500) / 1e6, 1) == millions
    assert config.model.head == "ctc+rnnt"
    if size == "XL":  # too big for plain data parallelism: sharded parameters and moments
        assert config.mesh.fsdp == -1 and config.mesh.tensor > 1


@pytest.mark.parametrize("variant", ["default", "long", "tiny", "rnnt", "ctc_rnnt"])
def test_demo_variants_build(variant):
    config = demo.get_config(variant)
    assert _num_params(config, 30) > 0
    eval_lib.decoding_method(config)


def test_unknown_variants_are_clear_errors():
    with pytest.raises(ValueError, match="use one of"):
        conformer.get_config("XXL")
    with pytest.raises(ValueError, match="variant 'huge'"):
        demo.get_config("huge")
