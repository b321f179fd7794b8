"""The ``tfds`` reader: a prepared TFDS dataset stored as ``array_record``, read without
TensorFlow, and the loader of its ``tfds:<index>`` audio."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np

from data_prep.readers.common import (
    MISSING_AUDIO,
    NO_SPEAKER,
    UNDECODABLE_AUDIO,
    AudioError,
    Item,
    PrepareError,
    register_reader,
)

TFDS_RECORDS_PER_CHUNK = 1_000

TFDS_PREFIX = "tfds:"

# Skip reasons (keys of prep_report.json["skipped"]).
UNREADABLE_TFDS_RECORD = "unreadable_tfds_record"
MALFORMED_TFDS_TEXT = "malformed_tfds_text"  # A transcript that is not UTF-8.


class TfdsSource(NamedTuple):
    """A resolved ``--format tfds`` input (small and picklable: it travels to the workers)."""

    name: str
    data_dir: str | None
    split: str
    audio_key: str
    text_key: str
    id_key: str | None  # None: ids are "<split>-<index:08d>".
    speaker_key: str | None  # None: each utterance is its own speaker.
    sample_rate: int
    num_records: int


@functools.cache
def _open_tfds(name: str, data_dir: str | None, split: str) -> tuple[Any, Any]:
    """(builder, random-access data source) of a prepared TFDS split.

    Cached per process: the launcher opens it once to check it, each Beam worker once for all
    its chunks and items.

    Raises:
      PrepareError: TFDS missing, no such dataset/version/split, not prepared, not random
        access (tfrecord), or features that need TensorFlow.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise PrepareError(f"--format tfds needs tensorflow-datasets: {e}") from e
    where = f"TFDS dataset {name!r} in {data_dir or 'the default data directory'}"
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
        first_line = str(e).strip().splitlines()[0]  # The rest lists every TFDS dataset.
        raise PrepareError(f"{where} not found: {first_line}") from e
    except ImportError as e:
        # E.g. tfds.features.Audio builds a TensorFlow decoder as soon as the features are read.
        raise PrepareError(
            f"{where} cannot be opened without {e.name or 'a missing module'} ({e}); its "
            f"features (e.g. tfds.features.Audio) need TensorFlow: install it, or store the "
            f"audio as tfds.features.Tensor"
        ) from e
    if not builder.is_prepared():
        raise PrepareError(f"{where} is not prepared (no {builder.info.full_name} there)")
    try:
        data = builder.as_data_source(split)
    except NotImplementedError as e:  # tfrecord: no random access.
        raise PrepareError(
            f"{where} is not stored as array_record (or parquet), which random access needs: "
            f"{str(e).splitlines()[0]}"
        ) from e
    except (ValueError, KeyError) as e:
        splits = ", ".join(sorted(builder.info.splits.keys()))
        raise PrepareError(f"{where} has no split {split!r} ({e}); splits: {splits}") from e
    return builder, data


def _explicit(cfg: Any, name: str) -> bool:
    """Whether option ``name`` differs from its default (an explicit choice must exist)."""
    if dataclasses.is_dataclass(cfg):
        for field in dataclasses.fields(cfg):
            if field.name == name:
                return getattr(cfg, name) != field.default
    return True


@functools.cache
def _resolve_tfds(
    name: str,
    data_dir: str | None,
    split: str,
    audio_key: str,
    text_key: str,
    id_key: tuple[str, bool],  # (key, required)
    speaker_key: tuple[str, bool],
    sample_rate: int | None,
) -> TfdsSource:
    builder, data = _open_tfds(name, data_dir, split)
    features = builder.info.features
    names = ", ".join(sorted(features.keys()))
    where = f"TFDS dataset {builder.info.full_name}"

    def key_of(key: str, flag: str, required: bool) -> str | None:
        if key in features:
            return key
        if required:
            raise PrepareError(f"{where} has no feature {key!r} (--{flag}); features: {names}")
        return None

    key_of(audio_key, "tfds_audio_key", True)
    key_of(text_key, "tfds_text_key", True)
    resolved_id_key = key_of(id_key[0], "tfds_id_key", id_key[1])
    resolved_speaker_key = key_of(speaker_key[0], "tfds_speaker_key", speaker_key[1])
    audio = features[audio_key]
    dtype = getattr(audio, "np_dtype", None)
    shape = getattr(audio, "shape", ())
    if dtype is None or not (
        np.dtype(dtype) in (np.int16, np.int32) or np.issubdtype(dtype, np.floating)
    ):
        raise PrepareError(
            f"{where}: feature {audio_key!r} is not int16, int32 or float samples ({audio!r})"
        )
    if len(shape) not in (1, 2):
        raise PrepareError(
            f"{where}: feature {audio_key!r} has shape {shape}; expected (N,) or (N, C)"
        )
    rate = sample_rate or getattr(audio, "sample_rate", None)
    if not rate:
        raise PrepareError(
            f"{where}: feature {audio_key!r} does not say its sample rate; pass --tfds_sample_rate"
        )
    return TfdsSource(
        name=name,
        data_dir=data_dir,
        split=split,
        audio_key=audio_key,
        text_key=text_key,
        id_key=resolved_id_key,
        speaker_key=resolved_speaker_key,
        sample_rate=int(rate),
        num_records=len(data),
    )


