"""RNN-T lattice recursions fused in Pallas kernels: one launch runs a whole recursion.

`jaxspeech.losses.rnnt` with kernel="xla" runs the alpha recursion as a `lax.scan` over the
T + U anti-diagonals of the (T, U+1) lattice (and its gradient as a second one, the
pruned windows' as a scan over frames): on a GPU each diagonal is a loop iteration of
several small kernels. Here a kernel launch runs the whole recursion of every utterance
(one program per utterance), on the blank and next-label log-probabilities the joiner
and its log-softmax computed in XLA before, and a `jax.custom_vjp` gives their gradient
in closed form from alpha and beta (Graves 2012): with log P = beta(0, 0),

  d log P / d blank(t, u) = exp(alpha(t, u) + blank(t, u) + beta(t+1, u) - log P)
  d log P / d label(t, u) = exp(alpha(t, u) + label(t, u) + beta(t, u+1) - log P)

(beta(T_b, U_b) = 0: the final blank ends the alignment). The posteriors are the
occupation the pruned loss picks its windows by (`_loss_and_occupation` takes them as
the gradient), and the pruned windows' own lattice is the same recursion on a (T, U+1)
lattice that is impossible (log(0)) outside the windows (`window_nll`).

Layout: a program works on one anti-diagonal n = t + u at a time, as a vector over the
lanes u = 0 .. L-1 (L = U+1 rounded up to a power of two, what Triton's tensors must be;
lanes past U are impossible). XLA skews the lattices beforehand: row n, lane u holds cell
(n - u, u) (`skew`). A step reads the previous diagonal shifted by one lane (alpha: the
cell below, u-1; beta: the cell above, u+1): the kernel writes each diagonal to its
output row beside a log(0) column on the side the shift reads from, and reads the
shifted view back from the previous row, with a barrier between (other threads wrote
it). Backend and its evidence: as the CTC kernel's (kernels/ctc.py), Pallas' Triton
lowering. A program's blocks are larger than shared memory (Conformer-L at 16 s: three
(560, 257) float32 arrays, 1.7 MB, against 227 KiB), and Mosaic GPU's `pallas_call`
stages blocks whole in shared memory (it fails to compile: "exceeds available shared
memory"); with the arrays left in global memory its iota and shifted loads need
hand-written layouts ("Failed to infer the output layout of the iota"). Statistics are
float32; impossible is LOG_ZERO (a finite log(0), as in `jaxspeech.losses.rnnt`), never
-inf, so no NaN can arise.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxspeech.losses.kernels.common import TRITON_AVAILABLE, interpret_on, pow2, trace_platform
from jaxspeech.parallel.rules import map_batch_shards

if TRITON_AVAILABLE:  # a jax without it: loss.kernel=pallas is refused (common.resolve)
    from jax.experimental.pallas import triton as plt

LOG_ZERO = -1e30  # jaxspeech.losses.rnnt.LOG_ZERO (that module imports this one)


def _logaddexp(x: jax.Array, y: jax.Array) -> jax.Array:
    """log(e^x + e^y) from ops every Pallas lowering has, floored at LOG_ZERO (two
    impossible paths stay at the floor instead of sinking below it)."""
    m = jnp.maximum(x, y)
    return jnp.maximum(m + jnp.log1p(jnp.exp(-jnp.abs(x - y))), LOG_ZERO)


def skew(x_btu: jax.Array, lanes: int, fill: float = LOG_ZERO) -> jax.Array:
    """(B, T, U+1) -> (B, T+U, lanes + 1): out[b, n, 1 + u] = x[b, n - u, u], `fill`
    outside the lattice (n - u outside [0, T), u > U) and in column 0 (what the kernels'
    shifted reads see). With fill 0 it is linear (its transpose, `unskew`, takes gradients
    back).

    A shear by reshape, not a gather: row u of the time-padded (B, U+1, T+U+1) array, read
    with row length T+U, starts u places later.
    """
    b, t, u1 = x_btu.shape
    width = t + u1  # T frames, then U+1 LOG_ZERO columns (at least as many as rows)
    x_but = jnp.pad(x_btu.swapaxes(1, 2), ((0, 0), (0, 0), (0, u1)), constant_values=fill)
    flat = x_but.reshape(b, u1 * width)[:, : u1 * (width - 1)]
    x_bnu = flat.reshape(b, u1, width - 1).swapaxes(1, 2)  # [b, n, u] = x[b, n - u, u]
    return jnp.pad(x_bnu, ((0, 0), (0, 0), (1, lanes - u1)), constant_values=fill)


def unskew(g_bnl: jax.Array, t: int) -> jax.Array:
    """The transpose of `skew`'s linear part (fill 0), written out: (B, T+U, L) values of
    lanes u = 0 .. L-1 (columns 1 .. L of a skewed array) -> (B, T, U+1) with out[b, t, u]
    = g[b, t + u, u]; T = `t`. Each of skew's reshapes, slice and pads in reverse
    (`jax.linear_transpose` would not do inside a shard_map: its cotangents vary over
    the mesh axes and its traced zeros do not)."""
    b, n, _ = g_bnl.shape
    u1 = n - t + 1
    g_bun = g_bnl[:, :, :u1].swapaxes(1, 2)  # (B, U+1, T+U)
    flat = jnp.pad(g_bun.reshape(b, u1 * n), ((0, 0), (0, u1)))  # skew's slice dropped u1
    return flat.reshape(b, u1, n + 1)[:, :, :t].swapaxes(1, 2)


def _alpha_kernel(blank_ref, label_ref, alpha_ref, *, diagonals: int, lanes: int, barrier: bool):
    """One utterance. blank_ref, label_ref (N, L+1) skewed log-probs (`skew`); alpha_ref
    (N, L+1): alpha of cell (n - u, u) at column u + 1, column 0 LOG_ZERO."""
    pad = jnp.full((1,), LOG_ZERO, jnp.float32)
    a0 = jnp.where(jnp.arange(lanes) == 0, 0.0, LOG_ZERO).astype(jnp.float32)
    alpha_ref[0, pl.ds(0, 1)] = pad
    alpha_ref[0, pl.ds(1, lanes)] = a0

    def step(n, prev):
        if barrier:  # the shifted read below reads other threads' writes of row n - 1
            plt.debug_barrier()
        stay = prev + blank_ref[n - 1, pl.ds(1, lanes)]  # (t-1, u) by a blank
        # (t, u-1) by its label: both read one column left, where lane 0 finds LOG_ZERO.
        climb = alpha_ref[n - 1, pl.ds(0, lanes)] + label_ref[n - 1, pl.ds(0, lanes)]
        cur = _logaddexp(stay, climb)
        alpha_ref[n, pl.ds(0, 1)] = pad
        alpha_ref[n, pl.ds(1, lanes)] = cur
        return cur

    jax.lax.fori_loop(1, diagonals, step, a0)


def _beta_kernel(
    diag_ref, lane_ref, blank_ref, label_ref, beta_ref, *, diagonals: int, lanes: int, barrier: bool
):
    """One utterance, backwards from its final cell (T_b-1, U_b), on diagonal diag_ref ()
    = T_b-1+U_b, lane lane_ref () = U_b. beta_ref (N, L+1): beta of cell (n - u, u) (the
    log-probability of finishing from it, its final blank included) at column u, column L
    LOG_ZERO; LOG_ZERO on every cell no finishing path leaves (past T_b or U_b)."""
    pad = jnp.full((1,), LOG_ZERO, jnp.float32)
    lane = jnp.arange(lanes)
    last, top = diag_ref[...], lane_ref[...]

    def row(n, recursed):
        blank = blank_ref[n, pl.ds(1, lanes)]
        final = jnp.where(lane == top, blank, LOG_ZERO)  # only the final blank remains
        return jnp.where(n > last, LOG_ZERO, jnp.where(n == last, final, recursed))

    n0 = diagonals - 1
    b0 = row(n0, jnp.full((lanes,), LOG_ZERO, jnp.float32))
    beta_ref[n0, pl.ds(0, lanes)] = b0
    beta_ref[n0, pl.ds(lanes, 1)] = pad

    def step(i, nxt):
        n = n0 - i
        if barrier:
            plt.debug_barrier()
        stay = nxt + blank_ref[n, pl.ds(1, lanes)]  # blank to (t+1, u)
        climb = beta_ref[n + 1, pl.ds(1, lanes)] + label_ref[n, pl.ds(1, lanes)]  # to (t, u+1)
        cur = row(n, _logaddexp(stay, climb))
        beta_ref[n, pl.ds(0, lanes)] = cur
        beta_ref[n, pl.ds(lanes, 1)] = pad
        return cur

    jax.lax.fori_loop(1, diagonals, step, b0)


def _call(kernel, ins: list, like: jax.Array, interpret: bool) -> jax.Array:
    """pallas_call over a (B,) grid, one program per utterance: each sees its own rows of
    `ins` ((N, L+1) of a (B, N, L+1), () of a (B,)) and writes its (N, L+1) rows of a
    float32 output shaped as `like`."""
    b, n, width = like.shape
    lanes = width - 1

    def spec(shape):
        zeros = (0,) * (len(shape) - 1)
        return pl.BlockSpec((None, *shape[1:]), lambda i: (i, *zeros))

    # Inside a shard_map (`lattice_nll`: each device's rows) the output varies over the
    # same mesh axes as the lattices.
    vary = jax.typeof(like).manual_axis_type
    out_shape = jax.ShapeDtypeStruct(like.shape, jnp.float32, manual_axis_type=vary)
    return pl.pallas_call(
        functools.partial(kernel, diagonals=n, lanes=lanes, barrier=not interpret),
        grid=(b,),
        in_specs=[spec(x.shape) for x in ins],
        out_specs=spec(out_shape.shape),
        out_shape=out_shape,
        # Triton (module docstring); a warp per 32 lanes, at most 4.
        compiler_params=(
            plt.CompilerParams(num_warps=max(1, min(4, lanes // 32)), num_stages=1)
            if TRITON_AVAILABLE
            else None
        ),
        interpret=interpret,
        name=kernel.__name__.strip("_"),
    )(*ins)


def _ends(t: int, u: int, frames_b: jax.Array, label_len_b: jax.Array):
    """(B,) int32 diagonal T_b-1+U_b and lane U_b of each final cell, lengths clipped to
    the lattice (1 <= T_b <= T, 0 <= U_b <= U)."""
    frames = jnp.clip(frames_b, 1, t).astype(jnp.int32)
    labels = jnp.clip(label_len_b, 0, u).astype(jnp.int32)
    return frames - 1 + labels, labels


def lattice_nll(
    blank_btu: jax.Array,
    label_btu: jax.Array,
    frames_b: jax.Array,
    label_len_b: jax.Array,
    interpret: bool | None = None,
) -> jax.Array:
    """(B,) -log P(y | x) of (B, T, U+1) float32 blank and next-label log-probs, frames_b
    (B,) T_b and label_len_b (B,) U_b, by the alpha kernel; about -LOG_ZERO where no path
    exists. As `jaxspeech.losses.rnnt.rnnt_loss_from_logprobs` (reverse mode only).
    `interpret`: run the kernels in Pallas' interpret mode; None: unless the step is
    traced for a GPU (`common.interpret_on`).

    Under a mesh each device runs its own rows (`map_batch_shards`: XLA cannot split a
    custom call along the batch, and would gather the global batch onto every device);
    interpreted kernels run unsplit (the interpreter's loops fail shard_map's check of
    varying axes; they serve tests on one host)."""
    if interpret is None:
        interpret = interpret_on(trace_platform())

    def nll(blank, label, frames, label_len):
        shape = tuple(blank.shape)  # static (a shard's rows): the backward pass unskews to it
        return _lattice_nll(blank, label, frames, label_len, interpret, shape)

    args = (blank_btu, label_btu, frames_b, label_len_b)
    return nll(*args) if interpret else map_batch_shards(nll, *args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _lattice_nll(blank_btu, label_btu, frames_b, label_len_b, interpret, shape):
    return _nll_fwd(blank_btu, label_btu, frames_b, label_len_b, interpret, shape)[0]


def _nll_fwd(blank_btu, label_btu, frames_b, label_len_b, interpret, shape):
    b, t, u1 = shape
    lanes = pow2(u1)
    blank_sk, label_sk = skew(blank_btu, lanes), skew(label_btu, lanes)
    alpha = _call(_alpha_kernel, [blank_sk, label_sk], blank_sk, interpret)
    diag, top = _ends(t, u1 - 1, frames_b, label_len_b)
    rows = jnp.arange(b)
    log_p = alpha[rows, diag, top + 1] + blank_sk[rows, diag, top + 1]
    return -log_p, (blank_sk, label_sk, alpha, diag, top, log_p)


def _nll_bwd(interpret, shape, res, g_b):
    """g * the posteriors of the module docstring's formulas, back in (B, T, U+1); 0 for an
    utterance with no path (its loss is marked invalid by the callers)."""
    blank_sk, label_sk, alpha, diag, top, log_p = res
    b, n, width = blank_sk.shape
    lanes = width - 1
    beta = _call(_beta_kernel, [diag, top, blank_sk, label_sk], blank_sk, interpret)
    no_row = jnp.full((b, 1, lanes), LOG_ZERO, jnp.float32)
    beta_up = jnp.concatenate([beta[:, 1:, :lanes], no_row], axis=1)  # (t+1, u): row n+1
    beta_right = jnp.concatenate([beta[:, 1:, 1:], no_row], axis=1)  # (t, u+1): n+1, u+1
    ok_b = log_p > 0.5 * LOG_ZERO
    base = alpha[:, :, 1:] - jnp.where(ok_b, log_p, 0.0)[:, None, None]

    def posterior(log_prob, beta_next):
        # <= 1 exactly in exact arithmetic; the clip keeps rounding (and impossible
        # utterances, zeroed below) from overflowing.
        return jnp.exp(jnp.minimum(base + log_prob[:, :, 1:] + beta_next, 0.0))

    final = (jnp.arange(n)[None, :, None] == diag[:, None, None]) & (
        jnp.arange(lanes)[None, None, :] == top[:, None, None]
    )
    d_blank = posterior(blank_sk, beta_up) + final  # the final blank: probability 1
    d_label = posterior(label_sk, beta_right)
    scale = jnp.where(ok_b, -g_b, 0.0)[:, None, None]
    d_blank, d_label = scale * d_blank, scale * d_label
    t = shape[1]
    return unskew(d_blank, t), unskew(d_label, t), None, None


_lattice_nll.defvjp(_nll_fwd, _nll_bwd)


def window_lattice(x_btr: jax.Array, start_bt: jax.Array, u1: int) -> jax.Array:
    """(B, T, R) values of each frame's window of rows [s_t, s_t + R) -> (B, T, U+1)
    lattice holding them there and LOG_ZERO elsewhere (R is small: a select per window
    slot, fused by XLA; its gradient a reduction, no scatter)."""
    rows = jnp.arange(u1)[None, None, :] - start_bt[:, :, None]  # (B, T, U+1) slot of row u
    out = jnp.full(rows.shape, LOG_ZERO, jnp.float32)
    for r in range(x_btr.shape[2]):
        out = jnp.where(rows == r, x_btr[:, :, r : r + 1], out)
    return out


def window_nll(
    blank_btr: jax.Array,
    label_btr: jax.Array,
    start_bt: jax.Array,
    frames_b: jax.Array,
    label_len_b: jax.Array,
    u1: int,
    interpret: bool | None = None,
) -> jax.Array:
    """(B,) -log P over the alignments inside the pruned windows (as
    `jaxspeech.losses.rnnt._window_loss`): the lattice kernels on the (B, T, U+1) lattice
    that is impossible outside the windows. A path counts iff every cell it leaves is in
    a window, and every cell of a path is left by one of its moves (the final cell by the
    final blank), so it sums exactly the windows' alignments; about -LOG_ZERO where none
    is (U_b > (R-1) T_b). Shapes: (B, T, R) log-probs, start_bt (B, T) window starts,
    u1 = U+1 the lattice's rows; `interpret` as `lattice_nll`."""
    blank = window_lattice(blank_btr.astype(jnp.float32), start_bt, u1)
    label = window_lattice(label_btr.astype(jnp.float32), start_bt, u1)
    return lattice_nll(blank, label, frames_b, label_len_b, interpret)
