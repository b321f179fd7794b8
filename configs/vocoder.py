r"""The neural vocoder: HiFi-GAN trained by the same trainer as the recognizers and the
synthesizer (`config.task = "vocoder"`), on the demo corpus's audio, on CPU. It inverts
the recognizer's own log-mel (config.features), the features FastSpeech2
(configs/tts.py) predicts, so `python -m jaxspeech.evaluate --workdir TTS_RUN
--vocoder_workdir VOCODER_RUN` scores the synthesizer's speech through it beside
Griffin-Lim.

Run: `make demo-tts` (after the synthesizer, this config into runs/demo-vocoder), or
  python -m jaxspeech.train --config configs/vocoder.py --workdir runs/vocoder

Variants (`--config configs/vocoder.py:NAME`):
  (default) the demo's size: a 64-channel generator (hifigan.DEMO_GENERATOR, 0.23 M
            parameters) and the small discriminators (DEMO_DISCRIMINATOR, 0.33 M), 8192-
            sample segments, 120 steps at 1e-3: 2.7 minutes of 2 CPU cores, far too
            few steps for clean speech (HiFi-GAN trains for hundreds of thousands): the
            demo shows the pipeline, not the quality.
  tiny      a seconds-long model for tests (tests/tts/test_vocoder_training.py): its mel
            L1 falls, nothing more.

Expected: log-mel L1 about 3.6 -> 2.4 over the 120 steps, not speech yet. Every measured
figure, with command, commit and device: docs/results/tts.md.
"""

from ml_collections import ConfigDict

from jaxspeech.config import defaults

VARIANTS = ("default", "tiny")


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "default"
    if variant not in VARIANTS:
        raise ValueError(f"unknown configs/vocoder.py variant {variant!r}: use one of {VARIANTS}")
    # The vocoder's keys (the shared sections, config.vocoder and its discriminators'
    # optimizer config.optim2), their defaults and why; what it changes:
    c = defaults.get_config(task="vocoder")
    c.data.dir = "data/demo/shards"  # written by `python -m data_prep.prepare`
    c.data.eval_split = "tts_heldout"  # the synthesizer's evaluation split (configs/tts.py)
    c.data.eval_bucket_boundaries = (3.0, 6.5)  # two compilations of the scoring pass
    c.vocoder.generator_channels = 64  # hifigan.DEMO_GENERATOR
    c.vocoder.discriminator = "demo"
    # A few minutes of CPU: more, smaller steps. At HiFi-GAN's 2e-4 the near-silent
    # initial generator did not move in 10 steps (log-mel L1 5.16 -> 5.19, batch 8); at
    # 1e-3 it fell to 4.5 over steps 1-10 and 3.0 over steps 11-20 (4 segments a step).
    c.vocoder.batch_size = 4
    c.optim.peak_lr = c.optim2.peak_lr = 1e-3  # the generator's and the discriminators'
    c.vocoder.eval_utterances = 4
    # `make demo-tts` gives the vocoder a few of its 30 minutes on 2 CPU cores. Measured on
    # a quiet machine (2026-11-27, docs/results/tts.md): 1.05 s a step of 4 segments, 24 s of
    # compilation, 2.7 min for the 120 steps with the final evaluation; the evaluation of
    # both vocoders after it 3.6 min. Log-mel L1 3.6 -> 2.4 in these steps: not speech yet.
    c.train.num_steps = 120
    c.train.log_every = 25
    c.train.checkpoint_every = 0  # saved at the end (and on SIGTERM, and every 10 min)
    c.monitor.samples_every = 0  # the final evaluation writes the comparison
    if variant == "tiny":
        c.data.eval_split = "dev"
        c.data.eval_bucket_boundaries = (2.0,)
        c.vocoder.segment_samples = 1600
        c.vocoder.batch_size = 4
        c.vocoder.generator_channels = 16
        c.vocoder.resblocks = 1
        c.vocoder.discriminator = "tiny"
        c.optim.peak_lr = c.optim2.peak_lr = 2e-3
        c.vocoder.eval_utterances = 2
        c.train.num_steps = 20
        c.train.log_every = 5
        c.train.checkpoint_every = 10
        c.monitor.samples_every = 20  # once, at the end
    return c
