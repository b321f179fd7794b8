"""Readers: ``--format`` -> a PCollection of :class:`~data_prep.readers.common.Item`, one
module per input format, and the audio loader for items.

A reader only lists utterances (id, where the audio is, transcript, speaker); the
validation, decoding and encoding happen once, for every format alike, in
``data_prep.prepare``. Where the audio of an item is, ``Item.audio_path``:

- a local path or a Beam filesystem URL (``gs://...``): any libsndfile format;
- ``pipe:<command>``: a Kaldi ``wav.scp`` pipe or a Lhotse ``command`` source whose stdout
  is a sound file (only with ``--allow_pipes``, since it runs a command; ``Item.pipe``
  set by those two readers alone; no shell: :mod:`.pipes`);
- ``tfds:<index>``: record ``index`` of the TFDS dataset named by ``--input``;
- ``wds:<shard>#<offset>:<size>``: an audio member's bytes inside a WebDataset tar shard;
- ``hf:<file>#<row>``: a row's audio bytes in a Hugging Face dataset's Arrow or parquet file.

``Item.start``/``Item.end`` cut a segment (seconds) out of the decoded audio (Kaldi
``segments``, NeMo offsets, Lhotse supervisions and cuts); ``Item.channels`` picks channels.

Formats: ``manifest`` (JSON lines, :mod:`.manifest`), ``librispeech`` (a LibriSpeech split
directory, :mod:`.librispeech`), ``kaldi`` (a Kaldi data directory, :mod:`.kaldi`),
``tfds`` (a prepared TFDS dataset stored as ``array_record``, :mod:`.tfds`),
``webdataset`` (WebDataset tar shards, :mod:`.webdataset`), ``hf`` (Hugging Face
datasets: save_to_disk directories or parquet files, :mod:`.hf`) and ``lhotse`` (Lhotse
CutSets, or RecordingSets with SupervisionSets, :mod:`.lhotse`). Shared pieces:
:mod:`.common` (Item, errors, the registry), :mod:`.textfiles` (input files and lines),
:mod:`.audio` (loading an item's audio), :mod:`.pipes` (commands, run without a shell).
Importing this package registers every format in :data:`READERS`.
"""

from data_prep.readers import hf, kaldi, lhotse, librispeech, manifest, tfds, webdataset
from data_prep.readers.audio import load_item_audio
from data_prep.readers.common import READERS, register_reader

# The format modules are imported for their registration in READERS.
__all__ = [
    "READERS",
    "hf",
    "kaldi",
    "lhotse",
    "librispeech",
    "load_item_audio",
    "manifest",
    "register_reader",
    "tfds",
    "webdataset",
]
