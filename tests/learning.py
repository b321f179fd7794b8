"""A task every recipe must learn in a few dozen steps, for the learning guards
(tests/test_learning.py): a handful of "utterances" whose labels are tones.

Label k (1..K) is a 0.12 s sine at its own frequency, labels are separated by 40 ms of
silence, and a little noise covers everything. A model that learns alignments transcribes
the training utterances within ~40 steps; one whose encoder stopped carrying the audio
(the blank plateau) stays at the labels' prior. The utterances are few and fixed, so a
transducer's predictor can memorize their label sequences without listening: the pressure
that flattened the demo's encoder when the transducer taught it before CTC had found any
alignment (jaxspeech.training.objective.transducer_encoder_scale).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from configs import demo
from jaxspeech.audio import features
from jaxspeech.config import build, keys
from jaxspeech.decoding import attention_device
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.decoding import rnnt as rnnt_decoding
from jaxspeech.metrics import wer as wer_lib
from jaxspeech.parallel import rules
from jaxspeech.training import batch as batch_lib
from jaxspeech.training import state as state_lib
from jaxspeech.training import step as step_lib

SAMPLE_RATE = 16000
TONES = 7  # labels 1..7; 0 is the blank
VOCAB = TONES + 1
TONE_S, GAP_S = 0.12, 0.04


def tone_batch(num: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """`num` utterances of 3-6 tone labels as a training batch (the loader's arrays)."""
    rng = np.random.default_rng(seed)
    tone = int(TONE_S * SAMPLE_RATE)
    gap = int(GAP_S * SAMPLE_RATE)
    lengths = rng.integers(3, 7, size=num)
    labels = np.zeros((num, 6), np.int32)
    waves = []
    t = np.arange(tone) / SAMPLE_RATE
    envelope = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.01)  # 10 ms fades: no clicks
    for i, n in enumerate(lengths):
        seq = rng.integers(1, TONES + 1, size=n)
        labels[i, :n] = seq
        parts = [np.zeros(gap)]
        for k in seq:
            parts += [0.5 * envelope * np.sin(2 * np.pi * (250.0 + 300.0 * k) * t), np.zeros(gap)]
        waves.append(np.concatenate(parts))
    samples = max(len(w) for w in waves)
    audio = np.zeros((num, samples), np.float32)
    for i, w in enumerate(waves):
        audio[i, : len(w)] = w + 0.01 * rng.standard_normal(len(w))
    return {
        "audio": audio,
        "audio_len": np.array([len(w) for w in waves], np.int32),
        "labels": labels,
        "label_len": lengths.astype(np.int32),
        "weight": np.ones(num, np.float32),
        "label_overflow": np.zeros(num, np.int32),
        "corrupt": np.zeros(num, np.int32),
    }


def guard_config(head: str = "ctc", encoder: str = "conformer", steps: int = 40):
    """configs/demo.py:tiny with `head` and `encoder`, trained `steps` steps on the tone
    batch: no augmentation (a fixed batch), a short warm-up and a peak LR of 3e-3."""
    c = demo.get_config("tiny")
    c.model.head, c.model.encoder = head, encoder
    c.specaug.enabled = False
    c.optim.peak_lr, c.optim.warmup_steps = 3e-3, 5
    c.train.num_steps = steps
    # The transducer's warm-up over the first third of the run (the demo's: 300 of 1,350).
    c.loss.rnnt_warmup_steps = steps // 3
    c.mesh.data = 1
    return c


# What a demo variant's head learns with, kept from its config by variant_guard_config:
# the head, the encoder and its context (a streaming model's chunks), and every loss
# setting but the transducer's warm-up (the guard scales that to its own steps).
HEAD_KEYS = ("model.head", "model.encoder") + tuple(
    f"model.conformer.{k}"
    for k in ("causal", "chunk_size", "left_chunks", "dynamic_chunk", "max_dynamic_chunk")
)


def head_settings(config) -> dict:
    """{dotted key: value} of `config`'s settings that the guard trains a variant with."""
    flat = keys.flat(config.to_dict())
    return {
        k: v
        for k, v in flat.items()
        if k in HEAD_KEYS or (k.startswith("loss.") and k != "loss.rnnt_warmup_steps")
    }


def variant_guard_config(variant: str, steps: int):
    """guard_config with the head settings of configs/demo.py:`variant`."""
    settings = head_settings(demo.get_config(variant))
    c = guard_config(settings["model.head"], settings["model.encoder"], steps)
    for key, value in settings.items():
        *path, name = key.split(".")
        section = c
        for part in path:
            section = section[part]
        section[name] = value
    return c


