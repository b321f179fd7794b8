"""NumPy reference implementations (test oracles) of the decentralized synchronization
schemes: ring gossip, BMUF block updates and GTC threshold-compressed gradient exchange.

Written from the math alone, with no jax, so that the sharded JAX versions can be checked
against something that shares none of their code. Learner-stacked arrays have the learner
axis first, shape (N, ...). Gossip and BMUF compute in float64; GTC computes in float32,
as the messages it models do.
"""

import math
from collections.abc import Callable
from typing import Any

import numpy as np

GTC_VALUE_MODES = ("sign", "float")

# A tree is a (possibly nested) dict whose leaves are arrays.
Tree = dict[str, Any]


# --- trees ------------------------------------------------------------------------------


def tree_map_reference(fn: Callable[..., Any], *trees: Any) -> Any:
    """Applies `fn` leaf by leaf to dicts of arrays with the same (nested) keys.

    Leaves are anything that is not a dict; the result has the same structure, with
    `fn(*leaves)` at each leaf.
    """
    first = trees[0]
    if not isinstance(first, dict):
        return fn(*trees)
    for other in trees[1:]:
        # Mismatched trees would silently drop or misalign leaves.
        if not isinstance(other, dict) or set(other) != set(first):
            raise ValueError(f"trees differ in structure: {sorted(first)} vs {other!r}")
    return {key: tree_map_reference(fn, *(t[key] for t in trees)) for key in first}


def _tree_leaves(tree: Any) -> list[Any]:
    """Leaves in dict insertion order, depth first."""
    if not isinstance(tree, dict):
        return [tree]
    return [leaf for value in tree.values() for leaf in _tree_leaves(value)]


def _tree_pick(tree: Any, index: int) -> Any:
    """From a tree whose leaves are tuples, the tree of their `index`-th entries."""
    if isinstance(tree, dict):
        return {key: _tree_pick(value, index) for key, value in tree.items()}
    return tree[index]


# --- ring mixing matrix and gossip -------------------------------------------------------


def ring_mixing_matrix(n: int) -> np.ndarray:
    """The ring gossip mixing matrix W, shape (n, n), float64.

    n == 2: every entry 1/2 (each learner averages with its only neighbour).
    n >= 3: W[i, i] = W[i, i +- 1 mod n] = 1/3, all else 0. Symmetric, doubly stochastic.
    """
    if n < 2:
        raise ValueError(f"a ring needs at least 2 learners, got {n}")
    if n == 2:
        return np.full((2, 2), 0.5)
    w = np.zeros((n, n))
    for i in range(n):
        # For n == 3 the three entries cover the whole row: all 1/3.
        for j in (i - 1, i, i + 1):
            w[i, j % n] = 1.0 / 3.0
    return w


def gossip_reference(before: np.ndarray, after: np.ndarray, overlap: bool) -> np.ndarray:
    """One ring gossip step over N learners.

    before: (N, ...) parameters at the start of the step.
    after:  (N, ...) each learner's parameters after its own local optimizer update.
    Returns (N, ...) float64:
      overlap=False: new[i] = sum_j W[i, j] after[j]  (exchange after the update).
      overlap=True:  new[i] = sum_j W[i, j] before[j] + (after[i] - before[i])
                     (D-PSGD: neighbours' pre-update values, so the exchange can overlap
                     the step's compute).
    """
    before = np.asarray(before, dtype=np.float64)
    after = np.asarray(after, dtype=np.float64)
    if before.shape != after.shape:
        raise ValueError(f"before {before.shape} and after {after.shape} differ")
    n = after.shape[0]
    w = ring_mixing_matrix(n)
    # Mix over the learner axis only: flatten the rest so one matmul covers every element.
    if overlap:
        mixed = w @ before.reshape(n, -1) + (after - before).reshape(n, -1)
    else:
        mixed = w @ after.reshape(n, -1)
    return mixed.reshape(after.shape)


def gossip_tree(before: Tree, after: Tree, overlap: bool) -> Tree:
    """gossip_reference applied to every leaf of (nested) dicts of (N, ...) arrays."""
    return tree_map_reference(lambda b, a: gossip_reference(b, a, overlap), before, after)


# --- BMUF --------------------------------------------------------------------------------


def bmuf_default_momentum(n: int) -> float:
    """Block momentum eta = 1 - 1/n, from zeta / (n (1 - eta)) = 1 with zeta = 1."""
    if n < 1:
        raise ValueError(f"need at least 1 learner, got {n}")
    return 1.0 - 1.0 / n


