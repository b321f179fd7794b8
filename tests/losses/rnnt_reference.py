"""Independent numpy references for the transducer losses (float64, no jaxspeech code).

On tiny lattices (T, U <= 4 or so) the RNN-T likelihood is computed the way it is defined:
a log-sum-exp over every monotonic alignment, enumerated one by one. An alignment of T
frames and U labels is a sequence of T + U moves from cell (0, 0): a label move from (t, u)
to (t, u+1) emits y_{u+1}, a blank move from (t, u) to (t+1, u) ends frame t, and the last
move is the blank at (T-1, U). On larger lattices, where enumerating is out of reach, the
textbook dynamic programmes (forward recursion, Viterbi, CTC's extended-label recursion)
stand in; each is checked against an enumeration in the tests before it is relied on.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import numpy as np

Move = tuple[int, int, bool]  # (t, u, emits_label) of the cell the move leaves


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def alignments(t_len: int, u_len: int) -> Iterator[list[Move]]:
    """Every alignment of t_len >= 1 frames and u_len labels: choose which of the first
    T + U - 1 moves emit labels (the last move is the final blank)."""
    for label_moves in itertools.combinations(range(t_len + u_len - 1), u_len):
        t = u = 0
        moves = []
        for k in range(t_len + u_len):
            is_label = k in label_moves
            moves.append((t, u, is_label))
            t, u = (t, u + 1) if is_label else (t + 1, u)
        assert (t, u) == (t_len, u_len)
        yield moves


def lattice_paths(
    blank_tu: np.ndarray,
    label_tu: np.ndarray,
    t_len: int,
    u_len: int,
    allowed: Callable[[int, int], bool] | None = None,
) -> list[tuple[float, list[Move]]]:
    """(log-probability, moves) of every alignment whose cells all satisfy `allowed`, with
    blank_tu[t, u] = log p(blank | t, u) and label_tu[t, u] = log p(y_{u+1} | t, u)."""
    out = []
    for moves in alignments(t_len, u_len):
        if allowed is not None and not all(allowed(t, u) for t, u, _ in moves):
            continue
        score = sum(label_tu[t, u] if lab else blank_tu[t, u] for t, u, lab in moves)
        out.append((float(score), moves))
    return out


def lattice_logprobs(
    logits_tuv: np.ndarray, labels: list[int], blank: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(T, U+1) blank and next-label log-probabilities of a (T, U+1, V) logit lattice (the
    last column of the label grid is -inf: there is no next label)."""
    logp = log_softmax(logits_tuv)
    blank_tu = logp[..., blank]
    label_tu = np.full(blank_tu.shape, -np.inf)
    for u, y in enumerate(labels):
        label_tu[:, u] = logp[:, u, y]
    return blank_tu, label_tu


def nll_by_enumeration(
    logits_tuv: np.ndarray,
    labels: list[int],
    blank: int = 0,
    allowed: Callable[[int, int], bool] | None = None,
) -> tuple[float, np.ndarray]:
    """(-log P(y | x), its gradient w.r.t. the logits) summing every alignment (only those
    inside `allowed`, if given; (inf, 0) when none is). The gradient is that of a sum of
    paths: sum over paths of posterior(path) * d(-log p(path)), and each move's
    d(-log softmax(z)[k]) / dz = softmax(z) - onehot(k)."""
    t_len, u1, _ = logits_tuv.shape
    assert u1 == len(labels) + 1
    blank_tu, label_tu = lattice_logprobs(logits_tuv, labels, blank)
    paths = lattice_paths(blank_tu, label_tu, t_len, len(labels), allowed)
    grad = np.zeros(logits_tuv.shape)
    if not paths:
        return np.inf, grad
    log_p = np.logaddexp.reduce([s for s, _ in paths])
    probs = np.exp(log_softmax(logits_tuv))
    for s, moves in paths:
        w = np.exp(s - log_p)
        for t, u, lab in moves:
            grad[t, u] += w * probs[t, u]
            grad[t, u, labels[u] if lab else blank] -= w
    return float(-log_p), grad


