"""Transcribe audio files with a trained run: batches of short files on the mesh, long
files in overlapping windows (`jaxspeech.serving.longform`), word times, silence left
undecoded (`longform.SpeechGate`), and a progress line for long files."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TextIO

import jax
import numpy as np
import soundfile as sf
from flax import nnx

from jaxspeech.decoding import search
from jaxspeech.decoding.lm import TokenWords
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import loading
from jaxspeech.serving import longform
from jaxspeech.serving.progress import FileProgress

# Files at most this long get no progress line: they take seconds, and a batch of short
# files would fill the screen with finished bars.
PROGRESS_MIN_S = 60.0


def window_decoder(run: loading.Run, config, max_seconds: float) -> longform.WindowDecoder:
    """decode(audio (B, S), audio_len (B,)) -> per row (labels, frames) with `config`'s
    decoding: on the run's mesh (B a multiple of its batch shards), or with
    decoding.streaming through the stream functions, row by row (pieces of up to
    `max_seconds`)."""
    mesh = run.spec.mesh
    blank = run.tokenizer.blank_id
    searcher = search.Searcher(config, run.tokenizer, run.spec.graphdef)
    with jax.set_mesh(mesh):
        hypotheses = searcher.bind(run.params, run.model_vars, with_frames=True)
    if config.decoding.get("streaming", False):
        stream = search.StreamDecoder(
            run.spec.graphdef, run.params, run.model_vars, config, blank, max_seconds
        )
        return lambda audio, lens: hypotheses(stream(audio, lens))
    decode = search.make_decode_fn(run.spec.graphdef, config, blank)

    def fn(audio: np.ndarray, lens: np.ndarray) -> list:
        with jax.set_mesh(mesh):
            arrays = mesh_lib.host_to_global(mesh, {"audio": audio, "audio_len": lens})
            out = decode(run.params, run.model_vars, arrays["audio"], arrays["audio_len"])
            out = {k: mesh_lib.to_host_local(mesh, v) for k, v in out.items()}
        return hypotheses(out)

    return fn


def batch_size(requested: int, mesh) -> int:
    """`requested` rounded up to a multiple of the mesh's batch shards."""
    unit = mesh_lib.num_batch_shards(mesh)
    return unit * max(1, -(-requested // unit))


def transcribe_files(
    paths: list[str],
    run: loading.Run,
    config,
    *,
    window_s: float,
    overlap_s: float,
    batch: int,
    emit: Callable[[dict], None],
    min_pause_s: float = 0.25,
    gate: longform.SpeechGate | None = longform.DEFAULT_GATE,
    progress: TextIO | None = None,
    progress_min_s: float = PROGRESS_MIN_S,
) -> int:
    """Transcribe each file, `emit` each result (see `file_result`, or {"path", "error"});
    returns the number of files that failed (missing, not audio, or with NaN or infinite
    samples). A result's "file_rate" is the file's own sample rate (another than the
    model's is resampled). With a `progress` stream, a file longer than
    `progress_min_s` (by its header) gets a progress line there (`FileProgress`)."""
    batch = batch_size(batch, run.spec.mesh)
    decode = window_decoder(run, config, window_s)
    words = TokenWords.from_tokenizer(run.tokenizer)
    rate = int(config.features.sample_rate)
    frame_samples = nnx.merge(run.spec.graphdef, run.params, run.model_vars).frame_samples
    failed = 0
    for path in paths:
        t0 = time.perf_counter()
        samples = [0]  # of this file, counted as the windows read it

        def counted(blocks, total=samples):
            for block in blocks:
                total[0] += len(block)
                yield block

        bar = None
        if not os.path.isfile(path):  # libsndfile would say only "System error"
            failed += 1
            emit({"path": path, "error": "not found" if not os.path.exists(path) else "not a file"})
            continue
        try:
            info = sf.info(path)
            if progress is not None and info.duration > progress_min_s:
                tty = hasattr(progress, "isatty") and progress.isatty()
                bar = FileProgress(path, info.duration, progress, tty=tty)
            found = longform.transcribe(
                counted(longform.read_audio_blocks(path, rate)),
                decode,
                words,
                rate=rate,
                frame_samples=frame_samples,
                window_s=window_s,
                overlap_s=overlap_s,
                min_pause_s=min_pause_s,
                batch=batch,
                gate=gate,
                progress=None if bar is None else bar.update,
            )
        except (OSError, sf.SoundFileError) as e:  # missing, unreadable or not audio
            failed += 1
            emit({"path": path, "error": f"{type(e).__name__}: {e}"})
            continue
        except longform.NonFiniteAudio as e:  # its words so far are dropped with it
            failed += 1
            emit({"path": path, "error": str(e).removeprefix(f"{path}: ")})
            continue
        finally:
            if bar is not None:
                bar.close()
        result = file_result(path, found, samples[0] / rate, time.perf_counter() - t0)
        emit(dict(result, file_rate=int(info.samplerate)))
    return failed


def file_result(path: str, found: longform.Transcript, seconds: float, took: float) -> dict:
    """One file's result: its "text", its "words" with "start" and "end" seconds, its
    "seconds" of audio and "decode_seconds" of wall time; "skipped_silence_s" and
    "skipped_noise_s": seconds not decoded as silence or as steady noise;
    "dropped_words": the decoded words left out, each with its decoder times and "reason"
    ("silence" or "too long", `longform.SpeechGate`)."""

    def word(w: longform.Word) -> dict:
        return {"word": w.text, "start": round(w.start, 3), "end": round(w.end, 3)}

    return {
        "path": path,
        "text": " ".join(w.text for w in found.words),
        "words": [word(w) for w in found.words],
        "seconds": round(seconds, 3),
        "decode_seconds": round(took, 3),
        "skipped_silence_s": round(found.skipped_s, 3),
        "skipped_noise_s": round(found.noise_s, 3),
        "dropped_words": [dict(word(d.word), reason=d.reason) for d in found.dropped],
    }
