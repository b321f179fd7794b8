"""The flags of ``python -m data_prep.prepare`` and the checked :class:`PrepConfig` they
parse into."""

from __future__ import annotations

import dataclasses
import math
import os

from absl import flags

from data_prep.readers import READERS
from data_prep.readers.common import PrepareError
from jaxspeech.audio.features import LogMelConfig
from jaxspeech.audio.mfcc import FEATURE_KINDS, MAX_DELTAS
from jaxspeech.common import storage
from jaxspeech.data import records

HOURS_PER_SHARD = 1.0  # Default audio per shard (see data_prep.sharding.default_num_shards).


@dataclasses.dataclass(frozen=True)
class PrepConfig:
    """Everything the pipeline needs, parsed from flags."""

    format: str
    input: str
    output: str  # Absolute, or an object-store URL.
    split: str
    num_shards: int | None
    tokenizer: str
    vocab_size: int
    train_tokenizer: bool
    tokenizer_max_sentences: int
    min_duration: float
    max_duration: float
    sample_rate: int
    audio_format: str
    feature: LogMelConfig
    hours_per_shard: float = HOURS_PER_SHARD
    seed: int = 0  # Speaker-to-shard placement and record order within shards.
    alphabet: str | None = None  # Allowed characters of normalized text (None: any).
    # Skip items without phonemes (missing_phonemes) instead of writing them as ASR records.
    require_phonemes: bool = False
    # Reader options (data_prep.readers).
    allow_pipes: bool = False
    tfds_data_dir: str | None = None
    tfds_split: str | None = None  # None: --split.
    tfds_audio_key: str = "audio"
    tfds_text_key: str = "text"
    tfds_speaker_key: str = "speaker_id"
    tfds_id_key: str = "id"
    tfds_sample_rate: int | None = None  # None: from the audio feature's metadata.
    hf_audio_column: str = "audio"
    hf_text_column: str = "text"
    hf_speaker_column: str = "speaker_id"  # used where the table has it
    hf_id_column: str = "id"  # used where the table has it, else file and row
    lhotse_supervisions: str | None = None  # None: named like --input
    lhotse_audio_root: str | None = None  # None: the current directory

    @property
    def split_dir(self) -> str:
        return os.path.join(self.output, self.split)


def define_flags(fv: flags.FlagValues) -> None:
    """Defines every flag of ``data_prep.prepare`` in ``fv`` (a fresh set per parse)."""
    # Listed under the CLI's module in --help (they are its flags), not under this one.
    d = dict(flag_values=fv, module_name="data_prep.prepare")
    flags.DEFINE_string("format", "manifest", "Input format: " + ", ".join(sorted(READERS)), **d)
    flags.DEFINE_string(
        "input",
        None,
        "manifest: a JSON-lines file; librispeech: a split directory; kaldi: a data "
        "directory; tfds: a dataset name (with --tfds_data_dir); webdataset: a .tar shard, "
        "a directory of them or a glob; hf: a saved Hugging Face dataset directory, or "
        "parquet files (a file, a directory or a glob); lhotse: a CutSet, or a RecordingSet "
        "(or SupervisionSet) manifest (.jsonl or .jsonl.gz).",
        **d,
    )
    flags.DEFINE_string("output", None, "Output data directory DIR.", **d)
    flags.DEFINE_string("split", None, "Split name; written to DIR/<split>/.", **d)
    flags.DEFINE_integer("num_shards", None, "Shards (default: see --hours_per_shard).", **d)
    flags.DEFINE_float(
        "hours_per_shard", HOURS_PER_SHARD, "Audio per shard when --num_shards is not given.", **d
    )
    flags.DEFINE_integer("seed", 0, "Seed of shard placement and in-shard order.", **d)
    flags.DEFINE_string(
        "alphabet",
        None,
        "Characters a normalized transcript may hold (space always); others are skipped "
        "as out_of_alphabet. Default: any.",
        **d,
    )
    flags.DEFINE_bool(
        "require_phonemes",
        False,
        "Text-to-speech data: skip items without phonemes and phoneme_ends as "
        "missing_phonemes (by default they are written as ASR records). Manifest input only.",
        **d,
    )
    flags.DEFINE_enum("tokenizer", "char", ["char", "bpe", "unigram"], "Tokenizer kind.", **d)
    flags.DEFINE_integer("vocab_size", 256, "bpe/unigram labels, blank included.", **d)
    flags.DEFINE_bool("train_tokenizer", None, "Train DIR/tokenizer (default: split==train).", **d)
    flags.DEFINE_integer(
        "tokenizer_max_sentences", 2_000_000, "SentencePiece trains on this many.", **d
    )
    flags.DEFINE_float("min_duration", 0.1, "Shorter audio (seconds) is skipped.", **d)
    flags.DEFINE_float("max_duration", 30.0, "Longer audio (seconds) is skipped.", **d)
    flags.DEFINE_integer("sample_rate", 16000, "Output sample rate; others are resampled.", **d)
    flags.DEFINE_enum("audio_format", "pcm_s16le", list(records.AUDIO_FORMATS), "Payload.", **d)
    flags.DEFINE_integer("n_fft", 512, "Stats: FFT size.", **d)
    flags.DEFINE_integer("win_length", 400, "Stats: window length (samples).", **d)
    flags.DEFINE_integer("hop_length", 160, "Stats: hop length (samples).", **d)
    flags.DEFINE_integer("num_mel_bins", 80, "Stats: mel bins.", **d)
    flags.DEFINE_float("fmin", 0.0, "Stats: lowest mel frequency (Hz).", **d)
    flags.DEFINE_float("fmax", None, "Stats: highest mel frequency (default sample_rate/2).", **d)
    flags.DEFINE_float("log_floor", 1e-6, "Stats: log(mel + log_floor).", **d)
    flags.DEFINE_enum(
        "features", "log_mel", list(FEATURE_KINDS), "Stats of: the model's features.kind.", **d
    )
    flags.DEFINE_integer("num_ceps", 40, "Stats, --features mfcc: cepstra kept.", **d)
    flags.DEFINE_float("lifter", 22.0, "Stats, --features mfcc: cepstral lifter (0 = off).", **d)
    flags.DEFINE_integer("deltas", 0, "Stats, --features mfcc: delta orders appended.", **d)
    _define_reader_flags(d)


