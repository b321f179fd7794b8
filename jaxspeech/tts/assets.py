"""A text-to-speech run's own assets (RUN/assets), installed on its first start from the
prepared train split and kept for every resume, evaluation and export:

- phonemes.json: the phoneme table (`tts.batch.PhonemeTable`: "<pad>" 0, "<unk>" 1,
  then the train split's inventory, sorted), from DIR/<train>/phonemes.json (data_prep);
- speakers.json: the train split's speakers, sorted (row i of the speaker embedding);
- pitch_stats.json: mean and std of log F0 over the voiced frames of
  config.tts.pitch_utterances train utterances (the pitch targets' normalization);
- stats.json: the feature statistics, as a recognizer's run (`runs.assets`).

The table is written last: its presence marks the assets complete (other processes wait
for it). Speakers and pitch take one pass over the train split's records on the first
start (the split lists no speakers of its own).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
from ml_collections import ConfigDict

from jaxspeech.common import files, storage
from jaxspeech.common.errors import UserError
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.runs import crash
from jaxspeech.runs.assets import ASSETS, feature_stats, wait_for
from jaxspeech.tts.batch import PhonemeTable, frame_f0, speaker_ids

INVENTORY_FILE = "phonemes.json"  # beside a split's index.json (data_prep.phoneme_fields)
TABLE_FILE = "phonemes.json"  # RUN/assets/: the run's phoneme table
SPEAKERS_FILE = "speakers.json"
PITCH_FILE = "pitch_stats.json"
_READ_CHUNK = 256  # records per read of the speaker pass


@dataclasses.dataclass(frozen=True)
class TtsAssets:
    """What a text-to-speech run reads from RUN/assets."""

    table: PhonemeTable
    speakers: dict[str, int]  # speaker -> id
    mean: np.ndarray  # (F,) feature mean
    std: np.ndarray  # (F,) feature std
    pitch_mean: float  # of log F0 (Hz) over voiced frames
    pitch_std: float


def no_phonemes_message(data_dir: str, split: str) -> str:
    """The one line that refuses a split without phoneme fields."""
    return (
        f"{os.path.join(data_dir, split)} has no phoneme fields (no {INVENTORY_FILE}): "
        'prepare it from a manifest whose lines carry "phonemes" and "phoneme_ends" '
        "with `python -m data_prep.prepare --format manifest --require_phonemes ...` "
        "(config.task=tts needs phonemes and their durations)"
    )


def read_inventory(data_dir: str, split: str) -> list[str]:
    """The phonemes of DIR/<split>/phonemes.json.

    Raises:
      UserError: the split has no phoneme fields (`no_phonemes_message`).
    """
    split_dir = os.path.join(data_dir, split)
    path = files.inside(split_dir, INVENTORY_FILE, split_dir)
    if not os.path.isfile(path):
        raise UserError(no_phonemes_message(data_dir, split))
    with open(path, encoding="utf-8") as f:
        return list(json.load(f)["phonemes"])


def split_speakers(data_dir: str, split: str) -> list[str]:
    """Every record's speaker of a prepared split, in record order (headers only; a
    record that cannot be read is left out, the loader reports it)."""
    index = records.read_split_index(data_dir, split)
    reader = reader_lib.RecordReader(index.shard_paths, index.shard_num_records)
    out = []
    for start in range(0, index.num_records, _READ_CHUNK):
        raw, _, _ = reader.read(list(range(start, min(start + _READ_CHUNK, index.num_records))))
        out += [records.decode_header(d)["speaker"] for d in raw if d is not None]
    return out


def pitch_stats(data_dir: str, split: str, utterances: int, hop: int) -> tuple[float, float]:
    """(mean, std) of log F0 over the voiced frames (`tts_batch.frame_f0`) of `utterances`
    records evenly spaced over the split; (log 150 Hz, 0.25) when none is voiced."""
    crash.phase("installing assets: pitch statistics")  # librosa's numba code runs here
    index = records.read_split_index(data_dir, split)
    n = min(utterances, index.num_records)
    positions = np.unique(np.linspace(0, index.num_records - 1, n).round().astype(int))
    reader = reader_lib.RecordReader(index.shard_paths, index.shard_num_records)
    raw, _, _ = reader.read([int(p) for p in positions])
    logs = []
    for data in raw:
        if data is None:
            continue
        rec = records.decode_record(data)
        f0 = frame_f0(reader_lib.audio_float32(rec), rec["sample_rate"], hop)
        logs.append(np.log(f0[f0 > 0]))
    values = np.concatenate(logs) if logs else np.zeros((0,))
    if values.size < 2:
        return float(np.log(150.0)), 0.25
    return float(values.mean()), float(max(values.std(), 1e-3))


def install_tts_assets(config: ConfigDict, workdir: str, every_process: bool = False) -> TtsAssets:
    """The run's tables and statistics (see the module docstring), written on the first
    start by process 0 (or by `every_process`: a run on an object store), then read.

    Raises:
      UserError: the train split is not prepared or has no phoneme fields; its phoneme
        inventory holds phonemes the run's table lacks (a re-prepared corpus); its feature
        statistics are of other features than config.features.
    """
    split = config.data.train_split
    data_dir = storage.local_data(config.data.dir, split)
    split_dir = os.path.join(data_dir, split)
    stats_path = files.inside(split_dir, "stats.json", split_dir)  # copied into the run
    if not os.path.isfile(stats_path):
        raise UserError(
            f"{stats_path} not found: data.dir={data_dir!r} is not a prepared corpus "
            f"(run `python -m data_prep.prepare ... --output {data_dir} --split {split}`)"
        )
    inventory = read_inventory(data_dir, split)
    assets = os.path.join(workdir, ASSETS)
    table_path = os.path.join(assets, TABLE_FILE)
    if (every_process or jax.process_index() == 0) and not os.path.exists(table_path):
        os.makedirs(assets, exist_ok=True)
        with open(stats_path, "rb") as f:
            files.atomic_write(os.path.join(assets, "stats.json"), f.read())
        speakers = sorted(speaker_ids(split_speakers(data_dir, split)))
        files.atomic_json(os.path.join(assets, SPEAKERS_FILE), speakers)
        hop = int(config.features.hop_length)
        mean, std = pitch_stats(data_dir, split, int(config.tts.pitch_utterances), hop)
        files.atomic_json(os.path.join(assets, PITCH_FILE), {"mean": mean, "std": std})
        files.atomic_json(table_path, list(PhonemeTable.from_inventory(inventory).tokens))
    wait_for(table_path)
    return read_tts_assets(config, assets, inventory, stats_path)


def read_tts_assets(
    config: ConfigDict, assets: str, inventory: list[str], source: str
) -> TtsAssets:
    """The assets in `assets`, checked against the data's `inventory` and config.features."""
    with open(os.path.join(assets, TABLE_FILE), encoding="utf-8") as f:
        table = PhonemeTable(tuple(json.load(f)))
    new = sorted(set(inventory) - set(table.tokens))
    if new:
        raise UserError(
            f"the train split's phonemes {new[:5]} are not in this run's table "
            f"({os.path.join(assets, TABLE_FILE)}): use a new --workdir for a re-prepared corpus"
        )
    with open(os.path.join(assets, SPEAKERS_FILE), encoding="utf-8") as f:
        speakers = speaker_ids(json.load(f))
    with open(os.path.join(assets, PITCH_FILE), encoding="utf-8") as f:
        pitch = json.load(f)
    mean, std = feature_stats(config, os.path.join(assets, "stats.json"), source)
    return TtsAssets(table, speakers, mean, std, float(pitch["mean"]), float(pitch["std"]))
