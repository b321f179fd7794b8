"""CTC loss with the forward (alpha) and backward (beta) recursions fused in Pallas kernels.

`jaxspeech.losses.ctc.ctc_loss` with kernel="xla" runs optax's `lax.scan` over frames: on a
GPU every frame is a loop iteration of several small kernels (about 400 trips a step at
16 s, each launch costing more than its work). Here one kernel launch runs the whole
time loop for all utterances (one program per utterance), and a `jax.custom_vjp` gives
the gradient in closed form (Graves et al. 2006, eq. 16): d(-log P)/d logits[t, v] =
softmax[t, v] - sum over the states s labelled v of exp(alpha_t(s) + beta_t(s) - log P),
on the frames t < logit_len (0 past them), with beta from a second kernel in the
backward pass.

Layout: the extended label sequence (blank, l1, blank, l2, ..., blank) of 2U+1 states,
padded to a power of two S (what Triton's tensors must be), is the vector a program
works on; log-space, float32 statistics whatever the logits' dtype. The log-softmax and
the gather of each state's emission log-probability (B, T, S) are plain XLA before the
kernels (one fusion each); the recursion is what must not be a per-frame XLA loop. A
recursion step reads the previous frame's vector shifted by one and two states: the
kernel writes each frame's vector to its output row (two -inf columns on the side the
shift reads from) and reads the shifted views back from the previous row, with a
barrier between (the threads of a program read what other threads wrote).

Backend: Pallas' Triton lowering (`compiler_params=plt.CompilerParams(...)`), chosen on
this evidence (jax 0.10.2, loss + gradient compiled for the H100 target in the
deviceless GPU plan at Conformer-L's 64 x 400 frames, 160 labels, S = 512): the kernel
needs a `fori_loop` over frames with dynamically indexed rows of (T, S) blocks, shifted
(unaligned) loads and a thread barrier. Triton addresses global memory through
pointers, so all of it lowers as written (two `__gpu$xla.gpu.triton` custom calls).
The same kernel without compiler parameters (Mosaic GPU) fails: "Mosaic GPU kernel
exceeds available shared memory: smem_bytes=1644552 > max_smem_bytes=232448" (Mosaic
GPU stages whole blocks in shared memory; the recursion would need a hand-written
pipeline over frames), and `pallas_call` for Mosaic GPU is itself deprecated in favour
of `plgpu.kernel`. Triton is deprecated from jax 0.11 but still there (the GPU
machine's 0.11.2). The kernels use only generic Pallas ops plus `debug_barrier`, which
keeps a later port to another lowering small. On a CPU they run in interpret mode
(tests; slow).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxspeech.losses.kernels import common

if common.TRITON_AVAILABLE:
    from jax.experimental.pallas import triton as plt

NEG_INF = float("-inf")


def _lse3(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
    """log(e^a + e^b + e^c), -inf (not NaN) where all three are -inf."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == NEG_INF, 0.0, m)
    return m + jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m))


def _alpha_kernel(emit_ref, skip_ref, alpha_ref, *, frames: int, states: int, barrier: bool):
    """One utterance. emit_ref (T, S) per-state emission log-probs; skip_ref (S,) 0 where
    s-2 -> s is allowed, else -inf; alpha_ref (T, S + 2): alpha_t(s) at column s + 2,
    columns 0 and 1 -inf (what the shifted reads of states -2 and -1 see)."""
    pad = jnp.full((2,), NEG_INF, jnp.float32)
    skip = skip_ref[...]
    first = jnp.arange(states) < 2  # a path starts in the blank or the first label
    a0 = jnp.where(first, emit_ref[0, :], NEG_INF)
    alpha_ref[0, pl.ds(0, 2)] = pad
    alpha_ref[0, pl.ds(2, states)] = a0

    def step(t, prev):
        if barrier:  # the shifted reads below read other threads' writes of row t - 1
            plt.debug_barrier()
        move = alpha_ref[t - 1, pl.ds(1, states)]
        jump = alpha_ref[t - 1, pl.ds(0, states)] + skip
        cur = _lse3(prev, move, jump) + emit_ref[t, :]
        alpha_ref[t, pl.ds(0, 2)] = pad
        alpha_ref[t, pl.ds(2, states)] = cur
        return cur

    jax.lax.fori_loop(1, frames, step, a0)


