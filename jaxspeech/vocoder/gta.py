"""A synthesizer's ground-truth-aligned frames as the vocoder's training input
(`config.vocoder.gta_mels`): the frame store `python -m jaxspeech.synthesize --workdir
TTS_RUN --gta_split train --output FILE.npz` writes (`jaxspeech.tts.gta`), opened and
checked against the run before any step.

A vocoder trained on the recordings' own log-mel has never seen FastSpeech2's smoother
frames; one trained on the synthesizer's teacher-forced frames of the same recordings
learns to turn exactly those into the real waveform (Tacotron 2's WaveNet, HiFi-GAN's
fine-tuning). It then fits that synthesizer: the run's summary names the store.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile

from ml_collections import ConfigDict

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.common.errors import UserError
from jaxspeech.data.frame_store import GTA_LOG_MEL as KIND
from jaxspeech.data.frame_store import FrameStore


def open_gta_mels(config: ConfigDict, cfg: LogMelConfig) -> FrameStore:
    """config.vocoder.gta_mels, opened and checked: a frame store of ground-truth-aligned
    log-mel of config.data.train_split made with the front end `cfg`.

    Raises:
      UserError: no such file, not a GTA frame store, another split or front end.
    """
    path = str(config.vocoder.gta_mels)
    where = f"vocoder.gta_mels={path}"
    if not os.path.isfile(path):
        raise UserError(
            f"{where}: no such file; write it with `python -m jaxspeech.synthesize "
            f"--workdir TTS_RUN --gta_split {config.data.train_split} --output {path}`"
        )
    store = FrameStore(path)
    try:
        manifest = store.manifest
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise UserError(f"{where}: not a frame store of jaxspeech.synthesize ({e})") from e
    if manifest.get("kind") != KIND:
        raise UserError(f"{where}: holds {manifest.get('kind')!r}, not {KIND!r} frames")
    if manifest.get("split") != config.data.train_split:
        raise UserError(
            f"{where}: frames of split {manifest.get('split')!r}, but the vocoder trains on "
            f"data.train_split={config.data.train_split!r}"
        )
    ours = dataclasses.asdict(cfg)
    if manifest.get("features") != ours:
        differ = sorted(k for k in ours if (manifest.get("features") or {}).get(k) != ours[k])
        raise UserError(
            f"{where}: made with another front end than config.features (differs in "
            f"{', '.join(differ)}): the vocoder would learn frames it never sees"
        )
    return store


def coverage(store: FrameStore, num_records: int) -> str:
    """One line: which train utterances have frames in `store` (of `num_records`), those
    the synthesizer left out and why, and what the others use.

    Raises:
      UserError: the store was made from a split of another size (other data).
    """
    m = store.manifest
    if int(m["split_records"]) != num_records:
        raise UserError(
            f"vocoder.gta_mels={store.path}: made from {m['split_records']} records of "
            f"{m['data_dir']}/{m['split']}, but this split has {num_records}: other data"
        )
    skipped = m.get("skipped") or []
    why = f" ({len(skipped)} left out there: {skipped[0]['reason']}, ...)" if skipped else ""
    return (
        f"vocoder input: {m['utterances']} of {num_records} utterances as {m['tts_workdir']} "
        f"(step {m['step']}) predicts them, teacher-forced{why}; the others' own log-mel"
    )
