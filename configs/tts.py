r"""Text-to-speech: FastSpeech2 trained by the same trainer as the recognizers
(`config.task = "tts"`), on the demo corpus's phonemes and durations, on CPU.

Run: `make demo-tts` (the demo corpus with its tts_heldout split prepared, this config
trained into runs/demo-tts, then `python -m jaxspeech.evaluate` with `make demo`'s
recognizer), or after preparing the data yourself (the demo's records carry espeak-ng's
phonemes and their ends; `python -m data_prep.prepare ... --require_phonemes` for other
corpora):
  python -m jaxspeech.train --config configs/tts.py --workdir runs/tts

The demo corpus holds its dev and test voices out (the recognizer's test of unseen
speakers), and a synthesizer speaks only its training voices: the default evaluates on
tts_heldout, the corpus's unseen sentences spoken by training speakers
(`python -m data_prep.demo.synth --tts_heldout`, two per speaker by default).

Variants (`--config configs/tts.py:NAME`):
  (default) a demo-sized FastSpeech2: 2 + 2 Conformer blocks of dim 128, 80 log-mel bins
            of the recognizer's front end, rotary positions, no dropout, the decoder over
            pairs of frames; 1,350 steps, 15.4 minutes of training on the 2-core VM of
            2026-11-30 (`make demo-tts`).
  tiny      a seconds-long model for tests (tests/tts/test_tts_training.py); quality is not a
            goal, learning is (its mel loss falls, its durations fit).

Expected (`make demo-tts`, 2 CPU cores): `make demo`'s recognizer reads the Griffin-Lim
speech of tts_heldout at about 15% CER, the recordings at about 12% (ratio ~1.3, goal
<= 2). Every measured figure, with command, commit and device: docs/results/tts.md.
"""

from ml_collections import ConfigDict

from jaxspeech.config import defaults

VARIANTS = ("default", "tiny")


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "default"
    if variant not in VARIANTS:
        raise ValueError(f"unknown configs/tts.py variant {variant!r}: use one of {VARIANTS}")
    # The synthesizer's keys (the shared sections and config.tts), their defaults and why;
    # what it changes:
    c = defaults.get_config(task="tts")
    c.data.dir = "data/demo/shards"  # written by `python -m data_prep.prepare`
    c.data.eval_split = "tts_heldout"  # dev and test voices are held out (see above)
    # The demo's utterances are 0.9-6.2 s (configs/demo.py's buckets).
    c.data.bucket_boundaries = (1.75, 2.25, 2.75, 3.5, 4.5, 6.25)
    c.data.eval_bucket_boundaries = (3.0, 6.5)  # two compilations of the scoring pass
    c.tts.model.dim = 128
    c.tts.model.encoder_layers = 2
    c.tts.model.decoder_layers = 2
    c.tts.model.variance_channels = 128
    # The step's cost on 2 cores is the decoder over the frames. Rotary positions (no
    # (B, H, T, T) position scores nor their shift) and no dropout (1,350 steps are 2.5
    # epochs: nothing to overfit yet, and the dropout masks' random bits cost a quarter of
    # the step): the gradient of the largest batch (14 x 4.5 s) takes 0.62x the time of
    # relative positions with dropout 0.1, 0.72x for a middle one (benchmarks/tts_step.py).
    # It also fits better: tts_heldout mel L1 0.235 against 0.251, Griffin-Lim's CER 16.5%
    # against 18.1% (docs/results/tts.md, "The synthesizer's step").
    c.tts.model.pos_enc = "rope"
    c.tts.model.dropout = 0.0
    # The decoder over pairs of frames (Tacotron's reduction factor r = 2; ESPnet's
    # FastSpeech2 offers it too): half the positions, a quarter of the attention scores.
    # The gradient of the largest batch takes 0.64x the time of r = 1, a middle one's 0.72x
    # (benchmarks/tts_step.py). At the same 1,350 steps it fits the frames a little worse
    # (tts_heldout mel L1 0.244 against 0.235, MCD-DTW 25.0 against 23.9 dB), yet the
    # recognizer reads its speech better: Griffin-Lim's CER 14.8% against 16.5%, Vocos's
    # 15.0% against 16.5% (docs/results/tts.md, "Two frames a decoder position").
    c.tts.model.reduction = 2
    # 1,350 steps: 15.4 minutes of training on 2026-11-30's VM (0.66 s a step on average; at one
    # frame a position 22.6 minutes on 2026-11-29's, 0.86-0.94 s a step, a VM about 12%
    # slower by benchmarks/tts_step.py). At r = 1, 1,000 steps took 17.9 and fitted worse:
    # mel L1 0.256, Griffin-Lim's CER 17.8%. A feed-forward of 2 x dim, or one decoder block for
    # 1,700 steps, took as long and fitted worse too: mel L1 0.245, 0.241 ("A smaller
    # synthesizer for the same minutes").
    c.train.num_steps = 1350
    if variant == "tiny":
        c.data.eval_split = "dev"
        c.data.bucket_boundaries = (2.0,)  # one batch shape: one compilation
        c.data.batch_seconds = 12.0
        c.tts.model.dim = 32
        c.tts.model.encoder_layers = 1
        c.tts.model.decoder_layers = 1
        c.tts.model.ff_mult = 2
        c.tts.model.conv_kernel = 3
        c.tts.model.variance_channels = 32
        c.tts.model.embed_kernel = 3
        c.tts.model.dropout = 0.0
        c.tts.mcd_utterances = 2
        c.tts.pitch_utterances = 16
        c.optim.peak_lr = 3e-3
        c.optim.warmup_steps = 5
        c.train.num_steps = 40
        c.train.log_every = 5
        c.train.checkpoint_every = 20
        c.monitor.samples_every = 40  # once, at the end: each costs a compilation
    return c
