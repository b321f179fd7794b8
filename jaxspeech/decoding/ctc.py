"""CTC greedy decoding: jitted batched argmax on device, collapse on the host."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def greedy_ids(logits_btv: jax.Array) -> jax.Array:
    """(B, T, V) -> (B, T) int32 best label per frame (jit-friendly)."""
    return jnp.argmax(logits_btv, axis=-1).astype(jnp.int32)


def collapse(ids_bt: np.ndarray, lengths_b: np.ndarray, blank_id: int = 0) -> list[list[int]]:
    """Merge repeats, then drop blanks, within each row's valid frames."""
    out = []
    for row, n in zip(np.asarray(ids_bt), np.asarray(lengths_b)):
        row = row[: int(n)]
        if row.size == 0:
            out.append([])
            continue
        keep = np.ones(row.shape, bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != blank_id
        out.append(row[keep].tolist())
    return out
