"""An item's audio: ``Item.audio_path`` dispatched to its loader (a file, a ``pipe:``
command, a ``tfds:<index>`` record), decoded and cut to the item's segment."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from apache_beam.io.filesystems import FileSystems

from data_prep.readers.common import (
    CHANNEL_OUT_OF_RANGE,
    MISSING_AUDIO,
    SEGMENT_OUT_OF_RANGE,
    TOO_LONG_AUDIO,
    UNDECODABLE_AUDIO,
    AudioError,
    Item,
)
from data_prep.readers.hf import HF_PREFIX, load_row_audio
from data_prep.readers.kaldi import PIPE_NOT_ALLOWED, load_pipe_audio
from data_prep.readers.pipes import PIPE_NOT_IN_FORMAT, PIPE_PREFIX
from data_prep.readers.textfiles import is_remote
from data_prep.readers.tfds import TFDS_PREFIX, load_tfds_audio, tfds_source
from data_prep.readers.webdataset import WDS_PREFIX, load_member_audio


def load_item_audio(item: Item, cfg: Any) -> tuple[np.ndarray, int]:
    """An item's audio as ((N, C) float32, sample_rate), cut to its segment, with the
    columns ``item.channels`` names (all without).

    Raises:
      AudioError: see _load_segment; CHANNEL_OUT_OF_RANGE for a column the audio lacks.
    """
    audio, rate = _load_segment(item, cfg)
    if item.channels is None:
        return audio, rate
    if max(item.channels) >= audio.shape[1] or min(item.channels) < 0:
        raise AudioError(
            CHANNEL_OUT_OF_RANGE, f"channels {item.channels} of audio with {audio.shape[1]}"
        )
    return audio[:, list(item.channels)], rate


def _load_segment(item: Item, cfg: Any) -> tuple[np.ndarray, int]:
    """An item's audio as ((N, C) float32, sample_rate), cut to its segment.

    ``pipe:`` runs the command (without a shell) only when the reader marked it as one its
    format defines (``item.pipe``) and ``cfg.allow_pipes`` (whatever the reader did);
    ``tfds:<index>`` reads the record from the dataset ``cfg`` names; ``wds:`` a member of
    a WebDataset shard; ``hf:`` a row of a Hugging Face dataset file; anything else is a
    file.

    Raises:
      AudioError: with the skip reason (missing, undecodable, pipe_not_in_format,
        pipe_not_allowed, pipe_shell_syntax, pipe_failed...).
    """
    source = item.audio_path
    if source.startswith(PIPE_PREFIX):
        if not item.pipe:  # a manifest's "pipe:..." path: data, not a command
            raise AudioError(
                PIPE_NOT_IN_FORMAT,
                f"{source!r}: only Kaldi wav.scp and Lhotse command sources run commands",
            )
        if not getattr(cfg, "allow_pipes", False):
            raise AudioError(PIPE_NOT_ALLOWED, f"{source!r} needs --allow_pipes")
        audio, rate = load_pipe_audio(source[len(PIPE_PREFIX) :])
    elif source.startswith(TFDS_PREFIX):
        try:
            index = int(source[len(TFDS_PREFIX) :])
        except ValueError as e:
            raise AudioError(MISSING_AUDIO, f"bad TFDS reference {source!r}") from e
        audio, rate = load_tfds_audio(index, tfds_source(cfg))
    elif source.startswith((WDS_PREFIX, HF_PREFIX)):
        try:
            if source.startswith(WDS_PREFIX):
                audio, rate = load_member_audio(source[len(WDS_PREFIX) :])
            else:
                audio, rate = load_row_audio(source[len(HF_PREFIX) :], cfg.hf_audio_column)
        except AudioError:
            raise
        except Exception as e:  # libsndfile raises several types for undecodable input.
            raise AudioError(UNDECODABLE_AUDIO, str(e)) from e
    else:
        try:
            if (item.start != 0.0 or item.end is not None) and not is_remote(source):
                return load_file_segment(source, item.start, item.end)
            whole = item.start == 0.0 and item.end is None  # a segment may be short
            limit = getattr(cfg, "max_duration", None) if whole else None
            audio, rate = load_audio_file(source, limit)
        except AudioError:
            raise
        except FileNotFoundError as e:
            raise AudioError(MISSING_AUDIO, str(e)) from e
        except Exception as e:  # libsndfile raises several types for undecodable input.
            raise AudioError(UNDECODABLE_AUDIO, str(e)) from e
    return cut_segment(audio, rate, item.start, item.end), rate


def load_audio_file(path: str, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Reads any libsndfile format as ((N, C) float32, sample_rate); a local file longer
    than `max_seconds` by its header is refused before it is read (an hour-long file
    decoded whole only to be skipped would take GBs).

    Raises:
      FileNotFoundError: no such file.
      AudioError(TOO_LONG_AUDIO): longer than `max_seconds`.
      Exception: anything libsndfile cannot decode.
    """
    import soundfile as sf

    if is_remote(path):
        if not FileSystems.exists(path):
            raise FileNotFoundError(path)
        import io

        with FileSystems.open(path, compression_type="uncompressed") as f:
            source: Any = io.BytesIO(f.read())
    else:
        if not os.path.isfile(path):
            raise FileNotFoundError(path)
        source = path
        seconds = sf.info(path).duration if max_seconds is not None else 0.0
        if max_seconds is not None and seconds > max_seconds:
            raise AudioError(TOO_LONG_AUDIO, f"{seconds:.1f} s by its header: over {max_seconds} s")
    audio, sample_rate = sf.read(source, dtype="float32", always_2d=True)
    return audio, int(sample_rate)


