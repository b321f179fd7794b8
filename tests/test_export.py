"""jaxspeech.export's functions against the training code, in process: the StableHLO
artifacts of a CTC and a CTC+transducer model at two (B, S), one longer than every
training bucket; a greedy RNN-T search written here over the exported pieces against
`jaxspeech.decoding.rnnt.rnnt_greedy`; and reloading with jax alone in a fresh process."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import demo
from jaxspeech import export
from jaxspeech import state as state_lib
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.decoding import rnnt as rnnt_decoding

VOCAB = 12
RATE = 16000


def _model(variant: str):
    """A tiny model of configs/demo.py:tiny with `variant`'s head, seeded weights and
    non-trivial feature statistics: (graphdef, params, model_vars, config)."""
    config = demo.get_config("tiny")
    config.model.head = {"ctc": "ctc", "ctc_rnnt": "ctc+rnnt"}[variant]
    model = state_lib.make_model(config, VOCAB, 3)
    graphdef, params, model_vars = nnx.split(model, nnx.Param, ...)
    f = config.features.num_mel_bins
    rng = np.random.default_rng(0)
    stats = state_lib.feature_stats(rng.normal(-5, 1, f), rng.uniform(2, 4, f))
    return graphdef, nnx.to_pure_dict(params), stats, config


def _audio(b: int, s: int, seed: int):
    """(B, S) noise with ragged lengths (the last row full)."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(0.55 * s, s, b).astype(np.int32)
    audio = (0.1 * rng.standard_normal((b, s))).astype(np.float32)
    audio[np.arange(s)[None, :] >= lengths[:, None]] = 0.0
    return audio, lengths


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A CTC + transducer model (every exported function; compiled once for the module):
    (model parts, loaded exported functions, manifest "functions", directory)."""
    graphdef, params, stats, config = _model("ctc_rnnt")
    fns = export.inference_functions(graphdef, params, stats)
    where = tmp_path_factory.mktemp("artifact")
    described = export.export_stablehlo(fns, RATE, str(where))
    loaded = {
        name: jax.export.deserialize((where / d["file"]).read_bytes())
        for name, d in described.items()
    }
    return (graphdef, params, stats, config), loaded, described, where


# Two shapes: the second (9 s) is longer than the tiny config's largest bucket (8 s).
SHAPES = [(2, 16000, 0), (3, 9 * RATE, 1)]


@pytest.mark.parametrize("b,s,seed", SHAPES)
def test_ctc_artifact_equals_the_training_code(exported, b, s, seed):
    (graphdef, params, stats, config), loaded, described, _ = exported
    assert max(config.data.bucket_boundaries) * RATE < SHAPES[1][1]
    audio, lengths = _audio(b, s, seed)
    model = nnx.merge(graphdef, params, stats)
    enc, enc_len = model(jnp.asarray(audio), jnp.asarray(lengths), train=False)
    ref = np.asarray(jax.nn.log_softmax(model.ctc_logits(enc), -1))
    got, got_len = loaded["ctc"].call(audio, lengths)
    np.testing.assert_array_equal(got_len, enc_len)
    np.testing.assert_allclose(np.asarray(got), ref, atol=1e-4, rtol=0)
    # Greedy decoding of the artifact's output = the evaluator's greedy ids.
    ids = np.asarray(ctc_decoding.greedy_ids(model.ctc_logits(enc)))
    assert ctc_decoding.collapse(np.argmax(got, -1), got_len) == ctc_decoding.collapse(
        ids, np.asarray(enc_len)
    )
    assert described["ctc"]["inputs"] == [
        {"name": "audio", "shape": ["b", "s"], "dtype": "float32"},
        {"name": "audio_len", "shape": ["b"], "dtype": "int32"},
    ]
    assert [o["name"] for o in described["ctc"]["outputs"]] == ["log_probs", "lengths"]
    assert described["ctc"]["outputs"][0]["shape"][0] == "b"
    assert described["ctc"]["outputs"][0]["shape"][2] == str(VOCAB)


def _greedy_over_pieces(loaded, audio, lengths, blank, max_symbols):
    """RNN-T greedy search over the exported functions, one row at a time (numpy loop)."""
    enc, enc_len = (np.asarray(x) for x in loaded["encoder"].call(audio, lengths))
    out = []
    for i in range(len(audio)):
        state = loaded["predictor_init"].call(np.array([blank], np.int32))
        pred, *state = loaded["predictor_step"].call(*state, np.array([blank], np.int32))
        tokens = []
        for t in range(int(enc_len[i])):
            for _ in range(max_symbols):
                logp = np.asarray(loaded["joiner"].call(enc[i : i + 1, t], pred))
                k = int(np.argmax(logp[0]))
                if k == blank:
                    break
                tokens.append(k)
                pred, *state = loaded["predictor_step"].call(*state, np.array([k], np.int32))
        out.append(tokens)
    return out


@pytest.mark.parametrize("b,s,seed", SHAPES)
def test_transducer_pieces_equal_the_training_code(exported, b, s, seed):
    (graphdef, params, stats, config), loaded, described, _ = exported
    assert set(described) == {"ctc", "encoder", "predictor_init", "predictor_step", "joiner"}
    audio, lengths = _audio(b, s, seed)
    model = nnx.merge(graphdef, params, stats)
    enc, enc_len = model(jnp.asarray(audio), jnp.asarray(lengths), train=False)
    tr = model.transducer
    enc_proj = tr.joiner.enc_proj(enc)
    got_proj, got_len = loaded["encoder"].call(audio, lengths)
    np.testing.assert_array_equal(got_len, enc_len)
    np.testing.assert_allclose(np.asarray(got_proj), np.asarray(enc_proj), atol=1e-4, rtol=0)
    # One predictor step and the joiner on the first frame, against the model's parts.
    pred_init, pred_step, joint = tr.decoder_fns()
    tokens = jnp.arange(b, dtype=jnp.int32) + 1
    ref_pred, ref_state = pred_step(pred_init(b), tokens)
    state = loaded["predictor_init"].call(np.asarray(tokens))
    got_pred, *got_state = loaded["predictor_step"].call(*state, np.asarray(tokens))
    np.testing.assert_allclose(np.asarray(got_pred), np.asarray(ref_pred), atol=1e-5, rtol=0)
    for g, r in zip(got_state, jax.tree.leaves(ref_state), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    ref_logp = jax.nn.log_softmax(joint(enc_proj[:, 0], ref_pred), -1)
    got_logp = loaded["joiner"].call(np.asarray(got_proj)[:, 0], np.asarray(got_pred))
    np.testing.assert_allclose(np.asarray(got_logp), np.asarray(ref_logp), atol=1e-4, rtol=0)
    # The whole greedy search over the pieces = the evaluator's batched greedy search.
    blank, max_symbols = 0, int(config.decoding.max_symbols_per_frame)
    ref_tokens, ref_num = rnnt_decoding.rnnt_greedy(
        enc_proj, enc_len, pred_init, pred_step, joint, blank_id=blank,
        max_symbols_per_frame=max_symbols,
    )  # fmt: skip
    want = rnnt_decoding.to_lists(np.asarray(ref_tokens), np.asarray(ref_num))
    assert _greedy_over_pieces(loaded, audio, lengths, blank, max_symbols) == want


def test_short_audio_is_padded_to_min_samples_by_the_runtime(exported):
    """Below the manifest's min_samples the artifact refuses the shape; zero-padded to it,
    with audio_len the true length, it decodes like the training code."""
    (graphdef, params, stats, _), loaded, _, _ = exported
    min_samples = int(export.MIN_SECONDS * RATE)
    audio, _ = _audio(1, min_samples - 1, 0)
    with pytest.raises(Exception, match="refining shapes"):
        loaded["ctc"].call(audio, np.array([min_samples - 1], np.int32))
    padded = np.zeros((1, min_samples), np.float32)
    padded[0, :1000] = audio[0, :1000]
    lengths = np.array([1000], np.int32)
    got, got_len = loaded["ctc"].call(padded, lengths)
    model = nnx.merge(graphdef, params, stats)
    enc, enc_len = model(jnp.asarray(padded), jnp.asarray(lengths), train=False)
    np.testing.assert_array_equal(got_len, enc_len)
    ref = jax.nn.log_softmax(model.ctc_logits(enc), -1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-4, rtol=0)


def test_the_artifact_runs_with_jax_alone_in_a_fresh_process(exported):
    """Deserialized and run without jaxspeech (nor flax) imported: the program and the
    parameters are all in the file."""
    _, loaded, described, where = exported
    audio, lengths = _audio(2, 20000, 5)
    np.save(where / "audio.npy", audio)
    np.save(where / "lengths.npy", lengths)
    script = (
        "import sys, json, numpy as np, jax\n"
        f"d = {str(where)!r}\n"
        "exp = jax.export.deserialize(open(d + '/ctc.stablehlo', 'rb').read())\n"
        "lp, n = exp.call(np.load(d + '/audio.npy'), np.load(d + '/lengths.npy'))\n"
        "np.save(d + '/out.npy', np.asarray(lp))\n"
        "print(json.dumps(sorted(m for m in ('jaxspeech', 'flax') if m in sys.modules)))\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # one plain CPU device, as a deployment would have
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    want = np.asarray(loaded["ctc"].call(audio, lengths)[0])
    np.testing.assert_allclose(np.load(where / "out.npy"), want, atol=1e-5, rtol=0)
