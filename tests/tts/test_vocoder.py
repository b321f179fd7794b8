"""HiFi-GAN: sizes, output shape and range, padding invariance, a few alternating Adam steps
on one utterance, and the same losses and gradients on an 8-device mesh as on one device.

Tiny modules, compiles dominate: the generator has the full structure (4 upsampling stages)
with few channels and residual blocks; the discriminators keep 2 of the 5 periods and 2 of
the 3 scales. Every jitted function is compiled for few shapes: the single-device
loss-and-gradient functions serve the padding, learning and mesh tests."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel.rules import state_shardings
from jaxspeech.vocoder import losses as vl
from jaxspeech.vocoder.discriminators import DEMO_DISCRIMINATOR, HiFiGANDiscriminator
from jaxspeech.vocoder.hifigan import DEMO_GENERATOR, HiFiGANGenerator, num_params, vocode
from tests.tts.tones import harmonic_tone

HOP, MELS, B, S = 160, 80, 8, 880  # S samples -> T = 6 frames -> 960 samples
T = 1 + S // HOP
LENGTHS = np.array([S, 850, 801, 700, 643, 555, 480, 400])


def _generator(seed: int = 0) -> HiFiGANGenerator:
    return HiFiGANGenerator(
        n_mels=MELS, channels=16, resblock_kernels=(3, 5), resblock_dilations=((1, 3, 5),) * 2,
        rngs=nnx.Rngs(seed),
    )  # fmt: skip


def _discriminator(seed: int = 1) -> HiFiGANDiscriminator:
    """Tiny channels, 2 of the periods and 2 scales (every sub-discriminator is the same
    code; `test_sizes_and_upsampling` counts the default's 5 + 3)."""
    return HiFiGANDiscriminator(
        periods=(2, 3), period_channels=(4, 8, 16, 16, 16),
        scales=2, scale_channels=(8, 8, 16, 16, 16, 16, 16), rngs=nnx.Rngs(seed),
    )  # fmt: skip


@pytest.fixture(scope="module")
def batch() -> dict[str, np.ndarray]:
    """Eight crops of one utterance (a harmonic tone), of LENGTHS samples, zero-padded."""
    tone = harmonic_tone(S + 7 * 50)
    audio = np.stack([tone[50 * i : 50 * i + S] for i in range(B)])
    out = jax.jit(vl.make_batch)(audio, jnp.asarray(LENGTHS, jnp.int32))
    return jax.tree.map(np.asarray, out)


def test_sizes_and_upsampling():
    default = nnx.eval_shape(lambda: HiFiGANGenerator(rngs=nnx.Rngs(0)))
    assert default.hop == math.prod(default.rates) == HOP and default.rates == (5, 4, 4, 2)
    assert 12e6 < num_params(default) < 14e6  # the paper's V1: 13.9 M at 22.05 kHz
    demo = nnx.eval_shape(lambda: HiFiGANGenerator(**DEMO_GENERATOR, rngs=nnx.Rngs(0)))
    assert 1e5 < num_params(demo) < 5e5
    disc = nnx.eval_shape(lambda: HiFiGANDiscriminator(rngs=nnx.Rngs(0)))
    assert [d.period for d in disc.periods] == [2, 3, 5, 7, 11] and len(disc.scales) == 3
    assert 65e6 < num_params(disc) < 75e6  # the paper's MPD + MSD: 70.7 M
    small = nnx.eval_shape(lambda: HiFiGANDiscriminator(**DEMO_DISCRIMINATOR, rngs=nnx.Rngs(0)))
    assert num_params(small) < 5e5


@nnx.jit
def _vocode(generator, mel, mask):
    return vocode(generator, mel, mask)


@pytest.fixture(scope="module")
def modules() -> tuple[HiFiGANGenerator, HiFiGANDiscriminator]:
    """One generator and one discriminator for every test (an init costs seconds)."""
    return _generator(), _discriminator()


def test_output_is_frames_times_hop_in_range_and_zero_past_the_end(modules, batch):
    mask = np.asarray(vl.frame_mask(jnp.asarray(LENGTHS), T, HOP))
    audio = np.asarray(_vocode(modules[0], batch["mel"], mask))
    assert audio.shape == (B, T * HOP) and audio.dtype == np.float32
    assert np.all(np.abs(audio) <= 1.0) and np.abs(audio).max() > 0
    valid = np.repeat(mask, HOP, axis=1)
    assert np.all(audio[~valid] == 0.0) and np.all(np.where(valid, np.abs(audio), 0).max(1) > 0)


def test_a_rows_valid_output_ignores_the_padding_content_and_amount(modules, batch):
    """Every convolution zeroes the invalid positions first, so a row's valid samples are
    those of the row alone: the same with 5 more frames of padding (as a longer row in the
    batch would add) and garbage in every padded frame."""
    gen = modules[0]
    mask = np.asarray(vl.frame_mask(jnp.asarray(LENGTHS), T, HOP))
    want = np.asarray(_vocode(gen, batch["mel"], mask))
    extra = 5
    garbage = np.random.default_rng(0).uniform(-20, 20, (B, T + extra, MELS)).astype(np.float32)
    long_mask = np.pad(mask, ((0, 0), (0, extra)))
    mel = np.where(
        long_mask[..., None], np.pad(batch["mel"], ((0, 0), (0, extra), (0, 0))), garbage
    )
    got = np.asarray(_vocode(gen, mel, long_mask))
    np.testing.assert_allclose(got[:, : T * HOP], want, atol=1e-6)
    assert np.all(got[:, T * HOP :] == 0.0)


def test_discriminator_features_ignore_the_padding_content_and_amount(modules, batch):
    disc = modules[1]
    run = nnx.jit(lambda d, a, n: d(a, n))
    want = run(disc, batch["audio"], LENGTHS)
    extra = 131  # not a multiple of any period or stride
    garbage = np.random.default_rng(1).uniform(-1, 1, (B, T * HOP + extra)).astype(np.float32)
    valid = np.arange(T * HOP + extra)[None] < LENGTHS[:, None]
    got = run(disc, np.where(valid, np.pad(batch["audio"], ((0, 0), (0, extra))), garbage), LENGTHS)
    assert len(want) == 2 + 2
    for w, g in zip(want, got):
        for wm, gm, mask in zip(w.maps, g.maps, w.masks):
            mask = np.broadcast_to(np.asarray(mask), wm.shape)
            np.testing.assert_allclose(
                np.asarray(gm)[:, : wm.shape[1]][mask], np.asarray(wm)[mask], atol=1e-5
            )


def _losses(gen_def, disc_def):
    """Jitted (loss, parts), gradients of the generator's loss in its parameters and of
    the discriminators' loss in theirs (the fake audio from the same generator)."""

    def gen_loss(gen_params, disc_params, batch):
        gen, disc = nnx.merge(gen_def, gen_params), nnx.merge(disc_def, disc_params)
        return vl.generator_loss(gen, disc, batch)

    def disc_loss(disc_params, gen_params, batch):
        gen, disc = nnx.merge(gen_def, gen_params), nnx.merge(disc_def, disc_params)
        return vl.discriminator_loss(disc, batch, vl.generate(gen, batch, vl.FRONT_END))

    return (
        jax.jit(jax.value_and_grad(gen_loss, has_aux=True)),
        jax.jit(jax.value_and_grad(disc_loss, has_aux=True)),
    )


@pytest.fixture(scope="module")
def split_models(modules):
    gen_def, gen_state = nnx.split(modules[0])
    disc_def, disc_state = nnx.split(modules[1])
    return (gen_def, gen_state, nnx.to_pure_dict(gen_state)), (
        disc_def, disc_state, nnx.to_pure_dict(disc_state),
    )  # fmt: skip


@pytest.fixture(scope="module")
def single_device(split_models, batch):
    """The jitted loss functions and their values and gradients at the initial parameters."""
    (gen_def, _, gen_params), (disc_def, _, disc_params) = split_models
    gen_fn, disc_fn = _losses(gen_def, disc_def)
    return (
        (gen_fn, disc_fn),
        gen_fn(gen_params, disc_params, batch),
        disc_fn(disc_params, gen_params, batch),
    )


def test_loss_parts_are_weighted_and_finite(single_device):
    _, ((gen_total, parts), gen_grads), ((disc_total, disc_parts), _) = single_device
    want = parts["adversarial"] + 2.0 * parts["feature"] + 45.0 * parts["mel"]
    np.testing.assert_allclose(float(gen_total), float(want), rtol=1e-6)
    np.testing.assert_allclose(
        float(disc_total), float(disc_parts["real"] + disc_parts["fake"]), rtol=1e-6
    )
    assert all(np.isfinite(float(v)) and float(v) > 0 for v in parts.values())
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(gen_grads))