def _beta_kernel(
    len_ref, emit_ref, skip_ref, final_ref, x_ref, *, frames: int, states: int, barrier: bool
):
    """One utterance, backwards from its last frame L - 1. len_ref () frames L; emit_ref
    (T, S); skip_ref (S,) 0 where s -> s+2 is allowed; final_ref (S,) 0 at the two final
    states; x_ref (T, S + 2): beta_t(s) + emit_t(s) at column s (beta_t excludes frame
    t's emission), -inf in columns S, S + 1 and on the frames t >= L."""
    pad = jnp.full((2,), NEG_INF, jnp.float32)
    last = len_ref[...] - 1
    skip, final = skip_ref[...], final_ref[...]
    t0 = frames - 1
    beta = jnp.where(t0 == last, final, NEG_INF)
    x_ref[t0, pl.ds(0, states)] = beta + emit_ref[t0, :]
    x_ref[t0, pl.ds(states, 2)] = pad

    def step(i, carry):
        t = frames - 1 - i
        if barrier:
            plt.debug_barrier()
        stay = x_ref[t + 1, pl.ds(0, states)]
        move = x_ref[t + 1, pl.ds(1, states)]
        jump = x_ref[t + 1, pl.ds(2, states)] + skip
        beta = jnp.where(t == last, final, jnp.where(t > last, NEG_INF, _lse3(stay, move, jump)))
        x_ref[t, pl.ds(0, states)] = beta + emit_ref[t, :]
        x_ref[t, pl.ds(states, 2)] = pad
        return carry

    jax.lax.fori_loop(1, frames, step, 0)


