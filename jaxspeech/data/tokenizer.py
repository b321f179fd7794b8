"""Text normalization and the CTC/RNN-T tokenizer (characters or SentencePiece).

Id 0 is always the CTC/RNN-T blank and id 1 is always ``<unk>``; ``vocab_size`` counts both,
so it is the size of the model's output layer. A tokenizer lives in a directory:
``tokenizer.json`` (kind, vocabulary) plus ``spm.model`` for SentencePiece.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Sequence

from jaxspeech.common import files

BLANK_ID = 0
UNK_ID = 1
BLANK = "<blank>"
UNK = "<unk>"
CONFIG_FILE = "tokenizer.json"
SPM_FILE = "spm.model"
KINDS = ("char", "sentencepiece")
SPM_MODEL_TYPES = ("bpe", "unigram")


def normalize_text(s: str) -> str:
    """Lowercases, collapses runs of whitespace to one space, and strips both ends."""
    return " ".join(s.lower().split())


class Tokenizer:
    """Maps normalized text to label ids (blank 0, ``<unk>`` 1) and back.

    Build one with :func:`train_char_tokenizer`, :func:`train_sentencepiece_tokenizer` or
    :meth:`Tokenizer.load`.
    """

    def __init__(
        self,
        *,
        kind: str,
        vocab: Sequence[str] = (),
        spm_model: bytes | None = None,
        model_type: str = "char",
    ):
        """Args:
        kind: "char" or "sentencepiece".
        vocab: for "char", the pieces by id: [BLANK, UNK, *characters].
        spm_model: for "sentencepiece", the serialized SentencePiece model (its own ids
          are ours minus one; its unk is id 0 and it has no bos/eos).
        model_type: for "sentencepiece", "bpe" or "unigram" (recorded, not re-derived: the
          model's protobuf schema module may not import under the installed protobuf).
        """
        if kind not in KINDS:
            raise ValueError(f"tokenizer kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self._spm = None
        self._spm_model = spm_model
        if kind == "char":
            vocab = list(vocab)
            if vocab[:2] != [BLANK, UNK] or len(set(vocab)) != len(vocab):
                raise ValueError("char vocab must start with [<blank>, <unk>] and be unique")
            if any(len(c) != 1 for c in vocab[2:]):
                raise ValueError("char vocab entries after <blank>, <unk> must be single chars")
            self._pieces = vocab
            self._char_to_id = {c: i for i, c in enumerate(vocab) if i > UNK_ID}
            self.model_type = "char"
        else:
            import sentencepiece as spm

            if spm_model is None:
                raise ValueError("a sentencepiece tokenizer needs spm_model bytes")
            self._spm = spm.SentencePieceProcessor(model_proto=spm_model)
            if self._spm.unk_id() != 0 or self._spm.bos_id() >= 0 or self._spm.eos_id() >= 0:
                raise ValueError("spm model must have unk_id 0 and no bos/eos pieces")
            self._pieces = [BLANK] + [
                self._spm.id_to_piece(i) for i in range(self._spm.get_piece_size())
            ]
            self._pieces[UNK_ID] = UNK
            if model_type not in SPM_MODEL_TYPES:
                raise ValueError(f"model_type must be one of {SPM_MODEL_TYPES}, got {model_type!r}")
            self.model_type = model_type

    # -- properties -------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of output labels, blank and <unk> included."""
        return len(self._pieces)

    @property
    def blank_id(self) -> int:
        return BLANK_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def pieces(self) -> list[str]:
        """The piece string of every id (index = id)."""
        return list(self._pieces)

    # -- encode / decode --------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Normalizes ``text`` and returns ids in [1, vocab_size); never the blank.

        Characters outside the vocabulary become ``unk_id`` (count them with
        :meth:`count_unk`).
        """
        text = normalize_text(text)
        if self._spm is None:
            get = self._char_to_id.get
            return [get(c, UNK_ID) for c in text]
        return [i + 1 for i in self._spm.encode(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """Maps ids back to text, dropping blanks and ``<unk>`` (they have no spelling).

        Raises:
          ValueError: an id outside [0, vocab_size).
        """
        kept = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"id {i} outside the vocabulary [0, {self.vocab_size})")
            if i > UNK_ID:
                kept.append(i)
        if self._spm is None:
            return "".join(self._pieces[i] for i in kept)
        return self._spm.decode([i - 1 for i in kept])

    def count_unk(self, ids: Iterable[int]) -> int:
        """Number of ``<unk>`` ids in an encoded sequence."""
        return sum(1 for i in ids if i == UNK_ID)

    # -- persistence ------------------------------------------------------------------------

    def save(self, directory: str) -> None:
        """Writes ``directory/tokenizer.json`` (+ ``spm.model``); creates the directory."""
        os.makedirs(directory, exist_ok=True)
        config = {
            "kind": self.kind,
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "blank_id": BLANK_ID,
            "unk_id": UNK_ID,
            "normalization": "lowercase, collapse whitespace, strip",
            "vocab": self._pieces,
        }
        if self._spm_model is not None:
            files.atomic_write(os.path.join(directory, SPM_FILE), self._spm_model)
            config["spm_model"] = SPM_FILE
        text = json.dumps(config, ensure_ascii=False, indent=1)
        files.atomic_write(os.path.join(directory, CONFIG_FILE), text)

    @classmethod
    def load(cls, directory: str) -> Tokenizer:
        """Reads a tokenizer written by :meth:`save`.

        Raises:
          FileNotFoundError: no ``tokenizer.json`` (or its ``spm.model``) in ``directory``.
          UserError: ``tokenizer.json`` names a model outside ``directory``.
        """
        path = files.inside(directory, CONFIG_FILE, directory)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"no tokenizer at {path}; `python -m data_prep.prepare ... --split train` "
                "trains one into DIR/tokenizer/"
            )
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        if config["kind"] == "char":
            return cls(kind="char", vocab=config["vocab"])
        # A tokenizer may come with a dataset or run from elsewhere: its files stay in it.
        spm_path = files.inside(directory, config.get("spm_model", SPM_FILE), path)
        if not os.path.isfile(spm_path):
            raise FileNotFoundError(f"{path} names a SentencePiece model but {spm_path} is missing")
        with open(spm_path, "rb") as f:
            tok = cls(kind=config["kind"], spm_model=f.read(), model_type=config["model_type"])
        if tok.vocab_size != config["vocab_size"]:
            raise ValueError(f"{spm_path} has {tok.vocab_size} ids, {path} says {config}")
        return tok

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tokenizer):
            return NotImplemented
        return (
            self.kind == other.kind
            and self.model_type == other.model_type
            and self._pieces == other._pieces
            and self._spm_model == other._spm_model
        )

    def __hash__(self) -> int:
        return hash((self.kind, tuple(self._pieces)))

    def __repr__(self) -> str:
        return (
            f"Tokenizer(kind={self.kind!r}, model_type={self.model_type!r}, "
            f"vocab_size={self.vocab_size})"
        )


def train_char_tokenizer(texts: Iterable[str]) -> Tokenizer:
    """Builds a character tokenizer: [<blank>, <unk>, *sorted characters of the normalized
    texts] (space included)."""
    chars: set[str] = set()
    for t in texts:
        chars.update(normalize_text(t))
    return Tokenizer(kind="char", vocab=[BLANK, UNK, *sorted(chars)])


def train_sentencepiece_tokenizer(
    texts: Iterable[str],
    model_type: str = "unigram",
    vocab_size: int = 256,
    *,
    character_coverage: float = 1.0,
    num_threads: int | None = None,
) -> Tokenizer:
    """Trains a SentencePiece model on the normalized texts.

    Args:
      texts: raw transcripts (normalized here; empty ones are ignored).
      model_type: "bpe" or "unigram".
      vocab_size: total labels INCLUDING the blank, i.e. SentencePiece gets vocab_size - 1
        pieces (its <unk> among them), so the model's output layer is exactly vocab_size.
      character_coverage: SentencePiece's share of characters to cover; 1.0 suits small
        alphabets, ~0.9995 suits CJK.
      num_threads: trainer threads (default: CPU count).

    Raises:
      ValueError: bad model_type, or the corpus cannot support the vocabulary size.
    """
    import sentencepiece as spm

    if model_type not in SPM_MODEL_TYPES:
        raise ValueError(f"model_type must be one of {SPM_MODEL_TYPES}, got {model_type!r}")
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be >= 3 (blank, unk, one piece), got {vocab_size}")
    normalized = [n for n in (normalize_text(t) for t in texts) if n]
    if not normalized:
        raise ValueError("cannot train a SentencePiece model on no (non-empty) text")
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(normalized),
            model_writer=buf,
            model_type=model_type,
            vocab_size=vocab_size - 1,  # + our blank = vocab_size.
            character_coverage=character_coverage,
            # Text is normalized by normalize_text so char and spm tokenizers agree on it.
            normalization_rule_name="identity",
            unk_id=0,
            bos_id=-1,  # CTC/RNN-T need no sentence markers.
            eos_id=-1,
            pad_id=-1,
            num_threads=num_threads or os.cpu_count() or 1,
            minloglevel=2,  # Its INFO log is a screenful per run.
        )
    except RuntimeError as e:
        raise ValueError(
            f"SentencePiece {model_type} training with vocab_size={vocab_size} failed on "
            f"{len(normalized)} sentences (SentencePiece's sizes below exclude our blank): {e}"
        ) from e
    return Tokenizer(kind="sentencepiece", spm_model=buf.getvalue(), model_type=model_type)
