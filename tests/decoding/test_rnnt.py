"""RNN-T greedy and modified beam search against plain-numpy references on a tiny random model."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspeech.decoding.rnnt import rnnt_greedy, rnnt_modified_beam_search, to_lists

D, H = 5, 6  # encoder dim, predictor dim


def _params(seed: int, v: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "emb": rng.standard_normal((v, H)),
        "w_rec": 0.7 * rng.standard_normal((H, H)),
        "w_enc": rng.standard_normal((D, H)),
        "w_pred": rng.standard_normal((H, H)),
        "w_out": 1.5 * rng.standard_normal((H, v)),
        "b_out": np.zeros(v),
    }


def _model(p: dict[str, np.ndarray], kind: str, xp, blank: int):
    """(pred_init, pred_step, joint) written once for numpy (reference) and jnp (decoders).

    'stateless': the state is the last label and the predictor output its embedding.
    'recurrent': the state is a pytree (h, number of labels fed); h' = tanh(h W + E[y]).
    """
    if xp is jnp:
        p = {k: jnp.asarray(a, jnp.float32) for k, a in p.items()}

    if kind == "stateless":

        def pred_init(n):
            return xp.full((n,), blank, xp.int32)

        def pred_step(state, tok):
            return p["emb"][tok], tok

    else:

        def pred_init(n):
            return (xp.zeros((n, H)), xp.zeros((n,), xp.int32))

        def pred_step(state, tok):
            h, count = state
            h = xp.tanh(h @ p["w_rec"] + p["emb"][tok])
            return h, (h, count + 1)

    def joint(enc, pred):
        return xp.tanh(enc @ p["w_enc"] + pred @ p["w_pred"]) @ p["w_out"] + p["b_out"]

    return pred_init, pred_step, joint


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _greedy_ref(enc_td, n, model, blank, max_sym):
    pred_init, pred_step, joint = model
    pred, state = pred_step(pred_init(1), np.full((1,), blank))
    out = []
    for t in range(n):
        for _ in range(max_sym):
            y = int(np.argmax(joint(enc_td[t : t + 1], pred)[0]))
            if y == blank:
                break
            out.append(y)
            pred, state = pred_step(state, np.array([y]))
    return out


def _modified_beam_sequences(enc_td, n, model, blank, v, max_sym=1) -> dict:
    """Every alignment in which each frame emits up to `max_sym` labels, followed by blank
    unless it emitted `max_sym` (max_sym 1: exactly one output per frame, as icefall's
    modified beam search: no blank after a label); probabilities summed per label
    sequence: {sequence: probability}."""
    pred_init, pred_step, joint = model
    pred0, state0 = pred_step(pred_init(1), np.full((1,), blank))
    probs: dict[tuple[int, ...], float] = {}
    labels = [y for y in range(v) if y != blank]

    def frame(t, pred, state, logp, seq):
        if t == n:
            probs[seq] = probs.get(seq, 0.0) + np.exp(logp)
            return
        extend(t, 0, pred, state, logp, seq)

    def extend(t, emitted, pred, state, logp, seq):
        lp = _log_softmax(joint(enc_td[t : t + 1], pred)[0])
        frame(t + 1, pred, state, logp + lp[blank], seq)  # blank ends the frame
        for y in labels:
            p2, s2 = pred_step(state, np.array([y]))
            if emitted + 1 == max_sym:  # the frame's last label ends it too
                frame(t + 1, p2, s2, logp + lp[y], seq + (y,))
            else:
                extend(t, emitted + 1, p2, s2, logp + lp[y], seq + (y,))

    frame(0, pred0, state0, 0.0, ())
    return probs


def _modified_beam_brute_force(enc_td, n, model, blank, v, max_sym=1):
    """The best (sequence, log-prob) of `_modified_beam_sequences`."""
    probs = _modified_beam_sequences(enc_td, n, model, blank, v, max_sym)
    best = max(probs, key=probs.get)
    return list(best), float(np.log(probs[best]))


def _modified_beam_ref(enc_td, n, model, blank, v, beam, max_sym=1):
    """icefall's modified beam search, one utterance, in plain Python: top `beam` of all
    (hypothesis, token) candidates, then candidates with equal sequences are log-added;
    `max_sym` such expansions per frame, a hypothesis that took blank (or the frame's
    last label) only staying in the later ones, merged only with hypotheses also done."""
    pred_init, pred_step, joint = model
    pred, state = pred_step(pred_init(1), np.full((1,), blank))
    hyps = [((), 0.0, pred, state, False)]
    for t in range(n):
        hyps = [(seq, score, pred, state, False) for seq, score, pred, state, _ in hyps]
        for e in range(max_sym):
            cands = []
            for k, (_, score, pred, _, done) in enumerate(hyps):
                if done:
                    cands.append((score, k, blank))
                    continue
                logp = _log_softmax(joint(enc_td[t : t + 1], pred)[0])
                cands += [(score + logp[y], k, y) for y in range(v)]
            cands.sort(key=lambda c: -c[0])
            merged: dict[tuple, list] = {}
            for score, k, y in cands[:beam]:
                seq, _, pred, state, done = hyps[k]
                done = True
                if y != blank:
                    seq = seq + (y,)
                    pred, state = pred_step(state, np.array([y]))
                    done = e == max_sym - 1
                if (seq, done) in merged:
                    merged[seq, done][1] = np.logaddexp(merged[seq, done][1], score)
                else:
                    merged[seq, done] = [seq, score, pred, state, done]
            hyps = [tuple(h) for h in merged.values()]
    seq, score, _, _, _ = max(hyps, key=lambda h: h[1])
    return list(seq), float(score)


def _decoders(model, blank):
    pred_init, pred_step, joint = model

    @functools.partial(jax.jit, static_argnames="max_sym")
    def greedy(enc, lens, max_sym):
        return rnnt_greedy(
            enc, lens, pred_init, pred_step, joint, blank_id=blank, max_symbols_per_frame=max_sym
        )

    @functools.partial(jax.jit, static_argnames=("beam", "max_sym"))
    def beam_search(enc, lens, beam, max_sym=1):
        return rnnt_modified_beam_search(
            enc,
            lens,
            pred_init,
            pred_step,
            joint,
            beam=beam,
            blank_id=blank,
            max_symbols_per_frame=max_sym,
        )

    return greedy, beam_search


def _enc(seed, b, t):
    return np.random.default_rng(seed).standard_normal((b, t, D)).astype(np.float32)


@pytest.mark.parametrize("kind,v,blank", [("stateless", 4, 0), ("recurrent", 3, 2)])
def test_greedy_equals_python_loop(kind, v, blank):
    p = _params(0, v)
    p["b_out"][blank] = -1.5  # favour labels, so that frames often emit several of them
    ref_model = _model(p, kind, np, blank)
    greedy, _ = _decoders(_model(p, kind, jnp, blank), blank)
    lens = np.array([4, 2, 0, 3, 4])
    most = 0
    for seed in range(3):
        enc = _enc(seed, 5, 4)
        for max_sym in (1, 3):
            tokens, num = greedy(enc, lens, max_sym)
            assert tokens.shape == (5, 4 * max_sym) and tokens.dtype == jnp.int32
            got = to_lists(tokens, num)
            want = [_greedy_ref(enc[i], lens[i], ref_model, blank, max_sym) for i in range(5)]
            assert got == want
            tokens = np.asarray(tokens)
            for row, n in zip(tokens, np.asarray(num)):
                assert (row[n:] == -1).all()
            if max_sym == 3:
                most = max(most, *(len(w) for w in want))
    assert most > 4  # some row emitted more labels than it has frames: the inner loop is tested


@pytest.mark.parametrize("kind,v,t,blank", [("stateless", 4, 3, 0), ("recurrent", 3, 4, 1)])
def test_modified_beam_search_equals_brute_force(kind, v, t, blank):
    p = _params(1, v)
    ref_model = _model(p, kind, np, blank)
    _, beam_search = _decoders(_model(p, kind, jnp, blank), blank)
    # Exact when no candidate is ever cut: K >= V * (number of distinct label sequences after
    # t-1 frames); then top-K keeps every candidate and all duplicates get merged.
    k = v * sum((v - 1) ** i for i in range(t))
    lens = np.array([t, t - 1, t, 1])
    for seed in range(2):
        enc = _enc(10 + seed, 4, t)
        tokens, num, score = beam_search(enc, lens, k)
        assert tokens.shape == (4, t)
        for i, hyp in enumerate(to_lists(tokens, num)):
            want_seq, want_logp = _modified_beam_brute_force(enc[i], lens[i], ref_model, blank, v)
            assert hyp == want_seq
            np.testing.assert_allclose(float(score[i]), want_logp, atol=1e-4, rtol=0)


@pytest.mark.parametrize("beam", [2, 3])
def test_pruned_modified_beam_search_equals_python_reference(beam):
    # A beam far narrower than the number of hypotheses: top-K pruning and merging must match a
    # dict-based reimplementation step for step.
    v, blank, t = 4, 0, 7
    p = _params(6, v)
    ref_model = _model(p, "recurrent", np, blank)
    _, beam_search = _decoders(_model(p, "recurrent", jnp, blank), blank)
    enc, lens = _enc(7, 3, t), np.array([7, 6, 4])
    tokens, num, score = beam_search(enc, lens, beam)
    for i, hyp in enumerate(to_lists(tokens, num)):
        want_seq, want_score = _modified_beam_ref(enc[i], lens[i], ref_model, blank, v, beam)
        assert hyp == want_seq
        np.testing.assert_allclose(float(score[i]), want_score, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind,v,t,blank", [("stateless", 3, 3, 0), ("recurrent", 4, 2, 1)])
def test_several_labels_per_frame_equal_brute_force(kind, v, t, blank):
    """Up to 2 labels per frame, a beam wide enough never to cut: the best sequence of all
    such alignments, its probability summed over them."""
    p = _params(8, v)
    p["b_out"][blank] = -1.0  # labels likely enough that frames emit two
    ref_model = _model(p, kind, np, blank)
    _, beam_search = _decoders(_model(p, kind, jnp, blank), blank)
    lens = np.array([t, t - 1, t])
    enc = _enc(30, 3, t)
    tokens, num, score = beam_search(enc, lens, 256, max_sym=2)
    assert tokens.shape == (3, 2 * t)
    longest = 0
    for i, hyp in enumerate(to_lists(tokens, num)):
        want_seq, want_logp = _modified_beam_brute_force(enc[i], lens[i], ref_model, blank, v, 2)
        assert hyp == want_seq
        np.testing.assert_allclose(float(score[i]), want_logp, atol=1e-4, rtol=0)
        longest = max(longest, len(hyp) - lens[i])
    assert longest > 0  # some best sequence has more labels than frames


@pytest.mark.parametrize("beam,max_sym", [(2, 2), (3, 3)])
def test_pruned_search_with_several_labels_per_frame_equals_python_reference(beam, max_sym):
    v, blank, t = 4, 0, 6
    p = _params(9, v)
    p["b_out"][blank] = -1.0
    ref_model = _model(p, "recurrent", np, blank)
    greedy, beam_search = _decoders(_model(p, "recurrent", jnp, blank), blank)
    enc, lens = _enc(12, 3, t), np.array([6, 5, 3])
    tokens, num, score = beam_search(enc, lens, beam, max_sym=max_sym)
    for i, hyp in enumerate(to_lists(tokens, num)):
        want_seq, want_score = _modified_beam_ref(
            enc[i], lens[i], ref_model, blank, v, beam, max_sym
        )
        assert hyp == want_seq
        np.testing.assert_allclose(float(score[i]), want_score, atol=1e-4, rtol=0)
    # One hypothesis and S labels per frame is greedy search with S symbols per frame.
    g_tokens, g_num = greedy(enc, lens, max_sym)
    b_tokens, b_num, _ = beam_search(enc, lens, 1, max_sym=max_sym)
    assert to_lists(b_tokens, b_num) == to_lists(g_tokens, g_num)
    assert any(len(g) > n for g, n in zip(to_lists(g_tokens, g_num), lens))


@pytest.mark.parametrize("kind", ["stateless", "recurrent"])
def test_beam1_equals_greedy_one_symbol_per_frame(kind):
    v, blank = 4, 0
    greedy, beam_search = _decoders(_model(_params(2, v), kind, jnp, blank), blank)
    enc, lens = _enc(3, 4, 6), np.array([6, 5, 3, 0])
    g_tokens, g_num = greedy(enc, lens, 1)
    b_tokens, b_num, _ = beam_search(enc, lens, 1)
    assert to_lists(b_tokens, b_num) == to_lists(g_tokens, g_num)
    assert sum(to_lists(g_tokens, g_num), []) != []


def test_rows_independent_and_padding_ignored():
    v, blank, t = 4, 0, 5
    greedy, beam_search = _decoders(_model(_params(3, v), "recurrent", jnp, blank), blank)
    enc, lens = _enc(4, 3, t), np.array([5, 3, 2])
    # Garbage in the padded frames must not change anything.
    garbage = enc.copy()
    for i, n in enumerate(lens):
        garbage[i, n:] = 50.0 * _enc(5 + i, 1, t - n)[0]
    results = {
        "greedy": lambda e, n: greedy(e, n, 2)[:2],
        "beam": lambda e, n: beam_search(e, n, 3),
    }
    for name, decode in results.items():
        batch = [np.asarray(x) for x in decode(enc, lens)]
        padded = [np.asarray(x) for x in decode(garbage, lens)]
        for a, b in zip(batch, padded):
            np.testing.assert_array_equal(a, b, err_msg=name)
        for i in range(3):
            alone = [np.asarray(x) for x in decode(enc[i : i + 1], lens[i : i + 1])]
            for a, b in zip(batch, alone):
                np.testing.assert_allclose(a[i], b[0], atol=1e-5, err_msg=name)


def test_to_lists():
    tokens = np.array([[3, 1, -1, -1], [-1, -1, -1, -1], [2, 2, 2, 1]])
    assert to_lists(tokens, np.array([2, 0, 4])) == [[3, 1], [], [2, 2, 2, 1]]


@pytest.mark.parametrize("kind", ["stateless", "recurrent"])
def test_frames_of_the_emitted_labels(kind):
    v, blank, max_sym = 4, 0, 3
    p = _params(4, v)
    p["b_out"][blank] = -1.5  # several labels per frame
    pred_init, pred_step, joint = _model(p, kind, np, blank)
    model = _model(p, kind, jnp, blank)
    enc, lens = _enc(11, 3, 5), np.array([5, 3, 0])
    tokens, num, frames = jax.jit(
        lambda e, n: rnnt_greedy(
            e, n, *model, blank_id=blank, max_symbols_per_frame=max_sym, with_frames=True
        )
    )(enc, lens)
    for i in range(3):
        # Reference: the Python greedy loop, noting the frame of every label it emits.
        pred, state = pred_step(pred_init(1), np.full((1,), blank))
        want = []
        for t in range(lens[i]):
            for _ in range(max_sym):
                y = int(np.argmax(joint(enc[i, t : t + 1], pred)[0]))
                if y == blank:
                    break
                want.append((y, t))
                pred, state = pred_step(state, np.array([y]))
        n = int(num[i])
        assert (
            list(zip(np.asarray(tokens[i, :n]).tolist(), np.asarray(frames[i, :n]).tolist()))
            == want
        )
        assert (np.asarray(frames[i, n:]) == -1).all()
    _, beam_search = _decoders(model, blank)
    plain = beam_search(enc, lens, 3)
    tokens_b, num_b, score_b, frames_b = jax.jit(
        lambda e, n: rnnt_modified_beam_search(
            e, n, *model, beam=3, blank_id=blank, with_frames=True
        )
    )(enc, lens)
    for a, b in zip(plain, (tokens_b, num_b, score_b)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for row, n, length in zip(np.asarray(frames_b), np.asarray(num_b), lens):
        # One label per frame at most: strictly increasing frames inside the row's length.
        assert (np.diff(row[:n]) > 0).all() and (row[:n] < length).all() and (row[n:] == -1).all()