def _call(kernel, ins: list, emit: jax.Array, out_cols: int, interpret: bool) -> jax.Array:
    """pallas_call over a (B,) grid, one program per utterance: each sees its own rows of
    `ins` ((T, S) of the (B, T, S) emissions, (S,) of a (B, S), () of a (B,)) and writes
    its (T, out_cols) rows of the (B, T, out_cols) float32 output."""
    b, t, s = emit.shape

    def spec(shape):
        zeros = (0,) * (len(shape) - 1)
        return pl.BlockSpec((None, *shape[1:]), lambda i: (i, *zeros))

    # Inside a shard_map (each device's rows: jaxspeech.losses.ctc) the output varies
    # over the same mesh axes as the emissions.
    vary = jax.typeof(emit).manual_axis_type
    out_shape = jax.ShapeDtypeStruct((b, t, out_cols), jnp.float32, manual_axis_type=vary)
    # Triton (see the module docstring); a warp per 32 states, at most 4.
    warps = max(1, min(4, s // 32))
    params = plt.CompilerParams(num_warps=warps, num_stages=1) if common.TRITON_AVAILABLE else None
    return pl.pallas_call(
        functools.partial(kernel, frames=t, states=s, barrier=not interpret),
        grid=(b,),
        in_specs=[spec(x.shape) for x in ins],
        out_specs=spec(out_shape.shape),
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret,
        name=kernel.__name__.strip("_"),
    )(*ins)


def extended_states(
    labels_bu: jax.Array, label_len_b: jax.Array, blank_id: int, num_states: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The extended label sequences, padded to `num_states` (S >= 2U + 1).

    Returns:
      ext_bs: (B, S) int32 label of each state (blank at even s, label (s - 1) / 2 at odd).
      live_bs: (B, S) bool: s < 2 * label_len + 1 (padding states are unreachable).
      skip_bs: (B, S) float32 0 where the transition s - 2 -> s is allowed (s a label
        different from the label before it), else -inf.
    """
    b, u = labels_bu.shape
    labels = jnp.concatenate([labels_bu, jnp.full((b, 1), blank_id, labels_bu.dtype)], 1)
    s = jnp.arange(num_states)
    idx = jnp.minimum((s - 1) // 2, u)  # u: the blank column appended above
    is_label = (s % 2 == 1) & ((s - 1) // 2 < label_len_b[:, None])
    ext = jnp.where(is_label, labels[:, jnp.maximum(idx, 0)], blank_id).astype(jnp.int32)
    live = s[None, :] < 2 * label_len_b[:, None] + 1
    before = jnp.pad(ext, ((0, 0), (2, 0)), constant_values=blank_id)[:, :num_states]
    skip = jnp.where(is_label & (s >= 2) & (ext != before), 0.0, NEG_INF)
    return ext, live, skip.astype(jnp.float32)


def _prepare(logits_btv, logit_len_b, labels_bu, label_len_b, blank_id):
    """Per-state emissions (B, T, S) (-inf on padding states), the skip masks and the
    clipped lengths; S = the power of two >= 2U + 1."""
    t, u = logits_btv.shape[1], labels_bu.shape[1]
    frames = jnp.clip(logit_len_b, 0, t).astype(jnp.int32)
    label_len = jnp.clip(label_len_b, 0, u).astype(jnp.int32)
    ext, live, skip = extended_states(labels_bu, label_len, blank_id, common.pow2(2 * u + 1))
    logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
    emit = jnp.take_along_axis(
        logp, jnp.broadcast_to(ext[:, None, :], logp.shape[:2] + ext.shape[1:]), 2
    )
    emit = jnp.where(live[:, None, :], emit, NEG_INF)
    n = 2 * label_len[:, None] + 1
    s = jnp.arange(ext.shape[1])
    final = jnp.where((s == n - 1) | (s == n - 2), 0.0, NEG_INF).astype(jnp.float32)
    return emit, ext, skip, final, frames, label_len


def _log_likelihood(alpha_bts, final_bs, frames_b, label_len_b) -> jax.Array:
    """(B,) log P(labels | logits): alpha at the last frame, summed over the final
    states; with no frames, 1 for an empty label sequence and 0 otherwise."""
    last = jnp.maximum(frames_b - 1, 0)[:, None, None]
    row = jnp.take_along_axis(alpha_bts, last, axis=1)[:, 0, :]
    log_p = jax.nn.logsumexp(row + final_bs, axis=-1)
    empty = jnp.where(label_len_b == 0, 0.0, NEG_INF)
    return jnp.where(frames_b > 0, log_p, empty)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def ctc_nll(
    logits_btv: jax.Array,
    logit_len_b: jax.Array,
    labels_bu: jax.Array,
    label_len_b: jax.Array,
    blank_id: int = 0,
    interpret: bool = False,
) -> jax.Array:
    """(B,) -log P(labels | logits), +inf where no alignment exists (no masking: see
    `jaxspeech.losses.ctc.ctc_loss`). Shapes as there; `interpret` runs the kernels in
    Pallas' interpret mode (CPU)."""
    return _nll_fwd(logits_btv, logit_len_b, labels_bu, label_len_b, blank_id, interpret)[0]


def _nll_fwd(logits_btv, logit_len_b, labels_bu, label_len_b, blank_id, interpret):
    emit, ext, skip, final, frames, label_len = _prepare(
        logits_btv, logit_len_b, labels_bu, label_len_b, blank_id
    )
    s = emit.shape[2]
    alpha = _call(_alpha_kernel, [emit, skip], emit, s + 2, interpret)[:, :, 2:]
    log_p = _log_likelihood(alpha, final, frames, label_len)
    return -log_p, (logits_btv, emit, alpha, ext, skip, final, frames, log_p)


def _nll_bwd(blank_id, interpret, res, g_b):
    """The closed-form gradient: g * (softmax - occupancy of each vocabulary entry) on
    the frames t < logit_len of utterances with an alignment; 0 elsewhere."""
    del blank_id
    logits, emit, alpha, ext, skip, final, frames, log_p = res
    s = emit.shape[2]
    skip_next = jnp.pad(skip[:, 2:], ((0, 0), (0, 2)), constant_values=NEG_INF)  # s -> s+2
    x = _call(_beta_kernel, [frames, emit, skip_next, final], emit, s + 2, interpret)[:, :, :s]
    t = logits.shape[1]
    ok_b = jnp.isfinite(log_p) & (g_b != 0)
    frame_ok = (jnp.arange(t)[None, :] < frames[:, None]) & ok_b[:, None]
    # alpha + beta - log P; emit = -inf only on padding states (alpha is -inf there too).
    log_gamma = jnp.where(emit == NEG_INF, NEG_INF, alpha + x - emit)
    log_gamma = log_gamma - jnp.where(ok_b, log_p, 0.0)[:, None, None]
    gamma = jnp.where(frame_ok[:, :, None], jnp.exp(log_gamma), 0.0)
    onehot = jax.nn.one_hot(ext, logits.shape[2], dtype=jnp.float32)  # (B, S, V)
    occupancy = jnp.einsum("bts,bsv->btv", gamma, onehot, precision=jax.lax.Precision.HIGHEST)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    grad = jnp.where(frame_ok[:, :, None], probs - occupancy, 0.0)
    grad = jnp.where(ok_b[:, None, None], g_b[:, None, None] * grad, 0.0)
    return grad.astype(logits.dtype), None, None, None


ctc_nll.defvjp(_nll_fwd, _nll_bwd)
