"""The one definition of a shard record, and of the per-split index beside the shards.

A record is self-describing bytes, never a pickle:

    b"JSR1" | uint32 little-endian header length | UTF-8 JSON header | audio payload

The JSON header holds ``{id, sample_rate, text, speaker, duration, num_samples,
audio_format}``, and for text-to-speech data optionally ``phonemes`` (the phonemes spoken,
space-separated tokens) with ``phoneme_ends`` (the second each one ends at: one float per
token, non-decreasing, the last one ``duration``); a record without them has neither key, so
its bytes are those it had before the fields existed. The payload is either raw
little-endian int16 PCM (``"pcm_s16le"``, the default: decoding is a zero-copy
``np.frombuffer``) or a FLAC stream (``"flac"``: roughly half the bytes, costs a decode per
read).

A split directory ``DIR/<split>/`` holds the shards, ``index.json`` (shard list and totals)
and ``durations.npy`` (one float32 duration per record, in global record order: shards in
index order, records in file order). The prepare tool writes them, the input pipeline reads
them through :func:`read_split_index`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxspeech.common import files, storage

MAGIC = b"JSR1"
AUDIO_FORMATS = ("pcm_s16le", "flac")
INDEX_FILE = "index.json"
DURATIONS_FILE = "durations.npy"

_PREFIX = struct.Struct("<4sI")  # magic, header length
_HEADER_KEYS = ("id", "sample_rate", "text", "speaker", "duration", "num_samples", "audio_format")
_PHONEME_KEYS = ("phonemes", "phoneme_ends")  # optional, both or neither


# ---------------------------------------------------------------------------------------------
# Audio conversion
# ---------------------------------------------------------------------------------------------


def to_int16(audio: np.ndarray) -> np.ndarray:
    """Converts mono audio to int16 PCM.

    Args:
      audio: (N,) integer or float array; floats are full scale in [-1, 1] and are clipped.

    Returns:
      (N,) int16 array. Float x maps to round(x * 32768) clipped to [-32768, 32767], so an
      int16 signal read as float (k / 32768) converts back exactly.
    """
    audio = np.asarray(audio)
    if audio.ndim != 1:
        raise ValueError(f"audio must be 1-D (mono), got shape {audio.shape}")
    if audio.dtype == np.int16:
        return audio
    if np.issubdtype(audio.dtype, np.floating):
        scaled = np.rint(audio.astype(np.float64) * 32768.0)
        return np.clip(scaled, -32768, 32767).astype(np.int16)
    if np.issubdtype(audio.dtype, np.integer):
        return np.clip(audio, -32768, 32767).astype(np.int16)
    raise ValueError(f"unsupported audio dtype {audio.dtype}")


def _encode_payload(audio_i16: np.ndarray, sample_rate: int, audio_format: str) -> bytes:
    if audio_i16.size == 0:
        return b""  # FLAC cannot hold zero frames; an empty payload needs no codec.
    if audio_format == "pcm_s16le":
        return audio_i16.astype("<i2", copy=False).tobytes()
    import soundfile as sf  # Only the FLAC path needs libsndfile.

    buf = io.BytesIO()
    sf.write(buf, audio_i16, sample_rate, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def _decode_payload(payload: memoryview, header: dict[str, Any]) -> np.ndarray:
    num_samples = header["num_samples"]
    fmt = header["audio_format"]
    if num_samples == 0:
        if len(payload):
            raise ValueError(f"corrupt record {header['id']!r}: payload for zero samples")
        return np.zeros((0,), np.int16)
    if fmt == "pcm_s16le":
        if len(payload) != 2 * num_samples:
            raise ValueError(
                f"corrupt record {header['id']!r}: payload has {len(payload)} bytes, "
                f"expected {2 * num_samples} for {num_samples} int16 samples"
            )
        # Zero-copy and read-only; astype is a no-op on little-endian hosts.
        return np.frombuffer(payload, dtype="<i2").astype(np.int16, copy=False)
    import soundfile as sf

    try:
        audio, _ = sf.read(io.BytesIO(payload), dtype="int16", always_2d=False)
    except Exception as e:  # libsndfile raises several types for bad streams.
        raise ValueError(f"corrupt record {header['id']!r}: undecodable FLAC ({e})") from e
    if audio.shape != (num_samples,):
        raise ValueError(
            f"corrupt record {header['id']!r}: FLAC decoded to shape {audio.shape}, "
            f"expected ({num_samples},)"
        )
    return audio


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


def encode_record(
    *,
    id: str,
    audio: np.ndarray,
    sample_rate: int,
    text: str,
    speaker: str,
    audio_format: str = "pcm_s16le",
    phonemes: str | None = None,
    phoneme_ends: Sequence[float] | None = None,
) -> bytes:
    """Serializes one utterance.

    Args:
      id: unique utterance id.
      audio: (N,) mono waveform, int16 or float in [-1, 1] (converted with clipping).
      sample_rate: Hz.
      text: raw transcript (tokenization happens in the training input pipeline).
      speaker: speaker id.
      audio_format: "pcm_s16le" (fast decode) or "flac" (smaller).
      phonemes: optional, the phonemes spoken as space-separated tokens.
      phoneme_ends: with phonemes, one end per token in seconds (the caller checks them:
        data_prep.phoneme_fields).

    Returns:
      The record bytes (see the module docstring for the layout).
    """
    if audio_format not in AUDIO_FORMATS:
        raise ValueError(f"audio_format must be one of {AUDIO_FORMATS}, got {audio_format!r}")
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    audio_i16 = to_int16(audio)
    header = {
        "id": str(id),
        "sample_rate": int(sample_rate),
        "text": str(text),
        "speaker": str(speaker),
        "duration": audio_i16.size / sample_rate,
        "num_samples": int(audio_i16.size),
        "audio_format": audio_format,
    }
    if (phonemes is None) != (phoneme_ends is None):
        raise ValueError("phonemes and phoneme_ends go together: give both or neither")
    if phonemes is not None:
        ends = [float(e) for e in phoneme_ends]
        if len(phonemes.split(" ")) != len(ends):
            raise ValueError(f"{len(ends)} phoneme_ends for {len(phonemes.split(' '))} phonemes")
        header["phonemes"], header["phoneme_ends"] = str(phonemes), ends
    return frame(MAGIC, header, _encode_payload(audio_i16, sample_rate, audio_format))


def frame(magic: bytes, header: dict[str, Any], payload: bytes) -> bytes:
    """`magic` (4 bytes) | uint32 little-endian header length | UTF-8 JSON `header` |
    `payload`: the framing of every record the project stores (utterances here, the
    teacher's targets in `distill.records`)."""
    header_bytes = json.dumps(header, ensure_ascii=False).encode("utf-8")
    return _PREFIX.pack(magic, len(header_bytes)) + header_bytes + payload


def unframe(
    data: bytes, magic: bytes, keys: Sequence[str], what: str = "record"
) -> tuple[dict[str, Any], memoryview]:
    """`frame`'s bytes -> (the JSON header, the payload as a view of `data`).

    Raises:
      ValueError: "corrupt <what>: ..." for bytes shorter than the prefix, another magic, a
        header length past the end, a header that is no JSON object or lacks one of `keys`.
    """
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise ValueError(f"corrupt {what}: {len(view)} bytes is shorter than the 8-byte prefix")
    found, header_len = _PREFIX.unpack_from(view)
    if found != magic:
        raise ValueError(f"corrupt {what}: bad magic {bytes(found)!r}, expected {magic!r}")
    end = _PREFIX.size + header_len
    if end > len(view):
        raise ValueError(
            f"corrupt {what}: header length {header_len} exceeds the {len(view)}-byte record"
        )
    try:
        header = json.loads(bytes(view[_PREFIX.size : end]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"corrupt {what}: unreadable JSON header ({e})") from e
    if not isinstance(header, dict) or any(k not in header for k in keys):
        raise ValueError(f"corrupt {what}: header lacks one of {tuple(keys)}")
    return header, view[end:]


def _split(data: bytes) -> tuple[dict[str, Any], memoryview]:
    header, payload = unframe(data, MAGIC, _HEADER_KEYS)
    if header["audio_format"] not in AUDIO_FORMATS:
        raise ValueError(f"corrupt record {header['id']!r}: audio_format {header['audio_format']}")
    if ("phonemes" in header) != ("phoneme_ends" in header):
        raise ValueError(f"corrupt record {header['id']!r}: phonemes without phoneme_ends")
    return header, payload


def decode_header(data: bytes) -> dict[str, Any]:
    """Parses only the JSON header (no audio decode).

    Returns:
      {id, sample_rate, text, speaker, duration, num_samples, audio_format}, and
      {phonemes, phoneme_ends} where the record has them.

    Raises:
      ValueError: the bytes are not a record.
    """
    return _split(data)[0]


def decode_record(data: bytes) -> dict[str, Any]:
    """Parses a record.

    Returns:
      {id: str, audio: (N,) int16 (read-only for pcm_s16le), sample_rate: int, text: str,
       speaker: str, duration: float seconds}, and where the record has them phonemes:
       str (space-separated tokens) and phoneme_ends: list of float seconds.

    Raises:
      ValueError: corrupt bytes (bad magic, lengths, header or payload).
    """
    header, payload = _split(data)
    audio = _decode_payload(payload, header)
    out = {
        "id": header["id"],
        "audio": audio,
        "sample_rate": header["sample_rate"],
        "text": header["text"],
        "speaker": header["speaker"],
        "duration": float(header["duration"]),
    }
    for key in _PHONEME_KEYS:
        if key in header:
            out[key] = header[key]
    return out


# ---------------------------------------------------------------------------------------------
# Split index
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class SplitIndex:
    """What the input pipeline needs to know about one prepared split.

    Attributes:
      split: split name.
      shard_paths: absolute shard file paths, in global record order.
      shard_num_records: records per shard, aligned with shard_paths.
      durations: (num_records,) float32 seconds, in global record order.
      num_records: total records.
      seconds: total audio seconds.
      sample_rate: Hz of every record.
    """

    split: str
    shard_paths: list[str]
    shard_num_records: list[int]
    durations: np.ndarray
    num_records: int
    seconds: float
    sample_rate: int


def write_split_index(
    split_dir: str, shards: list[dict[str, Any]], durations: np.ndarray, extra: dict[str, Any]
) -> None:
    """Writes ``index.json`` and ``durations.npy`` into ``split_dir``.

    Args:
      split_dir: the split directory; its base name is the split name.
      shards: in global order, each {path: file name relative to split_dir, num_records,
        seconds}.
      durations: (num_records,) seconds per record in global order (stored as float32).
      extra: more index fields; must contain ``sample_rate``; a ``split`` entry overrides the
        split name (default: the base name of split_dir).
    """
    durations = np.asarray(durations, dtype=np.float32)
    if durations.ndim != 1:
        raise ValueError(f"durations must be 1-D, got shape {durations.shape}")
    if "sample_rate" not in extra:
        raise ValueError("extra must contain 'sample_rate'")
    num_records = sum(int(s["num_records"]) for s in shards)
    if num_records != durations.size:
        raise ValueError(f"{durations.size} durations for {num_records} records in the shards")
    for s in shards:
        if os.path.isabs(s["path"]) or os.sep in s["path"]:
            raise ValueError(f"shard path must be a file name inside split_dir: {s['path']!r}")
    index = {
        "split": os.path.basename(os.path.normpath(split_dir)),
        "num_records": num_records,
        "seconds": float(sum(float(s["seconds"]) for s in shards)),
        **extra,
        "shards": [
            {
                "path": s["path"],
                "num_records": int(s["num_records"]),
                "seconds": float(s["seconds"]),
            }
            for s in shards
        ],
    }
    with files.atomic_open(os.path.join(split_dir, DURATIONS_FILE), "wb") as f:
        np.save(f, durations, allow_pickle=False)
    # Last: a split whose index exists is complete (the index is the completion mark).
    files.atomic_json(os.path.join(split_dir, INDEX_FILE), index)


def read_split_index(data_dir: str, split: str) -> SplitIndex:
    """Reads ``data_dir/<split>/index.json`` and ``durations.npy``.

    The shards themselves are not opened here (`jaxspeech.data.reader.check_shards` checks
    the ones a process will read; `data_prep.verify` checks them all).

    ``data_dir`` may be an object-store URL: the split is mirrored into the local cache
    first (`jaxspeech.common.storage.local_data`) and read there.

    Raises:
      FileNotFoundError: the split was never prepared (the message says how to prepare it).
      ValueError: index and durations disagree.
      StorageError: an object-store split that cannot be mirrored (one line).
      UserError: the index names a file outside the split (absolute, `..`, or a symlink
        leading out): a crafted dataset reads nothing of the user's.
    """
    data_dir = storage.local_data(data_dir, split)
    split_dir = os.path.abspath(os.path.join(data_dir, split))
    index_path = os.path.join(split_dir, INDEX_FILE)
    if not os.path.isfile(index_path):
        raise FileNotFoundError(
            f"no prepared split at {index_path}; run `python -m data_prep.prepare --format "
            f"manifest --input MANIFEST --output {data_dir} --split {split}` first"
        )
    with open(index_path, encoding="utf-8") as f:
        index = json.load(f)
    # A split may come from elsewhere: every file it names stays inside it.
    durations_path = files.inside(split_dir, DURATIONS_FILE, split_dir)
    durations = np.load(durations_path, allow_pickle=False).astype(np.float32, copy=False)
    shard_paths = [files.inside(split_dir, s["path"], index_path) for s in index["shards"]]
    shard_num_records = [int(s["num_records"]) for s in index["shards"]]
    if durations.shape != (index["num_records"],) or sum(shard_num_records) != durations.size:
        raise ValueError(
            f"{split_dir}: index lists {index['num_records']} records "
            f"({sum(shard_num_records)} in shards) but {DURATIONS_FILE} has {durations.size}"
        )
    return SplitIndex(
        split=index.get("split", split),
        shard_paths=shard_paths,
        shard_num_records=shard_num_records,
        durations=durations,
        num_records=int(index["num_records"]),
        seconds=float(index["seconds"]),
        sample_rate=int(index["sample_rate"]),
    )
