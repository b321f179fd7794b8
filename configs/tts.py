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
            of the recognizer's front end; 1350 steps, about 20 minutes on 2 CPU
            cores (`make demo-tts`).
  tiny      a seconds-long model for tests (tests/tts/test_tts_training.py); quality is not a
            goal, learning is (its mel loss falls, its durations fit).

Expected (`make demo-tts`, 2 CPU cores): `make demo`'s recognizer reads the Griffin-Lim
speech of tts_heldout at about 18% CER, the recordings at about 12% (ratio ~1.5, goal
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
    # Training within ~20 minutes on 2 CPU cores: 0.77 s a step once compiled (1.31 steps/s,
    # 7 logging windows of 5 steps of this config on a 0.2 h demo corpus), plus ~135 s of
    # start-up, 6 step compilations (88 s), samples and the final evaluation (~10 s):
    # (1200 - 135) / 0.77 = 1383 steps, rounded down.
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
