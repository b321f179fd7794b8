"""The exported acoustic function (`tts.acoustic.acoustic_function`, exported with
symbolic shapes as `tts.artifact` does) on inputs outside its tables: a speaker id < 0 or
>= the speaker table, a phoneme id outside the phoneme table, phoneme_len 0, negative or
past n, and a duration scale that is 0, negative or NaN. No output is ever NaN, and the
clamped ids speak as the module docstring says (speaker -> the nearest valid id, phoneme
-> <unk>), equal to the rows that give those ids directly."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspeech.tts import acoustic
from jaxspeech.tts.model import FastSpeech2

VOCAB, SPEAKERS, MELS, MAX_FRAMES, UNK = 9, 3, 8, 48, 1


@pytest.fixture(scope="module")
def exported():
    """A tiny random FastSpeech2's acoustic function, exported and read back."""
    model = FastSpeech2(
        vocab_size=VOCAB,
        num_speakers=SPEAKERS,
        dim=16,
        num_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        ff_mult=2,
        conv_kernel=3,
        n_mels=MELS,
        variance_channels=8,
        rngs=nnx.Rngs(0),
    )
    model.duration_predictor.out.bias[...] = jnp.full((1,), math.log(4.0), jnp.float32)
    graphdef, params = nnx.split(model, nnx.Param)
    stats = {"frontend": {"mean": np.full(MELS, -5.0), "std": np.full(MELS, 2.0)}}
    fn = acoustic.acoustic_function(graphdef, nnx.to_pure_dict(params), stats, MAX_FRAMES, 1e-6)
    blob = jax.export.export(jax.jit(fn))(*acoustic.argument_specs()).serialize()
    return jax.export.deserialize(blob).call


def test_out_of_range_inputs_give_finite_outputs_and_clamped_ids(exported):
    base = [2, 3, 4, 5, 0]
    rows = [  # (phonemes, phoneme_len, speaker, duration_scale)
        (base, 4, 0, 1.0),  # 0: in range
        (base, 4, -1, 1.0),  # 1: speaker -1 -> 0 (row 0)
        (base, 4, SPEAKERS - 1, 1.0),  # 2
        (base, 4, SPEAKERS, 1.0),  # 3: -> SPEAKERS - 1 (row 2)
        (base, 4, 10**6, 1.0),  # 4: -> SPEAKERS - 1 (row 2)
        ([2, UNK, 4, 5, 0], 4, 0, 1.0),  # 5
        ([2, VOCAB, 4, 5, 0], 4, 0, 1.0),  # 6: -> <unk> (row 5)
        ([2, -7, 4, 5, 0], 4, 0, 1.0),  # 7: -> <unk> (row 5)
        (base, 0, 0, 1.0),  # 8: nothing to say: no frame
        (base, -3, 1, 1.0),  # 9: as 0
        (base, 99, 1, 1.0),  # 10: as 5 (every position)
        (base, 4, 0, 0.0),  # 11: scale 0, < 0 and NaN speak at scale 1 (row 0)
        (base, 4, 0, -2.0),  # 12
        (base, 4, 0, float("nan")),  # 13
    ]
    phonemes = np.array([r[0] for r in rows], np.int32)
    lengths = np.array([r[1] for r in rows], np.int32)
    speakers = np.array([r[2] for r in rows], np.int32)
    scales = np.array([r[3] for r in rows], np.float32)
    log_mel, mask, durations, truncated = (
        np.asarray(x) for x in exported(phonemes, lengths, speakers, scales)
    )
    assert np.isfinite(log_mel).all()
    for got, want in [(1, 0), (3, 2), (4, 2), (6, 5), (7, 5), (11, 0), (12, 0), (13, 0)]:
        np.testing.assert_array_equal(durations[got], durations[want])
        np.testing.assert_allclose(log_mel[got], log_mel[want], atol=1e-5, err_msg=f"row {got}")
    assert (durations[0, :4] >= 1).all()
    for empty in (8, 9):
        assert not mask[empty].any() and not durations[empty].any() and not truncated[empty]
        np.testing.assert_allclose(log_mel[empty], math.log(1e-6), rtol=1e-6)
    assert durations[10].astype(bool).sum() == 4  # position 4 holds <pad> (0): no frame
    assert not truncated[:8].any()
