"""Long-form decoding against decoding utterance by utterance, on a trained run.

`python benchmarks/longform.py --workdir runs/demo --data data/demo/shards --split test`

Concatenates the split's utterances in order (0.3 s of silence between them) into files
of `--minutes` (1, 2, 5, 10 by default), writes each as a 16 kHz WAV and transcribes it
with `jaxspeech.transcribe` (cut at pauses of `--min_pause_s`, windows of `--window_s`
with `--overlap_s` where speech runs on; `--min_pause_s 0`: windows only); the same
utterances are also decoded one by one (each alone in a window). Both transcripts are
scored against the concatenated references (word and character errors over the whole
text). Also the peak resident memory after each length (lengths in increasing order, so a
flat column means memory does not grow with the audio) and the real-time factor.

Prints a table and writes `benchmarks/results/longform.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

import numpy as np
import soundfile as sf

from jaxspeech.config import build
from jaxspeech.data import reader
from jaxspeech.data.tokenizer import normalize_text
from jaxspeech.evaluation import run as eval_run
from jaxspeech.metrics.wer import ErrorCounts
from jaxspeech.parallel import rules
from jaxspeech.runs import loading
from jaxspeech.serving import recognizer as transcribe_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
PAUSE_S = 0.3


def one_by_one(decode, tokenizer, audio: list[np.ndarray], window: int, batch: int) -> list[str]:
    """Each utterance decoded alone (padded to the window), `batch` at a time."""
    out = []
    for i in range(0, len(audio), batch):
        group = audio[i : i + batch]
        x = np.zeros((batch, window), np.float32)
        lens = np.full(batch, window, np.int32)
        for row, a in enumerate(group):
            x[row, : len(a)], lens[row] = a, len(a)
        out += [tokenizer.decode(labels) for labels, _ in decode(x, lens)[: len(group)]]
    return out


def score(ref: str, hyp: str) -> dict:
    counts = ErrorCounts()
    counts.add(ref, hyp)
    return {"wer": round(counts.wer, 5), "cer": round(counts.cer, 5), "words": counts.words}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--minutes", default="1,2,5,10")
    ap.add_argument("--window_s", type=float, default=20.0)
    ap.add_argument("--overlap_s", type=float, default=2.0)
    ap.add_argument("--min_pause_s", type=float, default=0.25)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()

    config = eval_run.run_eval_config(args.workdir)
    rate = int(config.features.sample_rate)
    recs = reader.read_split_records(args.data, args.split)
    audio = [reader.audio_float32(r) for r in recs]
    texts = [normalize_text(r["text"]) for r in recs]
    result: dict = {
        "machine": environment.machine(),
        "window_s": args.window_s,
        "overlap_s": args.overlap_s,
        "min_pause_s": args.min_pause_s,
        "decoding": config.decoding.method,
        "rows": [],
    }
    with rules.axis_rules(build.rules_from_config(config)):
        run = loading.load_run(args.workdir)
        batch = transcribe_lib.batch_size(args.batch, run.spec.mesh)
        decode = transcribe_lib.window_decoder(run, config, args.window_s)
        window = int(args.window_s * rate)
        singles = one_by_one(decode, run.tokenizer, audio, window, batch)
        result["step"] = run.step
        pause = np.zeros(int(PAUSE_S * rate), np.float32)
        with tempfile.TemporaryDirectory() as tmp:
            for minutes in (float(m) for m in args.minutes.split(",")):
                n, total = 0, 0
                while total < minutes * 60 * rate:
                    total += len(audio[n % len(audio)]) + len(pause)
                    n += 1
                idx = [i % len(audio) for i in range(n)]
                path = os.path.join(tmp, f"{minutes:g}min.wav")
                sf.write(path, np.concatenate([x for i in idx for x in (audio[i], pause)]), rate)
                got: list[dict] = []
                t0 = time.perf_counter()
                transcribe_lib.transcribe_files(
                    [path], run, config, window_s=args.window_s, overlap_s=args.overlap_s,
                    batch=batch, emit=got.append, min_pause_s=args.min_pause_s,
                )  # fmt: skip
                seconds = time.perf_counter() - t0
                ref = " ".join(texts[i] for i in idx)
                row = {
                    "minutes": round(total / rate / 60, 2),
                    "utterances": n,
                    "long_form": score(ref, got[0]["text"]),
                    "one_by_one": score(ref, " ".join(singles[i] for i in idx)),
                    "rtf": round(seconds / (total / rate), 4),
                    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                }
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
    results.write_json(os.path.join(RESULTS, "longform.json"), result)
    print("| minutes | utterances | WER long-form | WER one by one | CER long-form | "
          "CER one by one | RTF | peak RSS MB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        lf, ob = r["long_form"], r["one_by_one"]
        print(
            f"| {r['minutes']} | {r['utterances']} | {lf['wer']:.2%} | {ob['wer']:.2%} | "
            f"{lf['cer']:.2%} | {ob['cer']:.2%} | {r['rtf']} | {r['peak_rss_mb']} |"
        )


if __name__ == "__main__":
    main()
