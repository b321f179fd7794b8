"""Streaming Conformer: chunk masks, causal convolution, x8 subsampling, cached chunk-by-chunk
inference (== the masked full computation), dynamic chunk training, remat, streamed features."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.config import build
from jaxspeech.models.conformer import (
    REMAT_POLICIES,
    ConformerEncoder,
    chunk_attention_mask,
    draw_chunk_size,
)
from jaxspeech.models.frontend import FeatureStats, Frontend
from jaxspeech.models.layers import depthwise_conv1d
from jaxspeech.models.subsampling import Conv2dSubsampling, subsampled_length

F = 20  # the fewest features x8 subsampling leaves one bin of: 20 -> 9 -> 4 -> 1


# The tiny encoder of these tests (num_features aside).
TINY = dict(
    dim=16, num_layers=2, num_heads=2, ff_mult=2, conv_kernel=5, subsampling_channels=4, dropout=0.0
)


def _encoder(*, params=None, **kw):
    """A tiny encoder with random parameters (or `params`, a pure dict), built abstractly:
    the eager initializers would cost seconds of op compilation per test."""
    args = dict(num_features=F, **TINY)
    enc = nnx.eval_shape(lambda: ConformerEncoder(**(args | kw), rngs=nnx.Rngs(0)))
    state = nnx.state(enc, nnx.Param)
    if params is None:
        rng = np.random.default_rng(0)

        def draw(path, leaf):
            name = str(path[-1].key)
            if name == "scale":  # LayerNorm
                return 1 + 0.1 * rng.standard_normal(leaf.shape, np.float32)
            if len(leaf.shape) < 2 or name.startswith("pos_bias"):
                return 0.1 * rng.standard_normal(leaf.shape, np.float32)
            fan_in = leaf.shape[0] * (leaf.shape[1] if name == "wo" else 1)
            return rng.standard_normal(leaf.shape, np.float32) / np.sqrt(fan_in)

        params = jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, params)
    nnx.update(enc, state)
    return enc


def _scanned_copy(enc, **kw):
    """A scan_layers=True encoder holding `enc`'s (unrolled) parameters, stacked."""
    params = nnx.to_pure_dict(nnx.state(enc, nnx.Param))
    blocks = params["blocks"]
    params["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[blocks[i] for i in sorted(blocks)])
    return _encoder(scan_layers=True, params=params, **kw)


# ------------------------------------------------------------------------------------------
# Masks and layers against brute force.
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("c,left", [(1, -1), (3, -1), (3, 0), (4, 1), (2, 2), (20, 1)])
def test_chunk_mask_matches_double_loop(c, left):
    t, lengths = 11, [11, 7]
    enc = _encoder(chunk_size=c, left_chunks=left)
    valid = jnp.arange(t)[None, :] < jnp.array(lengths)[:, None]
    got = np.asarray(enc._chunk_mask(valid, deterministic=True, rngs=None))
    traced = jax.jit(lambda n: chunk_attention_mask(t, n, left))(jnp.int32(c))
    np.testing.assert_array_equal(np.asarray(traced), np.asarray(chunk_attention_mask(t, c, left)))
    for b, length in enumerate(lengths):
        for i in range(t):
            for j in range(t):
                ci, cj = i // c, j // c
                want = cj <= ci and (left < 0 or cj >= ci - left) and j < length
                assert got[b, i, j] == want, (b, i, j)


def test_full_context_has_no_chunk_mask():
    enc = _encoder()
    assert enc._chunk_mask(jnp.ones((1, 5), bool), deterministic=True, rngs=None) is None


@pytest.mark.parametrize(
    "t,k,block", [(3, 5, 32), (11, 5, 4), (40, 15, 8), (37, 1, 16), (9, 4, 32)]
)
def test_causal_depthwise_conv_matches_np_convolve(t, k, block):
    rng = np.random.default_rng(t + k)
    x = rng.standard_normal((2, t, 3)).astype(np.float32)
    w = rng.standard_normal((k, 3)).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    got = np.asarray(depthwise_conv1d(x, w, bias, block=block, causal=True))
    want = np.empty_like(x)
    for b in range(2):
        for ch in range(3):
            # out[t] = sum_s w[s] x[t - (K - 1) + s]: a causal FIR filter with taps w reversed.
            want[b, :, ch] = np.convolve(x[b, :, ch], w[::-1, ch])[:t] + bias[ch]
    np.testing.assert_allclose(got, want, atol=1e-5)
    # The future does not reach the past: changing frames >= t0 leaves outputs < t0 alone.
    t0 = t // 2
    x2 = x.copy()
    x2[:, t0:] = rng.standard_normal(x2[:, t0:].shape)
    got2 = np.asarray(depthwise_conv1d(x2, w, bias, block=block, causal=True))
    np.testing.assert_array_equal(got2[:, :t0], got[:, :t0])


def _count_valid(length, kernel=3, stride=2):
    return sum(1 for start in range(0, length, stride) if start + kernel <= length)


def test_x8_subsampling_matches_lax_conv():
    ch, dim, t = 3, 8, 61
    sub = Conv2dSubsampling(F, ch, dim, factor=8, dtype=jnp.float32, rngs=nnx.Rngs(1))
    assert sub.receptive_field == 15
    x = np.random.default_rng(2).standard_normal((2, t, F)).astype(np.float32)
    lengths = np.array([t, 16])
    got, got_len = nnx.jit(lambda m, x, n: m(x, n))(sub, jnp.asarray(x), jnp.asarray(lengths))

    @jax.jit
    def reference(h):  # three stock VALID 3x3 stride-2 convolutions, patch order (i, j, c)
        for w, b in [(sub.w1, sub.b1), (sub.w2, sub.b2), (sub.w3, sub.b3)]:
            kernel = jnp.asarray(w[...]).reshape(3, 3, h.shape[-1], ch)  # HWIO
            h = jax.lax.conv_general_dilated(
                h, kernel, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
            h = jax.nn.relu(h + jnp.asarray(b[...]))
        return h

    h = reference(x[..., None])
    flat = np.asarray(h).reshape(2, h.shape[1], -1)
    want = flat @ np.asarray(sub.out.kernel[...]) + np.asarray(sub.out.bias[...])
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4)
    want_len = [_count_valid(_count_valid(_count_valid(n))) for n in lengths]
    assert got.shape[1] == want_len[0] and list(np.asarray(got_len)) == want_len
    for n in range(0, 60):
        want = _count_valid(_count_valid(_count_valid(n)))
        got = subsampled_length(n, 8)
        # Below the receptive field no frame is valid (the formula then gives <= 0).
        assert got == want if n >= 15 else (got <= 0 and want == 0), n
        want4 = _count_valid(_count_valid(n))
        assert subsampled_length(n, 4) == want4 if n >= 7 else subsampled_length(n, 4) <= 0


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match=r"\(4, 8\)"):
        _encoder(subsampling_factor=6)
    with pytest.raises(ValueError, match="remat"):
        _encoder(remat="some")
    with pytest.raises(ValueError, match="causal"):
        _encoder(chunk_size=2).init_stream(1)
    with pytest.raises(ValueError, match="chunk_size"):
        _encoder(causal=True).init_stream(1)
    with pytest.raises(ValueError, match="max_history"):
        _encoder(causal=True, chunk_size=2).init_stream(1)


