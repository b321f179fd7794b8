"""CTC loss with infeasible targets and non-finite values masked out and counted.

optax.ctc_loss returns a large *finite* value for targets that cannot be
aligned to the frames (labels plus the blanks forced between repeats exceed the
frames), so feasibility is checked explicitly here rather than by isinf.

Two implementations of the same loss: kernel="xla" (optax's `lax.scan` over frames; the
CPU path and the reference) and kernel="pallas" (`jaxspeech.losses.kernels.ctc`: the
recursions fused in one kernel launch each; interpreted, slowly, off the GPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxspeech.losses.kernels import common as kernels
from jaxspeech.losses.kernels import ctc as ctc_kernel
from jaxspeech.parallel.rules import map_batch_shards


def required_frames(labels_bu: jax.Array, label_len_b: jax.Array) -> jax.Array:
    """(B,) minimum frames a CTC alignment needs: U plus one blank per adjacent repeat."""
    u = labels_bu.shape[1]
    valid = jnp.arange(u)[None, :] < label_len_b[:, None]
    repeat = (labels_bu[:, 1:] == labels_bu[:, :-1]) & valid[:, 1:]
    return label_len_b + jnp.sum(repeat, axis=1)


def fused_nll(
    logits_btv: jax.Array,
    logit_len_b: jax.Array,
    labels_bu: jax.Array,
    label_len_b: jax.Array,
    blank_id: int,
    interpret: bool,
) -> jax.Array:
    """(B,) -log P of the Pallas kernel (+inf: no alignment), each device on its own rows
    (XLA cannot split a custom call along the batch: it would gather the global batch
    onto every device). Interpreted kernels run unsplit: the interpreter's loops fail
    shard_map's check of varying axes, and they serve tests on one host."""
    fn = lambda *a: ctc_kernel.ctc_nll(*a, blank_id, interpret)  # noqa: E731
    args = (logits_btv, logit_len_b, labels_bu, label_len_b)
    return fn(*args) if interpret else map_batch_shards(fn, *args)


def ctc_loss(
    logits_btv: jax.Array,
    logit_len_b: jax.Array,
    labels_bu: jax.Array,
    label_len_b: jax.Array,
    *,
    blank_id: int = 0,
    kernel: str = "xla",
) -> tuple[jax.Array, jax.Array]:
    """Per-utterance negative log-likelihood and a validity mask.

    Args:
      logits_btv: (B, T, V) unnormalized logits (float32 or bfloat16; float32 inside).
      logit_len_b: (B,) valid frames.
      labels_bu: (B, U) int32 label ids (padding arbitrary past label_len).
      label_len_b: (B,) label counts.
      kernel: "xla" or "pallas" (`jaxspeech.losses.kernels.common.resolve`).
    Returns:
      loss_b: (B,) float32, 0 where invalid.
      valid_b: (B,) bool: feasible alignment and finite loss.
    """
    if kernels.use_pallas(kernel):
        interpret = kernels.interpret_on(kernels.trace_platform())
        loss = fused_nll(logits_btv, logit_len_b, labels_bu, label_len_b, blank_id, interpret)
    else:
        t = logits_btv.shape[1]
        u = labels_bu.shape[1]
        logit_pad = (jnp.arange(t)[None, :] >= logit_len_b[:, None]).astype(jnp.float32)
        label_pad = (jnp.arange(u)[None, :] >= label_len_b[:, None]).astype(jnp.float32)
        loss = optax.ctc_loss(
            logits_btv.astype(jnp.float32), logit_pad, labels_bu, label_pad, blank_id=blank_id
        )
    feasible = required_frames(labels_bu, label_len_b) <= logit_len_b
    valid = feasible & jnp.isfinite(loss)
    return jnp.where(valid, loss, 0.0), valid