def load_file_segment(path: str, start: float, end: float | None) -> tuple[np.ndarray, int]:
    """A segment of a local file, read by seeking: ((N, C) float32, sample_rate), the same
    samples as ``cut_segment`` of the whole file.

    Kaldi segments cut many utterances out of long recordings (an hour, hundreds of segments):
    decoding the whole recording for each would cost hundreds of times its size. Formats
    libsndfile cannot seek in are decoded whole and cut.

    Raises:
      FileNotFoundError: no such file.
      AudioError(SEGMENT_OUT_OF_RANGE): see cut_segment.
      Exception: anything libsndfile cannot decode.
    """
    import soundfile as sf

    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    with sf.SoundFile(path) as f:
        rate = int(f.samplerate)
        if not f.seekable():
            audio = f.read(dtype="float32", always_2d=True)
            return cut_segment(audio, rate, start, end), rate
        first, last = segment_bounds(f.frames, rate, start, end)
        f.seek(first)
        return f.read(last - first, dtype="float32", always_2d=True), rate


def segment_bounds(n: int, rate: int, start: float, end: float | None) -> tuple[int, int]:
    """Sample range [first, last) of segment [start, end) seconds within n samples.

    Raises:
      AudioError(SEGMENT_OUT_OF_RANGE): the segment starts after the audio ends, or ends
        more than one frame (10 ms) past it (Kaldi's own tolerance for rounded times).
    """
    first = int(round(start * rate))
    last = n if end is None else int(round(end * rate))
    if first >= n or last > n + int(0.01 * rate) or last <= first:
        raise AudioError(
            SEGMENT_OUT_OF_RANGE,
            f"segment [{start}, {end}] s outside audio of {n / rate:.3f} s",
        )
    return first, min(last, n)


def cut_segment(audio: np.ndarray, rate: int, start: float, end: float | None) -> np.ndarray:
    """Samples [round(start * rate), round(end * rate)) of (N, C) audio.

    Raises:
      AudioError(SEGMENT_OUT_OF_RANGE): see segment_bounds.
    """
    if start == 0.0 and end is None:
        return audio
    first, last = segment_bounds(audio.shape[0], rate, start, end)
    return audio[first:last]
