"""The synthesizer's training step: attention positions, dropout and the decoder's
reduction factor, side by side.

`python benchmarks/tts_step.py [--quick]` times the gradient of FastSpeech2's training
objective (`jaxspeech.tts.objective.make_tts_grads_fn`: the targets from the waveform, the
teacher-forced forward, the losses, the backward) at configs/tts.py's model size, for
each combination of `tts.model.pos_enc` ("rel", "rope") and `tts.model.dropout` (0.1,
0) at one frame a decoder position, and for rotary positions without dropout at two
(`tts.model.reduction` 2, configs/tts.py's), on synthetic batches of the demo's largest and
middle bucket shapes. The variants are timed in interleaved rounds (one call of each per
round), so a machine whose speed drifts during the run (a shared VM) slows them alike;
each figure is the median over the rounds.
Prints a table and writes `benchmarks/results/tts_step.json`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import jax
import numpy as np
from flax import nnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` and `configs` from this checkout
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results, timing  # noqa: E402
from configs import tts as tts_config  # noqa: E402
from jaxspeech.config import build  # noqa: E402
from jaxspeech.tts.loading import model_arguments  # noqa: E402
from jaxspeech.tts.model import FastSpeech2  # noqa: E402
from jaxspeech.tts.objective import make_tts_grads_fn  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
PHONEMES, SPEAKERS = 140, 48  # the demo corpus's tables
# (rows, seconds, phonemes): the demo's largest bucket and a middle one (configs/tts.py's
# buckets at data.batch_seconds; the phonemes at its data.max_tokens_per_second).
SHAPES = [(14, 4.5, 135), (23, 2.75, 83)]
# (pos_enc, dropout, reduction)
VARIANTS = [(p, d, 1) for p, d in itertools.product(("rel", "rope"), (0.1, 0.0))]
VARIANTS.append(("rope", 0.0, 2))


def synthetic_batch(rows: int, seconds: float, phonemes: int, hop: int, seed: int = 0) -> dict:
    """A full batch of noise waveforms with `phonemes` phonemes of equal duration each
    (their frames adding up to the front end's 1 + S // hop), random speakers and a
    voiced F0 contour: the shapes and masks of a real one, nothing to skip."""
    rng = np.random.default_rng(seed)
    samples = int(seconds * 16000)
    frames = 1 + samples // hop
    durations = np.full((rows, phonemes), frames // phonemes, np.int32)
    durations[:, -1] += frames - durations.sum(1)
    return {
        "audio": (0.1 * rng.standard_normal((rows, samples))).astype(np.float32),
        "audio_len": np.full((rows,), samples, np.int32),
        "tokens": rng.integers(1, PHONEMES, (rows, phonemes)).astype(np.int32),
        "token_len": np.full((rows,), phonemes, np.int32),
        "durations": durations,
        "speaker": rng.integers(0, SPEAKERS, (rows,)).astype(np.int32),
        "pitch": rng.uniform(90.0, 220.0, (rows, frames)).astype(np.float32),
        "weight": np.ones((rows,), np.float32),
        "label_overflow": np.zeros((rows,), bool),
        "corrupt": np.zeros((rows,), bool),
    }


def step_fn(pos_enc: str, dropout: float, reduction: int):
    """(jitted (params, model_vars, batch, key) -> gradients, params, model_vars)."""
    config = tts_config.get_config()
    config.tts.model.pos_enc, config.tts.model.dropout = pos_enc, dropout
    config.tts.model.reduction = reduction
    cfg = build.feature_config(config)
    model = FastSpeech2(**model_arguments(config, PHONEMES, SPEAKERS), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    grads = make_tts_grads_fn(graphdef, cfg, config.tts.loss)
    fn = jax.jit(lambda p, v, b, k: grads(p, v, b, k, 0)[0])
    mels = cfg.num_mel_bins
    model_vars = {
        "frontend": {"mean": np.zeros(mels, np.float32), "std": np.ones(mels, np.float32)},
        "pitch": {"mean": np.float32(np.log(125.0)), "std": np.float32(0.4)},
    }
    return fn, nnx.to_pure_dict(params), model_vars, cfg.hop_length


def run_shape(shape: tuple, rounds: int) -> dict:
    """Median seconds per variant for one batch shape, timed in interleaved rounds."""
    calls, seeds = {}, itertools.count()  # a new dropout key for every call
    for variant in VARIANTS:
        fn, params, model_vars, hop = step_fn(*variant)
        batch = synthetic_batch(*shape, hop=hop)

        def call(fn=fn, p=params, v=model_vars, b=batch) -> None:
            jax.block_until_ready(fn(p, v, b, jax.random.key(next(seeds))))

        calls[variant] = call
    times = timing.interleaved_times(calls, rounds)  # the first call of each compiles it
    return {
        "rows": shape[0],
        "seconds": shape[1],
        "phonemes": shape[2],
        "variants": [
            {
                "pos_enc": p,
                "dropout": d,
                "reduction": r,
                "median_s": round(float(np.median(times[(p, d, r)])), 4),
            }
            for p, d, r in VARIANTS
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds, the largest shape only")
    args = ap.parse_args()
    shapes, rounds = (SHAPES[:1], 3) if args.quick else (SHAPES, 8)
    rows = [run_shape(s, rounds) for s in shapes]
    print("| batch | " + " | ".join(f"{p}, dropout {d}, r {r}" for p, d, r in VARIANTS) + " |")
    print("|" + "---|" * (len(VARIANTS) + 1))
    for r in rows:
        base = r["variants"][0]["median_s"]
        cells = [f"{v['median_s']:.3f} s ({v['median_s'] / base:.2f}x)" for v in r["variants"]]
        print(f"| {r['rows']} x {r['seconds']} s | " + " | ".join(cells) + " |")
    result = {"benchmark": "tts_step", **environment.jax_host(), "rounds": rounds, "shapes": rows}
    results.save_result(os.path.join(RESULTS, "tts_step.json"), result)


if __name__ == "__main__":
    main()