@dataclasses.dataclass
class Learned:
    """What a guard run measured: each loss part's mean over the first and last 5 steps,
    the transcripts of the training utterances by each of the model's searches
    (`decode`), and their label error rates."""

    first: dict
    last: dict
    hyps: dict  # search -> transcripts
    refs: list
    error_rates: dict  # search -> label error rate


def train(config, batch: dict, mesh=None) -> Learned:
    """Trains `config` on `batch` (every step the same rows) with the train step of
    `config.sync` on `mesh` (default: one device), then decodes the rows greedily."""
    mesh = mesh or build.mesh_from_config(config, devices=jax.devices()[:1])
    # Feature statistics of the batch itself, as data_prep computes them for a corpus.
    cfg = build.feature_config(config)
    feats = np.asarray(features.log_mel(jnp.asarray(batch["audio"]), cfg))
    frames = features.num_frames(batch["audio_len"], cfg.hop_length)
    valid = np.concatenate([f[:n] for f, n in zip(feats, frames)])
    # Built outside the mesh context (Flax would read logical axis names as mesh axes),
    # traced inside it, as the trainer does.
    with rules.axis_rules(build.rules_from_config(config)):
        state, setup = state_lib.init_train_state(
            config, VOCAB, mesh, valid.mean(0), valid.std(0) + 1e-3
        )
        shard = batch_lib.batch_shardings(mesh)
        step = step_lib.jit_train_step(setup, step_lib.setup_train_step(setup, config, 0), shard)
        arrays = {k: jax.device_put(v, shard[k]) for k, v in batch.items()}
        history = []
        with jax.set_mesh(mesh):
            for _ in range(int(config.train.num_steps)):
                state, m = step(state, arrays)
                history.append({k: float(v) for k, v in m.items() if k.startswith("loss_")})
            hyps = decode(setup, state, batch)
    refs = [list(r[:n]) for r, n in zip(batch["labels"], batch["label_len"])]
    rates = {
        k: sum(wer_lib.edit_distance(r, h) for r, h in zip(refs, v)) / sum(map(len, refs))
        for k, v in hyps.items()
    }
    mean = lambda rows: {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}  # noqa: E731
    return Learned(mean(history[:5]), mean(history[-5:]), hyps, refs, rates)


def decode(
    setup: state_lib.TrainSetup, state: state_lib.TrainState, batch: dict
) -> dict[str, list[list[int]]]:
    """Transcripts of the batch's rows by the run's model (the learners' mean under
    gossip), per search: RNN-T greedy with a transducer, CTC greedy with a CTC head, and
    with an attention decoder its beam search (joint with CTC where there is CTC) and,
    with CTC, attention rescoring (beam 4, the defaults of config.decoding)."""
    from flax import nnx

    params = setup.model_params(state)
    model = nnx.merge(setup.spec.graphdef, params, state.model_vars)
    enc, lengths = model(jnp.asarray(batch["audio"]), jnp.asarray(batch["audio_len"]))
    out = {}
    if model.transducer is not None:
        pred_init, pred_step, joint = model.transducer.decoder_fns()
        tokens, num = rnnt_decoding.rnnt_greedy(
            model.transducer.joiner.enc_proj(enc), lengths, pred_init, pred_step, joint, blank_id=0
        )[:2]
        out["rnnt_greedy"] = rnnt_decoding.to_lists(tokens, num)
    if model.ctc is not None:
        ids = ctc_decoding.greedy_ids(model.ctc_logits(enc))
        out["ctc_greedy"] = [y for y, _ in ctc_decoding.collapse_with_frames(ids, lengths, 0)]
    if model.decoder is not None:
        host = {"enc": np.asarray(enc, np.float32), "lengths": np.asarray(lengths)}
        if model.ctc is not None:
            host["logprobs"] = np.asarray(jax.nn.log_softmax(model.ctc_logits(enc)))
        device = attention_device.DecoderOnDevice(setup.spec.graphdef, params, state.model_vars)
        opts = attention_device.options_from_config(default_decoding(), model.ctc is not None)
        methods = ("aed_beam", "aed_rescore") if model.ctc is not None else ("aed_beam",)
        for method in methods:
            search = attention_device.AttentionSearch(
                method, device, opts, blank_id=0, fusion=None, with_frames=False
            )
            out[method] = search(host)
    return out


def default_decoding():
    """config.decoding at its defaults."""
    from jaxspeech.config import defaults

    return defaults.get_config().decoding
