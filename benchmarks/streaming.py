"""A streaming model decoded chunk by chunk: WER per chunk size and emission latency.

`python benchmarks/streaming.py --workdir runs/demo-streaming --data data/demo/shards`

For each attention chunk size of `--chunks` (encoder frames; the run must be a causal
Conformer, best trained with dynamic chunks: `configs/demo.py:streaming`), every dev and
test utterance goes through the model's stream functions one chunk at a time
(`search.StreamDecoder`, what `evaluate --streaming` runs) and is decoded greedily; the
same model is also decoded in full context (chunk size 0, masked full-sequence pass).
Reports WER/CER per chunk size, the real-time factor of the chunk-by-chunk decoding, and
the emission latency: for every label that a chunked decoding and the full-context
decoding both emit (matched by a minimum-edit alignment of the two label sequences), the
frames between its emission in the two; and, for a live stream, how long a label waits
for its chunk to be complete (frames from the label's frame to its chunk's end; the
compute time of a step comes on top).

Prints a table and writes `benchmarks/results/streaming.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import jax
import numpy as np
from flax import nnx
from rapidfuzz.distance import Levenshtein

from jaxspeech.config import build
from jaxspeech.data import reader
from jaxspeech.data.tokenizer import normalize_text
from jaxspeech.decoding import ctc, search
from jaxspeech.evaluation import run as eval_run
from jaxspeech.metrics.wer import ErrorCounts
from jaxspeech.parallel import rules
from jaxspeech.runs import loading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
BATCH = 16
PAD_SECONDS = 2.0


def full_context(run, config, audio: list[np.ndarray]) -> list[tuple[list[int], list[int]]]:
    """Greedy CTC labels and their frames of the masked full-sequence pass."""
    decode = search.make_decode_fn(run.spec.graphdef, config, run.tokenizer.blank_id)
    rate = int(config.features.sample_rate)
    pad, out = int(PAD_SECONDS * rate), []
    with jax.set_mesh(run.spec.mesh):
        for i in range(0, len(audio), BATCH):
            group = audio[i : i + BATCH]
            width = pad * math.ceil(max(len(a) for a in group) / pad)
            x, lens = np.zeros((BATCH, width), np.float32), np.zeros(BATCH, np.int32)
            for row, a in enumerate(group):
                x[row, : len(a)], lens[row] = a, len(a)
            got = jax.device_get(decode(run.params, run.model_vars, x, lens))
            out += ctc.collapse_with_frames(got["ids"], got["lengths"])[: len(group)]
    return out


def chunked(run, config, audio: list[np.ndarray]) -> tuple[list, float]:
    """Greedy CTC labels and frames through the stream functions; seconds taken."""
    longest = max(len(a) for a in audio) / int(config.features.sample_rate)
    stream = search.StreamDecoder(
        run.spec.graphdef, run.params, run.model_vars, config, run.tokenizer.blank_id, longest
    )
    t0, out = time.perf_counter(), []
    for i in range(0, len(audio), BATCH):
        group = audio[i : i + BATCH]
        width = max(len(a) for a in group)
        x, lens = np.zeros((len(group), width), np.float32), np.zeros(len(group), np.int32)
        for row, a in enumerate(group):
            x[row, : len(a)], lens[row] = a, len(a)
        got = stream(x, lens)
        out += ctc.collapse_with_frames(got["ids"], got["lengths"])
    return out, time.perf_counter() - t0


def delays(streamed: list, full: list) -> list[int]:
    """Frames from each label's full-context emission to its chunked one (matched labels)."""
    out = []
    for (a, fa), (b, fb) in zip(streamed, full):
        for op in Levenshtein.opcodes(b, a):
            if op.tag == "equal":
                out += [
                    fa[op.dest_start + k] - fb[op.src_start + k]
                    for k in range(op.src_end - op.src_start)
                ]
    return out


def scores(hyps: list, refs: list[str], tokenizer) -> dict:
    counts = ErrorCounts()
    for (labels, _), ref in zip(hyps, refs):
        counts.add(ref, tokenizer.decode(labels))
    return {"wer": round(counts.wer, 5), "cer": round(counts.cer, 5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--chunks", default="4,16")
    args = ap.parse_args()

    result: dict = {"machine": environment.machine(), "rows": []}
    data = {}
    for split in ("dev", "test"):
        recs = reader.read_split_records(args.data, split)
        data[split] = (
            [reader.audio_float32(r) for r in recs],
            [normalize_text(r["text"]) for r in recs],
        )
    base = eval_run.run_eval_config(args.workdir, "ctc_greedy", None, None, {"chunk_size": 0})
    with rules.axis_rules(build.rules_from_config(base)):
        run = loading.load_run(args.workdir, config=base)
        full = {s: full_context(run, base, audio) for s, (audio, _) in data.items()}
        result["step"] = run.step
        model = nnx.merge(run.spec.graphdef, run.params, run.model_vars)
        frame_ms = 1000 * model.frame_samples / int(base.features.sample_rate)
        result["frame_ms"] = frame_ms
        for split, (_, refs) in data.items():
            row = {"split": split, "chunk_frames": 0} | scores(full[split], refs, run.tokenizer)
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
        for c in (int(x) for x in args.chunks.split(",")):
            config = eval_run.run_eval_config(
                args.workdir, "ctc_greedy", None, None, {"chunk_size": c, "streaming": True}
            )
            run_c = loading.load_run(args.workdir, config=config)
            for split, (audio, refs) in data.items():
                hyps, seconds = chunked(run_c, config, audio)
                d = np.array(delays(hyps, full[split]))
                # A label at frame f is out when its chunk is complete: (f // c + 1) * c.
                wait = np.array([(f // c + 1) * c - f for _, fr in hyps for f in fr])
                total_s = sum(len(a) for a in audio) / int(config.features.sample_rate)
                row = {"split": split, "chunk_frames": c} | scores(hyps, refs, run.tokenizer)
                row |= {
                    "rtf": round(seconds / total_s, 4),
                    "matched_labels": int(d.size),
                    "delay_mean_frames": round(float(d.mean()), 2),
                    "delay_p90_frames": float(np.percentile(d, 90)),
                    "delay_max_frames": int(d.max()),
                    "chunk_wait_mean_frames": round(float(wait.mean()), 2),
                    "chunk_ms": c * frame_ms,
                }
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
    results.write_json(os.path.join(RESULTS, "streaming.json"), result)
    print("| chunk | split | WER | CER | x real time | emission delay vs full context, "
          "mean / p90 / max frames | wait for the chunk, mean ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        chunk = (
            f"{r['chunk_frames']} ({r.get('chunk_ms', 0):.0f} ms)" if r["chunk_frames"] else "full"
        )
        delay = (
            f"{r['delay_mean_frames']} / {r['delay_p90_frames']:g} / {r['delay_max_frames']}"
            if r["chunk_frames"]
            else ""
        )
        wait = (
            f"{r['chunk_wait_mean_frames'] * result['frame_ms']:.0f}" if r["chunk_frames"] else ""
        )
        print(
            f"| {chunk} | {r['split']} | {r['wer']:.2%} | {r['cer']:.2%} | {r.get('rtf', '')} | "
            f"{delay} | {wait} |"
        )


if __name__ == "__main__":
    main()
