r"""The neural vocoder (`config.task = "vocoder"`): a generator trained by the same trainer as
the recognizers and the synthesizer against HiFi-GAN's discriminators, on the demo corpus's
audio, on CPU. It inverts the recognizer's own log-mel (config.features), the features
FastSpeech2 (configs/tts.py) predicts, so `python -m jaxspeech.evaluate --workdir TTS_RUN
--vocoder_workdir VOCODER_RUN` scores the synthesizer's speech through it beside
Griffin-Lim.

Run: `make demo-tts` (after the synthesizer, this config into runs/demo-vocoder), or
  python -m jaxspeech.train --config configs/vocoder.py --workdir runs/vocoder

Variants (`--config configs/vocoder.py:NAME`):
  (default) Vocos (jaxspeech/vocoder/vocos.py: ConvNeXt at the frame rate, magnitude and
            phase, inverse STFT; vocos.DEMO_GENERATOR's 0.76 M parameters), 3,000 steps of
            8 segments of the mel L1 alone (the generator's pass only) at 4e-3 on a cosine:
            about 4.5 minutes on the 2-core VM. `make demo-tts` gives it the synthesizer's
            teacher-forced frames of half the train split (`--config.vocoder.gta_mels`);
            through the synthesizer on tts_heldout it is measured beside Griffin-Lim in
            docs/results/tts.md. The discriminators are built and rest:
            `--config.train.num_steps` past 3,000 trains adversarially from there.
            `--config.vocoder.vocos_mel_prior=True`: the magnitude as a residual over the
            mel's pseudo-inverse (FreeV): copy synthesis of held-out recordings fits far
            better (log-mel L1 0.38 against 0.65 after 1,000 steps), yet through the
            synthesizer it scored no better (docs/results/tts.md, "A magnitude prior").
  hifigan   HiFi-GAN's demo (hifigan.DEMO_GENERATOR, 0.23 M parameters) and the small
            discriminators (DEMO_DISCRIMINATOR, 0.33 M), 120 steps of 4 segments of 8192
            samples at 1e-3, adversarial from the start: 2.7 minutes on a quiet machine,
            log-mel L1 3.6 -> 2.4, not speech yet (HiFi-GAN trains for hundreds of
            thousands of steps, every layer at the sample rate: keep it for accelerators).
  tiny      a seconds-long Vocos for tests (tests/tts/test_vocoder_training.py): 10 mel-only
            steps, then 10 adversarial ones; its mel L1 falls, nothing more.

Every measured figure, with command, commit and device: docs/results/tts.md.
"""

from ml_collections import ConfigDict

from jaxspeech.config import defaults

VARIANTS = ("default", "hifigan", "tiny")


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
    c.vocoder.discriminator = "demo"
    c.vocoder.eval_utterances = 4
    c.train.checkpoint_every = 0  # saved at the end (and on SIGTERM, and every 10 min)
    c.monitor.samples_every = 0  # the final evaluation writes the comparison
    # HiFi-GAN's demo (hifigan.DEMO_GENERATOR, 0.23 M parameters). A few minutes of CPU:
    # more, smaller steps. At HiFi-GAN's 2e-4 the near-silent initial generator did not
    # move in 10 steps (log-mel L1 5.16 -> 5.19, batch 8); at 1e-3 it fell to 4.5 over
    # steps 1-10 and 3.0 over steps 11-20 (4 segments a step). Measured on a quiet machine
    # (2026-11-27, docs/results/tts.md): 1.05 s a step, 24 s of compilation, 2.7 min for the
    # 120 steps with the final evaluation; the evaluation of both vocoders after it 3.6 min;
    # log-mel L1 3.6 -> 2.4: not speech yet.
    c.vocoder.generator = "hifigan"
    c.vocoder.generator_channels = 64
    c.vocoder.batch_size = 4
    c.optim.peak_lr = c.optim2.peak_lr = 1e-3  # the generator's and the discriminators'
    c.train.num_steps = 120
    c.train.log_every = 25
    if variant != "hifigan":
        # Vocos (jaxspeech/vocoder/vocos.py): ConvNeXt at the frame rate and an inverse
        # STFT, 0.76 M parameters. A step of the mel L1 alone takes 70 ms for 8 segments
        # on a quiet 2-core VM; one with the demo discriminators took 4.7 s for 4 (loaded),
        # so the demo's minutes are all of the mel L1 (vocoder.adversarial_start = the
        # steps). At 2,000 steps a cosine from 4e-3 fitted better than 2e-3 on HiFi-GAN's
        # near-constant exponential decay: tts_heldout log-mel L1 0.547 against 0.598, and
        # through the synthesizer DNSMOS OVRL 2.92 against 2.87 (Griffin-Lim 2.89), CER
        # 18.4% against 18.8% (Griffin-Lim 18.1%). 3,000 steps: 0.495, yet the same CER.
        # 2e-3 or 8e-3 on the cosine, a linear-STFT magnitude loss, a consistency loss on
        # the predicted spectrum or 16 segments a step fitted no better (2026-11-29,
        # docs/results/tts.md, "Vocos"). With the synthesizer's teacher-forced frames of
        # half the train utterances (make demo-tts), 3,000 steps, through the synthesizer
        # of 2026-11-29: CER 16.50%, DNSMOS OVRL 2.97 (Griffin-Lim 16.52%, 2.87); through
        # 2026-11-30's (two frames a decoder position): 14.99%, 2.87 (14.82%, 2.70); 2,500
        # steps behind a synthesizer of 1,000 steps: 18.1%, 2.84 (Griffin-Lim 17.8%, 2.86)
        # ("The synthesizer's step"; before it, "Ground-truth-aligned frames").
        c.vocoder.generator = "vocos"
        c.vocoder.vocos_dim = 128  # vocos.DEMO_GENERATOR
        c.vocoder.vocos_intermediate_dim = 384
        c.vocoder.vocos_layers = 6
        c.vocoder.batch_size = 8
        c.optim.peak_lr = 4e-3
        c.optim.decay = "cosine"  # to optim.end_lr_ratio of the peak at the last step
        c.train.num_steps = 3000
        c.vocoder.adversarial_start = 3000
        c.train.log_every = 250
    if variant == "tiny":
        c.data.eval_split = "dev"
        c.data.eval_bucket_boundaries = (2.0,)
        c.vocoder.segment_samples = 1600
        c.vocoder.batch_size = 4
        c.optim.peak_lr = c.optim2.peak_lr = 2e-3
        c.optim.decay = "exponential"
        c.vocoder.vocos_dim = 16
        c.vocoder.vocos_intermediate_dim = 32
        c.vocoder.vocos_layers = 2
        c.vocoder.vocos_mel_prior = True  # the tests' training and export cover the prior
        c.vocoder.discriminator = "tiny"
        c.vocoder.eval_utterances = 2
        c.vocoder.adversarial_start = 10  # both kinds of step, and resuming across them
        c.train.num_steps = 20
        c.train.log_every = 5
        c.train.checkpoint_every = 10
        c.monitor.samples_every = 20  # once, at the end
    return c
