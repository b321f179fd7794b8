"""The training input pipeline from a config: bucket shapes that fit the mesh, host-side
waveform augmentation, and the per-process Grain loader.

The loader itself (`jaxspeech.data.pipeline`) and the augmenter
(`jaxspeech.audio.augment`) take explicit arguments; this module reads the config for
them and turns its mistakes into `UserError`s.
"""

from __future__ import annotations

import json
import os

from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.audio import augment
from jaxspeech.common import storage
from jaxspeech.common.errors import UserError
from jaxspeech.config import build, defaults
from jaxspeech.data import mixing
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import reader as reader_lib


def read_noise_list(path: str) -> tuple[str, ...]:
    """Noise files from JSON lines {"audio_filepath": ...} or one path per line; relative
    paths are relative to the list's directory.

    Raises:
      UserError: a missing list, a malformed line (named by its number), or no files.
    """
    if not os.path.isfile(path):
        raise UserError(f"noise manifest not found: {path}")
    base, files = os.path.dirname(os.path.abspath(path)), []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    line = json.loads(line)["audio_filepath"]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise UserError(f"{path}:{line_no}: not a {{audio_filepath}} line") from e
            files.append(os.path.join(base, line))
    if not files:
        raise UserError(f"noise manifest {path} lists no files")
    return tuple(files)


def waveform_augmenter(config: ConfigDict) -> augment.WaveformAugmenter | None:
    """The loader's host-side augmentation from ``config.waveform_aug`` (None: all off)."""
    w = config.waveform_aug
    try:
        cfg = augment.WaveformAugmentConfig(
            speeds=tuple(w.speeds),
            noise_prob=w.noise_prob,
            snr_db=tuple(w.snr_db),
            noise_files=read_noise_list(w.noise_manifest) if w.noise_manifest else (),
            noise_exponents=tuple(w.noise_exponents),
            reverb_prob=w.reverb_prob,
            num_rirs=w.num_rirs,
            rt60=tuple(w.rt60),
            seed=config.seed,
        )
        return augment.WaveformAugmenter(cfg, config.features.sample_rate) if cfg.enabled else None
    except ValueError as e:  # A bad value, or a noise file that does not exist.
        raise UserError(f"config.waveform_aug: {e}") from e


def train_pipeline(
    config: ConfigDict, mesh: Mesh, tokenizer_dir: str, extra: mixing.Extra | None = None
) -> tuple[pipeline_lib.Pipeline, augment.WaveformAugmenter | None]:
    """This process's training loader over `config.data` and its augmenter (or None).

    With `config.distill.other_split`, the labeled split and that one mixed by
    `config.distill.schedule` (`jaxspeech.data.mixing`); `extra` adds the arrays both
    streams carry (a teacher's targets).
    """
    spec = build.train_bucket_spec(config, mesh)
    augmenter = waveform_augmenter(config)
    labeled = _split_pipeline(
        config,
        config.data.dir,
        config.data.train_split,
        spec,
        augmenter,
        tokenizer_dir,
        short_first=True,
    )
    if not defaults.lookup(config, "distill.other_split"):  # off (or a run from before it)
        return labeled, augmenter
    distill = config.distill
    other_dir = distill.other_dir or config.data.dir
    _check_same_tokenizer(other_dir, tokenizer_dir)
    # A teacher's targets are frame-aligned with the audio as stored: speed perturbation
    # would change the frame count (noise and reverberation keep it).
    other = _split_pipeline(
        config,
        other_dir,
        distill.other_split,
        spec,
        augmenter,
        tokenizer_dir,
        speed=not distill.targets,
    )
    try:
        phases = mixing.parse_schedule(distill.schedule, int(config.train.num_steps))
    except ValueError as e:
        raise UserError(f"config.distill.schedule: {e}") from e
    pipe = mixing.MixedPipeline(
        plan=mixing.MixedPlan(labeled.plan, other.plan, phases),
        load=mixing.MixedLoad(labeled.load, other.load, extra),
        index=labeled.index,
        num_workers=labeled.num_workers,
        prefetch=labeled.prefetch,
        parts=(labeled, other),
        schedule=distill.schedule,
    )
    return pipe, augmenter


def _check_same_tokenizer(data_dir: str, tokenizer_dir: str) -> None:
    """The other stream's corpus must share the run's tokenizer (its labels and the
    teacher's token indices are read with it)."""
    from jaxspeech.data.tokenizer import Tokenizer

    path = os.path.join(storage.local_data(data_dir, "tokenizer"), "tokenizer")
    if not os.path.isdir(path):
        raise UserError(
            f"config.distill.other_dir={data_dir!r} has no tokenizer/: not a prepared corpus"
        )
    if Tokenizer.load(path).vocab_size != Tokenizer.load(tokenizer_dir).vocab_size:
        raise UserError(
            f"the tokenizer in {path} differs from this run's ({tokenizer_dir}): the other "
            "stream must be prepared with the same tokenizer"
        )


def _split_pipeline(
    config, data_dir, split, spec, augmenter, tokenizer_dir, *, speed=True, short_first=False
):
    """One split's training pipeline (shuffled, epoch-repeated) for this process;
    speed=False: no speed perturbation (the other waveform augmentations stay);
    short_first: with config.data's short-first phase (the labeled split's curriculum)."""
    try:
        return pipeline_lib.make_pipeline(
            data_dir=data_dir,
            split=split,
            tokenizer_dir=tokenizer_dir,
            spec=spec,
            **build.loader_settings(config, train=True),
            speeds=augmenter.cfg.speeds if augmenter and speed else (1.0,),
            augment=augmenter,
            # A run from before the key: augmentation from the start, as it was then.
            augment_from_epoch=int(defaults.lookup(config, "waveform_aug.start_epoch")),
            short_first_steps=int(defaults.lookup(config, "data.short_first_steps"))
            if short_first
            else 0,
            short_first_seconds=float(defaults.lookup(config, "data.short_first_seconds")),
            with_text=bool(config.monitor.log_batch_ids),
        )
    except (FileNotFoundError, reader_lib.ShardError) as e:
        raise UserError(str(e)) from e
    except ValueError as e:  # settings that do not fit the split (its rate, its durations)
        raise UserError(f"{data_dir}/{split}: {e}") from e
