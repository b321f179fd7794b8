"""Transcribe audio files of any length with a trained run:
`python -m jaxspeech.transcribe --workdir RUN a.wav b.flac ...`.

Each file (any format libsndfile reads, any rate and channel count) is decoded in
pieces cut at pauses, and in overlapping windows where speech runs on
(`jaxspeech.longform`), with the run's config.decoding or the
command line's decoder and LM, and printed as its text followed by one line per word
with its start and end in seconds; `--json` prints one JSON object per file instead. A
file that cannot be read is reported, counted and skipped; the exit code is then 1.
Runs in one process, on all of its devices.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import jax
import numpy as np
import soundfile as sf
from absl import app, flags, logging
from flax import nnx

from jaxspeech import cli, evaluate, longform, search
from jaxspeech import state as state_lib
from jaxspeech.decoding.lm import TokenWords
from jaxspeech.errors import UserError
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules


def window_decoder(run: state_lib.Run, config, max_seconds: float) -> longform.WindowDecoder:
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
    run: state_lib.Run,
    config,
    *,
    window_s: float,
    overlap_s: float,
    batch: int,
    emit: Callable[[dict], None],
    min_pause_s: float = 0.25,
) -> int:
    """Transcribe each file, `emit` each result ({"path", "text", "words", "seconds",
    "decode_seconds"} or {"path", "error"}); returns the number of files that failed."""
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

        try:
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
            )
        except (OSError, sf.SoundFileError) as e:  # missing, unreadable or not audio
            failed += 1
            emit({"path": path, "error": f"{type(e).__name__}: {e}"})
            continue
        emit(
            {
                "path": path,
                "text": " ".join(w.text for w in found),
                "words": [
                    {"word": w.text, "start": round(w.start, 3), "end": round(w.end, 3)}
                    for w in found
                ],
                "seconds": round(samples[0] / rate, 3),
                "decode_seconds": round(time.perf_counter() - t0, 3),
            }
        )
    return failed


def print_result(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result), flush=True)
    elif "error" in result:
        print(f"error: {result['path']}: {result['error']}", file=sys.stderr, flush=True)
    else:
        print(f"{result['path']}: {result['text']}")
        for w in result["words"]:
            print(f"  {w['start']:8.2f} {w['end']:8.2f}  {w['word']}")
        sys.stdout.flush()


FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    paths = argv[1:]
    if not paths:
        cli.usage_error("give one or more audio files to transcribe")
    if FLAGS.overlap_s >= FLAGS.window_s:
        cli.usage_error(f"--overlap_s ({FLAGS.overlap_s}) must be less than --window_s")

    def job() -> None:
        if jax.process_count() > 1:
            raise UserError("transcribe runs in one process (use evaluate for multi-host jobs)")
        try:
            config = evaluate.run_eval_config(
                FLAGS.workdir, FLAGS.method, FLAGS.beam, None, search.flag_overrides()
            )
            with rules.axis_rules(state_lib.rules_from_config(config)):
                run = state_lib.load_run(FLAGS.workdir, step=FLAGS.step, config=config)
                failed = transcribe_files(
                    paths,
                    run,
                    config,
                    window_s=FLAGS.window_s,
                    overlap_s=FLAGS.overlap_s,
                    batch=FLAGS.batch,
                    emit=lambda r: print_result(r, FLAGS.json),
                    min_pause_s=FLAGS.min_pause_s,
                )
        except (FileNotFoundError, ValueError) as e:
            raise UserError(str(e)) from e
        if failed:
            print(f"error: {failed} of {len(paths)} files could not be read", file=sys.stderr)
            sys.exit(1)

    cli.run_job(job)


if __name__ == "__main__":
    flags.DEFINE_string("workdir", None, "Run directory written by jaxspeech.train.", required=True)
    flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
    search.define_flags()
    flags.DEFINE_float("window_s", 20.0, "Seconds of audio per decoded window.", lower_bound=1.0)
    flags.DEFINE_float(
        "overlap_s", 2.0, "Seconds consecutive windows share (cut in the middle).", lower_bound=0
    )
    flags.DEFINE_float(
        "min_pause_s",
        0.25,
        "Cut the audio in the middle of pauses this long (0: overlapping windows only).",
        lower_bound=0,
    )
    flags.DEFINE_integer("batch", 8, "Pieces decoded at once.", lower_bound=1)
    flags.DEFINE_bool("json", False, "One JSON object per file instead of text.")
    logging.set_verbosity(logging.WARNING)
    app.run(main, flags_parser=cli.parse_flags)
