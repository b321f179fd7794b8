"""Decoding through the stream functions (`search.StreamDecoder`, what `evaluate
--streaming` and `transcribe --streaming` run) against the masked full-sequence pass of the
same streaming model: the same head outputs on every valid frame, and the same labels."""

import numpy as np
import pytest

from jaxspeech.common.errors import UserError
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.decoding import search
from tests.test_export import _audio, _model

VOCAB_BLANK = 0


def _full_pass(graphdef, params, stats, config, audio, lengths):
    """The masked full-sequence decode outputs (`make_decode_fn`)."""
    return search.make_decode_fn(graphdef, config, VOCAB_BLANK)(params, stats, audio, lengths)


@pytest.mark.parametrize("left_chunks", [2, -1])
def test_ctc_stream_decoding_equals_the_full_pass(left_chunks):
    # left_chunks -1: unlimited history, the cache sized for the longest audio.
    graphdef, params, stats, config = _model("ctc", streaming=True, left_chunks=left_chunks)
    config.decoding.method = "ctc_beam"  # log-probs out
    # Lengths that end inside the first chunk, exactly on a step and between steps.
    audio, lengths = _audio(5, 16000, seed=1)
    lengths[0] = 900
    stream = search.StreamDecoder(graphdef, params, stats, config, VOCAB_BLANK, max_seconds=1.0)
    s1, s2 = stream.info.first_samples, stream.info.step_samples
    lengths[1], lengths[2] = s1 + 2 * s2, s1 + 3 * s2 - 7
    got = stream(audio, lengths)
    want = _full_pass(graphdef, params, stats, config, audio, lengths)
    np.testing.assert_array_equal(got["lengths"], np.asarray(want["lengths"]))
    for row, n in enumerate(got["lengths"]):
        np.testing.assert_allclose(
            got["logprobs"][row, :n], np.asarray(want["logprobs"])[row, :n], atol=1e-4
        )
    config.decoding.method = "ctc_greedy"
    greedy = search.StreamDecoder(graphdef, params, stats, config, VOCAB_BLANK, 1.0)
    got_ids = search.Searcher(config, _tokenizer()).hypotheses(greedy(audio, lengths))
    want_ids = search.Searcher(config, _tokenizer()).hypotheses(
        {
            k: np.asarray(v)
            for k, v in _full_pass(graphdef, params, stats, config, audio, lengths).items()
        }
    )
    assert got_ids == want_ids


def test_rnnt_stream_decoding_equals_the_full_pass():
    graphdef, params, stats, config = _model("ctc_rnnt", streaming=True)
    config.decoding.method = "rnnt_greedy"
    audio, lengths = _audio(4, 12000, seed=2)
    stream = search.StreamDecoder(graphdef, params, stats, config, VOCAB_BLANK, max_seconds=1.0)
    got = stream(audio, lengths)
    want = {
        k: np.asarray(v)
        for k, v in _full_pass(graphdef, params, stats, config, audio, lengths).items()
    }
    searcher = search.Searcher(config, _tokenizer())
    assert searcher.hypotheses(got, with_frames=True) == searcher.hypotheses(want, with_frames=True)


def test_a_model_that_does_not_stream_is_refused():
    graphdef, params, stats, config = _model("ctc")
    with pytest.raises(UserError, match="needs a streaming encoder"):
        search.StreamDecoder(graphdef, params, stats, config, VOCAB_BLANK, 1.0)


def _tokenizer():
    return Tokenizer(kind="char", vocab=["<blank>", "<unk>", *"abcdefghijklmnopqrstuvwxyz '"])