def occupation_by_enumeration(
    blank_tu: np.ndarray, label_tu: np.ndarray, t_len: int, u_len: int
) -> np.ndarray:
    """(T, U+1) posterior probability that the alignment visits each cell."""
    paths = lattice_paths(blank_tu, label_tu, t_len, u_len)
    log_p = np.logaddexp.reduce([s for s, _ in paths])
    occ = np.zeros(blank_tu.shape)
    for s, moves in paths:
        for t, u, _ in moves:
            occ[t, u] += np.exp(s - log_p)
    return occ


def forward_nll(
    blank_tu: np.ndarray,
    label_tu: np.ndarray,
    t_len: int,
    u_len: int,
    allowed: Callable[[int, int], bool] | None = None,
) -> float:
    """-log P by the forward recursion, cell by cell (for lattices too big to enumerate);
    with `allowed`, over the alignments whose every cell it allows (a cell it forbids
    gets alpha = -inf, so no alignment passes through it)."""
    alpha = np.full((t_len, u_len + 1), -np.inf)
    for t in range(t_len):
        for u in range(u_len + 1):
            if allowed is not None and not allowed(t, u):
                continue
            if t == u == 0:
                alpha[t, u] = 0.0
                continue
            a = alpha[t - 1, u] + blank_tu[t - 1, u] if t > 0 else -np.inf
            b = alpha[t, u - 1] + label_tu[t, u - 1] if u > 0 else -np.inf
            alpha[t, u] = np.logaddexp(a, b)
    return float(-(alpha[t_len - 1, u_len] + blank_tu[t_len - 1, u_len]))  # inf if no path


def viterbi(
    blank_tu: np.ndarray, label_tu: np.ndarray, t_len: int, u_len: int
) -> tuple[float, list[tuple[int, int]]]:
    """(log-probability, visited cells in order) of the single most probable alignment."""
    delta = np.full((t_len, u_len + 1), -np.inf)
    came_by_label = np.zeros((t_len, u_len + 1), bool)
    for t in range(t_len):
        for u in range(u_len + 1):
            if t == u == 0:
                delta[t, u] = 0.0
                continue
            a = delta[t - 1, u] + blank_tu[t - 1, u] if t > 0 else -np.inf
            b = delta[t, u - 1] + label_tu[t, u - 1] if u > 0 else -np.inf
            delta[t, u], came_by_label[t, u] = max(a, b), b > a
    cells, t, u = [], t_len - 1, u_len
    while True:
        cells.append((t, u))
        if t == u == 0:
            break
        t, u = (t, u - 1) if came_by_label[t, u] else (t - 1, u)
    return float(delta[-1, u_len] + blank_tu[t_len - 1, u_len]), cells[::-1]


def ctc_nll(logits_tv: np.ndarray, labels: list[int], blank: int = 0) -> float:
    """CTC -log P(y | x) by the extended-label (blank-interleaved) forward recursion."""
    logp = log_softmax(logits_tv)
    ext = [blank]
    for y in labels:
        ext += [y, blank]
    alpha = np.full(len(ext), -np.inf)
    alpha[0] = logp[0, blank]
    if labels:
        alpha[1] = logp[0, ext[1]]
    for t in range(1, len(logp)):
        prev = alpha.copy()
        for s in range(len(ext)):
            terms = [prev[s]]
            if s >= 1:
                terms.append(prev[s - 1])
            if s >= 2 and ext[s] != blank and ext[s] != ext[s - 2]:
                terms.append(prev[s - 2])
            alpha[s] = np.logaddexp.reduce(terms) + logp[t, ext[s]]
    tail = alpha[-2:] if labels else alpha[-1:]
    return float(-np.logaddexp.reduce(tail))


def ctc_nll_by_enumeration(logits_tv: np.ndarray, labels: list[int], blank: int = 0) -> float:
    """CTC -log P(y | x) summing every frame-level token sequence that collapses to y
    (merge repeats, then drop blanks). V^T sequences: tiny sizes only."""
    logp = log_softmax(logits_tv)
    t_len, v = logp.shape
    total = []
    for seq in itertools.product(range(v), repeat=t_len):
        merged = [k for i, k in enumerate(seq) if i == 0 or k != seq[i - 1]]
        if [k for k in merged if k != blank] == list(labels):
            total.append(sum(logp[t, k] for t, k in enumerate(seq)))
    return float(-np.logaddexp.reduce(total)) if total else np.inf
