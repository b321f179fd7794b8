"""Transcribe audio files with an exported ONNX artifact: onnxruntime, numpy, soundfile
(and sentencepiece for a SentencePiece tokenizer); no jax, no jaxspeech.

    python examples/transcribe_onnx.py --artifact DIR [--int8] [--streaming] [--threads N] a.wav

DIR is `python -m jaxspeech.export --format onnx --output DIR`'s output: its
manifest.json names the functions, the audio they take and the tokenizer. Greedy
decoding: CTC (argmax per frame, repeats collapsed, blanks dropped) when the artifact
has `ctc`, else the transducer's (per frame, the joiner on the last emitted token's
predictor output until it picks the blank, at most `max_symbols_per_frame` tokens per
frame). `--streaming` (a streaming model's artifact) feeds the audio through the stream
functions a chunk at a time, as a live recognizer would, decoding each chunk's frames
as they come (`--partial` prints the text so far after every chunk, on stderr); the
text is the same as the whole-utterance decoding's. Prints `path<TAB>text` per file.
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
        padded = _padded(audio, max(len(audio), self.min_samples))
        length = np.array([len(audio)], np.int32)
        decoder = self.decoder()
        name = "ctc" if "ctc" in self.sessions else "encoder"
        frames, n = self.run(name, padded, length)
        return decoder(frames[0, : int(n[0])])

    def decoder(self):
        """A greedy decoder that takes the frames a chunk at a time ((T, V) CTC log-probs,
        else (T, J) encoder projections) and returns all tokens so far after each."""
        tokens: list[int] = []
        if "ctc" in self.sessions:
            last = [BLANK]

            def ctc(frames: np.ndarray) -> list[int]:
                for k in np.argmax(frames, axis=-1).tolist():
                    if k != last[0] and k != BLANK:
                        tokens.append(k)
                    last[0] = k
                return list(tokens)

            return ctc
        blank = np.array([BLANK], np.int32)
        state = self.run("predictor_init", blank)
        pred_state = self.run("predictor_step", *state, blank)  # [pred, *state]

        def transducer(frames: np.ndarray) -> list[int]:
            for frame in frames:
                for _ in range(self.max_symbols):
                    (log_probs,) = self.run("joiner", frame[None], pred_state[0])
                    k = int(np.argmax(log_probs[0]))
                    if k == BLANK:
                        break
                    tokens.append(k)
                    step = self.run("predictor_step", *pred_state[1:], np.array([k], np.int32))
                    pred_state[:] = step
            return list(tokens)

        return transducer

    def stream_ids(self, audio: np.ndarray, on_partial=None) -> list[int]:
        """One utterance through the stream functions, a chunk at a time (see the
        manifest's "streaming"); `on_partial(ids)` after every chunk."""
        info = self.manifest.get("streaming")
        if not info:
            raise ValueError("this artifact's model does not stream (no stream functions)")
        first, step = int(info["first_samples"]), int(info["step_samples"])
        which = 0 if "ctc" in self.sessions else info["outputs"].index("enc_proj")
        n_out = len(info["outputs"]) + 1  # the heads' outputs and valid, then the state
        decoder, ids = self.decoder(), []

        def emit(out):
            nonlocal ids
            frames, valid = out[which][0], out[n_out - 1][0]
            ids = decoder(frames[valid])
            if on_partial is not None:
                on_partial(ids)

        if len(audio) <= first:  # ends within the first chunk
            length = np.array([len(audio)], np.int32)
            emit(self.run("stream_flush_first", _padded(audio, first), length))
            return ids
        out = self.run("stream_first", _padded(audio[:first], first))
        emit(out)
        pos = first
        while len(audio) - pos >= step:
            out = self.run("stream_step", *out[n_out:], _padded(audio[pos : pos + step], step))
            emit(out)
            pos += step
        length = np.array([len(audio) - pos], np.int32)
        emit(self.run("stream_flush", *out[n_out:], _padded(audio[pos:], step), length))
        return ids

    def transcribe(self, audio: np.ndarray, *, streaming: bool = False, on_partial=None) -> str:
        if streaming:
            partial = None if on_partial is None else lambda ids: on_partial(self.decode_ids(ids))
            return self.decode_ids(self.stream_ids(audio, partial))
        return self.decode_ids(self.transcribe_ids(audio))


def _padded(audio: np.ndarray, n: int) -> np.ndarray:
    """(1, n) float32: the audio, then zeros (past its true length, which goes alongside)."""
    out = np.zeros((1, n), np.float32)
    out[0, : len(audio)] = audio
    return out


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
    parser.add_argument(
        "--streaming", action="store_true", help="Decode chunk by chunk (a streaming model)."
    )
    parser.add_argument(
        "--partial", action="store_true", help="With --streaming: the text after each chunk."
    )
    parser.add_argument("files", nargs="+", help="Audio files (wav, flac, ...).")
    args = parser.parse_args(argv)
    if args.partial and not args.streaming:
        parser.error("--partial needs --streaming")
    artifact = Artifact(args.artifact, int8=args.int8, threads=args.threads)
    if args.streaming and not artifact.manifest.get("streaming"):
        parser.error(f"{args.artifact}: the model does not stream (export a causal, chunked one)")
    for path in args.files:

        def partial(text: str, path: str = path) -> None:
            print(f"{path}\t... {text}", file=sys.stderr, flush=True)

        audio = artifact.read(path)
        text = artifact.transcribe(
            audio, streaming=args.streaming, on_partial=partial if args.partial else None
        )
        print(f"{path}\t{text}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