# ------------------------------------------------------------------------------------------
# Chunk-by-chunk inference == the masked full-sequence computation.
# ------------------------------------------------------------------------------------------


def _stream_and_full(enc, feats, lengths, full_enc, **init_kw):
    """One jitted program: `full_enc` on the whole (B, T, F) features, and `enc` streaming
    them as documented (first window, then a scan over the later ones, which also
    checks that the state keeps its shapes). Returns the full outputs and lengths, the
    concatenated streamed outputs and validity masks, and the number of calls."""
    b = feats.shape[0]
    total = int(max(subsampled_length(np.asarray(lengths), enc.subsampling.factor)))
    calls = -(-total // enc.chunk_size)
    first, later = enc.stream_frames(first=True), enc.stream_frames(first=False)
    padded = np.zeros((b, first + (calls - 1) * later, F), np.float32)
    padded[:, : feats.shape[1]] = feats[:, : padded.shape[1]]  # the last call is padded
    starts = np.array([0] + [first + i * later for i in range(calls - 1)])
    real = np.clip(np.asarray(lengths)[None, :] - starts[:, None], 0, None)
    real = np.minimum(real, np.array([first] + [later] * (calls - 1))[:, None]).astype(np.int32)
    rest = padded[:, first:].reshape(b, calls - 1, later, F).transpose(1, 0, 2, 3)

    @nnx.jit
    def run(full_enc, enc, feats, lengths, head, rest, real):
        full = full_enc(feats, lengths, deterministic=True)
        out, valid, state = enc.stream_step(enc.init_stream(b, **init_kw), head, real[0])

        def step(enc, state, xs):
            out, valid, state = enc.stream_step(state, *xs)
            return state, (out, valid)

        scan = nnx.scan(step, in_axes=(None, nnx.Carry, 0), out_axes=(nnx.Carry, 0))
        _, (outs, valids) = scan(enc, state, (rest, real[1:]))
        outs = jnp.concatenate([out[:, None], outs.transpose(1, 0, 2, 3)], axis=1)
        valids = jnp.concatenate([valid[:, None], valids.transpose(1, 0, 2)], axis=1)
        return full, outs.reshape(b, -1, outs.shape[-1]), valids.reshape(b, -1)

    (full, full_len), got, valid = run(full_enc, enc, feats, lengths, padded[:, :first], rest, real)
    return np.asarray(full), np.asarray(full_len), np.asarray(got), np.asarray(valid), calls


def _partial_length(t, factor, chunk):
    """The first length >= t whose encoder output ends inside a chunk."""
    while subsampled_length(t, factor) % chunk == 0:
        t += 1
    return t


@pytest.mark.parametrize(
    "factor,chunk,left,scan,pos_enc",
    [
        (4, 3, -1, False, "rel"),
        (4, 2, 1, True, "rel"),
        (8, 2, 2, True, "rel"),
        (4, 3, 1, True, "rope"),
    ],
)
def test_stream_equals_masked_full_sequence(factor, chunk, left, scan, pos_enc):
    kw = dict(
        subsampling_factor=factor, causal=True, chunk_size=chunk, left_chunks=left, pos_enc=pos_enc
    )
    enc = _encoder(**kw)
    t = _partial_length(80 if factor == 4 else 120, factor, chunk)
    rng = np.random.default_rng(factor + chunk)
    feats = rng.standard_normal((2, t, F)).astype(np.float32)
    # The second utterance is shorter, with garbage past its end; both end inside a chunk.
    lengths = np.array([t, _partial_length(t - 29, factor, chunk)])
    # Scanned layers stream with the same (stacked) parameters.
    streamer = _scanned_copy(enc, **kw) if scan else enc
    # left_chunks < 0: the cache holds every earlier frame of these short utterances.
    history = int(subsampled_length(t, factor))
    full, full_len, got, valid, calls = _stream_and_full(
        streamer, feats, lengths, enc, max_history=history
    )
    assert calls == -(-full.shape[1] // chunk)
    for b, n in enumerate(full_len):
        assert n % chunk  # the last chunk is partial
        np.testing.assert_array_equal(valid[b], np.arange(valid.shape[1]) < n)
        np.testing.assert_allclose(got[b, :n], full[b, :n], atol=1e-5)


def test_stream_step_checks_its_input_size():
    enc = _encoder(causal=True, chunk_size=2, left_chunks=1)
    assert (enc.stream_frames(first=True), enc.stream_frames(first=False)) == (11, 8)
    assert _encoder(causal=True, chunk_size=2, subsampling_factor=8).stream_frames(first=True) == 23
    state = enc.init_stream(1)
    with pytest.raises(ValueError, match="first stream_step call takes 11"):
        enc.stream_step(state, jnp.zeros((1, 8, F)))
    with pytest.raises(ValueError, match="later stream_step call takes 8"):
        enc.stream_step(state.replace(started=True), jnp.zeros((1, 11, F)))


# ------------------------------------------------------------------------------------------
# Dynamic chunk training.
# ------------------------------------------------------------------------------------------


def test_draw_chunk_size_follows_the_rule():
    n, max_chunk, full = 8000, 5, 99
    sizes = np.asarray(
        jax.vmap(lambda k: draw_chunk_size(k, max_chunk, full))(
            jax.random.split(jax.random.key(0), n)
        )
    )
    values, counts = np.unique(sizes, return_counts=True)
    assert set(values) == {1, 2, 3, 4, 5, full}
    freq = dict(zip(values.tolist(), (counts / n).tolist()))
    # 4 standard deviations of a binomial proportion.
    assert abs(freq[full] - 0.5) < 4 * np.sqrt(0.25 / n)
    p = 0.5 / max_chunk
    for c in range(1, max_chunk + 1):
        assert abs(freq[c] - p) < 4 * np.sqrt(p * (1 - p) / n)


def test_dynamic_chunk_training_draws_per_batch_and_jits_once():
    max_chunk, t, t_enc = 3, 45, 10  # 45 feature frames -> 10 encoder frames
    enc = _encoder(causal=True, dynamic_chunk=True, max_dynamic_chunk=max_chunk, chunk_size=2)
    # Row k > 0 changes the features from 4k + 3 on, which reach encoder frames >= k only:
    # encoder frame 0 then changes iff it attends frame k, i.e. iff the chunk size is > k.
    feats = np.repeat(np.random.default_rng(7).standard_normal((1, t, F)), max_chunk + 1, 0)
    for k in range(1, max_chunk + 1):
        feats[k, 4 * k + 3 :] += 1.0
    feats = jnp.asarray(feats, jnp.float32)
    lengths = jnp.full((max_chunk + 1,), t)

    def chunk_used(frame0_kd):
        same = [k for k in range(1, max_chunk + 1) if np.allclose(frame0_kd[k], frame0_kd[0])]
        return min(same) if same else t_enc  # full context: every change reaches frame 0

    traces = []

    @nnx.jit
    def forward(m, key):
        traces.append(1)
        train = m(feats, lengths, deterministic=False, rngs=nnx.Rngs(chunk=key))[0]
        return train[:, 0], m(feats, lengths, deterministic=True)[0][:, 0]

    drawn = []
    for seed in range(30):
        key = jax.random.key(seed)
        train0, eval0 = forward(enc, key)
        # The encoder draws exactly what draw_chunk_size gives for its 'chunk' stream key.
        want = int(draw_chunk_size(nnx.Rngs(chunk=key).chunk(), max_chunk, t_enc))
        assert chunk_used(np.asarray(train0)) == want, seed
        assert chunk_used(np.asarray(eval0)) == 2  # evaluation uses chunk_size
        drawn.append(want)
    assert len(traces) == 1  # one compiled step whatever chunk size was drawn
    assert t_enc in drawn and set(drawn) - {t_enc}  # both full context and chunks were drawn
    with pytest.raises(ValueError, match="rngs"):
        enc(feats, lengths, deterministic=False)


# ------------------------------------------------------------------------------------------
# Rematerialization.
# ------------------------------------------------------------------------------------------


def test_remat_policies_give_identical_loss_and_gradients():
    """none / full / dots, unrolled and scanned: one layer each (every variant costs a
    gradient compilation), the scanned one holding the unrolled one's parameters."""
    feats = jnp.asarray(np.random.default_rng(8).standard_normal((2, 40, F)), jnp.float32)
    lengths = jnp.array([40, 29])
    kw = dict(num_layers=1, chunk_size=3, causal=True)

    def loss(m):
        return jnp.sum(m(feats, lengths, deterministic=True)[0] ** 2)

    def jaxpr(m):
        graphdef, state = nnx.split(m)
        return str(jax.make_jaxpr(lambda st: loss(nnx.merge(graphdef, st)))(state))

    remat_call = r"= (remat\w*|checkpoint)\["
    grad_fn = nnx.jit(nnx.value_and_grad(loss))
    base = _encoder(**kw)
    assert not re.search(remat_call, jaxpr(base))
    ref_loss, ref_grads = grad_fn(base)
    assert float(ref_loss) > 1.0
    ref_grads = nnx.to_pure_dict(nnx.state(ref_grads, nnx.Param))
    for remat, scan in [("full", False), ("dots", True)]:
        enc = _encoder(remat=remat, params=nnx.to_pure_dict(nnx.state(base, nnx.Param)), **kw)
        enc = _scanned_copy(enc, remat=remat, **kw) if scan else enc
        # The blocks really are rematerialized, with the asked policy.
        program = jaxpr(enc)
        assert re.search(remat_call, program)
        assert (str(REMAT_POLICIES["dots"]) in program) == (remat == "dots")
        value, grads = grad_fn(enc)
        np.testing.assert_allclose(float(value), float(ref_loss), rtol=1e-6)
        grads = nnx.to_pure_dict(nnx.state(grads, nnx.Param))
        if scan:
            grads["blocks"] = {0: jax.tree.map(lambda a: a[0], grads["blocks"])}
        # Recomputation may round differently: float32 rounding, relative to the largest gradient.
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5 * (1 + np.abs(b).max())),
            grads,
            ref_grads,
        )


