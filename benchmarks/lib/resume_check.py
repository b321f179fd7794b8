"""Proof that a resume was exact: final parameters bit for bit, the same data order.

Reads two runs' latest checkpoints (`jaxspeech.runs.loading.load_run`) and their utterance ids
per step (`jaxspeech.runs.events.read_batch_ids`, RUN/batch_ids/p0.jsonl). Used by
benchmarks/chaos.py.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from jaxspeech.runs import loading


def final_model(workdir: str) -> tuple[int, dict]:
    """(step, {"params", "model_vars"} as numpy) of a run's latest checkpoint."""
    import jax

    from jaxspeech.parallel import mesh as mesh_lib

    mesh = mesh_lib.make_mesh({"data": 1}, devices=jax.devices()[:1])
    run = loading.load_run(workdir, mesh=mesh)
    model = {"params": run.params, "model_vars": run.model_vars}
    return run.step, jax.tree.map(np.asarray, model)


def trees_bitwise_equal(a: Any, b: Any) -> tuple[bool, list[str]]:
    """Whether two trees of arrays have the same paths, shapes, dtypes and bits; the
    paths that differ."""
    import jax

    fa = dict(jax.tree_util.tree_flatten_with_path(a)[0])
    fb = dict(jax.tree_util.tree_flatten_with_path(b)[0])
    bad = [jax.tree_util.keystr(k) for k in fa.keys() ^ fb.keys()]
    for k in fa.keys() & fb.keys():
        x, y = np.asarray(fa[k]), np.asarray(fb[k])
        # Raw bits: np.array_equal alone would call -0.0 and 0.0 equal and NaN unequal.
        same = x.dtype == y.dtype and x.shape == y.shape
        if not (same and np.array_equal(x, y, equal_nan=True) and x.tobytes() == y.tobytes()):
            bad.append(jax.tree_util.keystr(k))
    return not bad, sorted(bad)


def batch_id_lines(workdir: str) -> dict[int, list[list[str]]]:
    """Every complete line of RUN/batch_ids/p0.jsonl, grouped by step: a step replayed
    after a kill has several."""
    out: dict[int, list[list[str]]] = {}
    with open(os.path.join(workdir, "batch_ids", "p0.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                row = json.loads(line)
                out.setdefault(row["step"], []).append(row["ids"])
    return out


def verify(reference: str, chaos: str, steps: int) -> dict:
    """The final models and the data order of the runs in `reference` and `chaos`, compared
    (steps 1..`steps`), and whether every step replayed after a kill read the same
    utterances again."""
    from absl import logging as absl_logging

    from jaxspeech.runs.events import read_batch_ids

    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)  # read-only managers warn about it
    try:
        step_a, a = final_model(reference)
        step_b, b = final_model(chaos)
    finally:
        absl_logging.set_verbosity(verbosity)
    params_ok, params_bad = trees_bitwise_equal(a["params"], b["params"])
    vars_ok, vars_bad = trees_bitwise_equal(a["model_vars"], b["model_vars"])
    ids_a, ids_b = read_batch_ids(reference), read_batch_ids(chaos)
    order_bad = [s for s in range(1, steps + 1) if s not in ids_a or ids_a.get(s) != ids_b.get(s)]
    # A step replayed after a kill must have read the same utterances both times.
    replays = {s: v for s, v in batch_id_lines(chaos).items() if len(v) > 1}
    return {
        "final_step_reference": step_a,
        "final_step_chaos": step_b,
        "params_bitwise_equal": bool(params_ok and step_a == step_b == steps),
        "params_differ": params_bad,
        "model_vars_bitwise_equal": bool(vars_ok),
        "model_vars_differ": vars_bad,
        "data_order_equal": not order_bad,
        "data_order_differs_at": order_bad,
        "replayed_steps": sorted(replays),
        "replays_identical": all(all(x == v[0] for x in v) for v in replays.values()),
        "utterances_per_run": sum(len(ids_a.get(s, [])) for s in range(1, steps + 1)),
    }
