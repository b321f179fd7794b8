"""The MFCC front end (features.kind = "mfcc"): against librosa given the same log-mel
frames, deltas against librosa.feature.delta at each row's own length, padding, the model
with either encoder, streaming, export, the config's checks, and data_prep's statistics
against a one-pass computation over a prepared split's records."""

import json

import jax
import jax.numpy as jnp
import librosa
import numpy as np
import pytest
import soundfile as sf
from array_record.python.array_record_module import ArrayRecordReader
from flax import nnx

from configs import demo
from data_prep import config as prep_config
from data_prep import prepare as prep
from data_prep.readers.common import PrepareError
from jaxspeech.audio import features, mfcc
from jaxspeech.common.errors import UserError
from jaxspeech.config import build, validate
from jaxspeech.data import records
from jaxspeech.data.tokenizer import train_char_tokenizer
from jaxspeech.models import inference
from jaxspeech.models.frontend import Frontend
from jaxspeech.runs import assets
from jaxspeech.serving import recognizer_export as export_lib

RATE = 16000
MFCC_13 = dict(kind="mfcc", num_ceps=13, lifter=22.0)


def _speech(b: int, s: int, seed: int = 0) -> np.ndarray:
    """(B, S) float32 harmonics of a gliding pitch plus a little noise (structure in the
    cepstra, unlike white noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(s) / RATE
    f0 = rng.uniform(100, 200, (b, 1)) * (1 + 0.1 * np.sin(2 * np.pi * 2 * t))
    phase = 2 * np.pi * np.cumsum(f0, axis=1) / RATE
    x = sum(np.sin(k * phase) / k for k in range(1, 20)) * (0.5 + 0.5 * np.sin(np.pi * 3 * t))
    return (0.2 * x + 0.01 * rng.standard_normal((b, s))).astype(np.float32)


def _log_mel(audio: np.ndarray, num_mel_bins: int = 80) -> np.ndarray:
    cfg = features.LogMelConfig(num_mel_bins=num_mel_bins)
    return np.asarray(features.log_mel(jnp.asarray(audio), cfg))


@pytest.mark.parametrize("num_mel_bins,num_ceps", [(80, 13), (40, 40)])
def test_mfcc_matches_librosa_given_the_same_log_mel(num_mel_bins, num_ceps):
    log_mel = _log_mel(_speech(2, 12345), num_mel_bins)  # (B, T, M)
    out = {}
    for lifter in (22.0, 0.0):
        out[lifter] = got = np.asarray(mfcc.cepstra(jnp.asarray(log_mel), num_ceps, lifter))
        for b in range(2):
            want = librosa.feature.mfcc(
                S=log_mel[b].T.astype(np.float64),
                n_mfcc=num_ceps,
                dct_type=2,
                norm="ortho",
                lifter=lifter,
            )
            assert got[b].shape == want.T.shape
            assert np.max(np.abs(got[b] - want.T)) < 1e-3
    # Liftering scales coefficient k by 1 + (L / 2) sin(pi (k + 1) / L) (librosa's indexing).
    weights = 1 + 11 * np.sin(np.pi * np.arange(1, num_ceps + 1) / 22)
    np.testing.assert_allclose(out[22.0], out[0.0] * weights, rtol=1e-4, atol=1e-4)


def test_deltas_match_librosa_at_each_rows_length():
    x = np.asarray(mfcc.cepstra(jnp.asarray(_log_mel(_speech(4, 16000, 1))), 13, 22.0))
    lengths = np.array([101, 60, 5, 3])  # the whole row, a padded one, the shortest, too short
    got = np.asarray(jax.jit(mfcc.append_deltas, static_argnums=2)(x, jnp.asarray(lengths), 2))
    assert got.shape == (4, 101, 39)
    for b, n in enumerate(lengths):
        np.testing.assert_array_equal(got[b, :n, :13], x[b, :n])
        if n < 5:  # librosa refuses fewer frames than its width: zero deltas here
            assert not got[b, :n, 13:].any()
            continue
        ref = x[b, :n].T.astype(np.float64)
        for order in (1, 2):
            want = librosa.feature.delta(ref, width=5, order=order)
            assert np.max(np.abs(got[b, :n, 13 * order : 13 * (order + 1)] - want.T)) < 1e-4
        # data_prep's numpy MFCCs: the same arithmetic.
        log_mel = _log_mel(_speech(4, 16000, 1))[b, :n].T
        np.testing.assert_allclose(mfcc.mfcc_np(log_mel, 13, 22.0, 2).T, got[b, :n], atol=1e-4)


def _frontend(cfg: features.LogMelConfig, seed: int = 0) -> Frontend:
    fe = Frontend(cfg)
    rng = np.random.default_rng(seed)
    f = cfg.num_features
    fe.set_stats(rng.normal(0, 3, f).astype(np.float32), rng.uniform(1, 4, f).astype(np.float32))
    return fe


def test_padded_rows_equal_the_unpadded_utterance_and_padding_is_zero():
    cfg = features.LogMelConfig(**MFCC_13, deltas=2)
    fe = _frontend(cfg)
    audio = _speech(2, 9000, 2)
    lengths = np.array([9000, 6100])
    audio[1, 6100:] = 0.7  # whatever lies past a row's length must not matter
    feats, frames = fe(jnp.asarray(audio), jnp.asarray(lengths), train=False, rngs=None)
    feats, frames = np.asarray(feats), np.asarray(frames)
    assert feats.shape == (2, 57, 39) and list(frames) == [57, 39]
    alone, _ = fe(jnp.asarray(audio[1:, :6100]), jnp.asarray([6100]), train=False, rngs=None)
    np.testing.assert_allclose(feats[1, :39], np.asarray(alone)[0], atol=1e-4)
    assert not feats[1, 39:].any()


@pytest.mark.parametrize("encoder", ["conformer", "lstm"])
def test_tiny_models_take_the_mfcc_width(encoder):
    config = demo.get_config("tiny")
    config.features.kind, config.features.num_ceps, config.features.deltas = "mfcc", 13, 2
    config.model.encoder = encoder
    assert validate.mistakes(config, devices=8) == []
    model = build.make_model(config, 7, 0)
    assert model.frontend.mean.shape == (39,)
    audio = _speech(2, 8000, 3)
    feats, frames = model.frontend(
        jnp.asarray(audio), jnp.array([8000, 5000]), train=False, rngs=None
    )
    assert feats.shape == (2, 51, 39)
    enc, enc_len = model(jnp.asarray(audio), jnp.array([8000, 5000]))
    assert enc.shape[0] == 2 and enc.shape[1] >= int(enc_len[0]) > int(enc_len[1]) > 0
    assert model.ctc_logits(enc).shape == (*enc.shape[:2], 7)


@pytest.mark.parametrize("hops_per_step", [7, 1])
def test_mfcc_streams_like_the_batch_front_end(hops_per_step):
    cfg = features.LogMelConfig(num_mel_bins=40, **MFCC_13)
    fe = _frontend(cfg)
    audio = _speech(2, 5000, 4)
    lengths = np.array([5000, 4321])
    full, full_len = (
        np.asarray(x) for x in fe(jnp.asarray(audio), jnp.asarray(lengths), train=False, rngs=None)
    )
    chunk = cfg.hop_length * hops_per_step
    state, outs, pos = fe.init_stream(2), [np.zeros((2, 0, 13), np.float32)], 0
    step = nnx.jit(lambda m, s, a: m.stream_step(s, a))
    while pos + chunk <= 4000:
        out, state = step(fe, state, jnp.asarray(audio[:, pos : pos + chunk]))
        outs.append(np.asarray(out))
        pos += chunk
    tail, tail_len = fe.stream_flush(state, jnp.asarray(audio[:, pos:]), jnp.asarray(lengths - pos))
    for b in range(2):
        got = np.concatenate([np.concatenate(outs, 1)[b], np.asarray(tail)[b, : int(tail_len[b])]])
        np.testing.assert_allclose(got, full[b, : full_len[b]], atol=1e-4)
    with pytest.raises(ValueError, match="MFCC deltas .* cannot stream"):
        _frontend(features.LogMelConfig(**MFCC_13, deltas=1)).init_stream(1)


def _tiny_model(settings: dict, *, streaming: bool):
    """configs/demo.py:tiny with `settings` as its features (a chunked causal Conformer
    when `streaming`): (graphdef, params, feature statistics)."""
    config = demo.get_config("tiny")
    for k, v in settings.items():
        config.features[k] = v
    if streaming:
        conformer = config.model.conformer
        conformer.causal, conformer.chunk_size, conformer.left_chunks = True, 4, 2
    model = build.make_model(config, 9, 0)
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    f = model.frontend.cfg.num_features
    rng = np.random.default_rng(5)
    stats = build.feature_stats(rng.normal(0, 3, f), rng.uniform(1, 4, f))
    return graphdef, nnx.to_pure_dict(params), stats


def test_export_computes_mfcc_inside_with_symbolic_shapes():
    """A streaming MFCC model's CTC and stream functions export (`jax.export` with the
    exporter's symbolic batch and length, as `export_stablehlo` does); with deltas (not
    streaming) the serialized CTC function equals the model's on a ragged batch."""
    for settings, streaming in [(dict(MFCC_13), True), (dict(MFCC_13, deltas=2), False)]:
        graphdef, params, stats = _tiny_model(settings, streaming=streaming)
        fns = export_lib.inference_functions(graphdef, params, stats)
        assert ("stream_step" in fns) == streaming
        names = ["ctc", "stream_step", "stream_flush"] if streaming else ["ctc"]
        for name in names:
            specs = inference.argument_specs(name, fns, RATE)
            exported = jax.export.export(jax.jit(fns[name]), platforms=("cpu",))(*specs)
            loaded = jax.export.deserialize(exported.serialize())
        if not streaming:  # one compiled comparison: the rows' own delta edges, symbolic T
            inputs = list(export_lib.check_inputs("ctc", fns, RATE).values())
            got, lengths = loaded.call(*inputs)
            want, want_lengths = jax.jit(fns["ctc"])(*inputs)  # the model, concrete shapes
            np.testing.assert_array_equal(np.asarray(lengths), np.asarray(want_lengths))
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4)