def bmuf_reference(
    learners: np.ndarray,
    global_: np.ndarray,
    momentum: np.ndarray,
    eta: float,
    zeta: float,
    nesterov: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One BMUF block update.

    learners: (N, ...) learners' parameters at the end of the block.
    global_:  (...) global model at the start of the block.
    momentum: (...) block momentum.
    Returns (new_global (...), new_momentum (...), new_learners (N, ...)), all float64:
      G = mean_i learners[i] - global_
      new_momentum = eta * momentum + zeta * G
      new_global = global_ + new_momentum (+ eta * new_momentum with Nesterov)
      new_learners[i] = new_global (every learner restarts the next block from it).
    """
    learners = np.asarray(learners, dtype=np.float64)
    global_ = np.asarray(global_, dtype=np.float64)
    momentum = np.asarray(momentum, dtype=np.float64)
    block_gradient = learners.mean(axis=0) - global_
    new_momentum = eta * momentum + zeta * block_gradient
    new_global = global_ + new_momentum
    if nesterov:
        # Look ahead by one more momentum step, as Nesterov's variant does.
        new_global = new_global + eta * new_momentum
    new_learners = np.broadcast_to(new_global, learners.shape).copy()
    return new_global, new_momentum, new_learners


def bmuf_tree(
    learners: Tree,
    global_: Tree,
    momentum: Tree,
    eta: float,
    zeta: float,
    nesterov: bool,
) -> tuple[Tree, Tree, Tree]:
    """bmuf_reference per leaf of (nested) dicts; returns (new_global, new_momentum,
    new_learners) as three dicts of the same structure."""
    per_leaf = tree_map_reference(
        lambda w, g, m: bmuf_reference(w, g, m, eta, zeta, nesterov),
        learners,
        global_,
        momentum,
    )
    return _tree_pick(per_leaf, 0), _tree_pick(per_leaf, 1), _tree_pick(per_leaf, 2)


# --- GTC ---------------------------------------------------------------------------------


def gtc_capacity(n: int, capacity: float) -> int:
    """Elements one message holds: max(1, ceil(capacity * n))."""
    if capacity <= 0:
        raise ValueError(f"capacity must be > 0, got {capacity}")
    return max(1, math.ceil(capacity * n))


def _check_values(values: str) -> None:
    if values not in GTC_VALUE_MODES:
        raise ValueError(f"values must be one of {GTC_VALUE_MODES}, got {values!r}")


def pack_sign_words(indices: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """Packs (index, sign) pairs into int32 words: index * 2 + (1 if negative else 0).

    indices: (k,) ints; negative: (k,) bool. Returns (k,) int32.
    """
    indices = np.asarray(indices, dtype=np.int64)
    negative = np.asarray(negative, dtype=bool)
    return (indices * 2 + negative.astype(np.int64)).astype(np.int32)


def unpack_sign_words(words: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of pack_sign_words, skipping padding (-1).

    words: (cap,) int32. Returns (indices (k,) int32, values (k,) float32) with
    value = -tau for odd words, +tau for even ones.
    """
    words = np.asarray(words, dtype=np.int64)
    words = words[words != -1]
    tau32 = np.float32(tau)
    values = np.where(words % 2 == 1, -tau32, tau32).astype(np.float32)
    return (words // 2).astype(np.int32), values


def gtc_compress_reference(
    residual: np.ndarray,
    grad: np.ndarray,
    tau: float,
    density: float,
    capacity: float,
    values: str,
) -> dict[str, Any]:
    """One learner's GTC message from a flattened vector of n elements.

    residual, grad: (n,), cast to float32. Returns a dict:
      "x": (n,) float32, residual + grad added in float32.
      "tau": float32 threshold used: with density > 0 the k-th largest |x|,
             k = max(1, ceil(density * n)) (capped at n), else float32(tau).
      "indices": (cap,) int32, the first cap indices with |x| >= tau in increasing
             order, padded with -1; cap = max(1, ceil(capacity * n)).
      "values_sent": (cap,) float32, +-tau ("sign", + when x >= 0) or x ("float"),
             0 in padding.
      "words": (cap,) int32, "sign" only (key absent for "float"): index * 2 + (x < 0),
             padding -1.
      "new_residual": (n,) float32, x minus the sent values at the sent indices.
      "sent": int, elements sent; "overflow": int, qualifying elements left unsent.
    """
    _check_values(values)
    x = np.asarray(residual, dtype=np.float32) + np.asarray(grad, dtype=np.float32)
    x = x.reshape(-1)
    n = x.shape[0]
    cap = gtc_capacity(n, capacity)
    if values == "sign" and tau <= 0 and density == 0:
        raise ValueError("sign values need tau > 0 or density > 0: +-0 carries nothing")

    magnitude = np.abs(x)
    if density > 0:
        k = min(n, max(1, math.ceil(density * n)))
        # The k-th largest magnitude: at least k elements reach it (more on ties).
        threshold = np.sort(magnitude)[::-1][k - 1]
    else:
        threshold = np.float32(tau)
    threshold = np.float32(threshold)

    qualifying = np.flatnonzero(magnitude >= threshold)  # increasing index order
    sent_idx = qualifying[:cap]
    overflow = max(0, qualifying.shape[0] - cap)

    if values == "sign":
        v = np.where(x[sent_idx] >= 0, threshold, -threshold).astype(np.float32)
    else:
        v = x[sent_idx].copy()

    new_residual = x.copy()
    # float32 subtraction: the residual is what the JAX side keeps in float32 too.
    new_residual[sent_idx] = (x[sent_idx] - v).astype(np.float32)

    indices = np.full(cap, -1, dtype=np.int32)
    indices[: sent_idx.shape[0]] = sent_idx
    values_sent = np.zeros(cap, dtype=np.float32)
    values_sent[: sent_idx.shape[0]] = v

    result: dict[str, Any] = {
        "x": x,
        "tau": threshold,
        "indices": indices,
        "values_sent": values_sent,
        "new_residual": new_residual,
        "sent": int(sent_idx.shape[0]),
        "overflow": int(overflow),
    }
    if values == "sign":
        words = np.full(cap, -1, dtype=np.int32)
        words[: sent_idx.shape[0]] = pack_sign_words(sent_idx, x[sent_idx] < 0)
        result["words"] = words
    return result


def gtc_exchange_reference(
    residuals: np.ndarray,
    grads: np.ndarray,
    tau: float,
    density: float,
    capacity: float,
    values: str,
) -> dict[str, np.ndarray]:
    """GTC exchange among N learners on one flattened vector.

    residuals, grads: (N, n). Every learner compresses its own residual + grad, and all
    learners receive every message. Returns:
      "aggregate": (n,) float32, the sent values of learners 0..N-1 scattered at their
                   indices, accumulated in float32 learner by learner in that order.
      "new_residuals": (N, n) float32; "sent", "overflow": (N,) int64; "tau": (N,) float32.
    """
    residuals = np.asarray(residuals)
    grads = np.asarray(grads)
    if residuals.shape != grads.shape or residuals.ndim != 2:
        raise ValueError(f"need equal (N, n) shapes, got {residuals.shape}, {grads.shape}")
    per_learner = [
        gtc_compress_reference(r, g, tau, density, capacity, values)
        for r, g in zip(residuals, grads, strict=True)
    ]
    aggregate = np.zeros(residuals.shape[1], dtype=np.float32)
    for msg in per_learner:
        k = msg["sent"]
        # Indices within one message are distinct, so a plain fancy-index add is exact;
        # one learner at a time fixes the float32 summation order.
        aggregate[msg["indices"][:k]] += msg["values_sent"][:k]
    return {
        "aggregate": aggregate,
        "new_residuals": np.stack([m["new_residual"] for m in per_learner]),
        "sent": np.array([m["sent"] for m in per_learner], dtype=np.int64),
        "overflow": np.array([m["overflow"] for m in per_learner], dtype=np.int64),
        "tau": np.array([m["tau"] for m in per_learner], dtype=np.float32),
    }


def gtc_exchange_tree(
    residuals: Tree,
    grads: Tree,
    tau: float,
    density: float,
    capacity: float,
    values: str,
) -> dict[str, Any]:
    """gtc_exchange_reference per leaf of (nested) dicts of (N, ...) arrays.

    Each leaf is flattened per learner in row-major order (reshape(N, -1)), so capacity
    and adaptive thresholds apply per leaf. Returns {"aggregate": dict of (...) float32,
    "new_residuals": dict of (N, ...) float32, "sent": (N,) and "overflow": (N,) int64
    totals over leaves}.
    """

    def one_leaf(r: np.ndarray, g: np.ndarray) -> tuple[Any, ...]:
        r = np.asarray(r)
        g = np.asarray(g)
        n_learners = r.shape[0]
        out = gtc_exchange_reference(
            r.reshape(n_learners, -1), g.reshape(n_learners, -1), tau, density, capacity, values
        )
        return (
            out["aggregate"].reshape(r.shape[1:]),
            out["new_residuals"].reshape(r.shape),
            out["sent"],
            out["overflow"],
        )

    per_leaf = tree_map_reference(one_leaf, residuals, grads)
    sent = _tree_leaves(_tree_pick(per_leaf, 2))
    overflow = _tree_leaves(_tree_pick(per_leaf, 3))
    return {
        "aggregate": _tree_pick(per_leaf, 0),
        "new_residuals": _tree_pick(per_leaf, 1),
        "sent": np.sum(sent, axis=0, dtype=np.int64),
        "overflow": np.sum(overflow, axis=0, dtype=np.int64),
    }


# --- bytes on the wire -------------------------------------------------------------------


def gtc_message_bytes(n: int, capacity: float, values: str) -> int:
    """Bytes of one learner's GTC message over an n-element vector.

    "sign": cap int32 words + one float32 tau = cap * 4 + 4.
    "float": cap int32 indices + cap float32 values = cap * 8.
    """
    _check_values(values)
    cap = gtc_capacity(n, capacity)
    return cap * 4 + 4 if values == "sign" else cap * 8


def gtc_sent_bytes(n: int, capacity: float, values: str, num_learners: int) -> int:
    """Bytes one device sends in a ring all-gather of fixed-size messages:
    (N - 1) * gtc_message_bytes."""
    return (num_learners - 1) * gtc_message_bytes(n, capacity, values)


def allreduce_sent_bytes(n_bytes: float, num_learners: int) -> float:
    """Bytes one device sends in a ring all-reduce of n_bytes: 2 (N - 1) / N * n_bytes
    (reduce-scatter then all-gather, each moving (N - 1) / N of the buffer)."""
    return 2.0 * (num_learners - 1) / num_learners * n_bytes
