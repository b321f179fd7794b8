"""What the benchmark scripts share; scripts import these modules, never each other.

- results: writing a result's JSON file (and the `wrote PATH` line).
- environment: machine, device, jax version, date, load average of a result.
- timing: the median of repeated calls after a warm-up (depthwise_conv, features, export,
  losses, torch_peer).
- workers: a script re-run as a `--worker` answering one JSON line (train_step, losses).
- hlo: the collectives of compiled HLO text and the bytes they send (scaling, sync).
- hlo_launches: the kernel launches, loops, custom calls and GEMM FLOPs of optimized GPU
  HLO text (gpu_plan).
- gpu_target: the abstract devices of a GPU (targets/*.txtpb) to compile for without one
  (gpu_plan).
- cost_model: ring times and the weak-scaling projection to 1,024 devices (scaling, sync).
- lowering: abstract batches and compiler options for HLO-only compiles (scaling, sync).
- disruptions, run_record, trainer_process, corpus, resume_check: the chaos driver's
  parts (planning the signals, recording a run, running the trainer, the damaged corpus,
  the bitwise comparison of the final models).
- synthetic_batch, mfu, config_overrides: the train step benchmark's batch maker, peak
  FLOP/s and rates, and `--set KEY=VALUE` (train_step).
- peer, torch_peer, step_rows: train_step's PyTorch peer (`--peer`): the driver's side
  (spec, command, answer), the peer itself (runs in the peer's Python: torch, torchaudio,
  numpy, synthetic_batch and timing only, no jax), and the table of both frameworks' rows.
- store_servers: S3 (moto) and GCS (gcp-storage-emulator) servers on 127.0.0.1
  (input_pipeline; tests/e2e/test_object_store.py).
"""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