def test_config_checks_of_the_mfcc_keys():
    config = demo.get_config("tiny")
    config.features.kind = "mfcc"
    assert validate.mistakes(config, devices=8) == []
    config.features.num_ceps = 81
    assert validate.mistakes(config, devices=8) == [
        "features.num_ceps must be <= features.num_mel_bins=80 (the cepstra are a DCT of the "
        "mel bins), got 81"
    ]
    config.features.num_ceps, config.specaug.freq_mask_width = 8, 9
    (line,) = validate.mistakes(config, devices=8)
    assert line.startswith("specaug.freq_mask_width must be <= the MFCC width 8")
    config.features.num_ceps, config.specaug.freq_mask_width = 6, 3  # x4 subsampling: 7
    (line,) = validate.mistakes(config, devices=8)
    assert line.startswith("features.num_ceps x (1 + features.deltas) must be >= 7")
    config.specaug.freq_mask_width, config.features.num_ceps = 3, 13
    config.features.deltas = 1
    e = config.model.conformer
    e.causal, e.chunk_size, e.conv_kernel = True, 4, 16
    (line,) = validate.mistakes(config, devices=8)
    assert line.startswith("features.deltas must be 0 with a streaming encoder")
    config.features.kind = "log_mel"  # the MFCC keys are then unused, not checked
    config.features.num_ceps, config.features.deltas = 0, 7
    assert validate.mistakes(config, devices=8) == []