# ------------------------------------------------------------------------------------------
# Streamed front end == batch front end.
# ------------------------------------------------------------------------------------------


# Steps of 7 hops then a partial flush; 1-hop steps (the first emits no frame); a flush only.
@pytest.mark.parametrize("hops_per_step,stream_until", [(7, 4000), (1, 800), (1, 0)])
def test_frontend_stream_equals_batch_frontend(hops_per_step, stream_until):
    cfg = LogMelConfig(num_mel_bins=F)
    fe = Frontend(cfg)
    rng = np.random.default_rng(0)
    fe.set_stats(
        (rng.standard_normal(F) - 5).astype(np.float32), (1 + rng.random(F)).astype(np.float32)
    )
    s_total = 5000
    audio = (0.1 * rng.standard_normal((2, s_total))).astype(np.float32)
    lengths = np.array([s_total, 4321])
    full, full_len = fe(jnp.asarray(audio), jnp.asarray(lengths), train=False, rngs=None)
    full, full_len = np.asarray(full), np.asarray(full_len)
    chunk = cfg.hop_length * hops_per_step
    step = nnx.jit(lambda m, s, a: m.stream_step(s, a))
    state, outs, pos = fe.init_stream(2), [np.zeros((2, 0, F), np.float32)], 0
    while pos + chunk <= stream_until:
        out, state = step(fe, state, jnp.asarray(audio[:, pos : pos + chunk]))
        outs.append(np.asarray(out))
        pos += chunk
    tail, tail_len = fe.stream_flush(
        state, jnp.asarray(audio[:, pos:]), jnp.asarray(lengths - pos, jnp.int32)
    )
    tail, tail_len = np.asarray(tail), np.asarray(tail_len)
    steady = np.concatenate(outs, 1)
    # A frame's window ends 40 samples past the next hop: each step completes one frame per
    # hop, the first step one fewer (fe.stream_lag()).
    assert fe.stream_lag() == 1
    assert steady.shape[1] == max(0, pos // cfg.hop_length - 1)
    for b in range(2):
        got = np.concatenate([steady[b], tail[b, : tail_len[b]]])
        assert got.shape[0] == full_len[b]
        np.testing.assert_allclose(got, full[b, : full_len[b]], atol=1e-5)
        assert not tail[b, tail_len[b] :].any()


# ------------------------------------------------------------------------------------------
# The whole recognizer: audio chunks in, encoder frames out.
# ------------------------------------------------------------------------------------------


def test_model_streams_audio_like_the_masked_full_model():
    """ASRModel.stream_step / stream_flush on raw audio == the model on the whole utterance
    (chunked attention, causal conv), for a stream that ends inside a chunk."""
    from jaxspeech.models import build_model

    kw = dict(subsampling_factor=4, causal=True, chunk_size=2, left_chunks=1)
    enc = _encoder(**kw)
    cfg = LogMelConfig(num_mel_bins=F)
    model = nnx.eval_shape(
        lambda: build_model(
            encoder="conformer",
            encoder_kwargs=TINY | kw,
            vocab_size=5,
            feature_config=cfg,
            rngs=nnx.Rngs(0),
        )
    )
    state = nnx.state(model, nnx.Param)
    params = nnx.to_pure_dict(state)
    params["encoder"] = nnx.to_pure_dict(nnx.state(enc, nnx.Param))
    params["ctc"] = jax.tree.map(lambda x: np.zeros(x.shape, np.float32), params["ctc"])
    nnx.replace_by_pure_dict(state, params)
    nnx.update(model, state)
    rng = np.random.default_rng(7)
    stats = nnx.state(model, FeatureStats)  # still abstract: built by eval_shape
    nnx.replace_by_pure_dict(
        stats,
        build.feature_stats(rng.normal(-4, 1, F), np.full(F, 2.0)),
    )
    nnx.update(model, stats)
    first, later = model.stream_samples(first=True), model.stream_samples(first=False)
    n = first + 3 * later + 1234  # three full chunks after the first, then a partial one
    audio = (0.1 * rng.standard_normal((1, n))).astype(np.float32)
    full, full_len = model(jnp.asarray(audio), jnp.array([n]))
    st = model.init_stream(1)
    outs, valids = [], []
    out, valid, st = model.stream_step(st, jnp.asarray(audio[:, :first]))
    outs.append(out), valids.append(valid)
    pos = first
    while pos + later <= n:
        out, valid, st = model.stream_step(st, jnp.asarray(audio[:, pos : pos + later]))
        outs.append(out), valids.append(valid)
        pos += later
    out, valid = model.stream_flush(st, jnp.asarray(audio[:, pos:]))
    outs.append(out), valids.append(valid)
    got, ok = np.concatenate(outs, axis=1)[0], np.concatenate(valids, axis=1)[0]
    t = int(full_len[0])
    assert ok.sum() == t and ok[:t].all()
    np.testing.assert_allclose(got[:t], np.asarray(full)[0, :t], atol=1e-5)
    with pytest.raises(ValueError, match="takes"):
        model.stream_step(model.init_stream(1), jnp.zeros((1, later)))