def tfds_source(cfg: Any) -> TfdsSource:
    """The TFDS input of ``cfg``, checked (cached: the audio loader calls it per item).

    ``--tfds_audio_key``/``--tfds_text_key`` must exist; the id and speaker features are used
    when present, and must exist only when their flags were changed from the defaults.

    Raises:
      PrepareError: see _open_tfds; a missing feature (the message lists the dataset's
        features); audio that is not int16/int32/float of shape (N,) or (N, C); no sample rate.
    """
    return _resolve_tfds(
        cfg.input,
        cfg.tfds_data_dir,
        cfg.tfds_split or cfg.split,
        cfg.tfds_audio_key,
        cfg.tfds_text_key,
        (cfg.tfds_id_key, _explicit(cfg, "tfds_id_key")),
        (cfg.tfds_speaker_key, _explicit(cfg, "tfds_speaker_key")),
        cfg.tfds_sample_rate,
    )


def _feature_str(value: Any) -> str:
    """A TFDS id/speaker value (bytes for Text, numpy scalars for ints) as str."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def tfds_item(record: dict[str, Any], index: int, source: TfdsSource) -> Item:
    """The Item of record ``index`` (its audio is read again by the loader: see read_tfds)."""
    item_id = f"{source.split}-{index:08d}"
    if source.id_key is not None:
        item_id = _feature_str(record[source.id_key])
    speaker = NO_SPEAKER if source.speaker_key is None else _feature_str(record[source.speaker_key])
    raw = record[source.text_key]
    if isinstance(raw, np.ndarray) and raw.ndim == 0:
        raw = raw.item()
    text, error = None, None
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            error = MALFORMED_TFDS_TEXT
    else:
        text = str(raw)
    return Item(
        id=item_id,
        audio_path=f"{TFDS_PREFIX}{index}",
        text=text,
        speaker=speaker,
        error=error,
        position=index,
    )


def read_tfds_chunk(chunk: tuple[int, int], source: TfdsSource) -> Iterator[Item]:
    """The Items of records [start, stop) of the split."""
    _, data = _open_tfds(source.name, source.data_dir, source.split)
    start, stop = chunk
    for index in range(start, stop):
        try:
            record = data[index]
        except Exception:  # A corrupt record: counted, with the index as its id.
            item_id = f"{source.split}-{index:08d}"
            yield Item(
                id=item_id,
                audio_path=f"{TFDS_PREFIX}{index}",
                text=None,
                speaker=NO_SPEAKER,
                error=UNREADABLE_TFDS_RECORD,
                position=index,
            )
            continue
        yield tfds_item(record, index, source)


@register_reader("tfds")
def read_tfds(p: beam.Pipeline, cfg: Any) -> beam.PCollection:
    """A prepared TFDS dataset (``--input name[:version]``, ``--tfds_data_dir``, ``--tfds_split``)
    stored as ``array_record``, read through ``builder.as_data_source`` without TensorFlow.

    The audio feature must be samples: ``tfds.features.Tensor`` of int16 (scaled by 1/32768),
    int32 (1/2**31) or float, shape (N,) or (N, C). ``tfds.features.Audio`` works only where
    TensorFlow is installed: TFDS builds a TensorFlow decoder for it as soon as the dataset's
    features are loaded (checked with tensorflow-datasets 4.9.10), so without TensorFlow such a
    dataset fails with a PrepareError saying so. The sample rate comes from
    ``--tfds_sample_rate``, else the feature's ``sample_rate`` (Audio features have one).

    Records are listed in chunks of index ranges; each item carries only ``tfds:<index>``, and
    the loader reads the record again for its audio. Reading the audio twice is the price of
    keeping items small through Beam's shuffle (an item with its audio would carry the whole
    corpus through it).
    """
    source = tfds_source(cfg)
    chunks = [
        (start, min(start + TFDS_RECORDS_PER_CHUNK, source.num_records))
        for start in range(0, source.num_records, TFDS_RECORDS_PER_CHUNK)
    ]
    return (
        p
        | "TfdsChunks" >> beam.Create(chunks)
        | "ReadTfds" >> beam.FlatMap(read_tfds_chunk, source=source)
    )


def tfds_audio_to_float(samples: np.ndarray) -> np.ndarray:
    """TFDS audio samples (N,) or (N, C), int16/int32/float -> (N, C) float32 in [-1, 1].

    Raises:
      AudioError(UNDECODABLE_AUDIO): another rank or dtype.
    """
    samples = np.asarray(samples)
    if samples.ndim == 1:
        samples = samples[:, None]
    if samples.ndim != 2:
        raise AudioError(UNDECODABLE_AUDIO, f"audio of shape {samples.shape}")
    if samples.dtype == np.int16:
        return samples.astype(np.float32) / np.float32(32768.0)
    if samples.dtype == np.int32:
        return (samples.astype(np.float64) / 2.0**31).astype(np.float32)
    if np.issubdtype(samples.dtype, np.floating):
        return samples.astype(np.float32)
    raise AudioError(UNDECODABLE_AUDIO, f"audio of dtype {samples.dtype}")


def load_tfds_audio(index: int, source: TfdsSource) -> tuple[np.ndarray, int]:
    """Record ``index``'s audio: ((N, C) float32, sample_rate).

    Raises:
      AudioError: no such record (missing_audio), an unreadable record, or samples of another
        rank or dtype (undecodable_audio).
    """
    if not 0 <= index < source.num_records:
        raise AudioError(MISSING_AUDIO, f"no record {index} in {source.name}/{source.split}")
    _, data = _open_tfds(source.name, source.data_dir, source.split)
    try:
        record = data[index]
    except Exception as e:  # Whatever the array_record/proto layers raise for a bad record.
        raise AudioError(UNREADABLE_TFDS_RECORD, f"record {index}: {e}") from e
    return tfds_audio_to_float(record[source.audio_key]), source.sample_rate