# ---------------------------------------------------------------- statistics
def _stats_dir(tmp_path, feature: features.LogMelConfig) -> str:
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    train_char_tokenizer(["abc"]).save(str(data / "tokenizer"))
    record = {"feature": feature.as_dict(), "count": 3, "sum": [0.0] * feature.num_features}
    record["sum_sq"] = [3.0] * feature.num_features
    (data / "train" / "stats.json").write_text(json.dumps(record))
    return str(data)


@pytest.mark.parametrize(
    "stats_kw,config_kw,said",
    [
        (
            {},
            dict(kind="mfcc"),
            "computed with kind='log_mel', but the config asks for features.kind='mfcc'",
        ),
        (MFCC_13, dict(kind="log_mel"), "kind='mfcc'"),
        (
            MFCC_13,
            dict(MFCC_13, num_ceps=40),
            "num_ceps=13, but the config asks for features.num_ceps=40",
        ),
        (
            dict(MFCC_13, deltas=1),
            dict(MFCC_13),
            "deltas=1, but the config asks for features.deltas=0",
        ),
    ],
)
def test_the_trainer_refuses_statistics_of_other_features(tmp_path, stats_kw, config_kw, said):
    config = demo.get_config("tiny")
    config.data.dir = _stats_dir(tmp_path, features.LogMelConfig(**stats_kw))
    for k, v in config_kw.items():
        config.features[k] = v
    with pytest.raises(UserError, match="re-run data_prep.prepare") as e:
        assets.install_assets(config, str(tmp_path / "run"))
    assert said in str(e.value) and "\n" not in str(e.value)