def _define_reader_flags(d: dict) -> None:
    """The options of single --format readers (kaldi, tfds, hf, lhotse); `d`: the
    DEFINE_* keywords (flag_values, module_name)."""
    flags.DEFINE_bool("allow_pipes", False, "kaldi, lhotse: run commands (no shell).", **d)
    flags.DEFINE_string("tfds_data_dir", None, "tfds: the TFDS data directory.", **d)
    flags.DEFINE_string("tfds_split", None, "tfds: the TFDS split (default: --split).", **d)
    flags.DEFINE_string("tfds_audio_key", "audio", "tfds: the audio feature.", **d)
    flags.DEFINE_string("tfds_text_key", "text", "tfds: the transcript feature.", **d)
    flags.DEFINE_string("tfds_speaker_key", "speaker_id", "tfds: the speaker feature.", **d)
    flags.DEFINE_string("tfds_id_key", "id", "tfds: the id feature (else the index).", **d)
    flags.DEFINE_string("hf_audio_column", "audio", "hf: the Audio column (bytes, path).", **d)
    flags.DEFINE_string("hf_text_column", "text", "hf: the transcript column.", **d)
    flags.DEFINE_string("hf_speaker_column", "speaker_id", "hf: the speaker column.", **d)
    flags.DEFINE_string("hf_id_column", "id", "hf: the id column (else file and row).", **d)
    flags.DEFINE_string(
        "lhotse_supervisions",
        None,
        "lhotse: the SupervisionSet of a RecordingSet --input (default: named like it, "
        "'recordings' -> 'supervisions').",
        **d,
    )
    flags.DEFINE_string(
        "lhotse_audio_root",
        None,
        "lhotse: the directory relative audio paths are under (default: the current one).",
        **d,
    )
    flags.DEFINE_integer(
        "tfds_sample_rate", None, "tfds: audio rate (default: the feature's metadata).", **d
    )


