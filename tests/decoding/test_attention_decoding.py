"""Attention decoding through the evaluation's path (decoding.search: make_decode_fn on the
mesh, Searcher.bind on the host): aed_beam and aed_rescore give the same transcripts and
times on the 8-device mesh (data, FSDP and tensor sharding) as on one device; how each
head resolves decoding.method; and every CTC-dependent option with model.head=aed, and
every attention-decoding setting out of range, is one clear line (and an ONNX export of
an `aed` run, which has no decoder in ONNX yet)."""

import json
import types

import jax
import numpy as np
import pytest

from jaxspeech.common.errors import UserError
from jaxspeech.config import build, validate
from jaxspeech.decoding import search
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.serving import recognizer_export as export
from jaxspeech.training import state as state_lib
from tests.models.test_decoder import _aed_config, one_line

VOCAB = 9


def _audio(rows: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(8000, 16000, size=rows).astype(np.int32)
    audio = np.zeros((rows, 16000), np.float32)
    for i, n in enumerate(lengths):
        audio[i, :n] = 0.3 * rng.standard_normal(n)
    return audio, lengths


def _decode(mesh_shape, method: str, with_frames: bool) -> list:
    """A fresh ctc+aed model's transcripts (labels, frames) of `_audio` by `method`."""
    config = _aed_config(mesh_shape)
    config.decoding.method = method
    mesh = build.mesh_from_config(config, devices=jax.devices()[: int(np.prod(mesh_shape))])
    with rules.axis_rules(build.rules_from_config(config)):
        state, setup = state_lib.init_train_state(
            config, VOCAB, mesh, np.full(80, -5.0), np.full(80, 3.0)
        )
        searcher = search.Searcher(
            config, types.SimpleNamespace(blank_id=0, vocab_size=VOCAB), setup.spec.graphdef
        )
        decode = search.make_decode_fn(setup.spec.graphdef, config, 0)
        audio, lengths = _audio()
        with jax.set_mesh(mesh):
            hyps = searcher.bind(state.params, state.model_vars, with_frames=with_frames)
            arrays = mesh_lib.host_to_global(mesh, {"audio": audio, "audio_len": lengths})
            out = decode(state.params, state.model_vars, arrays["audio"], arrays["audio_len"])
            out = {k: mesh_lib.to_host_local(mesh, v) for k, v in out.items()}
        return hyps(out)


@pytest.mark.parametrize("method,with_frames", [("aed_beam", True), ("aed_rescore", False)])
def test_attention_decoding_on_8_devices_equals_1_device(method, with_frames):
    one = _decode((1, 1, 1, 1), method, with_frames)
    eight = _decode((1, 2, 2, 2), method, with_frames)
    assert one == eight
    labels = [h[0] if with_frames else h for h in one]
    assert any(labels)  # an untrained model still emits labels: the comparison means something
    if with_frames:  # CTC alignment times: one per label, non-decreasing
        assert all(len(f) == len(y) and f == sorted(f) for y, f in one)


def test_each_head_resolves_auto_and_refuses_what_it_cannot_run():
    config = _aed_config()
    assert search.decoding_method(config) == "ctc_greedy"  # cheap, for in-loop evaluation
    config.decoding.lm_path = __file__
    assert search.decoding_method(config) == "ctc_beam"
    assert search.uses_lm(config)
    config.decoding.method = "aed_beam"
    assert search.uses_lm(config)  # LM fusion in the attention beam too
    config.decoding.method = "rnnt_greedy"
    with pytest.raises(ValueError, match="needs a model with that head"):
        search.decoding_method(config)
    config.model.head, config.decoding.method, config.decoding.lm_path = "aed", "auto", ""
    assert search.decoding_method(config) == "aed_beam"


@pytest.mark.parametrize(
    "key,value,line",
    [
        ("decoding.method", "ctc_greedy", "needs a model with that head"),
        ("decoding.method", "ctc_beam", "needs a model with that head"),
        ("decoding.method", "aed_rescore", "rescores a CTC n-best; model.head 'aed' has no"),
        ("decoding.ctc_weight", 0.3, "has no CTC head: set decoding.ctc_weight=0"),
    ],
)
def test_ctc_options_with_the_attention_decoder_alone_are_one_line(key, value, line):
    config = _aed_config((1, 8, 1, 1))
    config.model.head = "aed"
    assert validate.mistakes(config, devices=8) == []
    one_line(config, key, value, line)


@pytest.mark.parametrize(
    "key,value,line",
    [
        ("decoding.ctc_weight", 1.5, "decoding.ctc_weight must be -1 or in [0, 1]"),
        ("decoding.eos_threshold", -1.0, "decoding.eos_threshold must be >= 0"),
        ("decoding.max_len_ratio", -0.5, "decoding.max_len_ratio must be >= 0"),
        ("decoding.streaming", True, "reads whole utterances: set decoding.streaming=False"),
    ],
)
def test_attention_decoding_settings_out_of_range_are_one_line(key, value, line):
    config = _aed_config((1, 8, 1, 1))
    config.decoding.method = "aed_beam"
    if key == "decoding.streaming":  # a streaming encoder, so that only the method is wrong
        config.model.conformer.update(causal=True, chunk_size=4)
    assert validate.mistakes(config, devices=8) == []
    one_line(config, key, value, line)


def test_an_onnx_export_of_the_attention_decoder_alone_is_one_clear_line(tmp_path):
    config = _aed_config()
    config.model.head = "aed"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config.to_dict()))
    with pytest.raises(UserError, match="model.head=aed: the onnx export has no attention"):
        export.export_run(str(run), str(tmp_path / "out"), fmt="onnx")
    assert not (tmp_path / "out").exists()