def test_matching_statistics_install(tmp_path):
    config = demo.get_config("tiny")
    config.features.kind, config.features.num_ceps, config.features.deltas = "mfcc", 13, 1
    config.data.dir = _stats_dir(tmp_path, build.feature_config(config))
    _, mean, std = assets.install_assets(config, str(tmp_path / "run"))
    assert mean.shape == std.shape == (26,)
    # A log-mel record written before the MFCC keys existed still matches a log-mel config.
    old = features.LogMelConfig().as_dict()
    assert "kind" not in old and assets.feature_differences(old, dict(old)) == {}
    assert assets.feature_differences(old, build.feature_config(config).as_dict()) == {
        "kind": ("log_mel", "mfcc")
    }


def test_prepare_writes_mfcc_statistics_of_its_records(tmp_path):
    """`data_prep.prepare --features mfcc ...`: stats.json's feature record and sums equal a
    one-pass numpy computation (librosa log-mel, DCT, librosa deltas) over the records."""
    lines = []
    for i, seconds in enumerate([0.5, 0.8, 0.3]):
        path = tmp_path / f"u{i}.wav"
        sf.write(str(path), _speech(1, int(seconds * RATE), 10 + i)[0], RATE, subtype="PCM_16")
        lines.append(json.dumps({"audio_filepath": str(path), "text": "abc", "speaker": "s"}))
    (tmp_path / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    out = str(tmp_path / "out")
    flags = ["--features", "mfcc", "--num_ceps", "13", "--lifter", "22", "--deltas", "2"]
    prep.prepare(
        ["prepare", "--format", "manifest", "--input", str(tmp_path / "manifest.jsonl")]
        + ["--output", out, "--split", "train", *flags, "--num_shards", "1"]
        + ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
    )
    stats = json.loads((tmp_path / "out" / "train" / "stats.json").read_text())
    want_feature = features.LogMelConfig(**MFCC_13, deltas=2).as_dict()
    assert stats["feature"] == want_feature
    frames = []
    for path in records.read_split_index(out, "train").shard_paths:
        reader = ArrayRecordReader(path)
        for raw in reader.read_all():
            y = records.decode_record(raw)["audio"].astype(np.float32) / 32768
            mel = librosa.feature.melspectrogram(
                y=y,
                sr=RATE,
                n_fft=512,
                hop_length=160,
                win_length=400,
                center=True,
                pad_mode="constant",
                n_mels=80,
                fmin=0.0,
                fmax=8000.0,
                norm="slaney",
            )
            ceps = librosa.feature.mfcc(S=np.log(mel + 1e-6), n_mfcc=13, norm="ortho", lifter=22)
            deltas = [librosa.feature.delta(ceps, width=5, order=k) for k in (1, 2)]
            frames.append(np.concatenate([ceps, *deltas]).astype(np.float64))
        reader.close()
    everything = np.concatenate(frames, axis=1)  # (39, frames of all records)
    assert stats["count"] == everything.shape[1]
    np.testing.assert_allclose(stats["sum"], everything.sum(1), rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(stats["sum_sq"], (everything**2).sum(1), rtol=1e-4)


@pytest.mark.parametrize(
    "flags,said",
    [
        (["--num_ceps", "81"], "--num_ceps must be in [1, --num_mel_bins=80], got 81"),
        (["--lifter", "-1"], "--lifter must be a finite number >= 0, got -1.0"),
        (["--deltas", "3"], "--deltas must be in [0, 2], got 3"),
    ],
)
def test_prepare_refuses_mfcc_settings_the_front_end_cannot_compute(flags, said):
    argv = ["prepare", "--format", "manifest", "--input", "m.jsonl", "--output", "o"]
    with pytest.raises(PrepareError) as e:
        prep_config.parse_args([*argv, "--split", "train", "--features", "mfcc", *flags])
    assert str(e.value) == said