def test_losses_ignore_what_the_padding_holds(split_models, single_device, batch):
    """Garbage in the audio past each length and in the mel past each row's frames: the same
    losses and gradients (the content; the amount is the two tests above)."""
    (_, _, gen_params), (_, _, disc_params) = split_models
    (gen_fn, disc_fn), gen_want, disc_want = single_device
    rng = np.random.default_rng(2)
    valid = np.arange(T * HOP)[None] < LENGTHS[:, None]
    frames = np.asarray(vl.frame_mask(jnp.asarray(LENGTHS), T, HOP))
    noise = lambda shape, lo, hi: rng.uniform(lo, hi, shape).astype(np.float32)
    dirty = batch | {
        "audio": np.where(valid, batch["audio"], noise(valid.shape, -1, 1)),
        "mel": np.where(frames[..., None], batch["mel"], noise(batch["mel"].shape, -20, 5)),
    }
    _assert_trees_close(gen_fn(gen_params, disc_params, dirty), gen_want, rtol=1e-5, atol=1e-7)
    _assert_trees_close(disc_fn(disc_params, gen_params, dirty), disc_want, rtol=1e-5, atol=1e-7)


def _assert_trees_close(got, want, *, rtol: float, atol: float) -> None:
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def test_alternating_adam_steps_lower_the_mel_loss(split_models, single_device, batch):
    """HiFi-GAN's loop (a discriminator step, then a generator step) on one utterance's
    crops. Measured: mel L1 10.6 (the paper's init, N(0, 0.01) kernels without weight
    norm, starts near silence: |audio| ~ 1e-9) -> 2.7 after 20 steps."""
    (_, _, gen_params), (_, _, disc_params) = split_models
    (gen_fn, disc_fn), ((_, first), _), _ = single_device
    tx = optax.adam(3e-3, b1=0.8, b2=0.99)  # the paper's betas

    @jax.jit
    def apply(grads, opt_state, params):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    gen_opt, disc_opt = tx.init(gen_params), tx.init(disc_params)
    for _ in range(20):
        _, disc_grads = disc_fn(disc_params, gen_params, batch)
        disc_params, disc_opt = apply(disc_grads, disc_opt, disc_params)
        (_, parts), gen_grads = gen_fn(gen_params, disc_params, batch)
        gen_params, gen_opt = apply(gen_grads, gen_opt, gen_params)
    (_, last), _ = gen_fn(gen_params, disc_params, batch)
    assert float(last["mel"]) < 0.5 * float(first["mel"]), (float(first["mel"]), float(last["mel"]))