def _feature(fv: flags.FlagValues) -> LogMelConfig:
    """The statistics' features: the model's `config.features` (LogMelConfig) as flags.

    Raises:
      PrepareError: MFCC settings the front end cannot compute.
    """
    if fv.features == "mfcc":
        if not 1 <= fv.num_ceps <= fv.num_mel_bins:
            raise PrepareError(
                f"--num_ceps must be in [1, --num_mel_bins={fv.num_mel_bins}], got {fv.num_ceps}"
            )
        if not (math.isfinite(fv.lifter) and fv.lifter >= 0):
            raise PrepareError(f"--lifter must be a finite number >= 0, got {fv.lifter}")
        if not 0 <= fv.deltas <= MAX_DELTAS:
            raise PrepareError(f"--deltas must be in [0, {MAX_DELTAS}], got {fv.deltas}")
    return LogMelConfig(
        sample_rate=fv.sample_rate,
        n_fft=fv.n_fft,
        win_length=fv.win_length,
        hop_length=fv.hop_length,
        num_mel_bins=fv.num_mel_bins,
        fmin=float(fv.fmin),
        fmax=float(fv.fmax if fv.fmax is not None else fv.sample_rate / 2),
        log_floor=float(fv.log_floor),
        kind=fv.features,
        num_ceps=fv.num_ceps,
        lifter=float(fv.lifter),
        deltas=fv.deltas,
    )


def parse_args(argv: list[str]) -> tuple[PrepConfig, list[str]]:
    """Parses our flags from ``argv`` (argv[0] is the program) and returns the rest for Beam.

    Raises:
      PrepareError: a missing or invalid flag value.
    """
    fv = flags.FlagValues()  # A fresh set per call: parse_args may run many times in-process.
    define_flags(fv)
    try:
        rest = fv(list(argv), known_only=True)
    except flags.Error as e:
        raise PrepareError(str(e)) from e
    for name in ("input", "output", "split"):
        if not fv[name].value:
            raise PrepareError(f"--{name} is required")
    if fv.format not in READERS:
        raise PrepareError(f"unknown --format {fv.format!r}; known: {', '.join(sorted(READERS))}")
    split = fv.split
    if os.sep in split or split.startswith(".") or split == "tokenizer":
        raise PrepareError(f"--split must be a plain directory name, got {split!r}")
    if not 0 <= fv.min_duration < fv.max_duration:
        raise PrepareError(f"need 0 <= --min_duration < --max_duration, got {fv.min_duration}")
    if fv.num_shards is not None and fv.num_shards < 1:
        raise PrepareError(f"--num_shards must be >= 1, got {fv.num_shards}")
    if not fv.hours_per_shard > 0:
        raise PrepareError(f"--hours_per_shard must be positive, got {fv.hours_per_shard}")
    if fv.alphabet is not None and fv.alphabet != fv.alphabet.lower():
        # Transcripts are checked after normalization, which lowercases them.
        raise PrepareError(f"--alphabet must be lowercase, got {fv.alphabet!r}")
    if fv.require_phonemes and fv.format != "manifest":
        # The other readers read no phoneme fields: every item would be skipped.
        raise PrepareError(f"--require_phonemes needs --format manifest, got {fv.format!r}")
    feature = _feature(fv)
    train_tok = fv.train_tokenizer if fv.train_tokenizer is not None else split == "train"
    cfg = PrepConfig(
        format=fv.format,
        input=fv.input,
        # An object-store URL stays one (data_prep.upload prepares it locally).
        output=fv.output if storage.is_remote(fv.output) else os.path.abspath(fv.output),
        split=split,
        num_shards=fv.num_shards,
        tokenizer=fv.tokenizer,
        vocab_size=fv.vocab_size,
        train_tokenizer=bool(train_tok),
        tokenizer_max_sentences=fv.tokenizer_max_sentences,
        min_duration=float(fv.min_duration),
        max_duration=float(fv.max_duration),
        sample_rate=fv.sample_rate,
        audio_format=fv.audio_format,
        feature=feature,
        hours_per_shard=float(fv.hours_per_shard),
        seed=fv.seed,
        alphabet=fv.alphabet,
        require_phonemes=bool(fv.require_phonemes),
        allow_pipes=bool(fv.allow_pipes),
        tfds_data_dir=fv.tfds_data_dir,
        tfds_split=fv.tfds_split,
        tfds_audio_key=fv.tfds_audio_key,
        tfds_text_key=fv.tfds_text_key,
        tfds_speaker_key=fv.tfds_speaker_key,
        tfds_id_key=fv.tfds_id_key,
        tfds_sample_rate=fv.tfds_sample_rate,
        hf_audio_column=fv.hf_audio_column,
        hf_text_column=fv.hf_text_column,
        hf_speaker_column=fv.hf_speaker_column,
        hf_id_column=fv.hf_id_column,
        lhotse_supervisions=fv.lhotse_supervisions,
        lhotse_audio_root=fv.lhotse_audio_root,
    )
    return cfg, rest[1:]
