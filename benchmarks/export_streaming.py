"""Exported streaming functions in onnxruntime: the cost of a chunk against the whole
utterance, on a demo-size streaming Conformer-CTC.

`python benchmarks/export_streaming.py [--chunks 4,8,16] [--threads 1] [--seconds 10]`

For each chunk size C (encoder frames per step; 40 ms each at x4 subsampling), the
demo config's model made causal with chunked attention (C frames, 64 frames of
history), randomly initialized (timings and equivalence do not depend on training),
is exported with `jaxspeech.serving.recognizer_export.export_onnx` (float32) and run in
onnxruntime on `--seconds` of noise:

- streamed: `stream_first`, every `stream_step`, `stream_flush`; the median time of one
  `stream_step` after a warm-up, the audio it covers, its real-time factor, and the
  audio a stream must receive before the first output (the first call's samples);
- the reference beside it: the whole utterance through the artifact's `ctc` function
  (the same model, full sequence with the chunk mask): time and real-time factor;
- agreement: the largest |difference| between the streamed frames and the whole
  utterance's log-probs, and whether the frame counts are equal.

Prints a table and writes `benchmarks/results/export_streaming.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
from flax import nnx

from configs import demo
from jaxspeech.config import build
from jaxspeech.serving import recognizer_export as export_lib
from jaxspeech.serving import staging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
RATE = 16000
VOCAB = 32  # about the demo's character vocabulary
HISTORY = 64  # encoder frames of attention cache (2.56 s at 40 ms a frame)


def export_streaming_model(chunk: int, output: str) -> dict:
    """The demo model made streaming with `chunk` frames per step, exported to ONNX."""
    config = demo.get_config()
    conformer = config.model.conformer
    conformer.causal, conformer.chunk_size = True, chunk
    conformer.left_chunks = HISTORY // chunk
    model = build.make_model(config, VOCAB, 0)
    _, params, _ = nnx.split(model, nnx.Param, ...)
    f = config.features.num_mel_bins
    stats = build.feature_stats(np.full(f, -5.0), np.full(f, 3.0))
    arguments = build.model_arguments(config, VOCAB)
    return export_lib.export_onnx(
        arguments,
        nnx.to_pure_dict(params),
        stats,
        RATE,
        output,
        staging.default_onnx_python(),
    )


def _sessions(directory: str, described: dict, threads: int) -> dict:
    import onnxruntime as ort  # noqa: PLC0415 (the `onnx` extra)

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    return {
        name: ort.InferenceSession(os.path.join(directory, d["file"]), options)
        for name, d in described.items()
    }


def _call(session, *arrays):
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, arrays, strict=True)))


def stream(sessions: dict, audio: np.ndarray, first: int, step: int) -> tuple:
    """One stream through the stream functions -> (log-probs of the valid frames, the
    seconds of every stream_step call)."""
    out = _call(sessions["stream_first"], audio[None, :first])
    frames, times, pos = [out[0][0][out[1][0]]], [], first
    while len(audio) - pos >= step:
        t0 = time.perf_counter()
        out = _call(sessions["stream_step"], *out[2:], audio[None, pos : pos + step])
        times.append(time.perf_counter() - t0)
        frames.append(out[0][0][out[1][0]])
        pos += step
    rest = np.zeros((1, step), np.float32)
    rest[0, : len(audio) - pos] = audio[pos:]
    lp, valid = _call(
        sessions["stream_flush"], *out[2:], rest, np.array([len(audio) - pos], np.int32)
    )
    frames.append(lp[0][valid[0]])
    return np.concatenate(frames), times


def measure_chunk(chunk: int, audio: np.ndarray, threads: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        described = export_streaming_model(chunk, d)
        export_seconds = time.perf_counter() - t0
        sessions = _sessions(d, described, threads)
        first = described["stream_first"]["inputs"][0]["shape"][1]
        step = described["stream_step"]["inputs"][-1]["shape"][1]
        first, step = int(first), int(step)
        stream(sessions, audio, first, step)  # warm-up
        streamed, step_times = stream(sessions, audio, first, step)
        length = np.array([len(audio)], np.int32)
        _call(sessions["ctc"], audio[None], length)  # warm-up
        whole_times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            lp, n = _call(sessions["ctc"], audio[None], length)
            whole_times.append(time.perf_counter() - t0)
    t = int(n[0])
    step_s, whole_s = float(np.median(step_times)), float(np.median(whole_times))
    return {
        "chunk_frames": chunk,
        "chunk_ms": 1e3 * step / RATE,
        "first_output_after_ms": 1e3 * first / RATE,
        "step_ms": 1e3 * step_s,
        "step_rtf": step_s / (step / RATE),
        "steps_timed": len(step_times),
        "whole_ms": 1e3 * whole_s,
        "whole_rtf": whole_s / (len(audio) / RATE),
        "frames_equal": bool(len(streamed) == t),
        "max_abs_diff_vs_whole": float(np.max(np.abs(streamed - lp[0, :t])))
        if len(streamed) == t
        else None,
        "export_seconds": export_seconds,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", default="4,8,16", help="Encoder frames per step, comma-separated.")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(RESULTS, "export_streaming.json"))
    args = ap.parse_args(argv)
    audio = (0.1 * np.random.default_rng(0).standard_normal(int(args.seconds * RATE))).astype(
        np.float32
    )
    rows = []
    for chunk in (int(c) for c in args.chunks.split(",")):
        rows.append(measure_chunk(chunk, audio, args.threads, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "model": "configs/demo.py Conformer-CTC (144 dim, 8 layers), causal, chunked, random init",
        "history_frames": HISTORY,
        "seconds": args.seconds,
        "threads": args.threads,
        "machine": environment.machine(),
        "cpu_count": os.cpu_count(),
        "rows": rows,
    }
    print(
        f"| C (frames) | chunk ms | first output after ms | step ms ({args.threads} thread) | "
        f"step RTF | whole {args.seconds:.0f} s ms | whole RTF | max abs diff |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        diff = r["max_abs_diff_vs_whole"]
        print(
            f"| {r['chunk_frames']} | {r['chunk_ms']:.0f} | {r['first_output_after_ms']:.0f} | "
            f"{r['step_ms']:.1f} | {r['step_rtf']:.3f} | {r['whole_ms']:.0f} | "
            f"{r['whole_rtf']:.3f} | {'frames differ' if diff is None else f'{diff:.1e}'} |"
        )
    results.save_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
