"""The PyTorch peer of benchmarks/train_step.py, seen from the driver.

`train_step.py --peer [--peer_python PY]` times, after each model and at the batch ours
measured (the plan's if ours did not fit), the peer of the same size:
benchmarks/lib/torch_peer.py (torchaudio's Conformer, the same heads with the full RNN-T
loss, AdamW, bf16 autocast; the same synthetic batch and timing), run in PY: by default
.venv-peer/bin/python (`make install-peer`) if it exists, else the driver's own Python (the
GPU machine's image has torch and torchaudio). Its row (framework "pytorch") follows ours
in the table and JSON, and a line per model gives ours / the peer's audio s/s.

This module needs neither torch nor jax: it reads the peer's sizes and training settings
off a jaxspeech config, builds the peer's command, and turns its one-line JSON answer
into a row of the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.lib import workers
from benchmarks.lib.step_rows import PEER
from benchmarks.lib.synthetic_batch import label_width

PEER_PYTHON = os.path.join(".venv-peer", "bin", "python")  # relative to the repository root
MODULE = "benchmarks.lib.torch_peer"
HEADS = ("ctc", "rnnt", "ctc+rnnt")  # heads the peer builds


def default_python(root: str) -> str:
    """`.venv-peer/bin/python` under `root` if it exists, else this interpreter (a machine
    whose own Python has torch and torchaudio, such as the GPU machine's image)."""
    venv = os.path.join(root, PEER_PYTHON)
    return venv if os.path.exists(venv) else sys.executable


def setup(python: str | None, root: str, configs: list) -> str:
    """The peer's Python (`python`, else `default_python(root)`), checked to import torch
    and torchaudio, and every config checked to be one the peer builds: a mistake stops
    the run (one line) before anything is measured."""
    python = python or default_python(root)
    versions = check_python(python)
    for config in configs:
        spec_from_config(config)
    print(f"PyTorch peer: {python} (torch, torchaudio {versions})", flush=True)
    return python


def check_python(python: str) -> str:
    """The torch and torchaudio versions `python` imports; SystemExit (one line) if it
    cannot import them."""
    code = "import torch, torchaudio; print(torch.__version__, torchaudio.__version__)"
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    except OSError as e:
        raise SystemExit(f"--peer: cannot run {python!r} ({e}); run `make install-peer`") from e
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(
            f"--peer: {python} cannot import torch and torchaudio ({last}); run "
            "`make install-peer` or pass --peer_python"
        )
    return proc.stdout.strip()


def spec_from_config(config) -> dict:
    """What the peer builds and how it trains, read off a configs/conformer.py config (after
    --set overrides): sizes, head, features, SpecAugment, dropout, loss weight, AdamW.
    SystemExit (one line) for what the peer does not build."""
    m, cf, tr, f = config.model, config.model.conformer, config.model.transducer, config.features
    if m.encoder != "conformer" or m.head not in HEADS:
        raise SystemExit(
            f"--peer builds a Conformer with a head of {HEADS}, not model.encoder="
            f"{m.encoder!r} with model.head={m.head!r}"
        )
    if "rnnt" in m.head and tr.predictor != "stateless":
        raise SystemExit(f"--peer builds the stateless predictor, not {tr.predictor!r}")
    if f.kind != "log_mel" or f.deltas:
        raise SystemExit(f"--peer computes plain log-mel features, not features.kind={f.kind!r}")
    s, o = config.specaug, config.optim
    return {
        "head": m.head,
        "dim": cf.dim,
        "num_layers": cf.num_layers,
        "num_heads": cf.num_heads,
        "ffn_dim": cf.ff_mult * cf.dim,
        "conv_kernel": cf.conv_kernel,
        "dropout": cf.dropout,
        "subsampling_channels": cf.subsampling_channels,
        "subsampling_factor": cf.subsampling_factor,
        "predictor_dim": tr.predictor_dim,
        "context_size": tr.context_size,
        "joiner_dim": tr.joiner_dim,
        "ctc_weight": config.loss.ctc_weight,
        "features": {
            k: f[k]
            for k in (
                "sample_rate",
                "n_fft",
                "win_length",
                "hop_length",
                "num_mel_bins",
                "fmin",
                "fmax",
                "log_floor",
            )
        },  # fmt: skip
        "specaug": {
            "enabled": s.enabled,
            "num_freq_masks": s.num_freq_masks,
            "freq_mask_width": s.freq_mask_width,
            "num_time_masks": s.num_time_masks,
            "time_mask_max_ratio": s.time_mask_max_ratio,
        },
        "optim": {k: o[k] for k in ("peak_lr", "b1", "b2", "eps", "weight_decay", "clip_norm")},
    }


def command(python: str, config, **job) -> list[str]:
    """The peer's command line, run from the repository root: `python -m
    benchmarks.lib.torch_peer JOB`, JOB the JSON of the config's spec, the label width of
    its S-second bucket and `job` (model, dtype, batch, seconds, repeats, vocab, blank)."""
    width = label_width(job["seconds"], config.data.max_tokens_per_second)
    return [
        python,
        "-m",
        MODULE,
        json.dumps({"spec": spec_from_config(config), **job, "label_width": width}),
    ]


def measure(python: str, root: str, config, **job) -> dict:
    """Runs the peer; returns its row (`peer_row`), its answer when the batch does not fit
    in device memory (`does_not_fit`), or {"failed": True, "error": its last stderr line}."""
    try:
        answer = workers.last_json_line(command(python, config, **job), 3600, "peer", 4000, root)
    except (RuntimeError, ValueError, IndexError, subprocess.TimeoutExpired) as e:
        last = (str(e).strip().splitlines() or ["no output"])[-1]
        answer = {"failed": True, "model": job["model"], "batch": job["batch"], "error": last}
    what = f"{job['model']} {job['dtype']} PyTorch peer, batch {job['batch']}"
    if answer.get("does_not_fit") or answer.get("failed"):
        why = "does not fit in device memory" if answer.get("does_not_fit") else "failed"
        print(f"{what}: {why}: {answer['error']}", flush=True)
        return answer | {"framework": PEER, "dtype": job["dtype"]}
    row = peer_row(answer)
    print(
        f"{what}: step {row['step_ms']:.0f} ms, loss {row['loss_first']:.3f} -> "
        f"{row['loss_last']:.3f}",
        flush=True,
    )
    return row


def peer_row(answer: dict) -> dict:
    """The peer's answer as a row of train_step's table: its audio s/s from its median step;
    no model FLOPs (its full transducer lattice costs more FLOPs than our pruned one, so
    ours would misstate its MFU), no compile step (eager), no XLA memory plan."""
    row = {"framework": PEER, **answer}
    for key in ("model_gflop_per_step", "achieved_tflops", "peak_tflops", "mfu", "compile_s"):
        row.setdefault(key, None)
    row["audio_s_per_s"] = row["batch"] * row["seconds"] / (row["step_ms"] / 1e3)
    row["batch_reduced_from"] = None
    return row
