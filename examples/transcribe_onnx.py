"""Transcribe audio files with an exported ONNX artifact: onnxruntime, numpy, soundfile
(and sentencepiece for a SentencePiece tokenizer); no jax, no jaxspeech.

    python examples/transcribe_onnx.py --artifact DIR [--int8] [--threads N] a.wav b.flac

DIR is `python -m jaxspeech.export --format onnx --output DIR`'s output: its
manifest.json names the functions, the audio they take and the tokenizer. Greedy
decoding: CTC (argmax per frame, repeats collapsed, blanks dropped) when the artifact
has `ctc`, else the transducer's (the encoder once; then per frame, the joiner on the
last emitted token's predictor output until it picks the blank, at most
`max_symbols_per_frame` tokens per frame). Prints `path<TAB>text` per file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import onnxruntime as ort
import soundfile as sf

BLANK, UNK = 0, 1  # jaxspeech's reserved ids: neither has a spelling


class Artifact:
    """An exported model's sessions, audio settings and tokenizer."""

    def __init__(self, directory: str, *, int8: bool = False, threads: int = 1):
        with open(os.path.join(directory, "manifest.json")) as f:
            self.manifest = json.load(f)
        if self.manifest["format"] != "onnx":
            raise ValueError(f"{directory} holds a {self.manifest['format']} artifact, not onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.sessions = {}
        for name, fn in self.manifest["functions"].items():
            file = fn.get("int8_file", fn["file"]) if int8 else fn["file"]
            if int8 and "int8_file" not in fn and name in ("ctc", "encoder"):
                raise ValueError(f"{directory} has no int8 {name}: export with --int8")
            path = os.path.join(directory, file)
            self.sessions[name] = ort.InferenceSession(
                path, options, providers=["CPUExecutionProvider"]
            )
        self.sample_rate = int(self.manifest["audio"]["sample_rate"])
        self.min_samples = int(self.manifest["audio"]["min_samples"])
        self.max_symbols = int(self.manifest["run"]["decoding"].get("max_symbols_per_frame", 4))
        self.decode_ids = load_tokenizer(os.path.join(directory, self.manifest["tokenizer"]["dir"]))

    def run(self, name: str, *arrays: np.ndarray) -> list[np.ndarray]:
        session = self.sessions[name]
        feeds = {i.name: a for i, a in zip(session.get_inputs(), arrays, strict=True)}
        return session.run(None, feeds)

    def read(self, path: str) -> np.ndarray:
        """A file as float32 mono samples in [-1, 1] at the artifact's rate."""
        audio, rate = sf.read(path, dtype="float32", always_2d=True)
        if rate != self.sample_rate:
            raise ValueError(
                f"{path}: {rate} Hz; the model takes {self.sample_rate} Hz (resample first, "
                f"e.g. `sox {path} -r {self.sample_rate} out.wav`)"
            )
        return audio.mean(axis=1)

    def transcribe_ids(self, audio: np.ndarray) -> list[int]:
        """One utterance's greedy token ids."""
        padded = np.zeros((1, max(len(audio), self.min_samples)), np.float32)
        padded[0, : len(audio)] = audio  # shorter audio: zeros past its true length
        length = np.array([len(audio)], np.int32)
        if "ctc" in self.sessions:
            log_probs, n = self.run("ctc", padded, length)
            best = np.argmax(log_probs[0, : int(n[0])], axis=-1)
            keep = np.ones(len(best), bool)
            keep[1:] = best[1:] != best[:-1]
            return [int(i) for i in best[keep] if i != BLANK]
        return self._transducer_greedy(padded, length)

    def _transducer_greedy(self, padded: np.ndarray, length: np.ndarray) -> list[int]:
        enc, n = self.run("encoder", padded, length)
        blank = np.array([BLANK], np.int32)
        state = self.run("predictor_init", blank)
        pred, *state = self.run("predictor_step", *state, blank)
        tokens = []
        for t in range(int(n[0])):
            for _ in range(self.max_symbols):
                (log_probs,) = self.run("joiner", enc[:, t], pred)
                k = int(np.argmax(log_probs[0]))
                if k == BLANK:
                    break
                tokens.append(k)
                pred, *state = self.run("predictor_step", *state, np.array([k], np.int32))
        return tokens

    def transcribe(self, audio: np.ndarray) -> str:
        return self.decode_ids(self.transcribe_ids(audio))


def load_tokenizer(directory: str):
    """tokenizer.json (+ spm.model) -> ids -> text, as jaxspeech's Tokenizer.decode."""
    with open(os.path.join(directory, "tokenizer.json")) as f:
        config = json.load(f)
    if config["kind"] == "char":
        vocab = config["vocab"]
        return lambda ids: "".join(vocab[i] for i in ids if i > UNK)
    import sentencepiece  # noqa: PLC0415 (only for SentencePiece tokenizers)

    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(directory, "spm.model"))
    return lambda ids: sp.decode([i - 1 for i in ids if i > UNK])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifact", required=True, help="Directory written by the export.")
    parser.add_argument("--int8", action="store_true", help="Use the int8 functions.")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads.")
    parser.add_argument("files", nargs="+", help="Audio files (wav, flac, ...).")
    args = parser.parse_args(argv)
    artifact = Artifact(args.artifact, int8=args.int8, threads=args.threads)
    for path in args.files:
        print(f"{path}\t{artifact.transcribe(artifact.read(path))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