def test_losses_and_gradients_on_an_8_device_mesh_equal_one_device(
    split_models, single_device, batch
):
    """Batch over (data, fsdp) = (4, 2): one row per device (a real and a generated one in
    the discriminators); kernels FSDP-sharded on their output channels where 2 divides them
    (grouped ones replicated)."""
    if len(jax.devices()) < 8:
        pytest.skip("needs the 8 simulated CPU devices of tests/conftest.py")
    (gen_def, gen_state, gen_params), (disc_def, disc_state, disc_params) = split_models
    _, gen_want, disc_want = single_device
    mesh = mesh_lib.make_mesh({"data": 4, "fsdp": 2}, devices=jax.devices()[:8])
    gen_sharded = jax.device_put(gen_params, state_shardings(gen_state, mesh))
    disc_sharded = jax.device_put(disc_params, state_shardings(disc_state, mesh))
    assert gen_sharded["conv_pre"]["kernel"].sharding.spec[-1] == "fsdp"
    global_batch = mesh_lib.host_to_global(mesh, batch)
    assert global_batch["audio"].sharding.spec[0] == ("replica", "stage", "data", "fsdp")
    with jax.set_mesh(mesh):
        gen_fn, disc_fn = _losses(gen_def, disc_def)  # fresh: compiled for the mesh
        gen_got = gen_fn(gen_sharded, disc_sharded, global_batch)
        disc_got = disc_fn(disc_sharded, gen_sharded, global_batch)
    # Measured: relative deviations up to 4e-7 (generator) and 7e-4 on values of ~1e-7
    # (discriminator; absolute 9e-8): the order of the batch sums differs.
    _assert_trees_close(gen_got, gen_want, rtol=1e-4, atol=1e-6)
    _assert_trees_close(disc_got, disc_want, rtol=1e-4, atol=1e-6)


def test_mismatched_configuration_is_refused(modules, batch):
    make = lambda: HiFiGANGenerator(channels=16, upsample_rates=(4, 4, 2, 2), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="upsampling"):  # 64 samples a frame, not 160
        vl.generate(nnx.eval_shape(make), batch, vl.FRONT_END)
    with pytest.raises(ValueError, match="mel bins"):
        vocode(modules[0], jnp.zeros((1, 3, 40)), jnp.ones((1, 3), bool))
    with pytest.raises(ValueError, match="halve"):
        HiFiGANGenerator(channels=24, rngs=nnx.Rngs(0))
