"""Exported ONNX models: float32 vs int8, accuracy, size and CPU latency in onnxruntime.

`python benchmarks/export.py --artifact DIR [--artifact DIR2 ...] --data DATA --split dev`
takes artifacts written by `python -m jaxspeech.export --format onnx --int8 ...` (one per
calibration method, say) and, with the runtime-only transcriber
(examples/transcribe_onnx.py: onnxruntime, greedy decoding, one utterance at a time):

- decodes every utterance of the split with the float32 model and each int8 model and
  scores it (jaxspeech.metrics.wer, the evaluator's scorer), next to the dev scores the
  export recorded for the JAX model (manifest.json);
- the size on disk of each model file;
- the latency of one 10 s utterance (the split's audio concatenated and cut to
  `--seconds`), onnxruntime with `--threads` intra-op threads (default 1), median of
  `--repeats` calls after one warm-up call, and the real-time factor.

Prints a table and writes `benchmarks/results/export.json`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import numpy as np

from jaxspeech.data import reader
from jaxspeech.data.tokenizer import normalize_text
from jaxspeech.metrics.wer import ErrorCounts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results, timing  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def _transcriber():
    path = os.path.join(HERE, "..", "examples", "transcribe_onnx.py")
    spec = importlib.util.spec_from_file_location("transcribe_onnx", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_split(data_dir: str, split: str) -> list[dict]:
    """Every utterance of a prepared split: normalized text, float32 audio (as the loader)."""
    return [
        {"text": normalize_text(r["text"]), "audio": reader.audio_float32(r)}
        for r in reader.read_split_records(data_dir, split)
    ]


def score(artifact, utts: list[dict]) -> dict:
    counts = ErrorCounts()
    for u in utts:
        counts.add(u["text"], artifact.transcribe(u["audio"]))
    return {"wer": counts.wer, "cer": counts.cer, "num_utts": counts.utterances}


def latency(artifact, audio: np.ndarray, repeats: int) -> float:
    """Median seconds of one utterance through the model (ids, no text), after a warm-up."""
    return timing.median_seconds(lambda: artifact.transcribe_ids(audio), repeats)


def measure(args) -> dict:
    transcriber = _transcriber()
    utts = read_split(args.data, args.split)
    rate = 16000
    long = np.concatenate([u["audio"] for u in utts])[: int(args.seconds * rate)]
    rows, jax_eval, step = [], None, None
    for i, directory in enumerate(args.artifact):
        with open(os.path.join(directory, "manifest.json")) as f:
            manifest = json.load(f)
        jax_eval, step = jax_eval or manifest["eval"], step or manifest["run"]["step"]
        with open(os.path.join(directory, "quantization.json")) as f:
            quant = json.load(f)
        name = "ctc" if "ctc" in manifest["functions"] else "encoder"
        fn = manifest["functions"][name]
        variants = ([("float32", False)] if i == 0 else []) + [(quant["method"], True)]
        for label, int8 in variants:
            artifact = transcriber.Artifact(directory, int8=int8, threads=args.threads)
            file = fn["int8_file"] if int8 else fn["file"]
            seconds = latency(artifact, long, args.repeats)
            row = {
                "model": "int8 " + label if int8 else label,
                "file": file,
                "mb": os.path.getsize(os.path.join(directory, file)) / 1e6,
                "latency_ms": seconds * 1e3,
                "rtf": seconds / (len(long) / rate),
                **score(artifact, utts),
            }
            if int8:
                row["calibration"] = quant["calibration"]
            rows.append(row)
            print(f"{row['model']}: CER {row['cer']:.2%} WER {row['wer']:.2%}", flush=True)
    base = rows[0]
    for r in rows[1:]:
        r["cer_delta"] = r["cer"] - base["cer"]
        r["goal_cer_within_0.5"] = bool(abs(r["cer_delta"]) <= 0.005)
    return {
        "split": args.split,
        "data": os.path.abspath(args.data),
        "jax_eval": jax_eval,
        "run_step": step,
        "utterance_seconds": len(long) / rate,
        "threads": args.threads,
        "repeats": args.repeats,
        "machine": environment.machine(),
        "cpu_count": os.cpu_count(),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", action="append", required=True, help="Export directory.")
    ap.add_argument("--data", required=True, help="Prepared data directory.")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(RESULTS, "export.json"))
    args = ap.parse_args(argv)
    result = measure(args)
    jax_eval = result["jax_eval"]
    if jax_eval:
        print(
            f"JAX model ({jax_eval['split']}): CER {jax_eval['cer']:.2%} WER {jax_eval['wer']:.2%}"
        )
    print(f"| model | MB | {result['utterance_seconds']:.0f} s utt, {args.threads} thread ms | "
          "RTF | CER | WER |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in result["rows"]:
        print(
            f"| {r['model']} | {r['mb']:.1f} | {r['latency_ms']:.0f} | {r['rtf']:.3f} | "
            f"{r['cer']:.2%} | {r['wer']:.2%} |"
        )
    results.save_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
